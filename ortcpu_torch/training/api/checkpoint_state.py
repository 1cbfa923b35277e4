"""``CheckpointState``: parameters, optimizer state and user properties of a training run.

Same API as ``onnxruntime.training.api.CheckpointState`` (1.19.2). Parameter values live
in torch tensors that ``Module`` and ``Optimizer`` feed to their graphs directly (training
updates them in place); the public accessors hand out numpy copies, as ORT does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from .._checkpoint_file import (
    CheckpointContents,
    CheckpointError,
    OptimizerGroupEntry,
    TensorEntry,
    property_kind,
    read_checkpoint,
    write_checkpoint,
)

__all__ = ["CheckpointError", "CheckpointState", "Parameter", "Parameters", "Properties"]


@dataclass
class _ParamSlot:
    """One parameter's storage. ``value`` and ``dims`` are None for a nominal checkpoint
    until a Module allocates them from the training model's input shapes."""

    name: str
    requires_grad: bool
    dims: tuple[int, ...]
    dtype: np.dtype
    value: torch.Tensor | None
    grad: torch.Tensor | None = None  # the gradient accumulation buffer, made by Module


@dataclass
class _OptimizerGroup:
    """Optimizer state of one group (ORT writes one, "group0")."""

    step: int = 0
    initial_lr: float = 0.001
    learning_rate: float = 0.001
    momentums: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


def _f32(x: float) -> float:
    """ORT keeps learning rates and float properties as float32."""
    return float(np.float32(x))


def _as_array(value, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # an ORT OrtValue
        value = value.numpy()
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array, got {type(value).__name__}")
    return value


class Parameter:
    """One model parameter: ``name``, ``data`` (a numpy copy; assignable), ``grad``,
    ``requires_grad``."""

    def __init__(self, slot: _ParamSlot):
        self._slot = slot

    @property
    def name(self) -> str:
        return self._slot.name

    @property
    def data(self) -> np.ndarray:
        """A copy of the parameter's current value."""
        return self._slot.value.numpy().copy()

    @data.setter
    def data(self, value: np.ndarray) -> None:
        """Copy ``value`` into the parameter (same shape and dtype required)."""
        _copy_into(self._slot, value)

    @property
    def grad(self) -> np.ndarray | None:
        """A copy of the accumulated gradient, or None (frozen, or no Module made yet)."""
        return None if self._slot.grad is None else self._slot.grad.numpy().copy()

    @property
    def requires_grad(self) -> bool:
        return self._slot.requires_grad

    def __repr__(self) -> str:
        return f"Parameter(name={self.name}, requires_grad={self.requires_grad})"


def _copy_into(slot: _ParamSlot, value) -> None:
    if slot.dims is None:
        raise RuntimeError(f"parameter {slot.name!r} has no shape yet (nominal checkpoint): "
                           "create a Module from the state first")
    arr = _as_array(value, f"parameter {slot.name!r}")
    if tuple(arr.shape) != tuple(slot.dims):
        raise ValueError(f"parameter {slot.name!r}: expected shape {list(slot.dims)}, "
                         f"got {list(arr.shape)}")
    if arr.dtype != slot.dtype:
        raise TypeError(f"parameter {slot.name!r}: expected dtype {slot.dtype}, got {arr.dtype}")
    src = torch.from_numpy(np.ascontiguousarray(arr))
    if slot.value is None:
        slot.value = src.clone()
    else:
        slot.value.copy_(src)


class Parameters:
    """Dictionary-like view of the parameters: ``state.parameters[name]``, ``in``, iteration
    (name, Parameter) pairs in name order, ``len``; assignment copies new values in."""

    def __init__(self, state: CheckpointState):
        self._state = state

    def _slot(self, name: str) -> _ParamSlot:
        slot = self._state._params.get(name)
        if slot is None:
            raise KeyError(f"Parameter {name} not found.")
        if self._state._nominal:
            raise RuntimeError(
                f"parameter {name!r} has no data: the checkpoint is nominal; create a Module "
                "and call copy_buffer_to_parameters(buffer, trainable_only=False) first"
            )
        return slot

    def __getitem__(self, name: str) -> Parameter:
        return Parameter(self._slot(name))

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        slot = self._state._params.get(name)
        if slot is None:
            raise KeyError(f"Parameter {name} not found.")
        _copy_into(slot, value)

    def __contains__(self, name: str) -> bool:
        return name in self._state._params

    def __iter__(self):
        for name in self._state._params:
            yield name, self[name]

    def __len__(self) -> int:
        return len(self._state._params)

    def __repr__(self) -> str:
        return f"Parameters({list(self._state._params)})"


class Properties:
    """Dictionary-like user properties: int, float (stored as float32) or str values."""

    def __init__(self, state: CheckpointState):
        self._state = state

    def __getitem__(self, name: str) -> int | float | str:
        if name not in self._state._properties:
            raise KeyError(f"Property {name} not found.")
        return self._state._properties[name]

    def __setitem__(self, name: str, value: int | float | str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"property name: expected a str, got {type(name).__name__}")
        if isinstance(value, (bool, np.bool_)):
            value = int(value)  # as ORT stores it
        kind = property_kind(name, value)
        self._state._properties[name] = (int(value) if kind == "int" else
                                         _f32(value) if kind == "float" else value)

    def __contains__(self, name: str) -> bool:
        return name in self._state._properties

    def __iter__(self):
        yield from self._state._properties.items()

    def __len__(self) -> int:
        return len(self._state._properties)

    def __repr__(self) -> str:
        return f"Properties({list(self._state._properties)})"


class CheckpointState:
    """The state of a training run: model parameters (trainable and frozen) with their
    gradients, optimizer state and user properties.

    Make one with :meth:`load_checkpoint`; save with :meth:`save_checkpoint`. Files are ONNX
    Runtime's checkpoint format, so either library reads what the other wrote.
    """

    def __init__(self, contents: CheckpointContents):
        if not isinstance(contents, CheckpointContents):
            raise TypeError("use CheckpointState.load_checkpoint(path) to create a CheckpointState")
        self._params: dict[str, _ParamSlot] = {}
        for entry, trainable in sorted(
                [(e, True) for e in contents.trainable] + [(e, False) for e in contents.frozen],
                key=lambda p: p[0].name):
            value = None if entry.data is None else torch.from_numpy(entry.data)
            dims = tuple(entry.data.shape) if entry.data is not None else None
            self._params[entry.name] = _ParamSlot(entry.name, trainable, dims, entry.dtype, value)
        self._nominal = contents.is_nominal
        self._properties: dict[str, int | float | str] = dict(contents.properties)
        self._optimizer_groups: dict[str, _OptimizerGroup] = {
            name: _OptimizerGroup(
                step=g.step, initial_lr=g.initial_learning_rate,
                learning_rate=g.initial_learning_rate,
                momentums={p: {m: torch.from_numpy(a) for m, a in moms.items()}
                           for p, moms in g.momentums.items()})
            for name, g in contents.optimizer_groups.items()}
        self._parameters = Parameters(self)
        self._property_view = Properties(self)

    @classmethod
    def load_checkpoint(cls, checkpoint_uri: str | os.PathLike) -> CheckpointState:
        """Load a complete or nominal checkpoint file.

        Raises :class:`CheckpointError` (a ValueError) for a file that is not a valid
        version-2 ONNX Runtime checkpoint, FileNotFoundError if it does not exist.
        """
        return cls(read_checkpoint(checkpoint_uri))

    @classmethod
    def save_checkpoint(cls, state: CheckpointState, checkpoint_uri: str | os.PathLike,
                        include_optimizer_state: bool = False) -> None:
        """Write ``state`` to ``checkpoint_uri`` (atomically: the old file stays intact
        until the new one is complete). The optimizer state is written only when
        ``include_optimizer_state`` is True."""
        if not isinstance(state, CheckpointState):
            raise TypeError(f"state: expected a CheckpointState, got {type(state).__name__}")
        write_checkpoint(state._contents(bool(include_optimizer_state)), checkpoint_uri)

    @property
    def parameters(self) -> Parameters:
        """The model parameters, by name."""
        return self._parameters

    @property
    def properties(self) -> Properties:
        """User properties (int, float or str), by name."""
        return self._property_view

    # -- internal -------------------------------------------------------------------------

    @property
    def is_nominal(self) -> bool:
        """True while parameter values have not been loaded into a nominal checkpoint."""
        return self._nominal

    def _contents(self, include_optimizer_state: bool) -> CheckpointContents:
        nominal = self.is_nominal

        def entry(s: _ParamSlot) -> TensorEntry:
            data = None if nominal else s.value.numpy()
            return TensorEntry(s.name, s.dims or (), s.dtype, data)

        out = CheckpointContents(
            trainable=[entry(s) for s in self._params.values() if s.requires_grad],
            frozen=[entry(s) for s in self._params.values() if not s.requires_grad],
            is_nominal=nominal, properties=dict(self._properties))
        if include_optimizer_state:
            for name, g in self._optimizer_groups.items():
                out.optimizer_groups[name] = OptimizerGroupEntry(
                    step=g.step, initial_learning_rate=g.initial_lr,
                    momentums={p: {m: t.numpy() for m, t in moms.items()}
                               for p, moms in g.momentums.items()})
        return out

    def __repr__(self) -> str:
        return (f"CheckpointState({len(self._params)} parameters, "
                f"{len(self._properties)} properties"
                f"{', nominal' if self.is_nominal else ''})")
