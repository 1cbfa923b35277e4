"""Helpers of the gradient-builder tests: build small ONNX models, build their training
graph, check it with onnx.checker (full check), run it in onnxruntime-training 1.19.2's
InferenceSession (and our executor when there is one) and compare every gradient with
torch autograd."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ortcpu_torch.graph import build_gradient_graph
from ortcpu_torch.graph.loading import _checkable

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(3)

F32, F64, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64
NP = {F32: np.float32, F64: np.float64, I64: np.int64}


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    """``inputs``/``outputs``: (name, elem_type, shape) triples; ``initializers``:
    name -> numpy array."""
    if isinstance(initializers, dict):
        initializers = [numpy_helper.from_array(np.asarray(v), k)
                        for k, v in initializers.items()]
    graph = helper.make_graph(
        nodes, "forward",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def check(model: onnx.ModelProto) -> None:
    """onnx.checker's full check (with strict shape inference); ORT's training ops of the
    ONNX domain that onnx has no schema for (MaxPoolGrad, AveragePoolGrad) are moved to a
    domain the checker leaves alone, as the executor's loader does."""
    onnx.checker.check_model(_checkable(model), full_check=True)


def ort_session(model: onnx.ModelProto, optimize: bool = False):
    """An InferenceSession with ORT's graph optimizations off (the graph runs as built),
    or all on (``optimize``: ORT's default)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def run_ort(model: onnx.ModelProto, feeds: dict, optimize: bool = False) -> dict:
    sess = ort_session(model, optimize)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


def run_ours(model: onnx.ModelProto, feeds: dict) -> dict:
    """Run ``model`` on our executor (numpy in, numpy out)."""
    from ortcpu_torch.graph import Executor

    out = Executor(model).run({k: torch.from_numpy(np.asarray(v).copy())
                               for k, v in feeds.items()})
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def build(model, requires_grad, loss="loss", **kw) -> onnx.ModelProto:
    """The training graph, full-checked."""
    training = build_gradient_graph(model, requires_grad, loss, **kw)
    check(training)
    return training


def torch_reference(fn, tensors: dict, requires_grad, dtype=torch.float64):
    """Loss and gradients of ``fn(**tensors)`` in ``dtype`` (float tensors cast, others
    as given)."""
    ts = {}
    for k, v in tensors.items():
        t = torch.from_numpy(np.asarray(v).copy())
        if t.is_floating_point():
            t = t.to(dtype).requires_grad_(k in requires_grad)
        ts[k] = t
    loss = fn(**ts)
    grads = torch.autograd.grad(loss, [ts[k] for k in requires_grad], allow_unused=True)
    out = {"loss": loss.detach().numpy()}
    for k, g in zip(requires_grad, grads, strict=True):
        out[f"{k}_grad"] = np.zeros_like(tensors[k]) if g is None else g.numpy()
    return out


def assert_close(got: dict, want: dict, atol: float, rtol: float = 1e-4, keys=None) -> None:
    for k in keys or want:
        np.testing.assert_allclose(np.asarray(got[k], dtype=np.float64),
                                   np.asarray(want[k], dtype=np.float64),
                                   atol=atol, rtol=rtol, err_msg=k)


def check_against_torch(model, fn, feeds: dict, requires_grad, *, atol=1e-5, rtol=1e-4,
                        init: dict | None = None, loss="loss", ours=True, **kw) -> dict:
    """Build the training graph of ``model``, run it in ORT and on our executor, and
    compare the loss and every ``<name>_grad`` with torch autograd in float64 (and ours
    with ORT). ``init``: initializer values (also passed to ``fn``). Returns ORT's
    outputs."""
    training = build(model, requires_grad, loss, **kw)
    got = run_ort(training, feeds)
    want = torch_reference(fn, {**feeds, **(init or {})}, requires_grad)
    keys = ["loss"] + [f"{p}_grad" for p in requires_grad]
    assert_close(got, want, atol, rtol, keys=keys)
    if ours:
        mine = run_ours(training, feeds)
        assert_close(mine, want, atol, rtol, keys=keys)
        assert_close(mine, got, atol, rtol, keys=keys)
    return got


def rand(*shape, dtype=np.float32, scale=1.0):
    return np.asarray(np.random.randn(*shape) * scale, dtype=dtype)
