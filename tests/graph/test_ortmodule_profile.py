"""A torch.profiler trace of one ORTModule training step (forward + backward) holds no aten
compute kernel beyond the documented glue:

- memory and views: allocation (empty*, zeros, ones_like: the autograd seed), views and
  reshapes, ``copy_``/``clone``/``contiguous``/``_to_copy`` (buffer write-back, the old value
  of a mutated buffer kept for the backward, layout fixes), ``fill_``/``zero_``;
- dropout masks drawn from torch's generator (``bernoulli_``, ``div_``), so
  ``torch.manual_seed`` reproduces a run;
- the kernels' index and label checks (``aminmax``, comparisons, ``any``, ``item``) and
  index arithmetic (``arange``/``where``/``mul``/``add`` on int64 offsets: batched MatMul's
  batch offsets, negative-index wrapping);
- the ONNX long tail the executor runs on torch (``ops_torch.py``: Add, Mul, Where,
  ReduceSum, ...), allowed only for op types the step's plans actually bind to torch
  (``Plan.counts()``), and small per-channel arithmetic inside registry kernels (running
  statistics: ``mul``/``add``).

Everything that is a model layer (GEMMs, convolutions, norms, softmax, activations, pooling,
RNNs, embedding, losses) must run on our kernels: no ``aten::mm``, ``aten::convolution``,
``aten::native_layer_norm``, ``aten::gelu``, ... in the trace. (These tests run in the
graph conftest's single-kernel Conv mode; in the default "auto" mode a ConvGrad whose
measured choice found torch's ``aten::convolution_backward`` faster runs that instead:
graph/ops_training.py.)
"""

from __future__ import annotations

import pytest
from torch.profiler import ProfilerActivity, profile

from ortcpu_torch import ORTModule

from .capture_models import NAMES, make

GLUE = {
    # memory, views, copies
    "empty", "empty_like", "empty_strided", "new_empty_strided", "zeros", "zero_", "fill_",
    "ones_like", "as_strided", "view", "view_as", "_reshape_alias", "_unsafe_view", "reshape",
    "expand", "permute", "select", "slice", "narrow", "unsqueeze", "squeeze", "transpose", "t",
    "detach", "detach_", "alias", "lift_fresh", "contiguous", "clone", "copy_", "resize_",
    "resolve_conj", "resolve_neg", "to", "_to_copy", "unbind", "split", "split_with_sizes",
    "chunk", "cat", "stack",
    # buffer write-back after the forward (ORTModule._Entry.write_buffers)
    "_foreach_copy_",
    # dropout masks from torch's generator
    "bernoulli_", "div_",
    # index / label checks in the kernels
    "aminmax", "any", "ne", "eq", "lt", "le", "gt", "ge", "__or__", "bitwise_or",
    "logical_not", "is_nonzero", "item", "_local_scalar_dense", "arange", "where",
    # per-channel arithmetic inside registry kernels (BatchNorm running statistics)
    "mul", "add",
}
# ONNX op types of ``kind == "torch"`` plan nodes -> the aten ops they may run
LONG_TAIL = {
    "Add": {"add", "add_"}, "Sub": {"sub", "sub_"}, "Mul": {"mul", "mul_"},
    "Div": {"div", "div_"}, "Neg": {"neg"}, "Where": {"where"}, "ReduceSum": {"sum"},
    "ReduceMean": {"mean"}, "Max": {"maximum"}, "Min": {"minimum"}, "Range": {"arange"},
    "Not": {"logical_not"}, "Equal": {"eq"}, "Less": {"lt"}, "Greater": {"gt"},
    "Expand": {"expand"}, "Sqrt": {"sqrt"}, "Pow": {"pow"}, "Abs": {"abs"},
    "Clip": {"clamp", "clip"}, "TopK": {"topk", "sort"}, "Cast": {"to", "_to_copy"},
    "ReduceMax": {"amax", "max"}, "ReduceMin": {"amin", "min"}, "Exp": {"exp"},
    "Log": {"log"}, "CumSum": {"cumsum"}, "ScatterElements": {"scatter", "scatter_add"},
    "ScatterND": {"index_put_", "index_put"}, "Tile": {"repeat"}, "Trilu": {"triu", "tril"},
    "And": {"logical_and", "bitwise_and"}, "Or": {"logical_or", "bitwise_or"},
}
# model layers: never on torch inside an ORTModule step
LAYERS = {"mm", "addmm", "bmm", "matmul", "linear", "convolution", "_convolution",
          "mkldnn_convolution", "convolution_backward", "native_batch_norm",
          "native_layer_norm", "_softmax", "_log_softmax", "gelu", "gelu_backward", "relu",
          "threshold_backward", "max_pool2d_with_indices", "avg_pool2d", "lstm", "gru",
          "mkldnn_rnn_layer", "embedding", "embedding_dense_backward", "nll_loss",
          "cross_entropy_loss", "_fused_dropout", "native_dropout", "sigmoid", "tanh"}


def _torch_kind_ops(om) -> set[str]:
    ops = set()
    for entry in om._cache.values():
        for ex in (entry.forward, entry.backward):
            for plan in (ex._plans.values() if ex is not None else ()):
                ops.update(k for k, c in plan.counts().items() if c["torch"])
    return ops


@pytest.mark.parametrize("name", NAMES)
def test_step_runs_no_aten_compute_beyond_glue(name):
    model, args = make(name)
    om = ORTModule(model, fallback="error")
    for _ in range(2):  # capture + plan, then a cached step
        om.zero_grad(set_to_none=True)
        om(*args)[0].backward()
    om.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        om(*args)[0].backward()
    seen = {e.name[len("aten::"):] for e in prof.events() if e.name.startswith("aten::")}
    assert seen, "the profiler recorded no aten events"
    allowed = set(GLUE)
    for op_type in _torch_kind_ops(om):
        allowed |= LONG_TAIL.get(op_type, set())
    assert not seen & LAYERS, f"model layers ran on torch: {sorted(seen & LAYERS)}"
    assert seen <= allowed, (f"aten ops beyond the glue: {sorted(seen - allowed)}; torch-kind "
                             f"plan nodes: {sorted(_torch_kind_ops(om))}")
