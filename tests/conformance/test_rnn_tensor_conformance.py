"""RNN, tensor-manipulation and fake-quantization ops (spec §8, §9, §10.1, §14) against
ONNX Runtime 1.19.2, within ORT's restrictions: RNN ops forward direction only, float32,
no sequence lengths; LSTMGrad without peepholes (ORT ignores them); SliceGrad with
positive steps; SplitTraining in float32; FakeQuant in float32.

Tolerances: the RNN ops chain S steps of GEMMs and MLAS sigmoid/tanh approximations, so
outputs are compared at rtol 1e-4 / atol 1e-5 (measured worst ~3e-6 on these sizes);
the gathers, slices, splits and concats move data and must match exactly; reductions
and scatter-adds are sums in a different order (rtol 1e-5 / atol 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from .ort_harness import check_op  # noqa: E402

RNN_TOL = {"rtol": 1e-4, "atol": 1e-5}


def _rng(seed):
    return np.random.default_rng(seed)


def _f(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- LSTM ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_bias,with_init", [(True, True), (False, False), (True, False)])
def test_lstm_training_and_grad(seed, with_bias, with_init):
    rng = _rng(seed)
    S, B, n_in, H = [int(v) for v in rng.integers(1, 6, 4)]
    x = _f(rng, S, B, n_in)
    w = _f(rng, 1, 4 * H, n_in, scale=0.5)
    r = _f(rng, 1, 4 * H, H, scale=0.5)
    b = _f(rng, 1, 8 * H, scale=0.5) if with_bias else None
    h0 = _f(rng, 1, B, H) if with_init else None
    c0 = _f(rng, 1, B, H) if with_init else None
    attrs = {"hidden_size": H}
    res = check_op("LSTMTraining", [x, w, r, b, None, h0, c0], attrs, num_outputs=5, **RNN_TOL)
    hall, _, _, call, iofc = res.ort
    dhall = _f(rng, S, 1, B, H)
    dhf = _f(rng, 1, B, H)
    dcf = _f(rng, 1, B, H)
    check_op("LSTMGrad", [x, w, r, None, h0, c0, hall, call, iofc, dhall, dhf, dcf], attrs,
             num_outputs=7, **RNN_TOL)
    # upstream gradients partly absent
    check_op("LSTMGrad", [x, w, r, None, h0, c0, hall, call, iofc, dhall, None, None], attrs,
             num_outputs=7, **RNN_TOL)


def test_lstm_peepholes_forward():
    rng = _rng(7)
    S, B, n_in, H = 4, 3, 5, 6
    x, w, r = _f(rng, S, B, n_in), _f(rng, 1, 4 * H, n_in, scale=.5), _f(rng, 1, 4 * H, H, scale=.5)
    p = _f(rng, 1, 3 * H, scale=0.5)
    check_op("LSTMTraining", [x, w, r, None, None, None, None, p], {"hidden_size": H},
             num_outputs=5, **RNN_TOL)


# ---- GRU -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("with_bias,with_init", [(True, True), (False, False)])
def test_gru_training_and_grad(seed, lbr, with_bias, with_init):
    rng = _rng(100 + seed)
    S, B, n_in, H = [int(v) for v in rng.integers(1, 6, 4)]
    x = _f(rng, S, B, n_in)
    w = _f(rng, 1, 3 * H, n_in, scale=0.5)
    r = _f(rng, 1, 3 * H, H, scale=0.5)
    b = _f(rng, 1, 6 * H, scale=0.5) if with_bias else None
    h0 = _f(rng, 1, B, H) if with_init else None
    attrs = {"hidden_size": H, "linear_before_reset": lbr}
    res = check_op("GRUTraining", [x, w, r, b, None, h0], attrs, num_outputs=3, **RNN_TOL)
    hall, _, zrh = res.ort
    dhall = _f(rng, S, 1, B, H)
    dhf = _f(rng, 1, B, H)
    check_op("GRUGrad", [x, w, r, b, None, h0, hall, zrh, dhall, dhf], attrs, num_outputs=5,
             **RNN_TOL)


# ---- gathers ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_and_grad(seed, dtype):
    rng = _rng(200 + seed)
    rank = int(rng.integers(1, 4))
    shape = [int(v) for v in rng.integers(1, 7, rank)]
    axis = int(rng.integers(-rank, rank))
    dim = shape[axis]
    ishape = [int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3)))]
    idx = rng.integers(-dim, dim, size=ishape)
    data = rng.standard_normal(shape).astype(dtype)
    res = check_op("Gather", [data, idx], {"axis": axis}, rtol=0, atol=0)
    dy = rng.standard_normal(res.ort[0].shape).astype(dtype)
    check_op("GatherGrad", [np.array(shape, np.int64), idx, dy], {"axis": axis})
    check_op("GatherGrad", [np.array(shape, np.int64), idx.astype(np.int32), dy],
             {"axis": axis})


@pytest.mark.parametrize("seed", range(6))
def test_gather_elements_and_grad(seed):
    rng = _rng(300 + seed)
    rank = int(rng.integers(1, 4))
    shape = [int(v) for v in rng.integers(1, 6, rank)]
    axis = int(rng.integers(-rank, rank))
    ishape = [int(rng.integers(1, s + 1)) for s in shape]
    ishape[axis] = int(rng.integers(1, 7))
    dim = shape[axis]
    idx = rng.integers(-dim, dim, size=ishape).astype(np.int64)
    data = _f(rng, *shape)
    check_op("GatherElements", [data, idx], {"axis": axis}, rtol=0, atol=0)
    dy = _f(rng, *ishape)
    check_op("GatherElementsGrad", [dy, np.array(shape, np.int64), idx], {"axis": axis})


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_and_grad(seed, batch_dims):
    rng = _rng(400 + seed)
    rank = int(rng.integers(batch_dims + 1, 4))
    shape = [int(v) for v in rng.integers(1, 5, rank)]
    k = int(rng.integers(1, rank - batch_dims + 1))
    q = [int(v) for v in rng.integers(1, 4, int(rng.integers(0, 2)))]
    ishape = shape[:batch_dims] + q + [k]
    idx = np.stack([rng.integers(-shape[batch_dims + j], shape[batch_dims + j],
                                 size=ishape[:-1]) for j in range(k)], -1).astype(np.int64)
    data = _f(rng, *shape)
    res = check_op("GatherND", [data, idx], {"batch_dims": batch_dims}, rtol=0, atol=0)
    upd = _f(rng, *res.ort[0].shape)
    check_op("GatherNDGrad", [np.array(shape, np.int64), idx, upd], {"batch_dims": batch_dims})


# ---- slices, splits, concats ----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_slice_and_grad(seed):
    rng = _rng(500 + seed)
    rank = int(rng.integers(1, 4))
    shape = [int(v) for v in rng.integers(1, 8, rank)]
    naxes = int(rng.integers(1, rank + 1))
    axes = [int(a) for a in rng.permutation(rank)[:naxes]]
    starts = [int(rng.integers(-shape[a] - 2, shape[a] + 2)) for a in axes]
    ends = [int(rng.integers(-shape[a] - 2, shape[a] + 2)) for a in axes]
    steps = [int(rng.choice([1, 2, 3, -1, -2])) for _ in axes]
    data = _f(rng, *shape)
    args = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
    res = check_op("Slice", [data, *args], rtol=0, atol=0)
    dy = _f(rng, *res.ort[0].shape)
    if all(s > 0 for s in steps):  # ORT 1.19.2's SliceGrad fails on negative steps (§9.4)
        check_op("SliceGrad", [dy, np.array(shape, np.int64), *args], rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(6))
def test_split_concat_training(seed):
    rng = _rng(600 + seed)
    rank = int(rng.integers(1, 4))
    shape = [int(v) for v in rng.integers(1, 7, rank)]
    axis = int(rng.integers(-rank, rank))
    parts = [int(v) for v in rng.integers(0, 4, int(rng.integers(1, 4)))]
    parts[0] += 1
    inputs = []
    for p in parts:
        s = list(shape)
        s[axis] = p
        inputs.append(_f(rng, *s))
    res = check_op("ConcatTraining", inputs, {"axis": axis}, num_outputs=2, rtol=0, atol=0)
    check_op("Concat", inputs, {"axis": axis}, rtol=0, atol=0)
    check_op("SplitTraining", [res.ort[0], np.array(parts, np.int64)], {"axis": axis},
             num_outputs=len(parts), rtol=0, atol=0)
    total = res.ort[0].shape[axis]
    n = [d for d in (1, 2, 3) if total % d == 0][-1]
    check_op("SplitTraining", [res.ort[0], np.zeros(0, np.int64)], {"axis": axis},
             num_outputs=n, ours_kwargs={"num_outputs": n}, rtol=0, atol=0)
    check_op("Split", [res.ort[0], np.array(parts, np.int64)], {"axis": axis},
             num_outputs=len(parts), rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_reduce_sum_training(seed, dtype):
    rng = _rng(700 + seed)
    rank = int(rng.integers(1, 4))
    shape = [int(v) for v in rng.integers(1, 7, rank)]
    data = (rng.standard_normal(shape) * 10).astype(dtype)
    nax = int(rng.integers(0, rank + 1))
    axes = np.array([int(a) - rank * int(rng.integers(0, 2)) for a in
                     rng.permutation(rank)[:nax]], np.int64)
    for keep in (0, 1):
        for noop in (0, 1):
            check_op("ReduceSumTraining", [data, axes],
                     {"keepdims": keep, "noop_with_empty_axes": noop})


@pytest.mark.parametrize("a,b", [([2, 3, 4], [4]), ([2, 1, 4], [1, 3, 1]), ([3], [1, 3]),
                                 ([1], [5, 1]), ([5, 1, 3], [5, 1, 3]), ([], [2, 2]),
                                 ([7, 1], [1])])
def test_broadcast_gradient_args(a, b):
    check_op("BroadcastGradientArgs", [np.array(a, np.int64), np.array(b, np.int64)],
             num_outputs=2)


# ---- FakeQuant ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_fake_quant_and_grad(seed):
    rng = _rng(800 + seed)
    x = _f(rng, int(rng.integers(1, 70)), 3, scale=3.0)
    x[0, 0] = 0.5 * 0.1   # exact ties around the rounding points
    x[0, 1] = 2.5 * 0.125
    scale = np.float32(rng.choice([0.1, 0.125, 0.03]))
    zp = np.float32(rng.integers(-5, 10))
    qmin, qmax = sorted(int(v) for v in rng.integers(-128, 256, 2))
    res = check_op("FakeQuant", [x, scale, zp], {"quant_min": qmin, "quant_max": qmax},
                   num_outputs=2, rtol=0, atol=0)
    dy = _f(rng, *x.shape)
    check_op("FakeQuantGrad", [dy, res.ort[1]], rtol=0, atol=0)
