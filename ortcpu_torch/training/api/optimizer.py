"""``Optimizer``: runs an ORT optimizer model (AdamW / SGD) over a Module's parameters."""

from __future__ import annotations

import os

import numpy as np
import torch

from ._models import load_onnx
from .checkpoint_state import _f32, _OptimizerGroup

_GROUP = "group0"  # ORT's generated optimizer models have one parameter group

_OPTIMIZER_OPS = ("AdamWOptimizer", "SGDOptimizerV2")
# optimizer-model input -> the checkpoint's name for that state of each parameter. ORT keeps
# one state per declared moment input, even SGD's unread first_order_moments.
_MOMENTUM_OF_INPUT = {"first_order_moments": "momentum0", "second_order_moments": "momentum1"}


class Optimizer:
    """Updates the parameters of ``module`` from their accumulated gradients with the
    optimizer model written by ``generate_artifacts`` (ORT's or ours).

    The optimizer graph (``AdamWOptimizer`` or ``SGDOptimizerV2``, optionally after
    ``InplaceClipGradNorm``) runs on ortcpu_torch's kernels and updates parameters and
    momentums in place. Its state (step count, initial learning rate, and per parameter
    ``momentum0`` / ``momentum1`` for the model's ``first_order_moments`` /
    ``second_order_moments`` inputs) lives in the module's ``CheckpointState`` and is saved
    with ``save_checkpoint(state, path, include_optimizer_state=True)``; a state loaded from
    such a checkpoint resumes where it stopped.
    """

    def __init__(self, optimizer_uri: str | os.PathLike, module):
        from .module import Module

        if not isinstance(module, Module):
            raise TypeError(f"module: expected an ortcpu_torch.training.api.Module, got "
                            f"{type(module).__name__}")
        self._module = module
        model = load_onnx(optimizer_uri, "optimizer_uri")
        ops = [n.op_type for n in model.graph.node if n.op_type in _OPTIMIZER_OPS]
        if len(ops) != 1:
            raise ValueError(
                f"optimizer model {os.fspath(optimizer_uri)!r}: expected exactly one "
                f"AdamWOptimizer or SGDOptimizerV2 node, found {ops or 'none'}")
        self._op = ops[0]
        self._input_names = [i.name for i in model.graph.input]
        momentum_names = [_MOMENTUM_OF_INPUT[n] for n in self._input_names
                          if n in _MOMENTUM_OF_INPUT]
        known = {"learning_rate", "step", "params", "gradients", *_MOMENTUM_OF_INPUT}
        unknown = [n for n in self._input_names if n not in known]
        if unknown:
            raise ValueError(f"optimizer model {os.fspath(optimizer_uri)!r}: unexpected inputs "
                             f"{unknown}; expected a subset of {sorted(known)}")
        from ...graph import Executor

        self._executor = Executor(model)

        state = module._state
        names = module._trainable_names
        slots = [state._params[n] for n in names]
        group = state._optimizer_groups.get(_GROUP)
        if group is None:
            group = _OptimizerGroup()
            state._optimizer_groups[_GROUP] = group
        else:
            group.learning_rate = group.initial_lr
        for s in slots:
            have = group.momentums.get(s.name)
            if have is None:
                group.momentums[s.name] = {m: torch.zeros_like(s.value) for m in momentum_names}
                continue
            for m in momentum_names:
                t = have.get(m)
                if t is None or tuple(t.shape) != tuple(s.value.shape) or t.dtype != s.value.dtype:
                    raise ValueError(
                        f"checkpoint optimizer state of parameter {s.name!r}: expected "
                        f"{m} of shape {list(s.value.shape)} and dtype {s.value.dtype}, got "
                        f"{'none' if t is None else f'{list(t.shape)} {t.dtype}'}")
        extra = sorted(set(group.momentums) - set(names))
        if extra:
            raise ValueError(f"checkpoint optimizer state has parameters {extra} that the "
                             f"training model does not train")
        self._group = group
        self._slots = slots
        self._lr = torch.empty(1, dtype=torch.float32)
        self._step = torch.empty(1, dtype=torch.int64)

    def _feeds(self) -> dict:
        feeds = {"learning_rate": self._lr, "step": self._step,
                 "params": [s.value for s in self._slots],
                 "gradients": [s.grad for s in self._slots]}
        for input_name, m in _MOMENTUM_OF_INPUT.items():
            if input_name in self._input_names:
                feeds[input_name] = [self._group.momentums[s.name][m] for s in self._slots]
        return {n: feeds[n] for n in self._input_names}

    def step(self) -> None:
        """One update of every trainable parameter from its accumulated gradient."""
        self._lr[0] = self._group.learning_rate
        self._step[0] = self._group.step + 1  # AdamW's step input is 1-based
        out = self._executor.run(self._feeds())
        flag = next(iter(out.values()), None)
        if flag is None or bool(np.asarray(flag).reshape(-1)[0]):
            self._group.step += 1

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate of the next steps."""
        if isinstance(learning_rate, bool) or not isinstance(learning_rate,
                                                             (int, float, np.floating)):
            raise TypeError(f"learning_rate: expected a float, got "
                            f"{type(learning_rate).__name__}")
        self._group.learning_rate = _f32(learning_rate)

    def get_learning_rate(self) -> float:
        """The current learning rate (float32, as ORT keeps it)."""
        return _f32(self._group.learning_rate)
