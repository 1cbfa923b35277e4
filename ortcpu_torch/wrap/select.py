"""Which side runs a call: ``wrap(model, select=...)``.

- ``"fastest"`` (the default): for each op and input signature (shapes, dtypes, which
  inputs need a gradient, scalar arguments, the module's training flag), the first call
  times a forward+backward of ours and of torch's on copies of the inputs (parameters
  and buffers copied too: no running statistics move, no gradient accumulates, the RNG
  state is restored), alternating, and the faster side runs every later call with that
  signature. Ours loses on tiny tensors (a Python autograd.Function's fixed cost of tens
  of microseconds) and wins on large ones (arena memory, fused kernels), so no single
  side is right for a whole model: this keeps the wrap from making any op slower.
- ``"ours"``: every supported call runs on our kernels (deterministic placement; what
  the tests of our kernels use).
- a dict ``{signature key: "ours" | "torch"}`` (``report(model).selection``): replays
  earlier choices (reproducible runs); a signature not in it is measured.

Every choice, with both timings, is listed by ``report()``.
"""

from __future__ import annotations

import time

import torch
from torch.nn.utils.stateless import _reparametrize_module

SELECT_MODES = ("fastest", "ours")
_REPS = 2  # runs per side and block, at least
_MAX_REPS = 10
_BLOCK_S = 2e-3


def check_select(select):
    if isinstance(select, dict):
        bad = {k: v for k, v in select.items() if v not in ("ours", "torch")}
        if bad:
            raise ValueError(f"wrap: select dict values must be 'ours' or 'torch', got {bad}")
        return "fastest", {k: {"side": v, "ours_ms": None, "torch_ms": None}
                           for k, v in select.items()}
    if select not in SELECT_MODES:
        raise ValueError(f"wrap: select must be one of {SELECT_MODES} or a dict of choices "
                         f"(report(model).selection), got {select!r}")
    return select, {}


def _sig(v) -> str:
    if isinstance(v, torch.Tensor):
        d = str(v.dtype).replace("torch.", "").replace("float", "f")
        return f"{d}{list(v.shape)}{'g' if v.requires_grad else ''}"
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_sig(x) for x in v) + ")"
    r = repr(v)
    return r if len(r) <= 24 else type(v).__name__


def signature(name: str, args, kwargs, extra: str = "") -> str:
    parts = [_sig(a) for a in args] + [f"{k}={_sig(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)}){extra}"


def _copy(v):
    if isinstance(v, torch.Tensor):
        c = v.detach().clone()
        return c.requires_grad_(v.requires_grad and c.is_floating_point())
    if isinstance(v, (list, tuple)):
        return type(v)(_copy(x) for x in v)
    return v


def _outputs(out):
    if isinstance(out, torch.Tensor):
        return [out] if out.requires_grad else []
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _outputs(o)]
    return []


def _time_once(fn, args, kwargs) -> float:
    a, k = _copy(args), {n: _copy(v) for n, v in kwargs.items()}
    t0 = time.perf_counter()
    outs = _outputs(fn(*a, **k))
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return time.perf_counter() - t0


def measure(run_ours, run_torch, args, kwargs) -> dict:
    """Forward+backward time of each side on copies of the inputs: the best of a few runs
    (the fastest run is what the side can do; slower ones were slowed by whatever else the
    machine ran), in two blocks per side, ours-torch-ours-torch (a block, not call by
    call: alternating call by call would charge each side the other's OpenMP threads still
    spinning; two blocks, so a burst of load elsewhere does not decide alone). The first
    run of each side is a warm-up; calls that take microseconds, where the per-call cost
    is what is decided, get more runs (up to ``_MAX_REPS`` per block, about
    ``_BLOCK_S`` of time). Ours raising (a configuration it does not take) counts as ours,
    so the normal path reports the fallback."""
    rng = torch.get_rng_state()
    sides = (("ours", run_ours), ("torch", run_torch))
    try:
        first = {side: _time_once(fn, args, kwargs) for side, fn in sides}  # warm-up
        reps = max(_REPS, min(_MAX_REPS, int(_BLOCK_S / max(max(first.values()), 1e-9))))
        times = {side: [] for side, _ in sides}
        for _ in range(2):
            for side, fn in sides:
                times[side] += [_time_once(fn, args, kwargs) for _ in range(reps)]
    except (TypeError, ValueError, RuntimeError):
        return {"side": "ours", "ours_ms": None, "torch_ms": None}
    finally:
        torch.set_rng_state(rng)
    o, t = min(times["ours"]), min(times["torch"])
    return {"side": "ours" if o <= t else "torch", "ours_ms": o * 1e3, "torch_ms": t * 1e3}


def module_runner(module, forward, before=None):
    """``forward(module, *args)`` with the module's parameters and buffers replaced by
    copies (nothing of the real module is changed, no hooks fire); ``before()`` first."""

    def run(*args, **kwargs):
        if before is not None:
            before()
        state = {n: _copy(t) for n, t in module.named_parameters()}
        state.update({n: _copy(t) for n, t in module.named_buffers()})
        with _reparametrize_module(module, state):
            return forward(module, *args, **kwargs)

    return run


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SCALARS = frozenset((int, float, bool, str, type(None)))


def _key(v):
    if type(v) in _PLAIN or isinstance(v, torch.Tensor):
        return (v.shape, v.dtype, v.requires_grad)  # torch.Size hashes as a tuple
    if isinstance(v, (list, tuple)):
        return tuple(_key(x) for x in v)
    try:
        hash(v)
    except TypeError:
        return type(v).__name__
    return v


def call_key(args, kwargs):
    """A hashable key of a call's arguments for ``choose``: per tensor its shape, dtype and
    whether it needs a gradient; other values themselves (their type name if unhashable).
    The common call, tensors only and no keywords, takes one attribute tuple per tensor."""
    a = tuple([(a.shape, a.dtype, a.requires_grad) if type(a) in _PLAIN else _key(a)
               for a in args])
    if not kwargs:
        return a
    # keyword arguments are mostly scalars (a functional's defaults spelled out by torch's
    # dispatch): those are their own key
    return a, tuple([(k, v if type(v) in _SCALARS else _key(v)) for k, v in kwargs.items()])


def choose(state, name: str, extra, run_ours, run_torch, args, kwargs, key=None) -> str:
    """"ours" or "torch" for this call of ``name`` (``extra``: what else tells calls
    apart, e.g. a module's configuration and training flag; ``key``: a caller's own
    hashable key for the same, computed more cheaply). The per-call cost is one tuple key;
    the readable signature is built once per new key."""
    fast = (name, extra, call_key(args, kwargs)) if key is None else key
    side = state.sides.get(fast)
    if side is None:
        sig = signature(name, args, kwargs, f" {extra}" if extra else "")
        c = state.choices.get(sig)
        if c is None:
            c = state.choices[sig] = measure(run_ours, run_torch, args, kwargs)
        side = state.sides[fast] = c["side"]
    return side
