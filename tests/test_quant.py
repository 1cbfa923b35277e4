"""FakeQuant / FakeQuantGrad (spec §14), ``ops.fake_quantize`` and ``nn.FakeQuantize``:
ORT's rounding (x/scale half to even, zero point added before truncation), checked
against ``torch.fake_quantize_per_tensor_affine`` and its straight-through gradient.

torch multiplies by a float32 ``1/scale`` where ORT divides, so the two can round
differently when ``x/scale`` lies within an ulp of a half-integer: such elements are
excluded from the comparison (and the rounding there is checked against ORT's rule).
No gradcheck: the straight-through estimator is by definition not the derivative of the
step function it replaces; its mask is compared with torch's instead.
"""

from __future__ import annotations

import pytest
import torch

from ortcpu_torch import kernels as K
from ortcpu_torch import nn as onn
from ortcpu_torch import ops


def _not_tie(x, scale):
    v = x.double() / scale
    return (v - v.floor() - 0.5).abs() > 1e-4


@pytest.mark.parametrize("n", [1, 7, 33, 70, 1000])
@pytest.mark.parametrize("scale,zp,qmin,qmax", [(0.1, 0, 0, 255), (0.05, 10, 0, 255),
                                                (0.02, -3, -128, 127), (0.3, 2, 0, 15)])
def test_fake_quantize_vs_torch(n, scale, zp, qmin, qmax):
    x = torch.randn(n, 3) * 4
    ok = _not_tie(x, scale)
    xt = x.clone().requires_grad_()
    xo = x.clone().requires_grad_()
    yt = torch.fake_quantize_per_tensor_affine(xt, scale, zp, qmin, qmax)
    yo = ops.fake_quantize(xo, scale, zp, qmin, qmax)
    assert torch.equal(yo[ok], yt[ok])
    g = torch.randn_like(yt)
    yt.backward(g)
    yo.backward(g)
    assert torch.equal(xo.grad[ok], xt.grad[ok])


def test_round_half_to_even_and_zero_point_before_truncation():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4])
    y, mask = K.FakeQuant(x, torch.tensor(1.0), torch.tensor(0.0), quant_min=-10, quant_max=10)
    assert y.tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 3.0]
    # zero point 0.7 (float) is added before truncation: nearbyint(2.5)=2, 2+0.7 -> 2,
    # output (2 - 0.7) * 1
    y, _ = K.FakeQuant(torch.tensor([2.5]), 1.0, 0.7, quant_min=0, quant_max=255)
    assert torch.allclose(y, torch.tensor([1.3]))


def test_mask_and_grad():
    x = torch.tensor([-1.0, 0.0, 10.0, 30.0, float("nan")], dtype=torch.float64)
    y, mask = K.FakeQuant(x, 0.1, 0.0, quant_min=0, quant_max=255)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [False, True, True, False, False]
    assert y[:4].tolist() == [0.0, 0.0, 10.0, 25.5] and torch.isnan(y[4])
    dy = torch.arange(5, dtype=torch.float64) + 1
    assert K.FakeQuantGrad(dy, mask).tolist() == [0.0, 2.0, 3.0, 0.0, 0.0]


def test_errors():
    x = torch.randn(4)
    with pytest.raises(ValueError, match="scale"):
        K.FakeQuant(x, 0.0, 0.0)
    with pytest.raises(ValueError, match="one element"):
        K.FakeQuant(x, torch.ones(2), 0.0)
    with pytest.raises(ValueError, match="quant_min"):
        K.FakeQuant(x, 1.0, 0.0, quant_min=5, quant_max=1)
    with pytest.raises(TypeError, match="bool"):
        K.FakeQuantGrad(x, x)


def test_fake_quantize_module_matches_torch():
    from torch.ao.quantization import FakeQuantize

    tq = FakeQuantize(quant_min=0, quant_max=255)
    oq = onn.FakeQuantize(quant_min=0, quant_max=255)
    for step in range(3):
        x = torch.randn(64, 16) * (step + 1)
        xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        yt, yo = tq(xt), oq(xo)
        assert torch.equal(oq.scale, tq.scale) and torch.equal(oq.zero_point, tq.zero_point)
        ok = _not_tie(x, float(tq.scale))
        assert torch.equal(yo[ok], yt[ok])
        yt.sum().backward()
        yo.sum().backward()
        assert torch.equal(xo.grad[ok], xt.grad[ok])
    oq.disable_fake_quant()
    x = torch.randn(5)
    assert torch.equal(oq(x), x)
    assert set(oq.state_dict()) >= {"scale", "zero_point", "fake_quant_enabled",
                                    "observer_enabled"}


def test_qat_step_trains():
    """A tiny quantization-aware training loop: the loss goes down."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 1)
    fq = onn.FakeQuantize(quant_min=0, quant_max=255)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(256, 8)
    target = x @ torch.randn(8, 1)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((lin(fq(x)) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
