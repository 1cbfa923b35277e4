"""Optional timing of a wrapped model (``wrap(model, timing=True)``, or turned on by
``report(model, timing=True)``): the wall time of each forward call on ours or on torch,
and of each backward node those calls created (a pre-hook and a hook on the output's
``grad_fn``), summed per side. Off by default: the hooks cost a few microseconds per call."""

from __future__ import annotations

import time

import torch

_now = time.perf_counter_ns


class _NodeTimer:
    """Pre-hook and hook of one backward node: adds the node's run time to a side."""

    __slots__ = ("times", "side", "start")

    def __init__(self, times: dict, side: str):
        self.times, self.side, self.start = times, side, 0

    def pre(self, grad_outputs):
        self.start = _now()

    def post(self, grad_inputs, grad_outputs):
        if self.start:
            self.times[self.side] += _now() - self.start
            self.start = 0


def _hook_outputs(out, times: dict, side: str, seen: set) -> None:
    if isinstance(out, torch.Tensor):
        node = out.grad_fn
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            t = _NodeTimer(times, side)
            node.register_prehook(t.pre)
            node.register_hook(t.post)
    elif isinstance(out, (tuple, list)):
        for o in out:
            _hook_outputs(o, times, side, seen)


def timed(state, side: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with its forward time and its outputs' backward nodes
    counted on ``side`` (``"ours"`` or ``"torch"``) of ``state.times``."""
    t0 = _now()
    out = fn(*args, **kwargs)
    state.times["forward"][side] += _now() - t0
    if torch.is_grad_enabled():
        _hook_outputs(out, state.times["backward"], side, set())
    return out
