"""Bindings of the channel-blocked ops that ``blocked_layout`` writes (domain
``ortcpu_torch.graph``): ``Conv16c`` (a Conv with its fused epilogue on blocked X, Y and
residual, or into its Concat's blocked buffer), ``Pool16c`` (MaxPool, AveragePool,
GlobalAveragePool), and the reorders ``ToNCHW16c`` / ``FromNCHW16c``. Every value they
read is static and blocked by construction; weights are packed once per plan."""

from __future__ import annotations

import math

import torch

from .._native import check_status, empty, ffi, get_num_threads, lib, native_fn, ptr
from ..kernels.conv import conv_geometry
from ..kernels.gemm import PackedWeight
from ..kernels.pool import pool_geometry
from .blocked_layout import BLOCK, conv_inputs, pool_kwargs
from .conv_infer import infer_geometry, measured_choice
from .fusions import INTERNAL_DOMAIN, epilogue_steps
from .op_table import op


def _internal(op_type):
    return op(op_type, domain=INTERNAL_DOMAIN, kind="kernel")


def _nchw(blocked) -> tuple:
    """The NCHW shape of a blocked one (its padded channel count)."""
    n, cb, h, w, _ = blocked
    return (n, cb * BLOCK, h, w)


def _expect(x, shape, what):
    if x.dtype != torch.float32 or tuple(x.shape) != shape or not x.is_contiguous():
        raise RuntimeError(f"{what}: expected a contiguous float32 tensor of shape "
                           f"{list(shape)}, got {x.dtype} {list(x.shape)} "
                           f"(contiguous: {x.is_contiguous()})")


@_internal("ToNCHW16c")
def _to_blocked(ctx):
    xs, ys = tuple(ctx.input_shapes[0]), tuple(ctx.output_shapes[0])

    def to_blocked(x):
        x = x.contiguous()
        _expect(x, xs, "ToNCHW16c")
        y = empty(ys, torch.float32)
        _reorder(lib.ortcpu_to_nchw16c_f32, x, y, xs, ys[1] * BLOCK)
        return y
    return to_blocked


@_internal("FromNCHW16c")
def _from_blocked(ctx):
    xs, ys = tuple(ctx.input_shapes[0]), tuple(ctx.output_shapes[0])
    n, c, cp, p = ys[0], ys[1], xs[1] * BLOCK, ys[2] * ys[3]

    def from_blocked(x):
        _expect(x, xs, "FromNCHW16c")
        if p == 1:  # one position: both layouts are the same memory (less the padding)
            return x.view(ys) if c == cp else x.view(n, cp)[:, :c].contiguous().view(ys)
        y = empty(ys, torch.float32)
        _reorder(lib.ortcpu_from_nchw16c_f32, x, y, ys, cp)
        return y
    return from_blocked


@_internal("Conv16c")
def _conv16c(ctx):
    """Y = relu?(conv(X) + B + residual) on blocked tensors (X NCHW where its channels are
    not whole blocks: a stem), on whichever kernel measures faster for the geometry
    (``conv_infer.measured_choice``): the blocked direct convolution, or X reordered to
    NCHW, the training kernel's forward (Winograd for a 3x3 of stride 1: inception's 3x3s
    at 55x55 and 27x27, batch 8, ran 2x faster on it than on either direct kernel) and Y
    reordered back."""
    node = ctx.node
    offset = ctx.attrs.pop("ortcpu_out_offset", None)
    steps = epilogue_steps(node)
    (_, _, *bias_name), res, buf = conv_inputs(node)
    w = ctx.const(1).contiguous()
    b = ctx.const(2) if bias_name and bias_name[0] else None
    xs, ys = tuple(ctx.input_shapes[0]), tuple(ctx.output_shapes[0])
    pad = ys[1] * BLOCK - w.shape[0]  # output channels padded with zeros (padded_channels)
    if pad:
        b = torch.cat([b if b is not None else w.new_zeros(w.shape[0]), w.new_zeros(pad)])
        w = torch.cat([w, w.new_zeros(pad, *w.shape[1:])])
    nchw_in = len(xs) == 4  # X NCHW (a stem's 3 channels), Y blocked
    geom, _ = conv_geometry("Conv", torch.empty(xs if nchw_in else _nchw(xs), device="meta"),
                            torch.empty(w.shape, device="meta"), **ctx.attrs)
    g16 = infer_geometry(geom)
    relu = "relu" in steps
    candidates = {"blocked" + k: f for k, f in _direct(xs, w, b, g16, relu).items()}
    candidates["reordered"] = _reordered(xs, ys, w, b, geom, relu)
    if not nchw_in and _strided_pointwise(xs, g16):
        # resnet50's 14x14 -> 7x7 shortcut, 2 threads: 1.16 -> 0.94 ms
        candidates.update({"subsampled" + k: f for k, f in
                           _direct(xs, w, b, g16, relu, subsampled=True).items()})
    conv = measured_choice(("nchw16c", nchw_in, tuple(g16), b is not None, tuple(steps),
                            buf is not None, get_num_threads()), candidates)
    n, per_sample = xs[0], math.prod(ys[1:])

    if buf is not None:
        def run(x, *rest):
            """Y into its slice of the Concat's blocked buffer: ``offset`` elements into
            each sample (its channel blocks)."""
            _expect(x, xs, "Conv16c X")
            y = rest[-1].view(n, -1)[:, offset:offset + per_sample]
            conv(x, y, None)
            return y.view(ys)
    elif res is not None:
        def run(x, *rest):
            _expect(x, xs, "Conv16c X")
            _expect(rest[-1], ys, "Conv16c residual")
            return conv(x, empty(ys, torch.float32), rest[-1])
    else:
        def run(x, *rest):
            _expect(x, xs, "Conv16c X")
            return conv(x, empty(ys, torch.float32), None)
    run.choice = conv
    run.with_epilogue = lambda s: run if s == steps else None
    return run


def _strided_pointwise(xs, g16) -> bool:
    """An unpadded 1x1 of stride > 1 whose output covers the map (every sh-th row, sw-th
    column)."""
    kh, kw, oh, ow, sh, sw, ph, pw = g16[6:14]
    return kh == kw == 1 and ph == pw == 0 and (sh, sw) != (1, 1) and \
        (oh, ow) == ((xs[2] - 1) // sh + 1, (xs[3] - 1) // sw + 1)


def _direct(xs, w, b, g16, relu, subsampled=False) -> dict:
    """The blocked kernels: ``conv1x1_nchw16c`` for an unpadded 1x1 of stride 1, with
    ``subsampled`` ``conv1x1s_nchw16c`` (a strided 1x1 on X subsampled into a scratch
    copy), ``conv_nchw_to16c`` for an NCHW X (``xs`` of rank 4), else ``conv_nchw16c``;
    each ``f(x, out, r)`` -> out ([N, per sample] or Y's shape; its samples may lie a
    Concat buffer's sample apart). {"": f}, and for blocked X also "_nofetch": the same
    kernel leaving its weight rows to the hardware prefetchers (Intel Ice Lake, resnet50's
    convolutions alone: 7-21% faster), and "_nofetch_sliced": that with every reduction
    in slices over blocks of tiles (the 7x7 2048 -> 512 1x1: +16%, the 56x56 3x3: -2.5%).
    Which wins depends on the CPU and the shape, so they are measured."""
    nchw_in = len(xs) == 4
    n, c, m = xs[0], xs[1] * (1 if nchw_in else BLOCK), w.shape[0]
    kh, kw, oh, ow, sh, sw, ph, pw = g16[6:14]
    pointwise = not nchw_in and kh == kw == sh == sw == 1 and ph == pw == 0 and \
        (oh, ow) == xs[2:4]
    if pointwise or subsampled or nchw_in:  # reduction (channel, ky, kx): W [M, C*kh*kw]
        packed = PackedWeight.pack(w.reshape(m, -1), trans_b=True)
    else:  # reduction in (channel block, ky, kx, channel in block) order
        packed = PackedWeight.pack(w.reshape(m, c // BLOCK, BLOCK, kh, kw)
                                   .permute(0, 1, 3, 4, 2).reshape(m, -1).contiguous(),
                                   trans_b=True)
    cgeom = ffi.new("int64_t[]", g16)
    wp, bp = packed.data_p, ptr(b)  # (packed and b live in the closures)
    conv = lib.ortcpu_conv_nchw_to16c if nchw_in else lib.ortcpu_conv_nchw16c

    def kernel(flags):
        def direct(x, out, r):
            ystride = out.stride(0) if n > 1 else 0
            if pointwise:
                st = lib.ortcpu_conv1x1_nchw16c(n, m, c, oh * ow, ptr(x), wp, bp, ptr(r),
                                                flags, ptr(out), ystride, get_num_threads())
            elif subsampled:
                st = lib.ortcpu_conv1x1s_nchw16c(n, m, c, xs[2], xs[3], sh, sw, ptr(x), wp,
                                                 bp, ptr(r), flags, ptr(out), ystride,
                                                 get_num_threads())
            else:
                st = conv(ptr(x), wp, bp, ptr(r), flags, ptr(out), ystride, cgeom,
                          get_num_threads())
            check_status(st, "Conv")
            return out
        direct.keep = (cgeom, packed, b)
        return direct
    rl = lib.ORTCPU_CONV16C_RELU if relu else 0  # conv_nchw_to16c's relu: 0 / 1 alike
    if nchw_in:
        return {"": kernel(rl)}
    nofetch = rl | lib.ORTCPU_CONV16C_NO_FETCH
    return {"": kernel(rl), "_nofetch": kernel(nofetch),
            "_nofetch_sliced": kernel(nofetch | lib.ORTCPU_CONV16C_SLICED)}


def _reordered(xs, ys, w, b, geom, relu):
    """The training kernel's forward (native ``conv_forward``, its algorithm chosen by
    the native code) between reorders; the residual and ReLU applied blocked, in place.
    (``w`` padded to Y's blocks: the padded channels compute zeros.)"""
    nchw_in = len(xs) == 4
    xn, yn = xs if nchw_in else _nchw(xs), _nchw(ys)
    cgeom = ffi.new("int64_t[]", geom)
    fwd = native_fn("conv_forward", torch.float32)

    def reordered(x, out, r):
        y4 = empty(yn, torch.float32)
        if nchw_in:
            x4 = x
        else:
            x4 = empty(xn, torch.float32)
            _reorder(lib.ortcpu_from_nchw16c_f32, x, x4, xn, xn[1])
        check_status(fwd(ptr(x4), ptr(w), ptr(b), ptr(y4), cgeom, get_num_threads()), "Conv")
        if out.is_contiguous():
            _reorder(lib.ortcpu_to_nchw16c_f32, y4, out, yn, yn[1])
        else:  # a Concat buffer's slice: sample by sample
            for s in range(yn[0]):
                _reorder(lib.ortcpu_to_nchw16c_f32, y4[s], out[s], (1, *yn[1:]), yn[1])
        if r is not None:
            out.add_(r.view(out.shape))
        return out.relu_() if relu else out
    reordered.keep = cgeom
    return reordered


def _reorder(fn, src, dst, nchw, cp):
    """``fn`` (to / from NCHW16c) between NCHW ``nchw`` and its blocked form of ``cp``
    channels."""
    check_status(fn(ptr(src), ptr(dst), nchw[0], nchw[1], cp, nchw[2] * nchw[3],
                    get_num_threads()), "reorder")


@_internal("Pool16c")
def _pool16c(ctx):
    op_type = ctx.attrs.pop("op")
    xs, ys = tuple(ctx.input_shapes[0]), tuple(ctx.output_shapes[0])
    kw, is_max, include_pad = pool_kwargs(op_type, ctx.attrs, xs[2:4])
    geom, _ = pool_geometry(op_type, xs[:4], 2, **kw)
    cgeom = ffi.new("int64_t[]", geom)

    def pool(x):
        _expect(x, xs, op_type)
        y = empty(ys, torch.float32)
        check_status(lib.ortcpu_pool_nchw16c_f32(ptr(x), ptr(y), cgeom, is_max, include_pad,
                                                 get_num_threads()), op_type)
        return y
    pool.keep = cgeom
    return pool
