"""Which side runs a call: ``wrap(model, select=...)``.

- ``"fastest"`` (the default): for each op and input signature (shapes, dtypes, which
  inputs need a gradient, scalar arguments, the module's training flag), the first call
  times a forward+backward of ours and of torch's on copies of the inputs (parameters
  and buffers copied too: no running statistics move, no gradient accumulates, the RNG
  state is restored) and keeps the faster side for every later call with that signature.
  Ours loses on tiny tensors (a Python autograd.Function's fixed cost of tens of
  microseconds) and wins on large ones (arena memory, fused kernels), so no single side
  is right for a whole model: this keeps the wrap from making any op slower.
- ``"ours"``: every supported call runs on our kernels (deterministic placement; what
  the tests of our kernels use).
- a dict ``{signature key: "ours" | "torch"}`` (``report(model).selection``): replays
  earlier choices (reproducible runs); a signature not in it is measured.

How a choice is measured (``measure``), so that it comes out the same from run to run:
the clock is the calling thread's CPU time, not wall time (a wall clock counts the time
the OS gave other processes, and on an oversubscribed machine a 2-thread OpenMP region
waits for a descheduled worker: measured 44 ms instead of 0.1 ms for a LayerNorm); the
forward and the whole backward run on the calling thread (CPU autograd) and our and
torch's parallel regions keep it busy to their end, so its CPU time is the call's wall
time on an idle machine. Each side runs in alternating blocks of repetitions (a block
lasts about ``_BLOCK_S``), its time is the median over all runs (the call a step pays:
torch's convolution backward on digits' 64x32x4x4 layer ran 0.73-0.84 ms at best but
1.08-1.30 ms in the median call, ours 1.04 / 1.12, and the fastest run chose torch),
and a ratio within 2 x ``MARGIN`` of the decision line is measured again in more blocks.
Ties go to torch: ours runs only where it measured at least ``MARGIN`` (and
``MIN_GAIN_S``) faster, so a choice flips between runs only for an op whose two sides
lie near that line, and the wrap never trades torch's op for one of ours that is not
clearly faster. (What is left of load in this clock is OpenMP's spin-wait: a thread
spinning at a barrier for a descheduled worker burns CPU time. With
``OMP_WAIT_POLICY=PASSIVE`` the choices repeat even on a loaded machine.)

Random ops (``Dropout``, ``F.dropout``, attention with ``dropout_p > 0``) are not timed:
under ``"fastest"`` they run on torch. Our dropout draws its mask from a seed taken from
torch's generator, so its mask differs from torch's; a timed choice near the line would
flip between runs and with it the random stream, so the same ``torch.manual_seed`` would
give another loss curve. Kept on torch, a wrapped model's run is plain torch's run.

Every choice, with both timings, is listed by ``report()``.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.nn.utils.stateless import _reparametrize_module

from ..ops._layout import channels_last
from .policy import RANDOM_TORCH, Unsupported

SELECT_MODES = ("fastest", "ours")
#: ours runs where its time is below torch's by at least this fraction and by at least
#: MIN_GAIN_S seconds (below that, the run-to-run noise of a call); ties go to torch
MARGIN = 0.05
MIN_GAIN_S = 10e-6
_BLOCKS = 3  # alternating blocks per side; as many again when the ratio is near a tie
_MIN_REPS, _MAX_REPS = 2, 25  # runs per block
_BLOCK_S = 1.5e-3  # CPU seconds a block aims at (tiny calls get more runs)


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


def _layout_tag(t: torch.Tensor) -> str:
    """How a non-contiguous tensor is laid out, for a signature: its layout changes both
    sides' costs (ours computes channels_last convolutions in NCHW between two copies)."""
    if t.is_contiguous():
        return ""
    return " channels_last" if channels_last(t) is not None else " strided"


def _sig(v) -> str:
    if isinstance(v, torch.Tensor):
        d = str(v.dtype).replace("torch.", "").replace("float", "f")
        return f"{d}{list(v.shape)}{'g' if v.requires_grad else ''}{_layout_tag(v)}"
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


_clock = time.thread_time


def _time_once(fn, args, kwargs) -> float:
    """One forward+backward of ``fn`` on copies of the arguments; the copies (and a module
    runner's copies of its parameters, ``fn.prepare``) and the output gradients are made
    off the clock."""
    a, k = _copy(args), {n: _copy(v) for n, v in kwargs.items()}
    prepare = getattr(fn, "prepare", None)
    if prepare is not None:
        prepare()
    t0 = _clock()
    outs = _outputs(fn(*a, **k))
    t = _clock() - t0
    if outs:
        grads = [torch.ones_like(o) for o in outs]
        t0 = _clock()
        torch.autograd.backward(outs, grads)
        t += _clock() - t0
    return t


def decide(ours_s: float, torch_s: float) -> str:
    """The side of a measured pair: ours only if at least ``MARGIN`` and ``MIN_GAIN_S``
    faster than torch."""
    return "ours" if ours_s <= torch_s * (1.0 - MARGIN) and torch_s - ours_s >= MIN_GAIN_S \
        else "torch"


def _near_tie(ours_s: float, torch_s: float) -> bool:
    """Whether the ratio ours/torch lies within 2 x ``MARGIN`` of the decision line."""
    return abs(ours_s - torch_s * (1.0 - MARGIN)) <= 2 * MARGIN * torch_s


def measure(run_ours, run_torch, args, kwargs) -> dict:
    """Forward+backward CPU time of each side on copies of the inputs (see the module
    docstring): one warm-up run per side, then ``_BLOCKS`` blocks per side, alternating
    (ours-torch-ours-torch...; blocks, not single calls, so that one side's leftover
    OpenMP spinning is not charged to the other call by call), as many blocks again when
    the ratio is within 2 x ``MARGIN`` of the decision line; each side's time is its median
    run. Ours raising (a configuration it does not take) counts as ours, so the normal
    path reports the fallback."""
    rng = torch.get_rng_state()
    sides = (("ours", run_ours), ("torch", run_torch))
    try:
        first = {side: _time_once(fn, args, kwargs) for side, fn in sides}  # warm-up
        reps = max(_MIN_REPS, min(_MAX_REPS, int(_BLOCK_S / max(max(first.values()), 1e-7))))
        runs = {side: [] for side in first}
        for blocks in (_BLOCKS, _BLOCKS):
            for _ in range(blocks):
                for side, fn in sides:
                    runs[side] += [_time_once(fn, args, kwargs) for _ in range(reps)]
            best = {side: statistics.median(ts) for side, ts in runs.items()}
            if not _near_tie(best["ours"], best["torch"]):
                break
    except (Unsupported, TypeError, ValueError, RuntimeError):
        return {"side": "ours", "ours_ms": None, "torch_ms": None}
    finally:
        torch.set_rng_state(rng)
    o, t = best["ours"], best["torch"]
    return {"side": decide(o, t), "ours_ms": o * 1e3, "torch_ms": t * 1e3}


def module_runner(module, forward, before=None):
    """``forward(module, *args)`` with the module's parameters and buffers replaced by
    copies (nothing of the real module is changed, no hooks fire); ``before()`` first.
    ``run.prepare()`` makes the copies for the next call (off ``measure``'s clock)."""
    pending = []

    def prepare():
        state = {n: _copy(t) for n, t in module.named_parameters()}
        state.update({n: _copy(t) for n, t in module.named_buffers()})
        pending.append(state)

    def run(*args, **kwargs):
        if before is not None:
            before()
        if not pending:
            prepare()
        with _reparametrize_module(module, pending.pop()):
            return forward(module, *args, **kwargs)

    run.prepare = prepare
    return run


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SCALARS = frozenset((int, float, bool, str, type(None)))


def _key(v):
    if type(v) in _PLAIN or isinstance(v, torch.Tensor):
        # torch.Size hashes as a tuple
        return (v.shape, v.dtype, v.requires_grad, v.is_contiguous())
    if isinstance(v, (list, tuple)):
        return tuple(_key(x) for x in v)
    try:
        hash(v)
    except TypeError:
        return type(v).__name__
    return v


def call_key(args, kwargs):
    """A hashable key of a call's arguments for ``choose``: per tensor its shape, dtype,
    whether it needs a gradient and whether it is contiguous (a channels_last call is
    measured apart); other values themselves (their type name if unhashable). The common
    call, tensors only and no keywords, takes one attribute tuple per tensor."""
    a = tuple([(a.shape, a.dtype, a.requires_grad, a.is_contiguous()) if type(a) in _PLAIN
               else _key(a) for a in args])
    if not kwargs:
        return a
    # keyword arguments are mostly scalars (a functional's defaults spelled out by torch's
    # dispatch): those are their own key
    return a, tuple([(k, v if type(v) in _SCALARS else _key(v)) for k, v in kwargs.items()])


def _arg(args, kwargs, i, name, default):
    return kwargs.get(name, args[i] if len(args) > i else default)


#: functional name -> whether a call draws random numbers (see the module docstring)
RANDOM_FUNCS = {
    "F.dropout": lambda a, k: _arg(a, k, 1, "p", 0.5) > 0 and _arg(a, k, 2, "training", True),
    "F.scaled_dot_product_attention": lambda a, k: _arg(a, k, 4, "dropout_p", 0.0) > 0,
}
#: swapped module entry name -> whether its call draws random numbers
RANDOM_MODULES = {"Dropout": lambda m: m.training and m.p > 0}


def choose(state, name: str, extra, run_ours, run_torch, args, kwargs, key=None,
           stats=None, random=None) -> str:
    """"ours" or "torch" for this call of ``name`` (``extra``: what else tells calls
    apart, e.g. a module's configuration and training flag; ``key``: a caller's own
    hashable key for the same, computed more cheaply). The per-call cost is one tuple key;
    the readable signature is built once per new key. A random op is torch's, untimed
    (``stats.chose_why`` then says so; ``random``: whether this call draws random
    numbers, by default from ``RANDOM_FUNCS``)."""
    fast = (name, extra, call_key(args, kwargs)) if key is None else key
    side = state.sides.get(fast)
    if random is None:
        draws = RANDOM_FUNCS.get(name)
        random = draws is not None and bool(draws(args, kwargs))
    if side is None:
        sig = signature(name, args, kwargs, f" {extra}" if extra else "")
        c = state.choices.get(sig)
        if c is None:
            if random:
                c = {"side": "torch", "ours_ms": None, "torch_ms": None, "random": True}
            elif state.all_torch:  # the in-model check put everything on torch
                c = {"side": "torch", "ours_ms": None, "torch_ms": None, "model_check": True}
            else:
                c = measure(run_ours, run_torch, args, kwargs)
            state.choices[sig] = c
        # (the in-model check's all-torch arm: this call's table is that arm's)
        side = state.sides[fast] = "torch" if state.torch_arm else c["side"]
    if random and side == "torch" and stats is not None:
        stats.chose_why = RANDOM_TORCH
    return side
