"""``torch.compile`` of a wrapped model: our kernels inside the compiled graph.

While Dynamo traces the wrapped model, the root's forward wrapper (``RootForward``) enters
``CompiledKernelMode`` instead of the eager ``KernelMode``: a ``TorchFunctionMode`` that
sends the supported functionals (``F.linear``, ``F.gelu``, ``F.layer_norm``,
``F.batch_norm``, ``F.conv2d``, ``F.cross_entropy``, ...) to the ``ortcpu::`` custom ops
of ``ops/library.py``. Swapped modules run torch's module forward under it, so
``nn.Linear`` becomes ``ortcpu::linear`` in the graph the same way ``F.linear`` does.
Dynamo inlines the mode, so the graph holds the custom ops as opaque calls with their
fake shapes and autograd formulas, and AOTAutograd puts the matching backward ops in
the backward graph; Inductor compiles everything else.

Nothing here counts or measures: state read while tracing becomes a guard, and a guard
that changes every call recompiles every call (issue 14). Each adapter takes torch's
signature and returns ``NotImplemented`` for what our ops do not take (the call then
runs torch's, traced as usual); its checks read only dtypes, ranks and arguments,
which Dynamo specialises on anyway.

Which families are routed: ``wrap(model, compile_kernels=...)`` (see ``FAMILIES``).
"""

from __future__ import annotations

import functools
import math
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .._native import lib
from ..ops import library as L
from ..ops.attention import fusable, grouped_fusable
from ..ops.conv import _tuple
from ..ops.pool import _pool_attrs
from .policy import FLOATS

_OPS = L.OPS  # the current overloads (library.OVERLOAD)


def _floats(*ts) -> bool:
    """Dense CPU float32/float64 tensors of one dtype (None allowed)."""
    dt = None
    for t in ts:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or \
                t.layout != torch.strided or t.dtype not in FLOATS:
            return False
        if dt is None:
            dt = t.dtype
        elif t.dtype != dt:
            return False
    return dt is not None


# ---- adapters: torch's signature in, an ortcpu:: op (or NotImplemented) out -------------


def _linear_adapter(pick: bool):
    def adapter(input, weight, bias=None):
        if not _floats(input, weight, bias) or weight.dim() != 2 or input.dim() < 1 or \
                (bias is not None and bias.dim() != 1):
            return NotImplemented
        return _OPS.linear(input, weight, bias, pick)
    return adapter


_linear = _linear_adapter(False)


def _addmm_adapter(pick: bool):
    """``torch.addmm(bias, x, w)`` with a 1-D bias, as Hugging Face's ``Conv1D`` (GPT-2)
    computes ``x·w + bias``: ``linear`` of ``w`` as it lies ([in, out], no copy)."""
    def adapter(input, mat1, mat2, *, beta=1, alpha=1, out=None):
        if out is not None or beta != 1 or alpha != 1 or \
                not _floats(input, mat1, mat2) or mat1.dim() != 2 or mat2.dim() != 2 or \
                input.dim() != 1 or input.shape[0] != mat2.shape[1]:
            return NotImplemented
        return _OPS.linear(mat1, mat2, input, pick, True)
    return adapter


_addmm = _addmm_adapter(False)


_GELU = {"none": 0, "tanh": 1}


def _gelu(input, approximate="none"):
    if approximate not in _GELU or not _floats(input):
        return NotImplemented
    return _OPS.gelu(input, _GELU[approximate])


def _act(kind: str, alpha: float = 0.0):
    def adapter(input, inplace=False):
        if inplace or not _floats(input):
            return NotImplemented
        return _OPS.act(input, kind, alpha)
    return adapter


def _leaky_relu(input, negative_slope=0.01, inplace=False):
    if inplace or not _floats(input) or not isinstance(negative_slope, (int, float)):
        return NotImplemented
    return _OPS.act(input, "LeakyRelu", float(negative_slope))


def _hard(kind: str, a: float, b: float):
    def adapter(input, inplace=False):
        if inplace or not _floats(input):
            return NotImplemented
        return _OPS.hard(input, kind, a, b)
    return adapter


def _hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if inplace or not _floats(input) or not min_val <= max_val:
        return NotImplemented
    return _OPS.hard(input, "hardtanh", float(min_val), float(max_val))


def _softmax_any(log: bool, input, dim, dtype):
    if dim is None or dtype is not None or not _floats(input) or input.dim() == 0 or \
            not isinstance(dim, int):
        return NotImplemented
    return _OPS.softmax(input, dim, log)


def _softmax_f(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax_any(False, input, dim, dtype)


def _softmax_t(input, dim, dtype=None):
    return _softmax_any(False, input, dim, dtype)


def _log_softmax_f(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax_any(True, input, dim, dtype)


def _log_softmax_t(input, dim, dtype=None):
    return _softmax_any(True, input, dim, dtype)


def _norm_dims(input, normalized_shape, *params):
    shp = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shp or len(shp) > input.dim() or tuple(input.shape[input.dim() - len(shp):]) != shp:
        return None
    if any(p is not None and tuple(p.shape) != shp for p in params):
        return None
    return len(shp)


# A norm over a permuted input (ConvNeXt's channels-last blocks) stays Inductor's: ours
# would copy it contiguous first, where Inductor reads the permutation inside its fused
# norm kernel. ConvNeXt-style, compiled wrapped vs eager wrapped, 5 separate processes
# each: 0.96-1.03x (median 0.98x) with ours, 0.97-1.06x (median 1.03x) without.
def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if not _floats(input, weight, bias) or not input.is_contiguous():
        return NotImplemented
    ndim = _norm_dims(input, normalized_shape, weight, bias)
    if ndim is None:
        return NotImplemented
    return _OPS.layer_norm(input, weight, bias, ndim, float(eps), False)[0]


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    if not _floats(input, weight) or not input.is_contiguous():
        return NotImplemented
    ndim = _norm_dims(input, normalized_shape, weight)
    if ndim is None:
        return NotImplemented
    e = torch.finfo(input.dtype).eps if eps is None else float(eps)
    return _OPS.layer_norm(input, weight, None, ndim, e, True)[0]


def _batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
                momentum=0.1, eps=1e-5):
    if not _floats(input, weight, bias) or input.dim() < 2 or \
            not isinstance(training, bool) or (running_mean is None) != (running_var is None):
        return NotImplemented
    if not training and running_mean is None:
        return NotImplemented
    for r in (running_mean, running_var):
        if r is not None and (not isinstance(r, torch.Tensor) or r.dtype not in FLOATS):
            return NotImplemented
    y, mean, _inv, var = _OPS.batch_norm(input, weight, bias, running_mean, running_var,
                                         training, float(eps))
    if training and running_mean is not None:
        _OPS.batch_norm_update_stats(running_mean, running_var, mean.detach(), var.detach(),
                                     float(momentum), input.numel() // input.shape[1])
    return y


_REDUCTION = {r: i for i, r in enumerate(L.REDUCTIONS)}


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                   reduce=None, reduction="mean", label_smoothing=0.0):
    if size_average is not None or reduce is not None or reduction not in _REDUCTION or \
            not _floats(input, weight) or input.dim() < 2 or \
            not isinstance(target, torch.Tensor) or target.dtype != torch.int64 or \
            not isinstance(label_smoothing, (int, float)) or \
            not 0.0 <= label_smoothing <= 1.0:
        return NotImplemented
    fused = reduction != "none" and torch.is_grad_enabled() and input.requires_grad
    return _OPS.cross_entropy(input, target, weight, int(ignore_index), _REDUCTION[reduction],
                              float(label_smoothing), fused)[0]


#: under ``compile_kernels="auto"`` cross entropy is ours inside the graph only from this
#: many classes and logits: below, the op's fixed cost (~35-45 us per forward+backward
#: over Inductor's fused log_softmax + nll at 16x10 to 64x256) is more than our kernel
#: saves. Zen 5, 1 thread, compiled fwd+bwd, Inductor's time / ours: 16x10 0.61, 64x256
#: 0.74, 128x512 0.88, 8192x10 0.87, 1024x64 0.78; 256x512 1.05, 64x2048 1.14, 512x512
#: 1.37, 512x4096 1.28 (a GPT LM head)
CE_MIN_CLASSES = 512
CE_MIN_LOGITS = 1 << 17


def _cross_entropy_sized(input, target, *args, **kwargs):
    if isinstance(input, torch.Tensor) and input.dim() >= 2:
        c, n = input.shape[1], input.numel()
        # symbolic sizes (dynamic shapes) keep ours: comparing them would add guards
        if isinstance(c, int) and isinstance(n, int) and \
                (c < CE_MIN_CLASSES or n < CE_MIN_LOGITS):
            return NotImplemented
    return _cross_entropy(input, target, *args, **kwargs)


def _conv(r: int, pick: bool = False):
    def adapter(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if isinstance(padding, str) or not _floats(input, weight, bias) or \
                input.dim() != r + 2 or weight.dim() != r + 2:
            return NotImplemented
        try:
            s = _tuple("stride", stride, r, 1)
            p = _tuple("padding", padding, r, 0)
            d = _tuple("dilation", dilation, r, 1)
        except (TypeError, ValueError):
            return NotImplemented
        return _OPS.conv(input, weight, bias, s, p, d, int(groups), pick)
    return adapter


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    if not _floats(query, key, value) or query.dim() < 2 or key.dim() != query.dim() or \
            not isinstance(dropout_p, (int, float)) or dropout_p != 0 or \
            (attn_mask is not None and not isinstance(attn_mask, torch.Tensor)) or \
            (is_causal and attn_mask is not None):
        return NotImplemented
    rep = 1
    if enable_gqa and query.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        if rep * key.shape[-3] != query.shape[-3] or attn_mask is not None or \
                not grouped_fusable(query, key, value):
            return NotImplemented
    elif not fusable(query, key, value, attn_mask):
        return NotImplemented
    if query.shape[-2] * key.shape[-2] > ATTENTION_MAX_SCORES:
        return NotImplemented
    s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _OPS.attention(query, key, value, attn_mask, bool(is_causal), s, rep)[0]


#: the largest L·S (scores per head) the compiled graph sends to our fused attention, which
#: materialises them: causal fwd+bwd on Zen 5, ours / torch's flash attention time,
#: 0.54-0.65 up to L = S = 512, 0.8-1.0 at 768, 0.85-1.05 at 1024, 1.6-1.75 at 2048 and
#: 4096 (torch's runs in tiles)
ATTENTION_MAX_SCORES = 1024 * 1024


def _pool_args(r, kernel_size, stride, padding, dilation=1):
    """(kernel, stride, padding, dilation) lists as the eager ops check them, or None."""
    try:
        return _pool_attrs("pool", r, kernel_size, stride, padding, dilation)
    except (TypeError, ValueError):
        return None


def _max_pool(r: int):
    def adapter(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False):
        if return_indices or not _floats(input) or input.dim() != r + 2:
            return NotImplemented
        a = _pool_args(r, kernel_size, stride, padding, dilation)
        if a is None:
            return NotImplemented
        return _OPS.max_pool(input, *a, bool(ceil_mode))[0]
    return adapter


def _avg_pool(r: int):
    def adapter(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
        if divisor_override is not None or not _floats(input) or input.dim() != r + 2:
            return NotImplemented
        a = _pool_args(r, kernel_size, stride, padding)
        if a is None:
            return NotImplemented
        return _OPS.avg_pool(input, *a[:3], bool(ceil_mode), bool(count_include_pad))
    return adapter


def _adaptive_avg_pool2d(input, output_size):
    if output_size not in (1, (1, 1), [1, 1]) or not _floats(input) or input.dim() != 4:
        return NotImplemented
    return _OPS.global_avg_pool(input)


_T = torch.Tensor

#: family -> [(torch function, name as in wrap's functional table, adapter)]
FAMILIES: dict[str, list] = {
    "linear": [(F.linear, "F.linear", _linear), (torch.addmm, "torch.addmm", _addmm)],
    "gelu": [(F.gelu, "F.gelu", _gelu)],
    "activations": [
        (F.silu, "F.silu", _act("QuickGelu", 1.0)),
        (F.relu, "F.relu", _act("Relu")),
        (torch.relu, "torch.relu", _act("Relu")),
        (_T.relu, "Tensor.relu", _act("Relu")),
        (F.leaky_relu, "F.leaky_relu", _leaky_relu),
        # not F.hardswish / F.hardsigmoid: Dynamo puts them in the graph without calling
        # the torch function mode (measured with torch 2.13), so they stay torch's
        (F.hardtanh, "F.hardtanh", _hardtanh),
        (F.relu6, "F.relu6", _hard("hardtanh", 0.0, 6.0)),
    ],
    "softmax": [
        (F.softmax, "F.softmax", _softmax_f), (torch.softmax, "torch.softmax", _softmax_t),
        (_T.softmax, "Tensor.softmax", _softmax_t),
        (F.log_softmax, "F.log_softmax", _log_softmax_f),
        (torch.log_softmax, "torch.log_softmax", _log_softmax_t),
        (_T.log_softmax, "Tensor.log_softmax", _log_softmax_t),
    ],
    "attention": [(F.scaled_dot_product_attention, "F.scaled_dot_product_attention",
                   _sdpa)],
    "layer_norm": [(F.layer_norm, "F.layer_norm", _layer_norm)]
    + ([(F.rms_norm, "F.rms_norm", _rms_norm)] if hasattr(F, "rms_norm") else []),
    "batch_norm": [(F.batch_norm, "F.batch_norm", _batch_norm)],
    "cross_entropy": [(F.cross_entropy, "F.cross_entropy", _cross_entropy)],
    "conv": [(F.conv1d, "F.conv1d", _conv(1)), (F.conv2d, "F.conv2d", _conv(2)),
             (F.conv3d, "F.conv3d", _conv(3))],
    "pool": [(F.max_pool1d, "F.max_pool1d", _max_pool(1)),
             (F.max_pool2d, "F.max_pool2d", _max_pool(2)),
             (F.max_pool3d, "F.max_pool3d", _max_pool(3)),
             (F.avg_pool1d, "F.avg_pool1d", _avg_pool(1)),
             (F.avg_pool2d, "F.avg_pool2d", _avg_pool(2)),
             (F.avg_pool3d, "F.avg_pool3d", _avg_pool(3)),
             (F.adaptive_avg_pool2d, "F.adaptive_avg_pool2d", _adaptive_avg_pool2d)],
}

#: under ``select="fastest"`` (the default) the GEMM-like families' ops choose their side
#: per signature at run time (``ops.library._side``): Inductor has no code of its own for
#: a matrix product or a convolution, it calls ATen's, so the eager measurement of ours
#: against ATen is the comparison that holds inside the graph too (the op boundary is
#: paid either way). Pointwise and normalization ops have no such switch: inside a graph
#: torch's side is Inductor's fused code, which no op-level measurement sees.
_PICKING = {F.linear: _linear_adapter(True), torch.addmm: _addmm_adapter(True),
            F.conv1d: _conv(1, True),
            F.conv2d: _conv(2, True), F.conv3d: _conv(3, True)}
#: under ``compile_kernels="auto"``: adapters that leave small calls to Inductor
_SIZED = {F.cross_entropy: _cross_entropy_sized}

#: ``compile_kernels="ours"``: every family
ALL = tuple(FAMILIES)
#: ``compile_kernels="auto"`` (the default): the families whose ortcpu:: ops measured
#: faster inside an Inductor graph than Inductor's own code (benchmarks/wrap_compile.py,
#: AVX2 EPYC): convolution (each signature on the faster of ours and ATen's, as above)
#: and pooling; not BatchNorm, which Inductor fuses with the ReLU and residual add around
#: it in training (benchmarks.models --compile, Zen 5, 2 threads, eager wrapped /
#: compiled wrapped, CPU time, 12-16 alternating rounds, twice: ResNet-style 0.92 / 0.95
#: -> 1.06 / 1.03x, MobileNetV3-style 0.96 / 0.96 -> 1.06 / 1.08x without it; the CNN
#: block of wrap_compile 0.94 -> 0.92x at 1 thread, 0.99 -> 0.96x at 2, within the
#: host's noise); GEMMs too where our GEMM is clearly faster than torch's
#: (``auto_families``). Not GEMMs otherwise: a custom op call costs ~0.1-0.4 ms more per
#: forward+backward than Inductor's direct ATen call (torch.library's Python dispatch,
#: measured on tiny to 64x256x256 shapes), more than a GEMM of torch's speed saves (AVX2
#: EPYC, MLP 64x256: 0.80x with ``linear`` in, 0.90x without); attention likewise; GELU
#: and cross entropy on the AVX-512 build only (``FUSED_ON_AVX512``); never LayerNorm,
#: softmax or the pointwise activations, which Inductor fuses with their neighbours.
AUTO = ("conv", "pool")
#: ``auto`` on our AVX-512 build also routes these: with the per-call cost of an op now
#: ~6 us above its kernel (library._autograd), ours measured faster inside the graph than
#: Inductor's fused code (Zen 5, 1 thread, eager wrapped / compiled: MLP block 0.90 ->
#: 0.92-0.94x, GPT block 0.94 -> 0.99-1.00x, CNN block 0.95 -> 1.00x with cross entropy;
#: with every side held to AVX2 code they measured 0.85 -> 0.80x and 0.89 -> 0.88x, so the
#: AVX2 build leaves them to Inductor). softmax measured neutral and stays Inductor's.
#: LayerNorm left this list: on an Intel Ice Lake (2 threads, compiled wrapped with it /
#: without it, 16 alternating rounds) it cost 12% of a GPT-2 step and 10% of a BERT step,
#: Inductor fusing it with the residual add around it; GELU and cross entropy there cost
#: 1-3%, within the rounds' spread.
FUSED_ON_AVX512 = ("gelu", "cross_entropy")
COMPILE_CHOICES = ("auto", "ours", "torch")
#: our float32 GEMM must take at most this share of torch.mm's time for ``linear`` to
#: join "auto" (AMD Zen 5, 1-2 threads, 256^3: our OpenBLAS on its AVX-512 kernels 0.47-0.52
#: of torch's MKL, which runs AVX2 code on AMD; held on its Haswell kernels 0.91-0.92, left
#: out. Eager wrapped / compiled wrapped per training step with ``linear`` in: GPT block
#: 0.55-0.59x -> 0.91-1.02x, MLP 0.61-0.66x -> 0.82-0.94x). The same edge for our fused
#: attention against torch's CPU flash attention (Zen 5, causal, fwd+bwd at the probe's
#: L = 128: ours 0.54-0.65 of torch's time on the AVX-512 kernels, 0.83-0.89 held on
#: Haswell's; longer sequences: ``ATTENTION_MAX_SCORES``)
GEMM_EDGE = 0.8


def _time_ratio(ours, torch_side) -> float:
    """ours' time / torch's: the fastest of 7 alternating rounds of 3 calls each per side
    (other processes' load only adds time: with medians, a loaded spell of the host at
    the first wrap left attention out of "auto" in one process of several)."""
    sides = {"ours": ours, "torch": torch_side}
    times: dict[str, list] = {k: [] for k in sides}
    for f in sides.values():
        f()
    for r in range(7):
        for name in (list(sides) if r % 2 else list(sides)[::-1]):
            t0 = time.perf_counter()
            for _ in range(3):
                sides[name]()
            times[name].append(time.perf_counter() - t0)
    return min(times["ours"]) / min(times["torch"])


@functools.lru_cache(maxsize=1)
def auto_families() -> tuple[str, ...]:
    """The families of ``compile_kernels="auto"`` in this process: ``AUTO``, plus
    ``linear`` when a 256x256x256 float32 GEMM of ours takes at most ``GEMM_EDGE`` of
    ``torch.mm``'s time, plus ``attention`` when our fused causal attention forward +
    backward (1x4x128x64) takes at most ``GEMM_EDGE`` of torch's
    ``scaled_dot_product_attention`` (each the fastest of 7 alternating rounds, measured
    once per process at the first wrap, a few tens of milliseconds in all), plus
    ``FUSED_ON_AVX512`` when our AVX-512 build is loaded."""
    from ..kernels.gemm import gemm
    from ..ops.attention import fused_attention

    g = torch.Generator().manual_seed(0)  # not the global generator: wrap draws nothing
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    fams = AUTO
    if _time_ratio(lambda: gemm(a, b, None), lambda: torch.mm(a, b)) <= GEMM_EDGE:
        fams += ("linear",)
    q, k, v = (torch.randn(1, 4, 128, 64, generator=g).requires_grad_() for _ in range(3))
    dy = torch.randn(1, 4, 128, 64, generator=g)
    with torch.enable_grad():  # (a scalar backward: a tensor gradient imports sympy)
        ratio = _time_ratio(
            lambda: (fused_attention(q, k, v, 0.125, True, None) * dy).sum().backward(),
            lambda: (F.scaled_dot_product_attention(q, k, v, is_causal=True) * dy).sum()
            .backward())
    if ratio <= GEMM_EDGE:
        fams += ("attention",)
    if lib.ortcpu_isa_level() >= 2:
        fams += FUSED_ON_AVX512
    return fams


def check_compile_kernels(value) -> tuple[str, ...]:
    """The families ``wrap(compile_kernels=value)`` routes under torch.compile."""
    if value == "auto":
        return auto_families()
    if value == "ours":
        return ALL
    if value == "torch":
        return ()
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise ValueError(f"wrap: compile_kernels must be one of {COMPILE_CHOICES} or a list "
                         f"of families from {list(FAMILIES)}, got {value!r}")
    fams = tuple(value)
    bad = [f for f in fams if f not in FAMILIES]
    if bad:
        raise ValueError(f"wrap: compile_kernels: unknown families {bad}; known: "
                         f"{list(FAMILIES)}")
    return fams


def tables(state) -> tuple[dict, dict]:
    """(routed by name, routed inside an included module): torch function -> adapter,
    for the families ``state.compile_kernels`` names, ``include``/``exclude`` applied by
    functional name as in eager routing; GEMMs and convolutions picking their side at run
    time under ``select="fastest"`` (``_PICKING``), always ours under ``select="ours"``;
    under ``compile_kernels="auto"`` small cross entropies Inductor's (``_SIZED``)."""
    everything, by_name = {}, {}
    pick = state.select == "fastest"
    sized = getattr(state, "compile_auto", False)
    for fam in state.compile_kernels:
        for func, name, adapter in FAMILIES[fam]:
            if pick:
                adapter = _PICKING.get(func, adapter)
            if sized:
                adapter = _SIZED.get(func, adapter)
            everything[func] = adapter
            op = name.split(".", 1)[1]
            if state.selected(name, op):
                by_name[func] = adapter
    return by_name, everything


def routed_names(state) -> list[str]:
    """Names of the functionals routed to ortcpu:: custom ops under torch.compile."""
    return [name for fam in state.compile_kernels for _f, name, _a in FAMILIES[fam]]


class CompiledKernelMode(TorchFunctionMode):
    """What the wrap does while torch.compile traces: routes the functionals of
    ``tables`` to ortcpu:: custom ops; no bookkeeping. ``scopes``: the stack of
    excluded (False) / included (True) modules being run."""

    def __init__(self, by_name: dict, everything: dict):
        super().__init__()
        self.by_name, self.everything = by_name, everything
        self.scopes: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if self.scopes:
            table = self.everything if self.scopes[-1] else None
        else:
            table = self.by_name
        if table is not None:
            adapter = table.get(func)
            if adapter is not None:
                out = adapter(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        return func(*args, **kwargs)
