"""Optimizer and gradient-control kernels (registry level): spec test vectors, float64
references, multi-tensor walking (odd sizes, empties, chunk boundaries), threads, in-place
semantics and bad input. Conformance against ORT is in conformance/."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ortcpu_torch import kernels as K
from ortcpu_torch import set_num_threads
from ortcpu_torch.kernels.grad_control import norm_multi
from ortcpu_torch.kernels.optim import ADAM_TORCH, adam_multi, sgd_multi

from .conftest import DTYPES, assert_close, assert_unchanged, snapshot

ODD = [0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 70]

# spec §12.4 (adamw_test.cc)
W0 = [-0.18330415, 0.6739549, 0.3117089, 0.42830977, -0.39579117, 0.07424858]
G0 = [-0.18660535, 1.0501877, -0.06538727, 0.78924006, -0.06989894, 0.08311288]


def _f32(x):
    return float(np.float32(x))


def _ref_adamw(w, g, m, v, lr, b1, b2, eps, wd, t, mode, correct_bias=True):
    """The spec's formulas in float64, with ORT's float32 bias corrections
    (pow of the float32 betas, rounded to float32)."""
    w, g, m, v = (x.double() for x in (w, g, m, v))
    bc1 = _f32(1 - _f32(b1) ** t) if correct_bias else 1.0
    bc2 = _f32(1 - _f32(b2) ** t) if correct_bias else 1.0
    if mode == 0:
        w = w - w * lr * wd
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    if mode == 0:
        w = w - (lr * m) / (bc1 * ((v / bc2).sqrt() + eps))
    else:
        w = w - lr * math.sqrt(bc2) / bc1 * m / (v.sqrt() + eps)
        w = w - lr * wd * w
    return w, m, v


def test_adamw_spec_vector():
    w = torch.tensor(W0).reshape(2, 3)
    g = torch.tensor(G0).reshape(2, 3)
    m1, m2 = torch.zeros(2, 3), torch.zeros(2, 3)
    flag, ws, ms, vs = K.AdamWOptimizer(torch.tensor(1e-3), torch.tensor(1), [w], [g], [m1],
                                        [m2], weight_decay=1e-2)
    assert flag.dtype == torch.bool and flag.item() and flag.shape == ()
    assert ws[0] is w and ms[0] is m1 and vs[0] is m2  # in place
    exp_w = [-0.18230231, 0.6729482, 0.31270576, 0.4273055, -0.39478722, 0.073247835]
    exp_m = [-0.018660536, 0.10501877, -0.0065387273, 0.07892401, -0.0069898935, 0.008311288]
    exp_v = [3.48216e-05, 0.0011028942, 4.2755e-06, 0.0006228999, 4.8859e-06, 6.9078e-06]
    assert_close(w.flatten(), torch.tensor(exp_w), rtol=0, atol=3e-8)
    assert_close(m1.flatten(), torch.tensor(exp_m), rtol=1e-6, atol=0)
    assert_close(m2.flatten(), torch.tensor(exp_v), rtol=1e-4, atol=0)  # spec prints 5 digits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,cb", [(0, 1), (1, 1), (1, 0)])
def test_adamw_vs_float64_reference(dtype, mode, cb):
    sizes = ODD + [40000, 5]  # > one native chunk
    ws = [torch.randn(n, dtype=dtype) for n in sizes]
    gs = [torch.randn(n, dtype=dtype) for n in sizes]
    ms = [0.1 * torch.randn(n, dtype=dtype) for n in sizes]
    vs = [torch.rand(n, dtype=dtype) for n in sizes]
    ref = [_ref_adamw(w, g, m, v, _f32(1e-2), 0.9, 0.999, 1e-8, 0.1, 7, mode, bool(cb))
           for w, g, m, v in zip(ws, gs, ms, vs, strict=True)]
    K.AdamWOptimizer(torch.tensor(1e-2, dtype=torch.float32), torch.tensor(7), ws, gs, ms, vs,
                     weight_decay=0.1, adam_mode=mode, correct_bias=cb)
    # float32: hyper-parameters and corrections are float32-rounded as in ORT
    tol = dict(rtol=2e-6, atol=2e-7) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-14)
    for (rw, rm, rv), w, m, v in zip(ref, ws, ms, vs, strict=True):
        assert_close(w, rw, **tol)
        assert_close(m, rm, **tol)
        assert_close(v, rv, **tol)


def test_adamw_update_signal_false_and_step0():
    w, g = torch.randn(5), torch.randn(5)
    m, v = torch.zeros(5), torch.zeros(5)
    before = snapshot(w, m, v)
    flag, *_ = K.AdamWOptimizer(torch.tensor(1e-3), torch.tensor(3), [w], [g], [m], [v],
                                torch.tensor(False))
    assert not flag.item()
    assert_unchanged(before, [w, m, v])
    K.AdamWOptimizer(torch.tensor(1e-3), torch.tensor(0), [w], [g], [m], [v])
    assert torch.isnan(w).all()  # step 0 with bias correction divides by zero (as ORT)


def test_adamw_bad_input():
    w, g, m, v = (torch.randn(4) for _ in range(4))
    lr, t = torch.tensor(1e-3), torch.tensor(1)
    before = snapshot(w, m, v)
    with pytest.raises(ValueError, match="correct_bias"):
        K.AdamWOptimizer(lr, t, [w], [g], [m], [v], adam_mode=0, correct_bias=0)
    with pytest.raises(ValueError, match="adam_mode"):
        K.AdamWOptimizer(lr, t, [w], [g], [m], [v], adam_mode=2)
    with pytest.raises(ValueError, match="gradients\\[0\\]"):
        K.AdamWOptimizer(lr, t, [w], [torch.randn(5)], [m], [v])
    with pytest.raises(ValueError, match="momentums_1 must have 1"):
        K.AdamWOptimizer(lr, t, [w], [g], [m, m], [v])
    with pytest.raises(ValueError, match="must not be empty"):
        K.AdamWOptimizer(lr, t, [], [], [], [])
    with pytest.raises(TypeError, match="float32 or float64"):
        K.AdamWOptimizer(lr, t, [w.half()], [g.half()], [m.half()], [v.half()])
    with pytest.raises(TypeError, match="step"):
        K.AdamWOptimizer(lr, torch.tensor(1.0), [w], [g], [m], [v])
    with pytest.raises(ValueError, match="contiguous"):
        K.AdamWOptimizer(lr, t, [torch.randn(4, 4).t()], [torch.randn(4, 4)],
                         [torch.zeros(4, 4)], [torch.zeros(4, 4)])
    with pytest.raises(ValueError, match="shares memory"):
        K.AdamWOptimizer(lr, t, [w], [g], [w], [v])
    assert_unchanged(before, [w, m, v])


def test_sgdv2_spec_vector_and_signal():
    w = torch.tensor([-0.18330414593219757, 0.6739549040794373, 0.31170889735221863,
                      0.42830976843833923, -0.3957911729812622, 0.07424858212471008]).reshape(2, 3)
    g = torch.tensor([0.23206964135169983, 0.48894181847572327, 0.7008894681930542,
                      1.0418732166290283, -0.6794909238815308, -1.15215265750885]).reshape(2, 3)
    exp = torch.tensor([-0.18353621661663055, 0.6734659671783447, 0.3110080063343048,
                        0.4272679090499878, -0.39511168003082275, 0.07540073245763779])
    before = w.clone()
    flag, (w2,) = K.SGDOptimizerV2(torch.tensor(1e-3), [w], [g], torch.tensor(False))
    assert not flag.item() and torch.equal(w, before)
    flag, (w2,) = K.SGDOptimizerV2(torch.tensor(1e-3), [w], [g])
    assert flag.item() and w2 is w
    assert torch.equal(w.flatten(), exp)  # exact, as ORT


@pytest.mark.parametrize("dtype", DTYPES)
def test_sgd_legacy(dtype):
    w, g = torch.randn(3, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype)
    w0, g0 = w.clone(), g.clone()
    nw, ng = K.SGDOptimizer(torch.tensor(0.5), w, g)
    assert nw is w and ng is g
    assert_close(nw, w0 - 0.5 * g0, rtol=0, atol=0)
    assert_close(ng, -0.5 * g0, rtol=0, atol=0)
    w, g = w0.clone(), g0.clone()
    nw, ng = K.SGDOptimizer(torch.tensor(0.5), w, g, needs=(True, False))
    assert ng is None and torch.equal(g, g0)


@pytest.mark.parametrize("t", [0, 1, 4])
def test_adam_legacy(t):
    w, g = torch.randn(33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)
    m, v = 0.1 * torch.randn(33, dtype=torch.float64), torch.rand(33, dtype=torch.float64)
    a, b, lam, eps, r = 0.9, 0.999, 0.1, 1e-8, _f32(0.01)  # R is a float32 tensor
    m_ref = a * m + (1 - a) * g
    v_ref = b * v + (1 - b) * g * g
    ac = _f32(1 - _f32(a) ** t) if t > 0 else 1.0
    bc = _f32(1 - _f32(b) ** t) if t > 0 else 1.0
    upd = (m_ref / ac) / ((v_ref / bc).sqrt() + eps) + lam * w
    w_ref, d_ref = w - r * upd, -r * upd
    new_t, m2, v2, w2, g2, mp = K.AdamOptimizer(torch.tensor(r), torch.tensor(t), w, g, m, v,
                                                lambda_=lam)
    assert new_t.item() == t + 1 and new_t.dtype == torch.int64 and mp is None
    assert w2 is w and g2 is g and m2 is m and v2 is v
    for x, y in ((w, w_ref), (g, d_ref), (m, m_ref), (v, v_ref)):
        assert_close(x, y, rtol=1e-12, atol=1e-14)


# ---- gradient control ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_all_l2(dtype):
    assert K.ReduceAllL2(torch.tensor([3.0], dtype=dtype), torch.tensor([[4.0]], dtype=dtype)
                         ).item() == 5.0
    xs = [torch.randn(n, dtype=dtype) for n in ODD + [70001]]
    ref = torch.cat([x.double() for x in xs]).norm()
    out = K.ReduceAllL2(*xs)
    assert out.dtype == dtype and out.shape == ()
    assert_close(out.double(), ref, rtol=1e-7 if dtype == torch.float32 else 1e-14, atol=0)
    assert K.ReduceAllL2(torch.empty(0, dtype=dtype)).item() == 0.0
    assert math.isnan(K.ReduceAllL2(torch.tensor([1.0, math.nan], dtype=dtype)).item())
    assert math.isinf(K.ReduceAllL2(torch.tensor([1.0, math.inf], dtype=dtype)).item())


def test_norm_multi_p_and_threads():
    xs = [torch.randn(n) for n in ODD + [100003, 3]]
    flat = torch.cat(xs).double()
    set_num_threads(1)
    one = [norm_multi(xs, p) for p in (1.0, 2.0, 3.0, math.inf)]
    set_num_threads(2)
    two = [norm_multi(xs, p) for p in (1.0, 2.0, 3.0, math.inf)]
    ref = [flat.abs().sum().item(), (flat ** 2).sum().item(), (flat.abs() ** 3).sum().item(),
           flat.abs().max().item()]
    for a, b, r in zip(one, two, ref, strict=True):
        assert a == pytest.approx(r, rel=1e-12) and b == pytest.approx(r, rel=1e-12)
    xs[3][0] = math.nan
    assert math.isnan(norm_multi(xs, math.inf)) and math.isnan(norm_multi(xs, 2.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale(dtype):
    x = torch.randn(7, 9, dtype=dtype)
    before = snapshot(x)
    y = K.Scale(x, torch.tensor(3.0, dtype=torch.float64), scale_down=1)
    assert_unchanged(before, [x])
    f = float(np.float32(1.0) / np.float32(3.0))  # float32 reciprocal, as ORT
    assert torch.equal(y, x * torch.tensor(f, dtype=dtype))
    y = K.Scale(torch.tensor([7.0], dtype=torch.float64), torch.tensor(0.1, dtype=torch.float64))
    assert y.item() == 7.0 * float(np.float32(0.1))
    y = K.Scale(x, torch.tensor([[2]], dtype=torch.int64))
    assert torch.equal(y, x * 2)
    with pytest.raises(ValueError, match="non-zero"):
        K.Scale(x, torch.tensor(0.0))
    with pytest.raises(ValueError, match="one element"):
        K.Scale(x, torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="scale"):
        K.Scale(x, torch.tensor(True))
    nc = torch.randn(6, 4, dtype=dtype).t()
    assert torch.equal(K.Scale(nc, torch.tensor(2.0)), nc * 2)


def test_inplace_clip_grad_norm_spec():
    def grads():
        return [torch.tensor([1.0, 2, 3]), torch.tensor([4.0, 5, 6, 7]),
                torch.tensor([8.0, 9, 10, 11, 12])]
    gs = grads()
    out = K.InplaceClipGradNorm(gs, max_norm=12.0)
    assert all(o is g for o, g in zip(out, gs, strict=True))
    exp = [[0.4707, 0.9414, 1.4120], [1.8827, 2.3534, 2.8241, 3.2948],
           [3.7654, 4.2361, 4.7068, 5.1775, 5.6481]]
    for g, e in zip(gs, exp, strict=True):
        assert_close(g, torch.tensor(e), rtol=0, atol=6e-5)
    gs = grads()
    K.InplaceClipGradNorm(gs, max_norm=100.0)
    assert all(torch.equal(a, b) for a, b in zip(gs, grads(), strict=True))
    gs = [torch.tensor([1.0, math.inf, 0.0])]
    K.InplaceClipGradNorm(gs)
    assert gs[0][0] == 0 and math.isnan(gs[0][1]) and gs[0][2] == 0
    with pytest.raises(ValueError, match="fro"):
        K.InplaceClipGradNorm(grads(), norm_type="inf")


@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulators_and_zero(dtype):
    buf = torch.randn(4, 5, dtype=dtype)
    b0 = buf.clone()
    v = torch.randn(5, dtype=dtype)
    assert K.InPlaceAccumulator(buf, v) is buf
    assert torch.equal(buf, b0 + v)
    K.InPlaceAccumulator(buf, v, torch.tensor(False))
    assert torch.equal(buf, b0 + v)
    flag, out = K.InPlaceAccumulatorV2(buf, v, torch.tensor(True))
    assert flag.shape == (1,) and flag.item() and out is buf
    assert torch.equal(buf, v.expand(4, 5))
    full = torch.randn(4, 5, dtype=dtype)
    K.InPlaceAccumulatorV2(buf, full, torch.tensor(False))
    assert torch.equal(buf, v.expand(4, 5) + full)
    with pytest.raises(ValueError, match="broadcast"):
        K.InPlaceAccumulator(buf, torch.randn(3, dtype=dtype))
    with pytest.raises(TypeError, match="value must be float32 or float64"):
        K.InPlaceAccumulator(buf, torch.randn(5, dtype=torch.float16))  # ORT misreads fp16
    other = torch.float64 if dtype == torch.float32 else torch.float32
    with pytest.raises(TypeError, match="dtype of the buffer"):
        K.InPlaceAccumulator(buf, torch.randn(5, dtype=other))
    z = K.ZeroGradient(buf, torch.tensor(1))
    assert z is buf and torch.count_nonzero(buf) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_is_all_finite(dtype):
    xs = [torch.randn(n, dtype=dtype) for n in ODD]
    assert K.IsAllFinite(*xs).item() is True
    for bad in (math.inf, math.nan):
        ys = [x.clone() for x in xs]
        ys[9][5] = bad
        assert K.IsAllFinite(*ys).item() is False
        is_inf = math.isinf(bad)
        assert K.IsAllFinite(*ys, isinf_only=1).item() is (not is_inf)
        assert K.IsAllFinite(*ys, isnan_only=1).item() is is_inf
    big = torch.randn(200001, dtype=dtype)
    big[-1] = -math.inf
    assert K.IsAllFinite(big).item() is False


def test_mixed_precision_scale():
    xs = [torch.randn(3, 4), torch.randn(7)]
    s = torch.tensor(0.5)
    ys = K.MixedPrecisionScale(s, *xs, to=10)
    assert [y.dtype for y in ys] == [torch.float16] * 2
    for x, y in zip(xs, ys, strict=True):
        assert torch.equal(y, (x * 0.5).half())
    fused = K.MixedPrecisionScale(s, *xs, to=16, fuse_outputs=1)
    assert fused.shape == (19,) and fused.dtype == torch.bfloat16
    y = K.MixedPrecisionScale(s, xs[0].half(), to=1)
    assert y.dtype == torch.float32 and torch.equal(y, xs[0].half().float() * 0.5)
    with pytest.raises(ValueError, match="to must be"):
        K.MixedPrecisionScale(s, *xs, to=7)


# ---- multi-tensor entry points ----------------------------------------------------------


def test_adam_multi_threads_bitwise_and_layout():
    """Elementwise updates do not depend on how the group is split over threads, and a
    group mixing empties, tiny and chunk-crossing tensors updates every element once."""
    sizes = [0, 1, 40000, 0, 17, 70000, 3, 0]
    base = [[torch.randn(n) for n in sizes] for _ in range(4)]
    results = []
    for nt in (1, 2):
        set_num_threads(nt)
        w, g, m, v = ([t.clone() for t in grp] for grp in base)
        v = [x.abs() for x in v]
        adam_multi(w, g, m, v, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
                   bc1=0.5, bc2=0.3, mode=ADAM_TORCH)
        results.append(w)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
    # per tensor == the group walk
    set_num_threads(2)
    w, g, m, v = ([t.clone() for t in grp] for grp in base)
    v = [x.abs() for x in v]
    for i in range(len(sizes)):
        adam_multi([w[i]], [g[i]], [m[i]], [v[i]], lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
                   weight_decay=0.1, bc1=0.5, bc2=0.3, mode=ADAM_TORCH)
    for a, b in zip(results[0], w, strict=True):
        assert torch.equal(a, b)


def test_sgd_multi_momentum_init_flags():
    w = [torch.randn(5), torch.randn(6)]
    g = [torch.randn(5), torch.randn(6)]
    buf = [torch.full((5,), 7.0), torch.full((6,), 2.0)]
    w0 = [x.clone() for x in w]
    sgd_multi(w, g, buf, init=[True, False], lr=0.1, momentum=0.9)
    assert torch.equal(buf[0], g[0])
    assert torch.equal(buf[1], torch.addcmul(2.0 * torch.full((6,), 0.9), g[1], torch.ones(6)))
    assert_close(w[0], w0[0] - 0.1 * g[0], rtol=1e-7, atol=1e-7)
