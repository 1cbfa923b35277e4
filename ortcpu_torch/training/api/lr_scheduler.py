"""``LinearLRScheduler``: linear warm-up to the initial learning rate, then linear decay to 0."""

from __future__ import annotations

import numpy as np

from .optimizer import Optimizer


class LinearLRScheduler:
    """Linear warm-up then linear decay of the optimizer's learning rate.

    After ``k`` optimizer steps the learning rate is (ONNX Runtime's documented schedule)::

        lr(k) = initial_lr * k / warmup_step_count                       k < warmup_step_count
        lr(k) = initial_lr * max(0, (total_step_count - k)
                                    / max(1, total_step_count - warmup_step_count))   otherwise

    ``k`` is the optimizer's step count (``Optimizer.step`` calls so far), so ``step()`` of
    the scheduler belongs after ``optimizer.step()``. Creating the scheduler sets the
    optimizer's initial learning rate to ``initial_lr`` (saved in checkpoints) and its
    current learning rate to ``lr(k)``.

    Difference from onnxruntime-training 1.19.2: its Python wrapper hands ``warmup_step_count``
    and ``total_step_count`` to the native scheduler in swapped order, so ORT itself computes
    ``initial_lr * k / total_step_count`` for ``k < total_step_count`` and 0 afterwards. Ours
    follows the documented schedule; ``LinearLRScheduler(opt, total, warmup, lr)`` reproduces
    ORT 1.19.2's numbers exactly.
    """

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int,
                 initial_lr: float):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer: expected an ortcpu_torch.training.api.Optimizer, got "
                            f"{type(optimizer).__name__}")
        for name, v in (("warmup_step_count", warmup_step_count),
                        ("total_step_count", total_step_count)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected a non-negative int, got {v!r}")
        if not isinstance(initial_lr, (int, float)) or isinstance(initial_lr, bool):
            raise TypeError(f"initial_lr: expected a float, got {type(initial_lr).__name__}")
        self._optimizer = optimizer
        self._warmup = warmup_step_count
        self._total = total_step_count
        self._initial_lr = float(initial_lr)
        optimizer._group.initial_lr = float(initial_lr)
        self._apply()

    def learning_rate_at(self, k: int) -> float:
        """The scheduled learning rate after ``k`` optimizer steps (float32 arithmetic, as
        ORT computes it, so equal schedules give bit-equal rates)."""
        f32 = np.float32
        if k < self._warmup:
            factor = f32(k) / f32(self._warmup)
        else:
            factor = max(f32(0), f32(self._total - k) / f32(max(1, self._total - self._warmup)))
        return float(f32(self._initial_lr) * factor)

    def _apply(self) -> None:
        self._optimizer.set_learning_rate(self.learning_rate_at(self._optimizer._group.step))

    def step(self) -> None:
        """Set the optimizer's learning rate for its current step count."""
        self._apply()
