"""float64 training graphs on our executor, for the gradient ops onnxruntime-training
1.19.2 has no float64 kernel for (ReluGrad, GeluGrad, FastGeluGrad, ConvGrad,
SoftmaxGrad_13, LogSoftmaxGrad_13, BatchNormalizationGrad, SoftmaxCrossEntropyLossGrad,
LSTMGrad, GRUGrad, ...): every gradient vs torch autograd in float64, and a central
finite-difference check of the graph's own forward (a gradcheck that needs no torch
reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import helper as h

from .gradient_harness import F64, I64, build, make_model, rand, run_ours, torch_reference
from .test_gradient_ops import _onnx_gru, _onnx_lstm

N = h.make_node


def _case(name):
    """(nodes ending in 'y', inputs {name: array}, initializers, requires_grad, torch fn)."""
    r = lambda *s, scale=1.0: rand(*s, dtype=np.float64, scale=scale)  # noqa: E731
    if name == "relu_gelu":
        return ([N("Relu", ["x"], ["a"]), N("Gelu", ["a"], ["b"], domain="com.microsoft"),
                 N("FastGelu", ["b", "bias"], ["y"], domain="com.microsoft")],
                {"x": r(3, 4), "bias": r(4)}, {}, ["x", "bias"],
                lambda x, bias: F.gelu(F.gelu(torch.relu(x)) + bias, approximate="tanh"))
    if name == "softmax":
        return ([N("Softmax", ["x"], ["s"], axis=1), N("LogSoftmax", ["s"], ["y"], axis=-1)],
                {"x": r(2, 3, 4)}, {}, ["x"],
                lambda x: torch.log_softmax(torch.softmax(x, 1), -1))
    if name == "conv_bn_pool":
        return ([N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 1]),
                 N("BatchNormalization", ["c", "s", "t", "rm", "rv"], ["n", "m1", "v1"],
                   training_mode=1),
                 N("ReduceMean", ["n"], ["y"], axes=[2, 3])],
                {"x": r(2, 3, 6, 8), "w": r(4, 3, 3, 3, scale=0.5), "b": r(4), "s": r(4),
                 "t": r(4)}, {"rm": np.zeros(4), "rv": np.ones(4)}, ["x", "w", "b", "s", "t"],
                lambda x, w, b, s, t, **_: F.batch_norm(
                    F.conv2d(x, w, b, stride=(2, 1), padding=1), None, None, s, t,
                    training=True).mean((2, 3), keepdim=True))
    if name == "layer_norm_gemm":
        return ([N("LayerNormalization", ["x", "g", "b"], ["n"]),
                 N("Gemm", ["n", "w", "c"], ["y"], transB=1, alpha=0.5)],
                {"x": r(5, 6), "g": r(6), "b": r(6), "w": r(3, 6), "c": r(3)}, {},
                ["x", "g", "b", "w", "c"],
                lambda x, g, b, w, c: 0.5 * F.layer_norm(x, (6,), g, b) @ w.T + c)
    if name == "lstm":
        hidden = 3
        return ([N("LSTM", ["x", "w", "r", "b", "", "h0", "c0"], ["y"], hidden_size=hidden)],
                {"x": r(4, 2, 3), "w": r(1, 12, 3, scale=0.5), "r": r(1, 12, 3, scale=0.5),
                 "b": r(1, 24, scale=0.5), "h0": r(1, 2, 3), "c0": r(1, 2, 3)}, {},
                ["x", "w", "r", "b", "h0", "c0"], lambda **kw: _onnx_lstm(**kw)[0])
    if name == "gru":
        return ([N("GRU", ["x", "w", "r", "b", "", "h0"], ["y"], hidden_size=3,
                   linear_before_reset=1)],
                {"x": r(4, 2, 3), "w": r(1, 9, 3, scale=0.5), "r": r(1, 9, 3, scale=0.5),
                 "b": r(1, 18, scale=0.5), "h0": r(1, 2, 3)}, {},
                ["x", "w", "r", "b", "h0"], lambda **kw: _onnx_gru(**kw, lbr=1)[0])
    if name == "embedding_ce":
        return ([N("Gather", ["emb", "tok"], ["e"]),
                 N("SoftmaxCrossEntropyLoss", ["e", "lab", "cw"], ["y"], ignore_index=1)],
                {"emb": r(6, 4), "cw": np.abs(r(4)) + 0.1,
                 "tok": np.asarray([0, 5, 5, 2, 3], np.int64),
                 "lab": np.asarray([1, 0, 3, 2, 2], np.int64)}, {}, ["emb"],
                lambda emb, cw, tok, lab: F.cross_entropy(emb[tok], lab, weight=cw,
                                                          ignore_index=1))
    raise KeyError(name)


CASES = ["relu_gelu", "softmax", "conv_bn_pool", "layer_norm_gemm", "lstm", "gru",
         "embedding_ce"]


def _model(nodes, feeds, init, out_shape):
    nodes = list(nodes) + [N("Mul", ["y", "upstream"], ["wy"]),
                           N("ReduceSum", ["wy"], ["loss"], keepdims=0)]
    inputs = [(k, F64 if v.dtype == np.float64 else I64, list(v.shape))
              for k, v in feeds.items()]
    return make_model(nodes, inputs + [("upstream", F64, out_shape)], [("loss", F64, [])],
                      init)


@pytest.mark.parametrize("name", CASES)
def test_float64_on_our_executor(name):
    nodes, feeds, init, params, fn = _case(name)
    out_shape = list(fn(**{k: torch.from_numpy(v) for k, v in {**feeds, **init}.items()}).shape)
    upstream = rand(*out_shape, dtype=np.float64)
    model = _model(nodes, feeds, init, out_shape)
    training = build(model, params)
    feeds = {**feeds, "upstream": upstream}
    got = run_ours(training, feeds)

    def loss_fn(upstream, **kw):
        return (fn(**kw) * upstream).sum()

    want = torch_reference(loss_fn, {**feeds, **init}, params)
    # LayerNormalization-17 stashes Mean/InvStdDev in float32 (stash_type 1), as ORT does
    tol = 1e-6 if name == "layer_norm_gemm" else 1e-9
    for p in params:
        np.testing.assert_allclose(got[f"{p}_grad"], want[f"{p}_grad"], rtol=tol, atol=tol,
                                   err_msg=p)
    _finite_differences(model, training, feeds, params, got)


def _finite_differences(model, training, feeds, params, got, eps=1e-6, probes=6):
    """Central differences of the forward model's loss along random directions agree
    with the directional derivative from the graph's gradients."""
    rng = np.random.default_rng(0)
    for _ in range(probes):
        dirs = {p: rng.standard_normal(feeds[p].shape) for p in params}
        plus = {**feeds, **{p: feeds[p] + eps * d for p, d in dirs.items()}}
        minus = {**feeds, **{p: feeds[p] - eps * d for p, d in dirs.items()}}
        numeric = (run_ours(model, plus)["loss"] - run_ours(model, minus)["loss"]) / (2 * eps)
        analytic = sum(float((got[f"{p}_grad"] * d).sum()) for p, d in dirs.items())
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (numeric, analytic)
