"""Batch normalization: registry ops (BatchNormInternal, BatchNormalization,
BatchNormalizationGrad), ops.batch_norm and nn.BatchNorm1d/2d/3d against torch, including
running statistics over several training steps and state_dict compatibility.

Tolerances (float32): outputs rtol 1e-5 / atol 1e-5 (channel statistics accumulated in
double; measured max 5e-7); gradients rtol 1e-4 / atol 1e-5 (dX is a difference of
channel sums); running statistics rtol 1e-5. float64: 1e-10.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch as ot
from ortcpu_torch import kernels as K

from .conftest import assert_close, assert_unchanged, both_store_kinds, snapshot

T32 = {"rtol": 1e-5, "atol": 1e-5}
G32 = {"rtol": 1e-4, "atol": 1e-5}
T64 = {"rtol": 1e-10, "atol": 1e-10}


def tl(dtype, grad=False):
    return T64 if dtype == torch.float64 else (G32 if grad else T32)


SHAPES = [(8, 3), (4, 5, 7), (2, 3, 4, 5), (2, 2, 3, 2, 3), (3, 70, 1), (16, 17, 1, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_batchnorm_internal_vs_torch(dtype, shape):
    c = shape[1]
    x = torch.randn(shape, dtype=dtype) * 2 + 3
    s, b = torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype)
    im, iv = torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5
    before = snapshot(x, s, b, im, iv)
    y, rm, rv, sm, sis = K.BatchNormInternal(x, s, b, im, iv, epsilon=1e-5, momentum=0.9)
    assert_unchanged(before, [x, s, b, im, iv])
    assert_close(y, F.batch_norm(x, None, None, s, b, True, 0.0, 1e-5), **tl(dtype))
    dims = [0] + list(range(2, len(shape)))
    mu = x.double().mean(dims)
    var = x.double().var(dims, unbiased=False)
    assert_close(sm, mu, **tl(dtype))
    assert_close(sis, (var + 1e-5).rsqrt(), **tl(dtype))
    # ORT's rule: momentum·input + (1-momentum)·batch, biased variance
    assert_close(rm, 0.9 * im.double() + 0.1 * mu, **tl(dtype))
    assert_close(rv, 0.9 * iv.double() + 0.1 * var, **tl(dtype))
    # inference mode: Y only, from the given statistics
    y_inf = K.BatchNormInternal(x, s, b, im, iv, training_mode=0)
    assert_close(y_inf, F.batch_norm(x, im, iv, s, b, False, 0.0, 1e-5), **tl(dtype))
    y_onnx = K.BatchNormalization(x, s, b, im, iv)
    assert_close(y_onnx, y_inf, rtol=0, atol=0)
    y_t, rm_t, rv_t = K.BatchNormalization(x, s, b, im, iv, training_mode=1)
    assert_close(y_t, y, rtol=0, atol=0)
    assert_close(rm_t, rm, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_batchnorm_grad_vs_torch(dtype, shape):
    c = shape[1]
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    s = torch.randn(c, dtype=dtype, requires_grad=True)
    b = torch.randn(c, dtype=dtype, requires_grad=True)
    dy = torch.randn(shape, dtype=dtype)
    F.batch_norm(x, None, None, s, b, True, 0.0, 1e-5).backward(dy)
    _, _, _, sm, sis = K.BatchNormInternal(x.detach(), s.detach(), b.detach(),
                                           torch.zeros(c, dtype=dtype),
                                           torch.ones(c, dtype=dtype))
    dx, ds, db = K.BatchNormalizationGrad(dy, x.detach(), s.detach(), sm, sis)
    assert_close(dx, x.grad, **tl(dtype, True))
    assert_close(ds, s.grad, **tl(dtype, True))
    assert_close(db, b.grad, **tl(dtype, True))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 5), (2, 3, 2, 3), (2, 2, 2, 2, 2)])
def test_ops_gradcheck_float64(training, shape):
    c = shape[1]
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(c, dtype=torch.float64, requires_grad=True)
    b = torch.randn(c, dtype=torch.float64, requires_grad=True)
    rm = torch.randn(c, dtype=torch.float64)
    rv = torch.rand(c, dtype=torch.float64) + 0.5
    if training:
        f = lambda x, w, b: ot.ops.batch_norm(x, None, None, w, b, True)  # noqa: E731
    else:
        f = lambda x, w, b: ot.ops.batch_norm(x, rm, rv, w, b, False)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradcheck(lambda x: ot.ops.batch_norm(x, rm.clone(), rv.clone(),
                                                                training=True), (x,))


@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (16, 6)), ("BatchNorm1d", (8, 6, 9)),
                                       ("BatchNorm2d", (4, 6, 5, 7)),
                                       ("BatchNorm3d", (2, 6, 3, 4, 5))])
@pytest.mark.parametrize("momentum", [0.1, None, 0.5])
def test_modules_running_stats_over_steps(cls, shape, momentum):
    ref = getattr(torch.nn, cls)(6, momentum=momentum)
    ours = getattr(ot.nn, cls)(6, momentum=momentum)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours.load_state_dict(ref.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    for _ in range(4):
        x = torch.randn(shape) * 2 + 1
        xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        dy = torch.randn(shape)
        yr, yo = ref(xr), ours(xo)
        assert_close(yo, yr, **T32)
        yr.backward(dy)
        yo.backward(dy)
        assert_close(xo.grad, xr.grad, **G32)
    assert_close(ours.weight.grad, ref.weight.grad, **G32)
    assert_close(ours.bias.grad, ref.bias.grad, **G32)
    assert_close(ours.running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
    assert_close(ours.running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 4
    ref.eval()
    ours.eval()
    x = torch.randn(shape, requires_grad=True)
    assert_close(ours(x), ref(x), **T32)
    g1, = torch.autograd.grad(ours(x).sum(), x)
    g2, = torch.autograd.grad(ref(x).sum(), x)
    assert_close(g1, g2, **G32)


def test_module_variants():
    # no affine, no running stats: batch statistics in eval too
    for kw in ({"affine": False}, {"track_running_stats": False}):
        ref = torch.nn.BatchNorm2d(3, **kw)
        ours = ot.nn.BatchNorm2d(3, **kw)
        assert list(ours.state_dict()) == list(ref.state_dict())
        x = torch.randn(2, 3, 4, 4)
        assert_close(ours(x), ref(x), **T32)
        ref.eval()
        ours.eval()
        assert_close(ours(x), ref(x), **T32)
    m = ot.nn.BatchNorm1d(4)
    assert isinstance(m, torch.nn.BatchNorm1d) and repr(m) == repr(torch.nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        m(torch.randn(2, 4, 3, 3))


def test_ort_convention_by_argument():
    """ORT's running-var rule (biased) through ops.batch_norm(unbiased_running_var=False)."""
    x = torch.randn(5, 3, 4)
    rm, rv = torch.zeros(3), torch.ones(3)
    ot.ops.batch_norm(x, rm, rv, training=True, momentum=0.1, unbiased_running_var=False)
    _, rm_o, rv_o, _, _ = K.BatchNormInternal(x, torch.ones(3), torch.zeros(3),
                                              torch.zeros(3), torch.ones(3), momentum=0.9)
    assert_close(rm, rm_o, **T32)
    assert_close(rv, rv_o, **T32)


def test_nan_channel_isolated_and_empty_spatial():
    x = torch.randn(4, 3, 5)
    x[1, 1, 2] = float("nan")
    y = ot.ops.batch_norm(x, None, None, training=True)
    assert y[:, 1].isnan().all() and not y[:, [0, 2]].isnan().any()
    z = torch.randn(0, 3, 4)
    assert ot.ops.batch_norm(z, torch.zeros(3), torch.ones(3)).shape == (0, 3, 4)


def test_non_contiguous():
    x = torch.randn(5, 6, 4).transpose(1, 2)  # (5, 4, 6), C = 4
    assert_close(ot.ops.batch_norm(x, None, None, training=True),
                 F.batch_norm(x, None, None, training=True), **T32)


def test_bad_input():
    x = torch.randn(4, 3, 2)
    with pytest.raises(ValueError, match=r"scale must have shape \(3,\)"):
        K.BatchNormInternal(x, torch.ones(4), torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="rank >= 2"):
        K.BatchNormalizationGrad(torch.ones(3), torch.ones(3), torch.ones(3), torch.ones(3),
                                 torch.ones(3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        ot.ops.batch_norm(torch.randn(1, 3), None, None, training=True)
    with pytest.raises(ValueError, match="running_mean must have shape"):
        ot.ops.batch_norm(x, torch.zeros(2), torch.ones(3), training=True)


@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_multi_chunk_reductions(nthreads):
    """Large enough that the per-chunk partial sums of several threads are combined."""
    ot.set_num_threads(nthreads)
    for shape in [(64, 8, 32, 32), (4096, 48)]:
        c = shape[1]
        x = torch.randn(shape, requires_grad=True)
        w = torch.randn(c, requires_grad=True)
        b = torch.randn(c, requires_grad=True)
        dy = torch.randn(shape)
        y = ot.ops.batch_norm(x, None, None, w, b, True)
        g = torch.autograd.grad(y, (x, w, b), dy)
        yr = F.batch_norm(x, None, None, w, b, True)
        gr = torch.autograd.grad(yr, (x, w, b), dy)
        assert_close(y, yr, **T32)
        for a, r in zip(g, gr, strict=True):
            assert_close(a, r, rtol=1e-4, atol=1e-4)
    # layer norm's dscale / dbias and cross entropy's totals are per-chunk sums too
    x = torch.randn(4096, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    b = torch.randn(64, requires_grad=True)
    dy = torch.randn(4096, 64)
    g = torch.autograd.grad(ot.ops.layer_norm(x, (64,), w, b), (x, w, b), dy)
    gr = torch.autograd.grad(F.layer_norm(x, (64,), w, b), (x, w, b), dy)
    for a, r in zip(g, gr, strict=True):
        assert_close(a, r, rtol=1e-4, atol=1e-4)
    t = torch.randint(0, 64, (4096,))
    assert_close(ot.ops.cross_entropy(x, t, label_smoothing=0.1),
                 F.cross_entropy(x, t, label_smoothing=0.1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(2, 3, 37), (2, 3, 1025), (3, 2, 41, 50), (7, 5), (3, 1500)])
def test_streaming_stores_same_bits(dtype, shape):
    # big working sets write y / dX with streaming stores; planes (and rows, for
    # [N, C]) of odd lengths start off a 64-byte line, and those over the 1024-element
    # staging chunk take several chunks: all must match ordinary stores bit for bit
    x = torch.randn(shape, dtype=dtype) * 2 + 1
    dy = torch.randn(shape, dtype=dtype)
    c = shape[1]
    w, b = torch.rand(c, dtype=dtype) + 0.5, torch.randn(c, dtype=dtype)
    rm, rv = torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5

    def run():
        y, mean, var, inv = K.batchnorm.bn_train_forward("t", x, w, b, 1e-5)
        ye = K.batchnorm.bn_eval_forward("t", x, w, b, rm, rv, 1e-5)
        grads = K.batchnorm.bn_backward("t", dy, x, w, mean, inv, training=True)
        grads_eval = K.batchnorm.bn_backward("t", dy, x, w, rm, rv, training=False)
        return (y, mean, var, inv, ye, *grads, *grads_eval)

    streamed, cached = both_store_kinds(run)
    for s, c_ in zip(streamed, cached, strict=True):
        assert torch.equal(s, c_)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", [1, 3, 5])
def test_odd_channel_counts(dtype, c):
    """Regression (found by ``make test-sanitize``): the per-channel double sums were
    placed after 3·c elements of T in one scratch block, misaligned for odd c in
    float32 (undefined behaviour; UBSan aborts there). Training forward and backward
    against torch autograd in float64."""
    x = torch.randn(4, c, 7, dtype=dtype)
    w, b = torch.rand(c, dtype=dtype) + 0.5, torch.randn(c, dtype=dtype)
    params = [t.clone().double().requires_grad_() for t in (x, w, b)]
    ref = F.batch_norm(params[0], None, None, params[1], params[2], training=True)
    dy = torch.randn_like(x)
    ref.backward(dy.double())
    xs = x.clone().requires_grad_()
    ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()
    y = ot.ops.batch_norm(xs, None, None, ws, bs, training=True)
    y.backward(dy)
    t = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    assert_close(y, ref.detach(), **t)
    for ours, r in ((xs, params[0]), (ws, params[1]), (bs, params[2])):
        assert_close(ours.grad, r.grad, **t)


@pytest.mark.parametrize("nthreads", [1, 2, 3])
@pytest.mark.parametrize("shape", [(300, 3, 4, 4), (8, 32, 4, 4), (64, 16, 8, 8), (5, 7, 3, 3),
                                   (512, 64, 4, 4), (3, 9, 37), (64, 8, 32, 32)])
def test_channel_wise_path_and_running_update(nthreads, shape):
    """The per-channel kernel path (planes of < 32 elements summed lane-wise, flushed in
    blocks; larger planes block-summed; channels split over threads) and the in-kernel
    running-statistics update, against torch in float64; (64, 8, 32, 32) is over the
    per-channel path's size limit (the plane-wise path)."""
    ot.set_num_threads(nthreads)
    try:
        c = shape[1]
        x = (torch.randn(shape) * 2 + 3).requires_grad_()
        w = (torch.rand(c) + 0.5).requires_grad_()
        b = torch.randn(c, requires_grad=True)
        rm, rv = torch.randn(c), torch.rand(c) + 0.5
        rm64, rv64 = rm.double(), rv.double()
        dy = torch.randn(shape)
        y = ot.ops.batch_norm(x, rm, rv, w, b, True, 0.1)
        g = torch.autograd.grad(y, (x, w, b), dy)
        p64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
        yr = F.batch_norm(p64[0], rm64, rv64, p64[1], p64[2], True, 0.1)
        gr = torch.autograd.grad(yr, p64, dy.double())
        assert_close(y.double(), yr, **T32)
        for a, r in zip(g, gr, strict=True):
            assert_close(a.double(), r, rtol=1e-4, atol=1e-4)
        assert_close(rm.double(), rm64, rtol=1e-6, atol=1e-6)
        assert_close(rv.double(), rv64, rtol=1e-6, atol=1e-6)
    finally:
        ot.set_num_threads(None)


def test_running_stats_of_another_dtype_update_in_python():
    """float64 running buffers with a float32 input: not the kernel's in-place update (it
    writes x's dtype), the Python one; same values as torch."""
    x = torch.randn(6, 4, 3, 3)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    ot.ops.batch_norm(x, rm, rv, training=True, momentum=0.3)
    rm_ref, rv_ref = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    F.batch_norm(x.double(), rm_ref, rv_ref, training=True, momentum=0.3)
    assert_close(rm, rm_ref, rtol=1e-6, atol=1e-6)
    assert_close(rv, rv_ref, rtol=1e-6, atol=1e-6)
