"""Softmax cross-entropy: ops.cross_entropy / nn.CrossEntropyLoss against torch (weights,
ignore_index, every reduction, label smoothing, N-D inputs, probability targets) and the
registry ops (SoftmaxCrossEntropyLoss(+Grad, +Internal, +InternalGrad), SoftmaxCrossEntropy
(+Grad), SparseSoftmaxCrossEntropy(+Grad)) against their documented math, computed with
torch. Cases where ORT 1.19.2 is buggy (spec §19) are marked below; conformance for the
rest is in tests/conformance/test_norm_loss_conformance.py.

Tolerances: float32 rtol 1e-5 / atol 1e-6 for losses of logits ~ randn·3 (ours sums in
double; measured < 3e-7), gradients rtol 1e-5 / atol 5e-7 (the label's entry is
g·(p - 1), which cancels to ~ulp(1)·|g| absolute for p near 1, in torch as in ours; with
dY ~ randn that reached 2.3e-7); float64 1e-10.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch as ot
from ortcpu_torch import kernels as K

from .conftest import assert_close, assert_unchanged, snapshot

L32 = {"rtol": 1e-5, "atol": 1e-6}
G32 = {"rtol": 1e-5, "atol": 5e-7}
T64 = {"rtol": 1e-10, "atol": 1e-12}


def tl(dtype, grad=False):
    return T64 if dtype == torch.float64 else (G32 if grad else L32)


def _case(shape, dtype, ignore=-100, frac_ignored=0.2):
    x = (torch.randn(shape, dtype=dtype) * 3).requires_grad_()
    c = shape[1]
    sshape = (shape[0], *shape[2:])
    t = torch.randint(0, c, sshape)
    t[torch.rand(sshape) < frac_ignored] = ignore
    return x, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("shape", [(7, 5), (4, 3, 6), (3, 4, 2, 5), (16, 70)])
def test_cross_entropy_vs_torch(dtype, reduction, weighted, smoothing, shape):
    x, t = _case(shape, dtype)
    w = torch.rand(shape[1], dtype=dtype) + 0.1 if weighted else None
    kw = dict(weight=w, reduction=reduction, label_smoothing=smoothing)
    ours = ot.ops.cross_entropy(x, t, **kw)
    ref = F.cross_entropy(x, t, **kw)
    assert_close(ours, ref, **tl(dtype))
    dy = torch.randn_like(ref)
    g_ours, = torch.autograd.grad(ours, x, dy)
    g_ref, = torch.autograd.grad(ref, x, dy)
    assert_close(g_ours, g_ref, **tl(dtype, True))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_gradcheck(reduction, smoothing):
    x, t = _case((5, 4, 3), torch.float64, ignore=2)
    w = torch.rand(4, dtype=torch.float64) + 0.5
    f = lambda x: ot.ops.cross_entropy(x, t, w, ignore_index=2, reduction=reduction,  # noqa: E731
                                       label_smoothing=smoothing)
    assert torch.autograd.gradcheck(f, (x,))


@pytest.mark.parametrize("shape", [(6, 5), (5,)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_gradcheck_reentrant(shape, reduction, weighted, smoothing):
    """Contiguous-class (2-D / 1-D) inputs take the fused forward+gradient pass for a
    scalar loss: a second backward must repeat it bit for bit, so gradcheck's default
    nondet_tol=0 reentrancy check passes (it failed with "Backward is not reentrant")."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    c = shape[-1]
    t = torch.randint(0, c, shape[:-1], generator=gen)
    if t.dim():
        t[1] = -100
    w = torch.rand(c, generator=gen, dtype=torch.float64) + 0.5 if weighted else None
    kw = dict(weight=w, reduction=reduction, label_smoothing=smoothing)
    assert torch.autograd.gradcheck(lambda x: ot.ops.cross_entropy(x, t, **kw), (x,))
    p = torch.softmax(torch.randn(*shape, generator=gen, dtype=torch.float64), -1)
    assert torch.autograd.gradcheck(lambda x: ot.ops.cross_entropy(x, p, **kw), (x,))


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
@pytest.mark.parametrize("weighted", [False, True])
def test_probability_targets(smoothing, weighted):
    x = torch.randn(6, 5, 3, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(torch.randn(6, 5, 3, dtype=torch.float64), 1)
    w = torch.rand(5, dtype=torch.float64) if weighted else None
    for red in ("mean", "sum", "none"):
        ours = ot.ops.cross_entropy(x, p, w, reduction=red, label_smoothing=smoothing)
        ref = F.cross_entropy(x, p, w, reduction=red, label_smoothing=smoothing)
        assert_close(ours, ref, **T64)
    assert torch.autograd.gradcheck(
        lambda x: ot.ops.cross_entropy(x, p, w, label_smoothing=smoothing), (x,))


def test_unbatched_and_int32_targets():
    x = torch.randn(7, requires_grad=True)
    t = torch.tensor(3)
    assert_close(ot.ops.cross_entropy(x, t), F.cross_entropy(x, t), **L32)
    assert_close(ot.ops.cross_entropy(x, t, reduction="none"),
                 F.cross_entropy(x, t, reduction="none"), **L32)
    x2 = torch.randn(5, 9)
    t2 = torch.randint(0, 9, (5,), dtype=torch.int32)
    assert_close(ot.ops.cross_entropy(x2, t2), F.cross_entropy(x2, t2.long()), **L32)


def test_all_ignored_mean():
    """torch: NaN (0/0); ops follows torch. The ORT registry op returns 0 (spec §20.8)."""
    x = torch.randn(4, 3, requires_grad=True)
    t = torch.full((4,), -100)
    ours = ot.ops.cross_entropy(x, t)
    assert ours.isnan() and F.cross_entropy(x, t).isnan()
    assert_close(ot.ops.cross_entropy(x, t, reduction="sum"), torch.tensor(0.0), **L32)
    loss, _ = K.SoftmaxCrossEntropyLoss(x.detach(), t, ignore_index=-100)
    assert float(loss) == 0.0
    lp = torch.log_softmax(x.detach(), 1)
    d = K.SoftmaxCrossEntropyLossGrad(torch.tensor(1.0), lp, t, ignore_index=-100)
    assert torch.equal(d, torch.zeros(4, 3))


def test_out_of_range_labels_raise():
    x = torch.randn(4, 5)
    for bad in (5, -3, 100):
        t = torch.tensor([0, 1, bad, 2])
        before = snapshot(x, t)
        with pytest.raises(ValueError, match=rf"label {bad} at index \(2,\)"):
            ot.ops.cross_entropy(x, t)
        with pytest.raises(ValueError, match=rf"label {bad} at index"):
            K.SoftmaxCrossEntropyLoss(x, t)
        with pytest.raises(ValueError, match=rf"label {bad}"):
            K.SoftmaxCrossEntropyLossGrad(torch.tensor(1.0), x, t)
        with pytest.raises(ValueError, match=rf"label {bad}"):
            K.SparseSoftmaxCrossEntropy(x, t)
        assert_unchanged(before, [x, t])
    # ORT default ignore_index is -1, torch's -100: each is accepted by its own API
    t = torch.tensor([0, -1, 1, 2])
    K.SoftmaxCrossEntropyLoss(x, t)
    with pytest.raises(ValueError, match="label -1"):
        ot.ops.cross_entropy(x, t)


def test_native_label_check():
    """The native kernel checks labels itself (the Python check is bypassed here)."""
    from ortcpu_torch._native import KernelError
    from ortcpu_torch.kernels import loss as L

    x = torch.randn(3, 4)
    with pytest.raises(KernelError, match="INDEX_OUT_OF_RANGE.*label 9"):
        L.sce_forward("t", x, torch.tensor([0, 9, 1]), ignore_index=-1)
    with pytest.raises(KernelError, match="label -5"):
        L.sce_backward("t", x, torch.tensor([0, -5, 1]), ignore_index=-1)


def _lp(x, dim):
    return torch.log_softmax(x, dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_softmax_cross_entropy_loss_registry(dtype, reduction):
    x, t = _case((6, 5, 4), dtype, ignore=-1)
    x = x.detach()
    w = torch.rand(5, dtype=dtype) + 0.1
    loss, lp = K.SoftmaxCrossEntropyLoss(x, t, w, reduction=reduction)
    ref = F.cross_entropy(x, t, w, ignore_index=-1, reduction=reduction)
    assert_close(loss, ref, **tl(dtype))
    assert_close(lp, _lp(x, 1), **tl(dtype))
    dy = torch.randn_like(ref)
    xr = x.clone().requires_grad_()
    g_ref, = torch.autograd.grad(F.cross_entropy(xr, t, w, ignore_index=-1,
                                                 reduction=reduction), xr, dy)
    d = K.SoftmaxCrossEntropyLossGrad(dy, lp, t.int(), w, reduction=reduction)
    assert_close(d, g_ref, **tl(dtype, True))
    # Internal variants: ignore_index as a tensor input, bias added to the gradient
    loss2, lp2 = K.SoftmaxCrossEntropyLossInternal(x, t, w, torch.tensor(-1),
                                                   reduction=reduction)
    assert_close(loss2, ref, **tl(dtype))
    bias = torch.randn_like(x)
    d2 = K.SoftmaxCrossEntropyLossInternalGrad(dy, lp, t, w, torch.tensor(-1), bias,
                                               reduction=reduction)
    assert_close(d2, g_ref + bias, **tl(dtype, True))


def test_internal_output_type():
    x, t = _case((5, 4), torch.float32, ignore=-1)
    loss, lp = K.SoftmaxCrossEntropyLossInternal(x.detach(), t, output_type=11)
    assert loss.dtype == torch.float64 and lp.dtype == torch.float64
    assert_close(loss, F.cross_entropy(x.detach().double(), t, ignore_index=-1), **T64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_dense_softmax_cross_entropy(dtype, reduction):
    """reduction "none" is ORT-buggy (a scalar +Σ): ours returns the per-row loss,
    checked against torch's probability-target cross entropy."""
    x = torch.randn(3, 4, 7, dtype=dtype)
    lab = torch.softmax(torch.randn(3, 4, 7, dtype=dtype), -1)
    y, lp = K.SoftmaxCrossEntropy(x, lab, reduction=reduction)
    ref = F.cross_entropy(x.view(-1, 7), lab.view(-1, 7), reduction=reduction)
    assert_close(y, ref.view(3, 4) if reduction == "none" else ref, **tl(dtype))
    xr = x.clone().requires_grad_()
    r = F.cross_entropy(xr.view(-1, 7), lab.view(-1, 7), reduction=reduction)
    dy = torch.randn_like(r)
    g, = torch.autograd.grad(r, xr, dy)
    d = K.SoftmaxCrossEntropyGrad(dy.view(3, 4) if reduction == "none" else dy, lp, lab,
                                  reduction=reduction)
    assert_close(d, g, **tl(dtype, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_softmax_cross_entropy(dtype, reduction, weighted):
    """Per-sample weights; "none" returns per-sample losses (ORT 1.19.2 returns the sum);
    int32 labels work (ORT crashes)."""
    x = torch.randn(2, 5, 6, dtype=dtype)
    lab = torch.randint(0, 6, (2, 5))
    sw = torch.rand(2, 5, dtype=dtype) if weighted else None
    y, lp = K.SparseSoftmaxCrossEntropy(x, lab.int(), sw, reduction=reduction)
    nll = -_lp(x, -1).gather(-1, lab.unsqueeze(-1)).squeeze(-1)
    w = sw if weighted else torch.ones(2, 5, dtype=dtype)
    per = nll * w
    ref = {"none": per, "sum": per.sum(), "mean": per.sum() / w.sum()}[reduction]
    assert_close(y, ref, **tl(dtype))
    xr = x.clone().requires_grad_()
    per_r = -_lp(xr, -1).gather(-1, lab.unsqueeze(-1)).squeeze(-1) * w
    r = {"none": per_r, "sum": per_r.sum(), "mean": per_r.sum() / w.sum()}[reduction]
    dy = torch.randn_like(r)
    g, = torch.autograd.grad(r, xr, dy)
    d = K.SparseSoftmaxCrossEntropyGrad(dy, lp, lab, sw, reduction=reduction)
    assert_close(d, g, **tl(dtype, True))


def test_nan_row_does_not_spread_and_big_logits():
    x = torch.randn(4, 10)
    x[1, 2] = float("nan")
    t = torch.randint(0, 10, (4,))
    per = ot.ops.cross_entropy(x, t, reduction="none")
    assert per[1].isnan() and not per[[0, 2, 3]].isnan().any()
    # the forward shifts by the row's first logit and falls back to the max when another
    # logit exceeds it by > 60: both paths, and a -inf first logit
    big = torch.tensor([[1e4, 0.0, -1e4], [88.0, 89.0, 90.0], [-1e4, 0.0, 50.0],
                        [-float("inf"), 1.0, 2.0], [0.0, 59.0, 61.0]])
    tb = torch.tensor([1, 0, 2, 1, 1])
    assert_close(ot.ops.cross_entropy(big, tb, reduction="none"),
                 F.cross_entropy(big, tb, reduction="none"), **L32)


@pytest.mark.parametrize("c", [1, 7, 10, 31, 32, 33, 63, 1000, 1030])
def test_row_lengths_around_the_vector_lanes(c):
    """Rows shorter than the 32 accumulation lanes take a single vector loop, longer ones
    the lanes plus that loop for their tail: losses and the fused gradient match a float64
    evaluation for every split, with a NaN in the tail, a large logit beyond the first
    one by more than 60, and a -inf first logit."""
    g = torch.Generator().manual_seed(c)
    x = torch.randn(5, c, generator=g) * 3
    t = torch.randint(0, c, (5,), generator=g)
    x[1, c - 1] = float("nan")
    x[2, c - 1] += 70.0
    if c > 1:
        x[3, 0] = -float("inf")
    xr = x.clone().requires_grad_()
    loss = ot.ops.cross_entropy(xr, t, reduction="none")
    x64 = x.double().requires_grad_()
    ref = F.cross_entropy(x64, t, reduction="none")
    assert loss[1].isnan() and not loss[[0, 2, 3, 4]].isnan().any()
    keep = [0, 2, 3, 4]
    assert_close(loss[keep], ref[keep].float(), **L32)
    xs = x[keep].clone().requires_grad_()
    ot.ops.cross_entropy(xs, t[keep]).backward()
    x64s = x[keep].double().requires_grad_()
    F.cross_entropy(x64s, t[keep]).backward()
    assert_close(xs.grad, x64s.grad.float(), **G32)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_gradient_written_by_forward(weighted, smoothing):
    """With a scalar loss the forward writes the gradient (dy = 1) in its pass; the
    backward returns it (scaled by dy), a second backward (retain_graph) reruns that pass
    on the saved logits (bit-identical), a non-finite dy recomputes too (ignored rows stay 0). All
    agree with torch, including rows that take the max-shift fallback and NaN rows."""
    x = torch.randn(40, 77) * 3
    x[3, 5] = 70.0  # exceeds the row's first logit by > 60: max-shift fallback
    x[7, 0] = -float("inf")
    x = x.requires_grad_()
    t = torch.randint(0, 77, (40,))
    t[::6] = -100
    w = torch.rand(77) + 0.1 if weighted else None
    for red in ("mean", "sum"):
        kw = dict(weight=w, reduction=red, label_smoothing=smoothing)
        ours = ot.ops.cross_entropy(x, t, **kw)
        ref = F.cross_entropy(x, t, **kw)
        assert_close(ours, ref, **L32)
        g_ref, = torch.autograd.grad(ref, x, retain_graph=True)
        g1, = torch.autograd.grad(ours, x, retain_graph=True)
        g2, = torch.autograd.grad(ours, x, retain_graph=True)
        assert_close(g1, g_ref, **G32)
        assert torch.equal(g1, g2)  # reentrant: the second backward repeats the first
        g5, = torch.autograd.grad(ours, x, torch.tensor(0.75), retain_graph=True)
        g6, = torch.autograd.grad(ours, x, torch.tensor(0.75), retain_graph=True)
        assert torch.equal(g5, g6) and torch.equal(g5, g1 * 0.75)
        ours = ot.ops.cross_entropy(x, t, **kw)
        g3, = torch.autograd.grad(ours, x, torch.tensor(-2.5))
        assert_close(g3, -2.5 * g_ref, **G32)
        ours = ot.ops.cross_entropy(x, t, **kw)
        g4, = torch.autograd.grad(ours, x, torch.tensor(float("nan")))
        assert g4[::6].eq(0).all() and g4[1].isnan().all()
    # NaN in one row: that row's gradient is NaN, the others are torch's
    xn = x.detach().clone()
    xn[2, 9] = float("nan")
    xn.requires_grad_()
    gn, = torch.autograd.grad(ot.ops.cross_entropy(xn, t, w), xn)
    gr, = torch.autograd.grad(F.cross_entropy(xn, t, w), xn)
    assert gn[2].isnan().all()
    keep = torch.ones(40, dtype=torch.bool)
    keep[2] = False
    assert_close(gn[keep], gr[keep], **G32)
    # probability targets and N-D inputs go through the same fused forward
    xd = torch.randn(6, 5, 4, requires_grad=True)
    p = torch.softmax(torch.randn(6, 5, 4), 1)
    assert_close(torch.autograd.grad(ot.ops.cross_entropy(xd, p, label_smoothing=smoothing),
                                     xd)[0],
                 torch.autograd.grad(F.cross_entropy(xd, p, label_smoothing=smoothing),
                                     xd)[0], **G32)


@pytest.mark.parametrize("c", [1, 2, 7, 8, 9, 15, 16, 17, 33, 64, 65, 70])
def test_odd_class_counts(c):
    x, t = _case((9, c), torch.float32)
    ours = ot.ops.cross_entropy(x, t, label_smoothing=0.1)
    ref = F.cross_entropy(x, t, label_smoothing=0.1)
    assert_close(ours, ref, **L32)
    assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0], **G32)


def test_large_vocab_rows():
    """50000-long log-sum-exp rows: the truth is float64 (ours 3e-8 relative on the loss,
    2.5e-8 absolute on the gradient, measured), not torch's float32 result."""
    x = torch.randn(3, 50000, requires_grad=True)
    t = torch.tensor([0, 49999, 123])
    ours = ot.ops.cross_entropy(x, t)
    x64 = x.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, t)
    assert_close(ours, ref, rtol=3e-7, atol=0)
    assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x64)[0],
                 rtol=1e-5, atol=1e-7)


def test_empty_and_noncontiguous():
    x = torch.randn(0, 4, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    assert ot.ops.cross_entropy(x, t, reduction="sum") == 0
    assert ot.ops.cross_entropy(x, t, reduction="none").shape == (0,)
    xn = torch.randn(6, 5).t()
    tn = torch.randint(0, 6, (5,))
    assert_close(ot.ops.cross_entropy(xn, tn), F.cross_entropy(xn, tn), **L32)


def test_bad_arguments():
    x = torch.randn(4, 5)
    t = torch.randint(0, 5, (4,))
    with pytest.raises(ValueError, match="reduction"):
        ot.ops.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        ot.ops.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="weight must have shape"):
        ot.ops.cross_entropy(x, t, torch.ones(4))
    with pytest.raises(ValueError, match="target must have shape"):
        ot.ops.cross_entropy(x, t[:3])
    with pytest.raises(TypeError, match="int64 or int32"):
        K.SoftmaxCrossEntropyLoss(x, t.float())
    with pytest.raises(ValueError, match="dY must be a scalar"):
        K.SoftmaxCrossEntropyLossGrad(torch.ones(4), x, t)


def test_nn_cross_entropy_loss():
    w = torch.rand(5)
    ref = torch.nn.CrossEntropyLoss(weight=w, ignore_index=1, reduction="sum",
                                    label_smoothing=0.05)
    ours = ot.nn.CrossEntropyLoss(weight=w, ignore_index=1, reduction="sum",
                                  label_smoothing=0.05)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert ours.ignore_index == 1 and ours.label_smoothing == 0.05
    x = torch.randn(8, 5)
    t = torch.randint(0, 5, (8,))
    assert_close(ours(x, t), ref(x, t), **L32)
    assert ot.nn.CrossEntropyLoss().ignore_index == -100
