"""``generate_artifacts``: training, eval and optimizer models plus a checkpoint from an
ONNX forward model, as ``onnxruntime.training.artifacts`` (1.19.2) writes them.

Built on ortcpu_torch's gradient builder (``ortcpu_torch.graph.build_gradient_graph``)
with loss and optimizer graphs of our own. Everything written loads in ORT 1.19.2 as well
as in ``ortcpu_torch.training.api``: IR version <= 10, the model's default-domain opset
(13..21) and ``com.microsoft`` 1. Differences from ORT's generator:

- BatchNormalization's running statistics stay state: frozen parameters in the checkpoint,
  updated in place by every training step with torch's rule (ORT bakes them in as
  constants); the eval model runs BatchNormalization in inference mode with one output
  (ORT's own eval model has three there, which ORT then refuses to load).
- Models captured by ``ortcpu_torch.graph.export(..., train=True)`` are accepted: their
  written-out BatchNorm running-statistics updates (``<stat>.updated`` outputs) become
  the same checkpoint state.
- Models ORT's gradient builder rejects, such as torch-exported LayerNormalization with a
  single output (ORT issue #19427), are accepted.
- ``requires_grad=None`` makes every float initializer not in ``frozen_params`` trainable
  (ORT would move them all to graph inputs without training any).
- The artifact directory is created if missing; ``ort_format=True`` and
  ``custom_op_library`` are not supported (a clear error).
"""

from __future__ import annotations

import copy
import logging
import os
import pathlib
from enum import Enum

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .._checkpoint_file import CheckpointContents, TensorEntry, write_checkpoint
from ._captured_batchnorm import adopt_captured_batchnorm
from ._losses import add_loss
from ._optimizer_model import optimizer_model
from ._training_model import (
    add_gradient_accumulation,
    add_running_stat_updates,
    cap_ir_version,
    eval_model,
    move_initializers_to_inputs,
    order_inputs,
    set_outputs,
    training_batchnorm_stats,
)

__all__ = ["LossType", "OptimType", "generate_artifacts"]

MIN_OPSET, MAX_OPSET = 13, 21  # our gradient builder / what onnxruntime 1.19.2 knows
_log = logging.getLogger(__name__)


class LossType(Enum):
    """Loss added on top of the model's (first) output."""

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4


class OptimType(Enum):
    """Optimizer of the optimizer model: AdamW (betas 0.9/0.999, eps 1e-6, no weight decay,
    bias correction, HuggingFace mode — ORT's defaults) or SGD."""

    AdamW = 1
    SGD = 2


def _enum_name(value, enum, argument: str) -> str | None:
    if value is None:
        return None
    name = getattr(value, "name", None)  # ours or onnxruntime's enum member
    if isinstance(value, Enum) and name in enum.__members__:
        return name
    raise TypeError(f"{argument}: expected a {enum.__name__} member or None, got {value!r} "
                    "(onnxblock blocks are not supported)")


def _load_model(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return copy.deepcopy(model)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model: no ONNX model at {path!r}")
        return onnx.load(path)
    raise TypeError(f"model: expected an onnx.ModelProto or a path, got {type(model).__name__}")


def _names(value, argument: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{argument}: expected a list of names, got {value!r}")
    return list(value)


def generate_artifacts(model, requires_grad=None, frozen_params=None, loss=None,
                       optimizer=None, artifact_directory=None, prefix: str = "",
                       ort_format: bool = False, custom_op_library=None,
                       additional_output_names=None, nominal_checkpoint: bool = False,
                       loss_input_names=None) -> None:
    """Write ``{prefix}training_model.onnx``, ``{prefix}eval_model.onnx``,
    ``{prefix}checkpoint`` (and ``{prefix}nominal_checkpoint`` if asked) and, when
    ``optimizer`` is given, ``{prefix}optimizer_model.onnx`` into ``artifact_directory``
    (default: the working directory; created if missing).

    Args:
        model: the forward ONNX model (ModelProto or path); its initializers are the
            parameters.
        requires_grad: initializers to train (default: all float ones not frozen).
        frozen_params: initializers kept fixed but stored in the checkpoint.
        loss: a ``LossType``; None uses the model's first output as the loss.
        optimizer: an ``OptimType``; None writes no optimizer model.
        additional_output_names: model values returned after the loss.
        nominal_checkpoint: also write a checkpoint with names and types but no data.
        loss_input_names: values the loss reads (the prediction, then optionally the
            target input's name) instead of the model's first output.
    """
    from ...graph import build_gradient_graph

    if ort_format:
        raise ValueError("ort_format=True: ORT's flatbuffers model format is not supported; "
                         "the ONNX artifacts run on both libraries")
    if custom_op_library is not None:
        raise ValueError("custom_op_library: custom operator libraries are not supported")
    loss_name = _enum_name(loss, LossType, "loss")
    optim_name = _enum_name(optimizer, OptimType, "optimizer")
    forward = _load_model(model)
    opset = _check_opset(forward)
    adopt_captured_batchnorm(forward)
    frozen = _names(frozen_params, "frozen_params")
    extra_outputs = _names(additional_output_names, "additional_output_names")
    loss_inputs = _names(loss_input_names, "loss_input_names")
    inits = {t.name: t for t in forward.graph.initializer}
    if requires_grad is None:
        trainable = [n for n, t in inits.items() if n not in frozen
                     and t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE)]
    else:
        trainable = _names(requires_grad, "requires_grad")
    both = sorted(set(trainable) & set(frozen))
    if both:
        raise ValueError(f"parameters {both} are both in requires_grad and frozen_params")
    for argument, names in (("requires_grad", trainable), ("frozen_params", frozen)):
        missing = [n for n in names if n not in inits]
        if missing:
            raise ValueError(f"{argument}: {missing} are not initializers of the model")
    if not trainable:
        raise ValueError("requires_grad: no parameter to train")
    order = list(inits)
    trainable.sort(key=order.index)

    # the loss and the user outputs
    graph_outputs = [o.name for o in forward.graph.output]
    values = {o for n in forward.graph.node for o in n.output} | set(graph_outputs)
    for name in (*loss_inputs[:1], *extra_outputs):
        if name not in values:
            raise ValueError(f"{name!r} is not a value of the model")
    if loss_name is None:
        user_outputs = graph_outputs if not loss_inputs else loss_inputs
    else:
        user_outputs = [add_loss(forward, loss_name, loss_inputs or graph_outputs[:1])]
    user_outputs = list(dict.fromkeys([*user_outputs, *extra_outputs]))
    set_outputs(forward, user_outputs)

    stats = training_batchnorm_stats(forward)
    stat_names = [n for s in stats for n in (s.mean, s.var) if n not in trainable]
    frozen_all = list(dict.fromkeys([*frozen, *stat_names]))
    frozen_all.sort(key=order.index)

    evaluation = eval_model(forward, trainable + frozen_all)
    training = build_gradient_graph(forward, trainable, user_outputs[0],
                                    params_as_inputs=True)
    move_initializers_to_inputs(training, frozen_all)
    add_gradient_accumulation(training, trainable)
    add_running_stat_updates(training, [s for s in stats if s.mean in frozen_all],
                             {s.mean: int(np.prod(inits[s.mean].dims)) for s in stats})
    state_order = sorted(trainable + frozen_all, key=order.index)
    order_inputs(training, state_order)
    order_inputs(evaluation, state_order)
    cap_ir_version(training)
    onnx.checker.check_model(evaluation)

    folder = pathlib.Path(os.getcwd() if artifact_directory is None else artifact_directory)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(training, os.fspath(folder / f"{prefix}training_model.onnx"))
    onnx.save(evaluation, os.fspath(folder / f"{prefix}eval_model.onnx"))
    contents = CheckpointContents(trainable=[_entry(inits[n]) for n in trainable],
                                  frozen=[_entry(inits[n]) for n in frozen_all])
    write_checkpoint(contents, folder / f"{prefix}checkpoint")
    if nominal_checkpoint:
        contents.is_nominal = True
        write_checkpoint(contents, folder / f"{prefix}nominal_checkpoint")
    if optim_name is not None:
        elem = inits[trainable[0]].data_type
        onnx.save(optimizer_model(optim_name, elem, opset),
                  os.fspath(folder / f"{prefix}optimizer_model.onnx"))
    _log.info("artifacts written to %s", folder)


def _entry(t: onnx.TensorProto) -> TensorEntry:
    a = numpy_helper.to_array(t).copy()
    return TensorEntry(t.name, tuple(a.shape), a.dtype, a)


def _check_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            if not MIN_OPSET <= imp.version <= MAX_OPSET:
                raise ValueError(
                    f"model: default-domain opset {imp.version}; artifacts need opset "
                    f"{MIN_OPSET}..{MAX_OPSET} (the gradient builder's minimum, the newest "
                    "onnxruntime 1.19.2 knows): convert with onnx.version_converter")
            return imp.version
    raise ValueError("model: it imports no default-domain (ai.onnx) opset")
