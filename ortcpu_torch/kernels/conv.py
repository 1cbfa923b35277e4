"""Convolution kernels (spec §6.1): ONNX ``Conv`` and com.microsoft ``ConvGrad``,
1/2/3-D, strides, asymmetric pads, dilations, groups (depthwise included), ``auto_pad``
honoured (ORT 1.19.2's ConvGrad ignores it; we do not). float32 and float64.

Lowering (native/src/conv.c): depthwise convolutions (group == C > 1, M a multiple of C,
1-D/2-D, pads >= 0; stride 1, kernels of 5x5 and up or outputs of 14x14 and more, where
it measured faster) run on a direct per-channel kernel (conv_dw.inc); 2-D 3x3
convolutions with stride 1, dilation 1, one group and at least 8 input and 4 output
channels as Winograd F(2x2, 3x3) or F(4x4, 3x3) (GEMMs per block of output tiles; dX is
the Winograd forward of dY with the rotated kernel); everything else as im2col / col2im.
GEMMs on single-threaded OpenBLAS, the work split over our OpenMP threads (see
``kernels/gemm.py`` for the thread decision); small maps with small weights ("packed")
and, on AVX-512 builds, Winograd's forward / dX GEMMs and the narrow dW GEMMs of the
packed path run on our own register-tile kernels (native/src/conv_pk.inc); the forward
of first layers (at most 3 input channels per group) runs as the graph executor's direct
convolution ("direct", native/src/conv_infer.c, the weights packed per call).
``conv_forward`` and ``conv_backward`` take ``algo="auto" | "im2col" | "winograd2" |
"winograd4" | "small_map" | "depthwise" | "packed" | "direct"`` to force a lowering (tests,
benchmarks).
"""

from __future__ import annotations

import torch

from .._native import empty, ffi, lib, native_fn, ptr
from ._checks import (
    check_status,
    float_input,
    fmt_shape,
    get_num_threads,
    int_attr,
    needs_flags,
    same_dtype,
    select_outputs,
)
from ._registry import register
from ._spatial import auto_pad_attr, int_list, pad3, resolve_pads, spatial_rank

ALGOS = {"auto": 0, "im2col": 1, "winograd2": 2, "winograd4": 3, "small_map": 4,
         "depthwise": 5, "packed": 6, "direct": 7}


def conv_geometry(op: str, X: torch.Tensor, W: torch.Tensor, auto_pad="NOTSET",
                  dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                  algo="auto"):
    """Validate Conv attributes against X [N,C,in...] and W [M,C/group,k...];
    returns (geom list for the native code, output shape). ``algo`` forces the lowering:
    "im2col" (any geometry), "winograd2" / "winograd4" (F(2x2,3x3) / F(4x4,3x3): 2-D 3x3
    kernel, stride 1, dilation 1, group 1), "small_map" (im2col through zero-padded
    channel planes: 2-D, dilation 1, pads >= 0, any stride, a padded plane, ((out - 1) *
    stride + kernel) per side, of at most 4096 elements; auto takes it for outputs under
    1024 positions), "packed" (the same geometry as "small_map": forward and dX on our own
    register-tile kernel with the weights packed once per call, dW as "small_map"),
    "depthwise" (group == C > 1, M a multiple of C, 1-D/2-D, pads >= 0); "auto" lets the
    native code choose."""
    if not isinstance(algo, str) or algo not in ALGOS:
        raise ValueError(f"{op}: algo must be one of {sorted(ALGOS)}, got {algo!r}")
    r = spatial_rank(op, "X", X)
    if W.dim() != X.dim():
        raise ValueError(
            f"{op}: W must have rank {X.dim()} ([M, C/group, kernel...]), got shape {fmt_shape(W)}"
        )
    group = int_attr(op, "group", group)
    if group < 1:
        raise ValueError(f"{op}: group must be >= 1, got {group}")
    n, c = X.shape[0], X.shape[1]
    m = W.shape[0]
    if c % group:
        raise ValueError(f"{op}: input channels {c} must be divisible by group={group}")
    if m < 1 or m % group:
        raise ValueError(f"{op}: output channels W.shape[0]={m} must be a positive multiple "
                         f"of group={group}")
    if W.shape[1] != c // group:
        raise ValueError(f"{op}: W.shape[1] must be C/group = {c // group}, got shape "
                         f"{fmt_shape(W)}")
    k = list(W.shape[2:])
    if any(v < 1 for v in k):
        raise ValueError(f"{op}: kernel sizes must be >= 1, got W shape {fmt_shape(W)}")
    if kernel_shape is not None:
        ks = int_list(op, "kernel_shape", kernel_shape, r, 1, 1)
        if ks != k:
            raise ValueError(f"{op}: kernel_shape {ks} does not match W's kernel {k}")
    s = int_list(op, "strides", strides, r, 1, 1)
    d = int_list(op, "dilations", dilations, r, 1, 1)
    ap = auto_pad_attr(op, auto_pad)
    ins = list(X.shape[2:])
    pb, _, out = resolve_pads(op, ap, pads, ins, k, s, d)
    if algo.startswith("winograd") and (r != 2 or k != [3, 3] or s != [1, 1] or d != [1, 1]
                               or group != 1):
        raise ValueError(f"{op}: algo={algo!r} needs a 2-D 3x3 kernel with stride 1, "
                         f"dilation 1 and group 1, got kernel {k}, strides {s}, dilations "
                         f"{d}, group {group}")
    if algo == "depthwise" and (r == 3 or group != c or c < 2 or any(v < 0 for v in pb)):
        raise ValueError(f"{op}: algo='depthwise' needs a 1-D/2-D convolution with group == "
                         f"C > 1 and pads >= 0, got rank {r}, C={c}, group {group}, pads "
                         f"{pb}")
    if algo == "direct" and (r == 3 or any(v < 0 for v in pb) or any(v > 64 for v in s)):
        raise ValueError(f"{op}: algo='direct' needs a 1-D/2-D convolution with pads >= 0 "
                         f"and strides <= 64, got rank {r}, pads {pb}, strides {s}")
    geom = [n, c, m, group, *pad3(ins, 1), *pad3(k, 1), *pad3(out, 1), *pad3(s, 1),
            *pad3(pb, 0), *pad3(d, 1), ALGOS[algo]]
    return geom, (n, m, *out)


class ConvPlan:
    """A checked Conv geometry bound to its native entry points: ``conv_forward_plan`` and
    ``conv_backward_plan`` run it on inputs of the signature it was checked for
    (contiguous, the same dtype and shapes) with no check repeated. The autograd front end
    (``ops.conv2d``) keeps one per input signature, so a call costs one dict lookup
    besides the kernel."""

    __slots__ = ("op", "geom", "geom_c", "out_shape", "dtype", "m", "fwd", "bwd", "unbatched",
                 "nhwc")

    def __init__(self, op: str, geom: list, out_shape: tuple, dtype: torch.dtype):
        self.op, self.geom, self.out_shape, self.dtype = op, geom, tuple(out_shape), dtype
        self.geom_c = ffi.new("int64_t[]", geom)  # built once: a list converts per call
        self.m = geom[2]
        self.fwd = native_fn("conv_forward", dtype)
        self.bwd = native_fn("conv_backward", dtype)
        self.unbatched = False  # set by the front end: its input gets a batch axis of 1
        # the channels-last depthwise kernel's (forward, backward): a 2-D convolution with
        # group == C == M, pads >= 0, algorithm "auto" (a forced one keeps its lowering)
        _, c, m, group = geom[:4]
        self.nhwc = (native_fn("dw_nhwc_forward", dtype), native_fn("dw_nhwc_backward", dtype)) \
            if geom[4] == 1 and geom[7] == 1 and group == c == m > 1 and geom[22] == 0 \
            and min(geom[16:19]) >= 0 else None


def _checked(op, X, W, B, attrs):
    X = float_input(op, "X", X)
    W = float_input(op, "W", W)
    same_dtype(op, "X", X, "W", W)
    geom, out_shape = conv_geometry(op, X, W, **attrs)  # W's rank checked before B's
    if B is not None:
        B = float_input(op, "B", B)
        same_dtype(op, "X", X, "B", B)
        if B.dim() != 1 or B.shape[0] != W.shape[0]:
            raise ValueError(f"{op}: B must be 1-D with W.shape[0]={W.shape[0]} elements, "
                             f"got shape {fmt_shape(B)}")
    return X, W, B, geom, out_shape


def conv_plan(op, X, W, B=None, **attrs) -> ConvPlan:
    """Check X, W, B and the Conv attributes (as ``conv_forward``) and return the plan."""
    X, W, B, geom, out_shape = _checked(op, X, W, B, attrs)
    return ConvPlan(op, geom, out_shape, X.dtype)


def _forward(fn, plan: ConvPlan, y_shape, X, W, B) -> torch.Tensor:
    Y = empty(y_shape, plan.dtype)
    st = fn(ptr(X), ptr(W), ptr(B), ptr(Y), plan.geom_c, get_num_threads())
    if st:
        check_status(st, plan.op)
    return Y


def _backward(fn, plan: ConvPlan, dY, X, W, need):
    """(dX, dW, dB) shaped like X, W and [M], None where ``need`` says so."""
    dX = empty(X.shape, plan.dtype) if need[0] else None
    dW = empty(W.shape, plan.dtype) if need[1] else None
    dB = empty((plan.m,), plan.dtype) if need[2] else None
    if dX is None and dW is None and dB is None:
        return None, None, None
    st = fn(ptr(dY), ptr(X), ptr(W), ptr(dX), ptr(dW), ptr(dB), plan.geom_c,
            get_num_threads())
    if st:
        check_status(st, plan.op)
    return dX, dW, dB


def conv_forward_plan(plan: ConvPlan, X, W, B=None) -> torch.Tensor:
    """Y of ``plan`` for contiguous X, W, B of the signature it was checked for."""
    return _forward(plan.fwd, plan, plan.out_shape, X, W, B)


def conv_backward_plan(plan: ConvPlan, dY, X, W, need=(True, True, True)):
    """(dX, dW, dB) of ``plan``, None where ``need`` says so; dY contiguous, of the
    plan's output shape, X and W as checked."""
    return _backward(plan.bwd, plan, dY, X, W, need)


def dw_nhwc_forward(plan: ConvPlan, X, Wt, B=None) -> torch.Tensor:
    """Y [N, OH, OW, C] of a depthwise ``plan`` (``plan.nhwc``) on channels-last memory:
    X [N, H, W, C] and the tap-major weight Wt [KH*KW, C], both contiguous."""
    n, _, oh, ow = plan.out_shape
    return _forward(plan.nhwc[0], plan, (n, oh, ow, plan.m), X, Wt, B)


def dw_nhwc_backward(plan: ConvPlan, dY, X, Wt, need=(True, True, True)):
    """(dX [N, H, W, C], dWt [KH*KW, C], dB) of ``dw_nhwc_forward``, None where ``need``
    says so; dY [N, OH, OW, C] contiguous."""
    return _backward(plan.nhwc[1], plan, dY, X, Wt, need)


PATHS = {v: k for k, v in ALGOS.items() if v}


def conv_path(op, X, W, **attrs) -> str:
    """The lowering (an ``ALGOS`` name other than "auto") ``conv_forward`` runs for these
    arguments; backward follows it for dX (dW / dB of "packed" run as "small_map"; the
    backward of "direct", a forward-only lowering, takes its own)."""
    _, _, _, geom, _ = _checked(op, X, W, None, attrs)
    st = lib.ortcpu_conv_path(geom, X.element_size())
    if st < 0:
        check_status(st, op)
    return PATHS[st]


def conv_forward(op, X, W, B=None, **attrs):
    return conv_forward_geom(op, X, W, B, **attrs)[0]


def conv_forward_geom(op, X, W, B=None, **attrs):
    """(Y, geom): conv_forward plus the checked geometry, which conv_backward can take
    for the same X and W instead of re-deriving it from the attributes."""
    X, W, B, geom, out_shape = _checked(op, X, W, B, attrs)
    Y = empty(out_shape, X.dtype)
    st = native_fn("conv_forward", X.dtype)(ptr(X), ptr(W), ptr(B), ptr(Y), geom,
                                            get_num_threads())
    check_status(st, op)
    return Y, geom


def conv_backward(op, dY, X, W, need=(True, True, True), geom=None, **attrs):
    """(dX, dW, dB), None where ``need`` says so. ``geom``: from conv_forward_geom (or
    conv_geometry) on the same X and W, with dY of its output's shape."""
    X = float_input(op, "X", X)
    W = float_input(op, "W", W)
    dY = float_input(op, "dY", dY)
    same_dtype(op, "X", X, "W", W)
    same_dtype(op, "X", X, "dY", dY)
    if geom is None:
        geom, out_shape = conv_geometry(op, X, W, **attrs)
        if tuple(dY.shape) != tuple(out_shape):
            raise ValueError(f"{op}: dY must have the Conv output shape {out_shape}, got "
                             f"{fmt_shape(dY)}")
    dX = empty(X.shape, X.dtype) if need[0] else None
    dW = empty(W.shape, X.dtype) if need[1] else None
    dB = empty((W.shape[0],), X.dtype) if need[2] else None
    if dX is None and dW is None and dB is None:
        return None, None, None
    st = native_fn("conv_backward", X.dtype)(ptr(dY), ptr(X), ptr(W), ptr(dX), ptr(dW),
                                             ptr(dB), geom, get_num_threads())
    check_status(st, op)
    return dX, dW, dB


@register
def Conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    """ONNX Conv (1/2/3-D; groups, dilations, asymmetric pads, auto_pad). Inputs: X, W,
    optional B. Output: Y."""
    return conv_forward("Conv", X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                        kernel_shape=kernel_shape, pads=pads, strides=strides)


@register
def ConvGrad(dY, X, W, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
             pads=None, strides=None, needs=None):
    """com.microsoft ConvGrad: dX, dW, dB of Conv (each optional via ``needs``); auto_pad
    is honoured. Inputs: dY, X, W. Outputs: dX, dW, dB."""
    need = needs_flags("ConvGrad", needs, 3)
    out = conv_backward("ConvGrad", dY, X, W, need, auto_pad=auto_pad, dilations=dilations,
                        group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    return select_outputs("ConvGrad", out, needs)
