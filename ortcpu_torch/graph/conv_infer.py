"""The inference Conv of the graph executor (native/src/conv_infer.c): weights packed once
per plan, a direct convolution on NCHW with the bias, a residual addend and ReLU applied
as the output leaves the registers (no im2col buffer, no extra passes over Y).

It tiles the output as 6 channels x 16 positions ("packed"), or for small maps in float32
also as 16 channels x 6 positions ("channels", no lanes lost to 7x7 maps). A float32 Conv
of one group on AVX-512 builds is also a GEMM candidate ("gemm": gemm_p16's 8x32 tile on
the transposed implicit GEMM, positions x output channels, native ``conv_p16`` and
``conv1x1_p16``). Which of these
and the training kernel (``conv_forward``: im2col/Winograd/depthwise + GEMM, the epilogue
as separate in-place passes) runs a Conv is decided per shape by measurement:
the first run of a plan times them on its real inputs (wall time, the plan's thread
count, the median of 7 alternating rounds) and keeps the faster; decisions are cached per
(geometry, dtype, epilogue, threads) for the process, so later plans of the same shapes
do not time again.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from .._native import check_status, empty, ffi, get_num_threads, lib, native_fn, ptr
from ..kernels.gemm import PackedWeight

#: (geometry, dtype, bias?, steps, into a buffer?, threads) -> "packed" / "channels" /
#: "gemm" / "training"
_DECIDED: dict[tuple, str] = {}
#: "auto" (measure), or "packed" / "channels" / "gemm" / "training" for every Conv bound
#: from now on ("channels" and "gemm" run "packed" where they do not apply)
_MODE = [os.environ.get("ORTCPU_GRAPH_CONV", "auto").strip().lower() or "auto"]
MODES = ("auto", "packed", "channels", "gemm", "training")
if _MODE[0] not in MODES:
    raise ValueError(f"ORTCPU_GRAPH_CONV must be one of {MODES}, got {_MODE[0]!r}")
#: timing rounds per candidate (alternating), after one warm-up call each; a candidate's
#: time is its median round, not its fastest: torch's convolution backward on digits'
#: 64x32x4x4 layer ran 0.73-0.84 ms at best but 1.08-1.30 ms in the median call (ours
#: 1.04 / 1.12), so the fastest of 3 rounds picked it where a training step pays the
#: median
ROUNDS = 7
#: whether measured choices keep their losing candidates (``keep_candidates``)
_KEEP = [False]
#: a round repeats a call until it has run at least this long (the clock resolves it)
MIN_ROUND_S = 2e-4


def infer_geometry(geom: list) -> list | None:
    """conv_infer's 16-entry geometry for ``conv_geometry``'s (1-D/2-D, begin pads >= 0),
    else None."""
    n, c, m, group = geom[0:4]
    ins, k, out, s, p, d = (geom[4 + 3 * i: 7 + 3 * i] for i in range(6))
    if ins[0] != 1 or k[0] != 1 or out[0] != 1 or p[0] != 0 or p[1] < 0 or p[2] < 0 or \
            s[1] > 64 or s[2] > 64 or out[1] < 1 or out[2] < 1:
        return None
    return [n, c, ins[1], ins[2], m, group, k[1], k[2], out[1], out[2], s[1], s[2], p[1],
            p[2], d[1], d[2]]


#: output positions per sample up to which channel tiles are a candidate (28 x 28)
CHANNEL_TILES_MAX_POSITIONS = 784


def channel_tiles(geom: list, dtype: torch.dtype) -> bool:
    """Whether channel tiles (layout 1: 16 output channels x 6 positions, float32) are a
    candidate for ``infer_geometry``'s geometry besides row tiles (6 channels x 16
    positions): small maps, where row tiles waste lanes (7x7 = 49 positions fill 64) and
    a 3x3's taps gathered per 6 positions measured faster (resnet50's 7x7 to 28x28 3x3s),
    with at least 16 output channels per group."""
    return dtype == torch.float32 and geom[8] * geom[9] <= CHANNEL_TILES_MAX_POSITIONS and \
        geom[4] // max(1, geom[5]) >= 16


class PackedConv:
    """One Conv geometry with its weight packed: ``run(x, b, res, relu, out)`` ->
    relu?(conv(x, W) + b + res) into ``out`` (a fresh tensor when None). Inputs must be
    contiguous tensors of the geometry's shapes and dtype (the caller checks). ``layout``:
    0 row tiles, 1 channel tiles (float32 only)."""

    def __init__(self, w: torch.Tensor, geom: list, out_shape: tuple, layout: int = 0):
        self.dtype = w.dtype
        self.out_shape = tuple(out_shape)
        geom = list(geom)[:16]
        self.layout = layout
        self.geom = ffi.new("int64_t[]", [*geom, layout])
        size = ffi.new("int64_t *")
        check_status(lib.ortcpu_conv_infer_packed_size(self.geom, size), "Conv")
        self.packed = torch.empty(size[0], dtype=w.dtype)
        w = w.contiguous()
        check_status(native_fn("conv_infer_pack", w.dtype)(ptr(w), self.geom,
                                                           ptr(self.packed)), "Conv")
        self._fn = native_fn("conv_infer", w.dtype)

    def run(self, x, b=None, res=None, relu=False, out=None, pack_all=False):
        """``pack_all``: every chunk's input columns packed, none read in place (tests)."""
        y = empty(self.out_shape, self.dtype) if out is None else out
        check_status(self._fn(ptr(x), ptr(self.packed), ptr(b), ptr(res), ptr(y), self.geom,
                              (1 if relu else 0) | (2 if pack_all else 0),
                              get_num_threads()), "Conv")
        return y


def gemm_candidate(geom: list, dtype: torch.dtype) -> bool:
    """Whether ``infer_geometry``'s geometry is a float32 Conv of one group, which
    ``GemmConv`` runs (AVX-512 builds only)."""
    return dtype == torch.float32 and geom[5] == 1 and \
        bool(lib.ortcpu_conv_p16_available())


class GemmConv:
    """A ``gemm_candidate`` Conv on gemm_p16's AVX-512 tile, the weight packed once as
    W^T [C*KH*KW, M]: Y^T = im2col(X)^T W^T per sample without an im2col matrix (native
    ``conv_p16``: tiles of 8 positions of one output row), or for an unpadded 1x1 Conv
    Y^T = X^T W^T over the flattened positions (``conv1x1s_p16``; a strided one reads X
    subsampled into a scratch copy, a quarter of X or less); with ``PackedConv.run``'s
    signature."""

    def __init__(self, w: torch.Tensor, geom: list, out_shape: tuple):
        self.dtype = w.dtype
        self.out_shape = tuple(out_shape)
        n, c, h, wd, m = geom[:5]
        oh, ow, sh, sw = geom[8:12]
        self.nb, self.k, self.n, self.p = n, c, m, oh * ow
        self.pointwise = geom[6] == geom[7] == 1 and geom[12] == geom[13] == 0 and \
            (oh, ow) == ((h - 1) // sh + 1, (wd - 1) // sw + 1)
        self.map = (h, wd, sh, sw)
        self.geom = ffi.new("int64_t[]", list(geom)[:16])
        self.weight = PackedWeight.pack(w.reshape(m, -1), trans_b=True)

    def run(self, x, b=None, res=None, relu=False, out=None):
        """``out``: contiguous, or a channel slice of a wider contiguous tensor (samples
        ``out.stride(0)`` apart; ``sample_strided``)."""
        y = empty(self.out_shape, self.dtype) if out is None else out
        ystride = y.stride(0) if self.nb > 1 else 0
        if self.pointwise:  # a strided one reads X subsampled, natively
            st = lib.ortcpu_conv1x1s_p16(self.nb, self.n, self.k, *self.map, ptr(x),
                                         ptr(self.weight.data), ptr(b), ptr(res), int(relu),
                                         ptr(y), ystride, get_num_threads())
        else:
            st = lib.ortcpu_conv_p16(ptr(x), ptr(self.weight.data), ptr(b), ptr(res),
                                     int(relu), ptr(y), ystride, self.geom, get_num_threads())
        check_status(st, "Conv")
        return y


def sample_strided(t: torch.Tensor) -> bool:
    """Whether ``t`` [N, C, ...] is contiguous within each sample, samples ``t.stride(0)``
    elements apart (a channel slice of a contiguous tensor: a Concat's buffer)."""
    return t.dim() >= 2 and t[0].is_contiguous() and t.stride(0) >= t[0].numel()


def set_mode(mode: str) -> None:
    """``"auto"``: each Conv signature runs on whichever kernel measured faster (the
    default; ``ORTCPU_GRAPH_CONV`` sets it at import); ``"packed"`` / ``"channels"`` /
    ``"gemm"`` / ``"training"``: that
    kernel for every Conv whose first run comes after this call (reproducible rounding,
    e.g. for outputs that are exact ties)."""
    if mode not in MODES:
        raise ValueError(f"set_mode: mode must be one of {MODES}, got {mode!r}")
    _MODE[0] = mode


def get_mode() -> str:
    return _MODE[0]


def keep_candidates(keep: bool) -> None:
    """``True``: Convs bound from now on keep every candidate after their measured choice
    (benchmarks force each in turn); by default (``False``) the choice drops the others and
    with them their packed weights (small maps pack both tile layouts: resnet50's 14x14 and
    7x7 stages hold most of its weights)."""
    _KEEP[0] = bool(keep)


def measured_choice(key: tuple, candidates: dict):
    """A callable running the faster of ``candidates`` (name -> callable, same signature,
    no side effects beyond their output), timed on the first call's arguments (or decided
    earlier for ``key`` in this process); a measured choice then drops the other
    candidates (``keep_candidates``). A mode other than "auto" picks by name and keeps
    them all."""
    chosen: list = []  # [callable, its name] once decided
    keep = _KEEP[0]

    def run(*args):
        if not chosen:
            mode = _MODE[0]
            if mode == "auto":
                name = _DECIDED.get(key) or _pick(key, candidates, args)
                chosen[:] = [candidates[name], name]
                if not keep:
                    for other in [o for o in candidates if o != name]:
                        del candidates[other]
            else:
                if mode in ("channels", "gemm") and mode not in candidates:
                    mode = "packed"
                name = mode if mode in candidates else _pick(key, candidates, args)
                chosen[:] = [candidates[name], name]
        return chosen[0](*args)

    def force(name):
        """Run ``candidates[name]`` from now on (benchmarks compare them)."""
        if name not in candidates:
            raise KeyError(f"conv candidate {name!r} is not kept (have {sorted(candidates)}); "
                           "call conv_infer.keep_candidates(True) before the plan is bound")
        chosen[:] = [candidates[name], name]
    run.__name__ = run.__qualname__ = "measured_choice"
    run.candidates = candidates
    run.force = force
    run.key = key
    run.chosen_name = lambda: chosen[1] if chosen else None  # None until the first call
    return run


def _pick(key, candidates, args) -> str:
    rounds = {name: [] for name in candidates}
    reps = {}
    for name, f in candidates.items():  # warm-up; its time sets the repetitions
        t0 = time.perf_counter()
        f(*args)
        dt = time.perf_counter() - t0
        reps[name] = max(1, min(50, int(MIN_ROUND_S / max(dt, 1e-7))))
    order = list(candidates.items())
    for _ in range(ROUNDS):
        for name, f in order:
            n = reps[name]
            t0 = time.perf_counter()
            for _ in range(n):
                f(*args)
            rounds[name].append((time.perf_counter() - t0) / n)
        order.reverse()
    median = {name: statistics.median(ts) for name, ts in rounds.items()}
    choice = min(median, key=median.get)
    _DECIDED[key] = choice
    return choice


def decisions() -> dict:
    """The choices made so far (key -> "packed" / "channels" / "gemm" / "training"), for
    reports and benchmarks."""
    return dict(_DECIDED)


def bind_static_conv(generic, w_const, geom, out_shape, xs, bs, dt, steps, into_buffer):
    """The Conv callable of a plan whose X/W/B signature is static and W (and B) constant:
    ``generic`` (the training kernel's static binding, ``generic(x, w, b, out=None)``) and
    the packed inference kernel, chosen by ``measured_choice``; ``steps``: the fused
    epilogue ("add" residual as the last argument, then "relu") or [] / None. Returns
    ``fn(x, w, b, *rest)`` with the same arguments as the node, or None when the packed
    kernel does not apply."""
    g16 = infer_geometry(geom)
    if g16 is None or not isinstance(w_const, torch.Tensor) or w_const.dtype != dt:
        return None
    steps = list(steps or [])
    if steps not in ([], ["relu"], ["add"], ["add", "relu"]):
        return None
    if into_buffer and "add" in steps:
        return None
    packed = PackedConv(w_const, g16, out_shape)
    chan = PackedConv(w_const, g16, out_shape, 1) if channel_tiles(g16, dt) else None
    relu, add = "relu" in steps, "add" in steps
    ws, y_shape = w_const.shape, packed.out_shape

    def fits(x, w, b, r=None):
        return w is w_const and x.dtype == dt and x.shape == xs and x.is_contiguous() and \
            (b is None or (b.dtype == dt and b.shape == bs and b.is_contiguous())) and \
            (r is None or (r.dtype == dt and r.shape == y_shape and r.is_contiguous()))

    def slow(x, w, b, r=None, out=None):  # the generic binding + torch epilogue
        # (into a channel slice of a Concat's buffer at batch > 1 through a copy: the
        # generic kernels write contiguous outputs)
        flat = out is not None and out.is_contiguous()
        y = generic(x, w, b, out=out) if flat else generic(x, w, b)
        if out is not None and y is not out:  # the registry kernel took other inputs
            y = out.copy_(y)
        if r is not None:
            y.add_(r)
        return y.relu_() if relu else y

    def native(pc, strided_ok=False):
        if add:
            def infer(x, w, b, r):
                if not fits(x, w, b, r) or ws != w.shape:
                    return slow(x, w, b, r)
                return pc.run(x, b, r, relu)
        elif into_buffer:
            def infer(x, w, b, out):
                if not fits(x, w, b):
                    return slow(x, w, b, out=out)
                if out.is_contiguous() or (strided_ok and sample_strided(out)):
                    return pc.run(x, b, None, relu, out)
                return out.copy_(pc.run(x, b, None, relu))
        else:
            def infer(x, w, b=None):
                if not fits(x, w, b):
                    return slow(x, w, b)
                return pc.run(x, b, None, relu)
        return infer

    if add:
        def gen(x, w, b, r):
            return slow(x, w, b, r)
    elif into_buffer:
        def gen(x, w, b, out):
            return slow(x, w, b, out=out)
    else:
        def gen(x, w, b=None):
            return slow(x, w, b)
    key = (tuple(g16), dt, bs is not None, tuple(steps), bool(into_buffer),
           get_num_threads())
    cands = {"packed": native(packed), "training": gen}
    if chan is not None:
        cands["channels"] = native(chan)
    if gemm_candidate(g16, dt):
        cands["gemm"] = native(GemmConv(w_const, g16, out_shape), strided_ok=True)
    return measured_choice(key, cands)
