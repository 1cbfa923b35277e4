"""Optimizer and gradient-control kernels (spec §10.2, §10.3, §12, §13) against ONNX
Runtime 1.19.2: AdamWOptimizer (both modes, with and without bias correction,
update_signal), SGDOptimizerV2, SGDOptimizer, AdamOptimizer, InplaceClipGradNorm,
ReduceAllL2, Scale, InPlaceAccumulator, InPlaceAccumulatorV2, ZeroGradient -- every one
that runs there, in float32 (ORT's only dtype for them), including the spec's test
vectors. IsAllFinite and MixedPrecisionScale have no CPU kernel in ORT (spec §19): they
are checked against torch in tests/test_optim_kernels.py.

Sequence inputs that ORT updates in place (optimizers, InplaceClipGradNorm) are compared
after the call too (``compare_inputs``); ORT's Python API does not alias plain tensor
feeds, so for single-tensor ops only the outputs are compared (ours writes in place).

Tolerances: rtol 1e-5 / atol 1e-6 except where noted. Our Adam family rounds like torch
(ε added after dividing by sqrt(1-β₂ᵗ)), ORT multiplies the bias corrections in another
order: measured differences are a few float32 ulp (max 6e-8 absolute on weights of
order 1).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from .ort_harness import check_op  # noqa: E402

SEEDS = range(6)

# w - lr*g: ORT rounds the product, ours fuses the multiply-add (as torch's SGD does, so
# that ortcpu_torch.optim.SGD is bit-for-bit torch's): results differ by at most ~1 ulp
SGD_TOL = {"rtol": 2.5e-7, "atol": 1e-7}


def _rng(seed):
    return np.random.default_rng(1000 + seed)


def _f(r, *shape, scale=1.0):
    return (scale * r.standard_normal(shape)).astype(np.float32)


def _group(r, n_tensors=None):
    n = n_tensors or int(r.integers(1, 5))
    shapes = [tuple(int(d) for d in r.integers(1, 9, size=int(r.integers(1, 4))))
              for _ in range(n)]
    w = [_f(r, *s) for s in shapes]
    g = [_f(r, *s) for s in shapes]
    m = [_f(r, *s, scale=0.1) for s in shapes]
    v = [np.abs(_f(r, *s, scale=0.01)) for s in shapes]
    return w, g, m, v


W0 = [-0.18330415, 0.6739549, 0.3117089, 0.42830977, -0.39579117, 0.07424858]
G0 = [-0.18660535, 1.0501877, -0.06538727, 0.78924006, -0.06989894, 0.08311288]


def test_adamw_spec_vector():
    w = np.array(W0, np.float32).reshape(2, 3)
    g = np.array(G0, np.float32).reshape(2, 3)
    z = np.zeros((2, 3), np.float32)
    res = check_op("AdamWOptimizer", [np.float32(1e-3), np.int64(1), [w], [g], [z], [z.copy()]],
                   {"weight_decay": 1e-2}, num_outputs=4, compare_inputs=(2, 4, 5))
    exp_w = [-0.18230231, 0.6729482, 0.31270576, 0.4273055, -0.39478722, 0.073247835]
    np.testing.assert_allclose(res.ours[1][0].ravel(), exp_w, rtol=0, atol=3e-8)
    assert res.ort[0].dtype == np.bool_ and res.ort[0].item()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode,cb", [(0, 1), (1, 1), (1, 0)])
def test_adamw(seed, mode, cb):
    r = _rng(seed)
    w, g, m, v = _group(r)
    attrs = {"adam_mode": mode, "correct_bias": cb}
    if seed % 2:
        attrs.update(alpha=0.85, beta=0.99, epsilon=1e-6, weight_decay=float(r.uniform(0, 0.2)))
    step = np.int64(r.integers(1, 50))
    signal = None if seed % 3 else np.array(True)
    check_op("AdamWOptimizer", [np.float32(r.uniform(1e-4, 1e-1)), step, w, g, m, v, signal],
             attrs, num_outputs=4, compare_inputs=(2, 4, 5), rtol=1e-5, atol=1e-6)


def test_adamw_update_signal_false():
    r = _rng(0)
    w, g, m, v = _group(r, 2)
    res = check_op("AdamWOptimizer", [np.float32(1e-2), np.int64(3), w, g, m, v,
                                      np.array(False)], num_outputs=4, compare_inputs=(2, 4, 5))
    assert not res.ours[0].item()
    for a, b in zip(res.ours_inputs[2], w, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_sgdv2(seed):
    r = _rng(seed)
    w, g, _, _ = _group(r)
    signal = [None, np.array(True), np.array(False)][seed % 3]
    check_op("SGDOptimizerV2", [np.float32(r.uniform(1e-3, 1)), w, g, signal], num_outputs=2,
             compare_inputs=(1,), **SGD_TOL)


def test_sgdv2_spec_vector():
    w = np.array([-0.18330414593219757, 0.6739549040794373, 0.31170889735221863,
                  0.42830976843833923, -0.3957911729812622, 0.07424858212471008],
                 np.float32).reshape(2, 3)
    g = np.array([0.23206964135169983, 0.48894181847572327, 0.7008894681930542,
                  1.0418732166290283, -0.6794909238815308, -1.15215265750885],
                 np.float32).reshape(2, 3)
    res = check_op("SGDOptimizerV2", [np.float32(1e-3), [w], [g]], num_outputs=2,
                   compare_inputs=(1,), **SGD_TOL)
    exp = [-0.18353621661663055, 0.6734659671783447, 0.3110080063343048, 0.4272679090499878,
           -0.39511168003082275, 0.07540073245763779]
    np.testing.assert_array_equal(res.ours[1][0].ravel(), np.array(exp, np.float32))


@pytest.mark.parametrize("seed", SEEDS)
def test_sgd_legacy(seed):
    r = _rng(seed)
    shape = tuple(int(d) for d in r.integers(1, 9, size=2))
    needs = [(True, True), (True, False), (False, True)][seed % 3]
    check_op("SGDOptimizer", [np.float32(r.uniform(1e-3, 1)), _f(r, *shape), _f(r, *shape)],
             needs=needs, **SGD_TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_adam_legacy(seed):
    r = _rng(seed)
    shape = tuple(int(d) for d in r.integers(1, 9, size=2))
    t = [0, 1, 7][seed % 3]
    attrs = {} if seed % 2 else {"lambda": 0.05, "alpha": 0.8, "beta": 0.99, "epsilon": 1e-6}
    if seed == 5:
        attrs["do_bias_correction"] = 0
    check_op("AdamOptimizer", [np.float32(r.uniform(1e-3, 1e-1)), np.int64(t), _f(r, *shape),
                               _f(r, *shape), _f(r, *shape, scale=0.1),
                               np.abs(_f(r, *shape, scale=0.01))],
             attrs, needs=(True,) * 5 + (False,), rtol=1e-5, atol=1e-6)


def test_clip_grad_norm_spec_vectors():
    def grads():
        return [np.array([1, 2, 3], np.float32), np.array([4, 5, 6, 7], np.float32),
                np.array([8, 9, 10, 11, 12], np.float32)]
    for max_norm in (12.0, 100.0):
        check_op("InplaceClipGradNorm", [grads()], {"max_norm": max_norm},
                 compare_inputs=(0,))


@pytest.mark.parametrize("seed", SEEDS)
def test_clip_grad_norm(seed):
    r = _rng(seed)
    _, g, _, _ = _group(r)
    attrs = {} if seed % 2 else {"max_norm": float(r.uniform(0.1, 20))}
    if seed == 4:
        g[0].flat[0] = np.inf  # coef 0: inf * 0 = NaN there, zeros elsewhere
    check_op("InplaceClipGradNorm", [g], attrs, compare_inputs=(0,))


@pytest.mark.parametrize("seed", SEEDS)
def test_reduce_all_l2(seed):
    r = _rng(seed)
    _, g, _, _ = _group(r)
    check_op("ReduceAllL2", g, output_dtypes=[np.float32])
    if seed == 0:
        check_op("ReduceAllL2", [np.array([3], np.float32), np.array([[4]], np.float32)],
                 output_dtypes=[np.float32], rtol=0, atol=0)


@pytest.mark.parametrize("scale_dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale_down", [0, 1])
def test_scale(x_dtype, scale_dtype, scale_down):
    r = _rng(0)
    x = r.standard_normal((5, 7)).astype(x_dtype)
    s = np.array([[3]], scale_dtype) if scale_dtype in (np.int64, np.int32) else \
        np.array(7.0 / 3, scale_dtype)
    check_op("Scale", [x, s], {"scale_down": scale_down}, rtol=0, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_inplace_accumulator(seed):
    r = _rng(seed)
    buf = _f(r, 4, 6)
    value = [_f(r, 4, 6), _f(r, 6), _f(r, 1, 6), _f(r, 4, 1)][seed % 4]
    signal = [None, np.array(True), np.array(False)][seed % 3]
    check_op("InPlaceAccumulator", [buf, value, signal], rtol=0, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_inplace_accumulator_v2(seed):
    r = _rng(seed)
    buf = _f(r, 3, 5)
    # same shape only: with a broadcasting value ORT 1.19.2 returns a tensor of *value's*
    # shape holding the first elements of the buffer plus value (buffer [3,5] + value [5]
    # -> shape [5], buffer[0,:] + value); ours broadcasts into the buffer as the spec says
    value = _f(r, 3, 5)
    flag = [None, np.array(True), np.array(False)][seed % 3]
    check_op("InPlaceAccumulatorV2", [buf, value, flag], num_outputs=2, rtol=0, atol=0)


def test_zero_gradient():
    r = _rng(0)
    check_op("ZeroGradient", [_f(r, 4, 5), np.array(1, np.int64)], rtol=0, atol=0)
