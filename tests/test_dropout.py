"""Dropout: mask statistics, reproducibility under torch's RNG, the backward reusing the
forward's mask, p = 0 / p = 1, registry Dropout / DropoutGrad semantics (spec §7) and
nn.Dropout."""

from __future__ import annotations

import math

import pytest
import torch

import ortcpu_torch as ot
from ortcpu_torch import kernels as K

from .conftest import assert_close


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mask_statistics(p, dtype):
    n = 200_003
    x = torch.ones(n, dtype=dtype)
    y, mask = _with_mask(x, p)
    kept = int(mask.sum())
    # binomial bound: |kept - n(1-p)| < 6 sigma
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 6 * sigma
    assert torch.equal(y != 0, mask)
    assert_close(y[mask], torch.full((kept,), 1 / (1 - p), dtype=dtype), rtol=1e-6, atol=0)
    # no long runs / periodicity: both halves and a strided subset agree with the ratio
    for part in (mask[: n // 2], mask[n // 2:], mask[::7]):
        m = part.numel()
        assert abs(int(part.sum()) - m * (1 - p)) < 6 * math.sqrt(m * p * (1 - p))
    # neighbouring elements are independent: P(both kept) ≈ (1-p)²
    both = int((mask[:-1] & mask[1:]).sum())
    q = (1 - p) ** 2
    assert abs(both - (n - 1) * q) < 6 * math.sqrt(n * q * (1 - q))


def _with_mask(x, p, generator=None):
    from ortcpu_torch.ops.dropout import dropout_with_mask

    return dropout_with_mask(x, p, True, generator=generator)


def test_reproducible_under_seed_and_generator():
    x = torch.randn(1000, 33)
    torch.manual_seed(123)
    a = ot.ops.dropout(x, 0.3)
    b = ot.ops.dropout(x, 0.3)
    torch.manual_seed(123)
    a2 = ot.ops.dropout(x, 0.3)
    assert torch.equal(a, a2) and not torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(ot.ops.dropout(x, 0.5, generator=g1), ot.ops.dropout(x, 0.5, generator=g2))
    # the mask does not depend on the thread count
    g1.manual_seed(9)
    ot.set_num_threads(1)
    one = ot.ops.dropout(torch.ones(300_000), 0.5, generator=g1)
    ot.set_num_threads(2)
    g1.manual_seed(9)
    two = ot.ops.dropout(torch.ones(300_000), 0.5, generator=g1)
    assert torch.equal(one, two)


@pytest.mark.parametrize("n", [1, 7, 16, 17, 33, 70, 1025])
def test_backward_uses_forward_mask(n):
    x = torch.randn(n, dtype=torch.float64, requires_grad=True)
    y, mask = _with_mask(x, 0.4)
    dy = torch.randn(n, dtype=torch.float64)
    y.backward(dy)
    assert_close(x.grad, dy * mask / 0.6, rtol=1e-15, atol=0)
    g = torch.Generator().manual_seed(3)
    assert torch.autograd.gradcheck(
        lambda x: ot.ops.dropout(x, 0.25, generator=g.manual_seed(3)), (x,))


def test_p_zero_and_one_and_eval():
    x = torch.randn(50, requires_grad=True)
    assert ot.ops.dropout(x, 0.0) is x
    assert ot.ops.dropout(x, 0.7, training=False) is x
    y = ot.ops.dropout(x, 1.0)
    assert torch.equal(y, torch.zeros(50))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros(50))
    with pytest.raises(ValueError, match="between 0 and 1"):
        ot.ops.dropout(x, 1.5)


def test_nan_inf_and_noncontiguous():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0] * 100)
    y, mask = _with_mask(x, 0.5)
    assert torch.equal(y[~mask], torch.zeros(int((~mask).sum())))
    assert y[mask].isnan().sum() == x[mask].isnan().sum()
    xt = torch.randn(40, 30).t()
    y, mask = _with_mask(xt, 0.2)
    assert_close(y[mask], xt[mask] / 0.8, rtol=1e-6, atol=0)


def test_registry_dropout_and_grad():
    x = torch.randn(64, 9)
    out, mask = K.Dropout(x, torch.tensor(0.25), torch.tensor(True), seed=5)
    out2, mask2 = K.Dropout(x, torch.tensor(0.25), torch.tensor(True), seed=5)
    assert torch.equal(mask, mask2) and mask.dtype == torch.bool
    assert_close(out, x * mask / 0.75, rtol=1e-6, atol=0)
    # inference (default training_mode false): identity, mask all true
    o, m = K.Dropout(x)
    assert torch.equal(o, x) and m.all()
    dy = torch.randn(64, 9)
    assert_close(K.DropoutGrad(dy, mask, torch.tensor(0.25)), dy * mask / 0.75, rtol=1e-6,
                 atol=0)
    # ratio defaults to 0.5; ratio 0 returns dy unmasked (ORT); training_mode is ignored
    assert_close(K.DropoutGrad(dy, mask), dy * mask * 2, rtol=1e-6, atol=0)
    assert torch.equal(K.DropoutGrad(dy, mask, torch.tensor(0.0)), dy)
    assert_close(K.DropoutGrad(dy, mask, 0.25, torch.tensor(False)), dy * mask / 0.75,
                 rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match=r"ratio must be in \[0, 1\)"):
        K.DropoutGrad(dy, mask, torch.tensor(1.0))
    with pytest.raises(TypeError, match="mask must be a bool"):
        K.DropoutGrad(dy, mask.float())
    with pytest.raises(ValueError, match="shape"):
        K.DropoutGrad(dy, mask[:3])


def test_inplace():
    x = torch.randn(100, 7, requires_grad=True)
    h = x * 1.0
    g = torch.Generator().manual_seed(4)
    ref = ot.ops.dropout(h.detach().clone(), 0.3, generator=g)
    g.manual_seed(4)
    out = ot.ops.dropout(h, 0.3, True, True, generator=g)
    assert out.data_ptr() == h.data_ptr() and torch.equal(out, ref)
    out.sum().backward()
    assert_close(x.grad, (ref != 0).float() / 0.7, rtol=1e-6, atol=0)
    m = ot.nn.Dropout(0.5, inplace=True)
    z = torch.ones(1000)
    assert m(z) is z and float((z == 0).float().mean()) > 0.3


def test_nn_dropout():
    m = ot.nn.Dropout(0.2)
    assert isinstance(m, torch.nn.Dropout) and m.p == 0.2 and repr(m) == repr(
        torch.nn.Dropout(0.2))
    x = torch.ones(10_000)
    y = m(x)
    assert 0.75 < float((y != 0).float().mean()) < 0.85
    m.eval()
    assert torch.equal(m(x), x)
    assert list(m.state_dict()) == []
