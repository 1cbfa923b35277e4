"""Training and eval models in ONNX Runtime's on-device-training layout.

Training model inputs: the user inputs, the parameters (trainable and frozen), one
``<param>_grad.accumulation.buffer`` per trainable parameter and ``lazy_reset_grad``.
Outputs: the loss, any additional outputs, then one ``<param>_grad.accumulation.out`` flag
per trainable parameter: an ``InPlaceAccumulatorV2`` adds each gradient into its buffer (or
overwrites it when ``lazy_reset_grad`` is true).

Training-mode BatchNormalization keeps its running statistics as frozen parameters (in
the checkpoint, graph inputs of both models). The training model updates them in place
by torch's rule -- ``mean <- m*mean + (1-m)*batch_mean`` and ``var <- m*var +
(1-m)*batch_var_unbiased`` with ``m`` the node's ``momentum`` -- through
``InPlaceAccumulatorV2`` in overwrite mode, whose flags are outputs named
``<stat>_grad.accumulation.out`` so that ORT's ``Module`` (and ours) treat them as the
internal outputs they are. ORT's own generator instead bakes the statistics into the graph
as constants that never change.

The eval model is the forward model with the loss, parameters as inputs, BatchNormalization
in inference mode (one output, which is all ORT accepts there) and Dropout's training-mode
input removed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .._onnx_utils import attribute, value_info, without_unused_batchnorm_outputs
from ._graph_edit import MS_DOMAIN, GraphEditor

MAX_IR_VERSION = 10  # what onnxruntime 1.19.2 loads
LAZY_RESET_GRAD = "lazy_reset_grad"


@dataclass
class RunningStats:
    """One training-mode BatchNormalization's running statistics."""

    node_input: str  # the normalized tensor (X)
    mean: str
    var: str
    momentum: float
    rank: int | None


def set_outputs(model: onnx.ModelProto, names: list[str]) -> None:
    infos = [value_info(model, n) or helper.make_empty_tensor_value_info(n) for n in names]
    del model.graph.output[:]
    model.graph.output.extend(infos)


def training_batchnorm_stats(model: onnx.ModelProto) -> list[RunningStats]:
    """Training-mode BatchNormalization nodes whose running statistics are initializers."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type != "BatchNormalization" or not attribute(n, "training_mode", 0):
            continue
        if len(n.input) < 5 or n.input[3] not in inits or n.input[4] not in inits:
            continue
        vi = value_info(model, n.input[0])
        rank = (len(vi.type.tensor_type.shape.dim)
                if vi is not None and vi.type.tensor_type.HasField("shape") else None)
        out.append(RunningStats(n.input[0], n.input[3], n.input[4],
                                float(attribute(n, "momentum", 0.9)), rank))
    return out


def move_initializers_to_inputs(model: onnx.ModelProto, names: list[str]) -> None:
    """Make the initializers ``names`` graph inputs (their values go to the checkpoint)."""
    g = model.graph
    present = {i.name for i in g.input}
    keep = []
    for t in g.initializer:
        if t.name in names:
            if t.name not in present:
                g.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
        else:
            keep.append(t)
    del g.initializer[:]
    g.initializer.extend(keep)


def order_inputs(model: onnx.ModelProto, params: list[str]) -> None:
    """Inputs as ORT lays them out: user inputs, the parameters in ``params`` order, then
    gradient buffers and ``lazy_reset_grad``. ORT's Module feeds the eval model the
    parameters in the training model's order, so both models must list them alike."""
    g = model.graph
    by_name = {i.name: i for i in g.input}
    rank = {p: i for i, p in enumerate(params)}

    def key(vi):
        if vi.name in rank:
            return (1, rank[vi.name])
        if vi.name.endswith("_grad.accumulation.buffer") or vi.name == LAZY_RESET_GRAD:
            return (2, 0)
        return (0, 0)

    ordered = sorted(by_name.values(), key=key)  # stable: user inputs keep their order
    del g.input[:]
    g.input.extend(ordered)


def cap_ir_version(model: onnx.ModelProto) -> None:
    model.ir_version = min(model.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)


def eval_model(forward: onnx.ModelProto, state_names: list[str]) -> onnx.ModelProto:
    """The eval model (see the module docstring)."""
    m = copy.deepcopy(forward)
    move_initializers_to_inputs(m, state_names)
    for n in m.graph.node:
        if n.op_type == "BatchNormalization" and attribute(n, "training_mode", 0):
            for a in n.attribute:
                if a.name == "training_mode":
                    a.i = 0
        elif n.op_type == "Dropout" and len(n.input) > 2:
            n.input[2] = ""
    without_unused_batchnorm_outputs(m, in_place=True)
    cap_ir_version(m)
    return m


def add_gradient_accumulation(model: onnx.ModelProto, trainable: list[str]) -> None:
    """Replace each ``<p>_grad`` output by an InPlaceAccumulatorV2 into
    ``<p>_grad.accumulation.buffer`` and its ``<p>_grad.accumulation.out`` flag."""
    ed = GraphEditor(model)
    g = model.graph
    grads = {f"{p}_grad": p for p in trainable}
    outputs = []
    reset = ed.reserve(LAZY_RESET_GRAD)
    for out in list(g.output):
        if out.name not in grads:
            outputs.append(out)
            continue
        buffer = ed.reserve(f"{out.name}.accumulation.buffer")
        flag = ed.reserve(f"{out.name}.accumulation.out")
        ed.node("InPlaceAccumulatorV2", [buffer, out.name, reset], name="GradientAccumulator",
                outputs=[flag], domain=MS_DOMAIN)
        buffer_input = copy.deepcopy(out)
        buffer_input.name = buffer
        g.input.append(buffer_input)
        outputs.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, [1]))
    g.input.append(helper.make_tensor_value_info(reset, TensorProto.BOOL, [1]))
    del g.output[:]
    g.output.extend(outputs)


def add_running_stat_updates(model: onnx.ModelProto, stats: list[RunningStats],
                             channels: dict[str, int]) -> None:
    """In-place updates of the BatchNorm running statistics (see the module docstring)."""
    if not stats:
        return
    ed = GraphEditor(model)
    g = model.graph
    internal = {(n.input[3], n.input[4]): n for n in g.node
                if n.op_type == "BatchNormInternal" and len(n.input) >= 5}
    overwrite = ed.const(np.array([True]), "running_stat_overwrite", np.bool_)
    for s in stats:
        bn = internal.get((s.mean, s.var))
        if bn is None or len(bn.output) < 3 or not bn.output[1] or not bn.output[2]:
            raise ValueError(f"internal: no BatchNormInternal with running outputs reads "
                             f"{s.mean!r} in the training graph")
        if s.rank is None:
            raise ValueError(f"BatchNormalization over {s.node_input!r}: its input rank is "
                             "unknown, so its running variance cannot be updated")
        new_mean, ort_var = bn.output[1], bn.output[2]
        # ORT's running_var uses the biased batch variance v; torch's the unbiased
        # v*n/(n-1): add (1-m)*(v*n/(n-1) - v) = (1-m)*v/(n-1)
        axes = [0, *range(2, s.rank)]
        tag = s.mean.rsplit(".", 1)[0] if "." in s.mean else s.mean
        mean_k = ed.reduce_mean(s.node_input, axes, 1, f"{tag}_RunningStat_Mean")
        (diff,) = ed.node("Sub", [s.node_input, mean_k], name=f"{tag}_RunningStat_Sub")
        (sq,) = ed.node("Mul", [diff, diff], name=f"{tag}_RunningStat_Square")
        var_b = ed.reduce_mean(sq, axes, 0, f"{tag}_RunningStat_Var")
        (size,) = ed.node("Size", [s.node_input], name=f"{tag}_RunningStat_Size")
        (size_f,) = ed.node("Cast", [size], name=f"{tag}_RunningStat_Cast",
                            to=TensorProto.FLOAT)
        per_channel = ed.const(np.float32(channels[s.mean]), f"{tag}_channels")
        (n,) = ed.node("Div", [size_f, per_channel], name=f"{tag}_RunningStat_Count")
        one = ed.const(np.float32(1.0), f"{tag}_one")
        (nm1,) = ed.node("Sub", [n, one], name=f"{tag}_RunningStat_CountMinusOne")
        (ratio,) = ed.node("Div", [var_b, nm1], name=f"{tag}_RunningStat_Unbias")
        weight = ed.const(np.float32(1.0 - s.momentum), f"{tag}_one_minus_momentum")
        (extra,) = ed.node("Mul", [ratio, weight], name=f"{tag}_RunningStat_Scale")
        (new_var,) = ed.node("Add", [ort_var, extra], name=f"{tag}_RunningStat_NewVar")
        for stat, value in ((s.mean, new_mean), (s.var, new_var)):
            flag = ed.reserve(f"{stat}_grad.accumulation.out")
            ed.node("InPlaceAccumulatorV2", [stat, value, overwrite],
                    name="RunningStatUpdate", outputs=[flag], domain=MS_DOMAIN)
            g.output.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, [1]))
