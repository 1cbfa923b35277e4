"""``Module``: training and evaluation steps of ORT training artifacts on our kernels."""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import torch

from .._onnx_utils import value_info, without_unused_batchnorm_outputs
from ._models import input_specs, layout_of, load_onnx
from .checkpoint_state import CheckpointState, _as_array


class Module:
    """Runs the training model (forward, loss, gradients accumulated into the parameters'
    gradient buffers) or the eval model of a set of training artifacts.

    Same API and conventions as ``onnxruntime.training.api.Module`` (1.19.2): user inputs are
    the model inputs that are neither checkpoint parameters, gradient buffers
    (``<param>_grad.accumulation.buffer``) nor ``lazy_reset_grad``; the outputs are the loss
    followed by any additional outputs. Gradients accumulate over calls until
    :meth:`lazy_reset_grad`, which makes the next training call overwrite them.

    Args:
        train_model_uri: path to the training model (or an ``onnx.ModelProto``).
        state: the ``CheckpointState`` holding the parameters (shared, updated in place).
        eval_model_uri: path to the eval model, optional.
        device: only ``"cpu"``.
        session_options: accepted for compatibility; unused.
    """

    training: bool

    def __init__(self, train_model_uri, state: CheckpointState, eval_model_uri=None,
                 device: str = "cpu", session_options=None):
        if not isinstance(state, CheckpointState):
            raise TypeError(f"state: expected a CheckpointState, got {type(state).__name__}")
        if not isinstance(device, str) or device.split(":")[0] != "cpu":
            raise ValueError(f"device: only 'cpu' is supported, got {device!r}")
        from ...graph import Executor

        self.training = True
        self._state = state
        self._accumulate = False  # the first training call overwrites the gradient buffers
        train = load_onnx(train_model_uri, "train_model_uri")
        self._train = layout_of(train, state._params, training=True)
        bindings = self._check_parameters(train)
        self._eval_model = None
        self._eval = None
        if eval_model_uri is not None:
            self._eval_model = load_onnx(eval_model_uri, "eval_model_uri")
            self._eval = layout_of(self._eval_model, state._params, training=False)
            specs = input_specs(self._eval_model)
            for name in self._eval.param_inputs:
                slot = state._params[name]
                _check_spec(name, slot.dtype, bindings[name], specs[name], "eval")
        # everything is checked (and the executors built) before the state is touched
        self._train_executor = Executor(train)
        if self._eval_model is not None:
            self._eval_executor = Executor(without_unused_batchnorm_outputs(self._eval_model))
        self._reset_flag = torch.ones(1, dtype=torch.bool)
        for name, dims in bindings.items():
            slot = state._params[name]
            if slot.value is None:  # a nominal checkpoint: zeros until copy_buffer_to_parameters
                slot.dims = dims
                slot.value = torch.zeros(dims, dtype=_torch_dtype(slot.dtype))
            slot.grad = torch.zeros_like(slot.value) if slot.requires_grad else None
        self._trainable_names = [n for n in self._train.param_inputs
                                 if state._params[n].requires_grad]

    # -- checking parameters and gradient buffers against the training model ---------------

    def _check_parameters(self, train: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
        """Parameter name -> shape, for every parameter input of the training model; a clear
        error for a checkpoint that does not fit the model."""
        state, lay = self._state, self._train
        specs = input_specs(train)
        missing = [p for _, p in lay.grad_inputs if p not in state._params]
        if missing:
            raise ValueError(f"the training model has gradient buffers of parameters "
                             f"{missing} that the checkpoint does not have")
        unused = [n for n in state._params if n not in lay.param_inputs]
        if unused:
            raise ValueError(f"checkpoint parameters {unused} are not inputs of the training "
                             f"model; the checkpoint does not belong to this model")
        grad_input_of = {p: n for n, p in lay.grad_inputs}
        bindings = {}
        for name in lay.param_inputs:
            slot = state._params[name]
            spec = specs[name]
            dims = slot.dims
            if slot.value is None:  # nominal checkpoint: the shape comes from the model
                if spec.dims is None or any(d is None for d in spec.dims):
                    raise ValueError(f"nominal checkpoint parameter {name!r}: the training "
                                     f"model gives it no fixed shape ({spec.dims})")
                dims = tuple(spec.dims)
            _check_spec(name, slot.dtype, dims, spec, "training")
            if slot.requires_grad != (name in grad_input_of):
                raise ValueError(
                    f"parameter {name!r} is {'trainable' if slot.requires_grad else 'frozen'} "
                    f"in the checkpoint but the training model "
                    f"{'has no' if slot.requires_grad else 'has a'} gradient buffer input "
                    f"{name + '_grad.accumulation.buffer'!r}")
            if slot.requires_grad:
                buffer = grad_input_of[name]
                _check_spec(buffer, slot.dtype, dims, specs[buffer], "training")
            bindings[name] = dims
        return bindings

    # -- steps -----------------------------------------------------------------------------

    def __call__(self, *user_inputs):
        """One training step (forward + gradient accumulation) or, after :meth:`eval`, one
        evaluation step. Inputs are numpy arrays (or torch tensors, or onnxruntime
        OrtValues); outputs numpy arrays (OrtValues when the inputs all are, as in ORT).
        One output is returned as is, several as a tuple."""
        lay = self._train if self.training else self._eval
        if lay is None:
            raise RuntimeError("eval mode needs an eval model: pass eval_model_uri to Module")
        if len(user_inputs) != len(lay.user_inputs):
            raise ValueError(f"expected {len(lay.user_inputs)} input(s) {lay.user_inputs}, "
                             f"got {len(user_inputs)}")
        feeds = {name: _to_tensor(x, name) for name, x in zip(lay.user_inputs, user_inputs,
                                                                  strict=True)}
        params = self._state._params
        for name in lay.param_inputs:
            feeds[name] = params[name].value
        if self.training:
            for buffer_name, param in lay.grad_inputs:
                feeds[buffer_name] = params[param].grad
            if lay.reset_input is not None:
                self._reset_flag[0] = not self._accumulate
                feeds[lay.reset_input] = self._reset_flag
            out = self._train_executor.run(feeds, lay.user_outputs)
            self._accumulate = True
        else:
            out = self._eval_executor.run(feeds, lay.user_outputs)
        results = tuple(out[n].detach().numpy().copy() for n in lay.user_outputs)
        ort_value = _ort_value_class(user_inputs)
        if ort_value is not None:  # ORT returns OrtValues for OrtValue inputs
            results = tuple(ort_value.ortvalue_from_numpy(r) for r in results)
        return results[0] if len(results) == 1 else results

    def train(self, mode: bool = True) -> Module:
        """Training mode (True) or eval mode (False); returns self."""
        self.training = bool(mode)
        return self

    def eval(self) -> Module:
        """Eval mode; returns self."""
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        """Make the next training step overwrite the gradient buffers instead of adding."""
        self._accumulate = False

    # -- parameters as one flat buffer -----------------------------------------------------

    def _flat_slots(self, trainable_only: bool):
        slots = [self._state._params[n] for n in self._train.param_inputs]
        return [s for s in slots if s.requires_grad or not trainable_only]

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """Number of parameter elements (trainable ones only by default)."""
        return sum(s.value.numel() for s in self._flat_slots(trainable_only))

    def get_contiguous_parameters(self, trainable_only: bool = False) -> torch.Tensor:
        """The parameters (in training-model input order) concatenated into one float32
        vector. Returned as a torch tensor; ``.numpy()`` gives the array, as with ORT's
        OrtValue."""
        slots = self._flat_slots(trainable_only)
        _require_float32(slots)
        if not slots:
            return torch.empty(0, dtype=torch.float32)
        return torch.cat([s.value.reshape(-1) for s in slots])

    def copy_buffer_to_parameters(self, buffer, trainable_only: bool = True) -> None:
        """Copy a flat float32 buffer (as from :meth:`get_contiguous_parameters`) into the
        parameters. A nominal checkpoint is completed by copying all of them
        (``trainable_only=False``)."""
        if self._state._nominal and trainable_only:
            raise ValueError("copy_buffer_to_parameters: a nominal checkpoint needs all "
                             "parameters loaded; pass trainable_only=False")
        flat = _as_array(buffer, "buffer").reshape(-1)
        slots = self._flat_slots(trainable_only)
        _require_float32(slots)
        expected = sum(s.value.numel() for s in slots)
        if flat.dtype != np.float32:
            raise TypeError(f"buffer: expected float32, got {flat.dtype}")
        if flat.size != expected:
            raise ValueError(f"buffer: expected {expected} elements, got {flat.size}")
        src = torch.from_numpy(np.ascontiguousarray(flat))
        offset = 0
        for s in slots:
            n = s.value.numel()
            s.value.copy_(src[offset:offset + n].view(s.value.shape))
            offset += n
        if not trainable_only:
            self._state._nominal = False

    # -- names and export ------------------------------------------------------------------

    def input_names(self) -> list[str]:
        """User input names of the training model (or of the eval model in eval mode)."""
        lay = self._train if self.training else self._eval
        return list(lay.user_inputs) if lay is not None else []

    def output_names(self) -> list[str]:
        """User output names of the training model (or of the eval model in eval mode)."""
        lay = self._train if self.training else self._eval
        return list(lay.user_outputs) if lay is not None else []

    def export_model_for_inferencing(self, inference_model_uri: str | os.PathLike,
                                     graph_output_names: list[str]) -> None:
        """Write an inference model: the eval model cut down to what ``graph_output_names``
        need, with the current parameter values as initializers and only the user inputs
        that remain in use as inputs."""
        if self._eval_model is None:
            raise RuntimeError("Eval model was not provided. Cannot export a model for "
                               "inferencing.")
        if isinstance(graph_output_names, str) or not graph_output_names:
            raise ValueError("graph_output_names: expected a non-empty list of output names")
        model = inference_model(self._eval_model, list(graph_output_names),
                                {n: s.value for n, s in self._state._params.items()})
        onnx.save(model, os.fspath(inference_model_uri))


# --------------------------------------------------------------------------- helpers


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def _check_spec(name, dtype, dims, spec, which: str) -> None:
    if spec.dtype is not None and spec.dtype != dtype:
        raise TypeError(f"parameter {name!r}: the {which} model expects dtype {spec.dtype}, "
                        f"the checkpoint has {dtype}")
    if spec.dims is not None:
        fixed = list(spec.dims)
        if len(fixed) != len(dims) or any(w is not None and w > 0 and w != g
                                          for w, g in zip(fixed, dims, strict=True)):
            raise ValueError(f"parameter {name!r}: the {which} model expects shape "
                             f"{fixed}, the checkpoint has {list(dims)}")


def _require_float32(slots) -> None:
    bad = [s.name for s in slots if s.value.dtype != torch.float32]
    if bad:
        raise TypeError(f"contiguous parameter buffers are float32 only; parameters {bad} "
                        f"are not")


def _ort_value_class(inputs):
    """onnxruntime's OrtValue class when every input is one (then outputs are too)."""
    kinds = {type(x) for x in inputs}
    if len(kinds) == 1:
        kind = next(iter(kinds))
        if kind.__module__.startswith("onnxruntime") and hasattr(kind, "ortvalue_from_numpy"):
            return kind
    return None


def _to_tensor(x, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):  # an ORT OrtValue
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"input {name!r}: expected a numpy array, got {type(x).__name__}")
    if x.dtype == object:
        raise TypeError(f"input {name!r}: object arrays are not supported")
    if not x.flags.c_contiguous or not x.flags.writeable or not x.dtype.isnative:
        # torch.from_numpy needs native byte order and warns on read-only arrays
        x = np.ascontiguousarray(x).astype(x.dtype.newbyteorder("="), copy=True)
    return torch.from_numpy(x)


def inference_model(eval_model: onnx.ModelProto, outputs: list[str],
                    parameters: dict[str, torch.Tensor]) -> onnx.ModelProto:
    """The eval model reduced to ``outputs``, parameters folded in as initializers."""
    model = copy.deepcopy(eval_model)
    g = model.graph
    produced = {o for n in g.node for o in n.output} | {i.name for i in g.input} \
        | {t.name for t in g.initializer}
    unknown = [o for o in outputs if o not in produced]
    if unknown:
        raise ValueError(f"graph_output_names: {unknown} are not values of the eval model")
    new_outputs = [value_info(model, o) or onnx.helper.make_empty_tensor_value_info(o)
                   for o in outputs]
    # keep the nodes the outputs depend on (reverse reachability), in their original order
    needed, keep = set(outputs), []
    for node in reversed(g.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
            for attr in node.attribute:  # names used inside subgraphs (If/Loop/Scan)
                if attr.type == onnx.AttributeProto.GRAPH:
                    needed.update(_subgraph_inputs(attr.g))
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    del g.output[:]
    g.output.extend(new_outputs)
    inputs = []
    for vi in g.input:
        if vi.name in parameters:
            if vi.name in needed:
                array = parameters[vi.name].detach().numpy()
                g.initializer.append(onnx.numpy_helper.from_array(array, vi.name))
        elif vi.name in needed:
            inputs.append(vi)
    del g.input[:]
    g.input.extend(inputs)
    kept_inits = [t for t in g.initializer if t.name in needed]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    kept_infos = [v for v in g.value_info if v.name in needed]
    del g.value_info[:]
    g.value_info.extend(kept_infos)
    return without_unused_batchnorm_outputs(model, in_place=True)


def _subgraph_inputs(graph: onnx.GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        names.update(i for i in node.input if i)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names.update(_subgraph_inputs(attr.g))
    return names
