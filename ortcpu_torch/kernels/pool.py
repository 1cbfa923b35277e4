"""Pooling kernels (spec §6.2, §6.3): ONNX MaxPool (with Indices), AveragePool,
GlobalAveragePool, GlobalMaxPool, and the training ops MaxPoolGrad, AveragePoolGrad;
1/2/3-D, float32 and float64. AveragePoolGrad is correct in 3-D with overlapping windows
(ORT 1.19.2 is not). ``global_pool_backward`` gives the global pools' gradients (ORT
builds those from Scale + Expand; the ops front end calls it directly).

MaxPool: NaN in a window propagates (as in torch), ties pick the first maximum; Indices
are flat offsets into the whole input (``storage_order=1``: column-major within the
plane). ceil_mode drops a last window that would start in the end padding (torch's rule).
AveragePool with count_include_pad=1 divides by the whole kernel volume, as ORT does, also
where a ceil_mode window overhangs the end padding (torch, and so ``ops.avg_pool*``, count
only the part inside the padded input: internal mode 2 vs 1 of ``avgpool_forward``).
"""

from __future__ import annotations

import math

import torch

from .._native import empty, native_fn, ptr
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

# Checked geometries by their arguments: a pooling call of a seen signature skips the
# attribute checks (about 8 us of a 2x2 pool's ~20 us call, measured); bounded.
_GEOMETRIES: dict = {}
_GEOMETRIES_LIMIT = 4096


_UNKEYED = object()  # a key part that is not hashable as it is: no caching


def _ints_key(v):
    """``v`` (None, an int, or a list/tuple of ints) as a hashable key part, or
    ``_UNKEYED`` when it is anything else (bools and floats are checked on every call)."""
    if v is None or type(v) is int:
        return v
    if type(v) in (list, tuple) and all(type(e) is int for e in v):
        return tuple(v)
    return _UNKEYED


def pool_geometry(op, X_shape, r, kernel_shape, strides=None, pads=None, dilations=None,
                  auto_pad="NOTSET", ceil_mode=0, out_sizes=None):
    """(geom list, out spatial sizes). ``out_sizes`` given: a gradient, whose geometry
    comes from dY's shape instead of ceil_mode."""
    key = (tuple(X_shape), r, *map(_ints_key, (kernel_shape, strides, pads, dilations,
                                                out_sizes)),
           auto_pad if type(auto_pad) is str else _UNKEYED,
           (type(ceil_mode), ceil_mode) if type(ceil_mode) in (int, bool) else _UNKEYED)
    cacheable = not any(k is _UNKEYED for k in key)
    hit = _GEOMETRIES.get(key) if cacheable else None
    if hit is None:
        hit = _pool_geometry(op, X_shape, r, kernel_shape, strides, pads, dilations,
                             auto_pad, ceil_mode, out_sizes)
        if cacheable:
            if len(_GEOMETRIES) >= _GEOMETRIES_LIMIT:
                _GEOMETRIES.clear()
            _GEOMETRIES[key] = hit
    return list(hit[0]), list(hit[1])


def _pool_geometry(op, X_shape, r, kernel_shape, strides, pads, dilations, auto_pad,
                   ceil_mode, out_sizes):
    if kernel_shape is None:
        raise ValueError(f"{op}: kernel_shape is required")
    k = int_list(op, "kernel_shape", kernel_shape, r, 1, 1)
    s = int_list(op, "strides", strides, r, 1, 1)
    d = int_list(op, "dilations", dilations, r, 1, 1)
    ap = auto_pad_attr(op, auto_pad)
    ceil_mode = int_attr(op, "ceil_mode", int(ceil_mode) if isinstance(ceil_mode, bool)
                         else ceil_mode, (0, 1))
    ins = list(X_shape[2:])
    pb, pe, out = resolve_pads(op, ap, pads, ins, k, s, d, ceil_mode)
    for i in range(r):
        ek = (k[i] - 1) * d[i] + 1
        if pb[i] >= ek or pe[i] >= ek:
            raise ValueError(f"{op}: pads must be smaller than the kernel extent {ek} on "
                             f"spatial axis {i}, got {pb[i]}, {pe[i]}")
    if out_sizes is not None:
        out = list(out_sizes)
    planes = X_shape[0] * X_shape[1]
    geom = [planes, *pad3(ins, 1), *pad3(k, 1), *pad3(out, 1), *pad3(s, 1), *pad3(pb, 0),
            *pad3(pe, 0), *pad3(d, 1)]
    return geom, out


def storage_order_indices(idx: torch.Tensor, x_shape) -> torch.Tensor:
    """Row-major flat indices -> ORT's storage_order=1 (column-major within the plane)."""
    sp = list(x_shape[2:])
    isz = math.prod(sp)
    plane, rem = torch.div(idx, isz, rounding_mode="floor"), idx % isz
    coords = []
    for size in reversed(sp):
        coords.append(rem % size)
        rem = torch.div(rem, size, rounding_mode="floor")
    coords.reverse()  # coords[0] is the first spatial axis
    col = torch.zeros_like(idx)
    mult = 1
    for size, c in zip(sp, coords, strict=True):
        col += c * mult
        mult *= size
    return plane * isz + col


def maxpool_forward(op, X, need_indices=True, **attrs):
    X = float_input(op, "X", X)
    r = spatial_rank(op, "X", X)
    geom, out = pool_geometry(op, X.shape, r, **attrs)
    Y = empty((X.shape[0], X.shape[1], *out), X.dtype)
    idx = torch.empty(Y.shape, dtype=torch.int64) if need_indices else None
    st = native_fn("maxpool_forward", X.dtype)(
        ptr(X), ptr(Y), _i64(idx), geom, get_num_threads())
    check_status(st, op)
    return Y, idx


def _i64(t):
    from .._native import ffi

    return ffi.NULL if t is None else ffi.cast("int64_t *", t.data_ptr())


def maxpool_backward(op, dY, Indices, x_shape):
    dY = float_input(op, "dY", dY)
    if not isinstance(Indices, torch.Tensor) or Indices.dtype != torch.int64:
        raise TypeError(f"{op}: Indices must be an int64 torch.Tensor")
    if Indices.shape != dY.shape:
        raise ValueError(f"{op}: Indices must have the shape of dY {fmt_shape(dY)}, got "
                         f"{fmt_shape(Indices)}")
    Indices = Indices.contiguous()
    dX = empty(tuple(x_shape), dY.dtype)
    ny, nx = dY.numel(), dX.numel()
    planes = 1
    if dY.dim() >= 2 and dX.dim() >= 2 and dY.shape[:2] == dX.shape[:2]:
        planes = max(dY.shape[0] * dY.shape[1], 1)
        if ny % planes or nx % planes:
            planes = 1
    if nx == 0 and ny == 0:
        return dX
    st = native_fn("maxpool_backward", dY.dtype)(ptr(dY), _i64(Indices), ptr(dX), ny, nx,
                                                 planes, get_num_threads())
    check_status(st, op)
    return dX


def avgpool_forward(op, X, count_include_pad=0, divisor=0, **attrs):
    X = float_input(op, "X", X)
    r = spatial_rank(op, "X", X)
    cip = int_attr(op, "count_include_pad", int(count_include_pad), (0, 1, 2))
    geom, out = pool_geometry(op, X.shape, r, **attrs)
    Y = empty((X.shape[0], X.shape[1], *out), X.dtype)
    st = native_fn("avgpool_forward", X.dtype)(ptr(X), ptr(Y), geom, cip, divisor,
                                               get_num_threads())
    check_status(st, op)
    return Y


def avgpool_backward(op, dY, x_shape, count_include_pad=0, divisor=0, **attrs):
    dY = float_input(op, "dY", dY)
    r = spatial_rank(op, "dY", dY)
    x_shape = tuple(x_shape)
    if len(x_shape) != dY.dim() or tuple(x_shape[:2]) != tuple(dY.shape[:2]):
        raise ValueError(f"{op}: output_shape {list(x_shape)} must be [N, C, spatial...] "
                         f"matching dY {fmt_shape(dY)}")
    cip = int_attr(op, "count_include_pad", int(count_include_pad), (0, 1, 2))
    attrs.pop("ceil_mode", None)
    geom, out = pool_geometry(op, x_shape, r, out_sizes=list(dY.shape[2:]), **attrs)
    # every output window must start inside the padded input
    for i in range(r):
        s = geom[10 + (3 - r) + i]
        pb = geom[13 + (3 - r) + i]
        if dY.shape[2 + i] > 0 and (dY.shape[2 + i] - 1) * s - pb >= x_shape[2 + i] + \
                geom[16 + (3 - r) + i]:
            raise ValueError(f"{op}: dY spatial size {dY.shape[2 + i]} too large for input "
                             f"size {x_shape[2 + i]} on axis {i}")
    dX = empty(x_shape, dY.dtype)
    st = native_fn("avgpool_backward", dY.dtype)(ptr(dY), ptr(dX), geom, cip, divisor,
                                                 get_num_threads())
    check_status(st, op)
    return dX


def _output_shape(op, output_shape, dY):
    if output_shape is None:
        raise ValueError(f"{op}: output_shape= (the forward input's shape) is required; ORT "
                         f"reads it from the graph")
    try:
        shp = [int(v) for v in output_shape]
    except TypeError:
        raise TypeError(f"{op}: output_shape must be a sequence of ints") from None
    if any(v < 0 for v in shp):
        raise ValueError(f"{op}: output_shape must be non-negative, got {shp}")
    return shp


@register
def MaxPool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
            pads=None, storage_order=0, strides=None, needs=None):
    """ONNX MaxPool (1/2/3-D, dilations, ceil_mode). Input: X. Outputs: Y, Indices (int64
    flat offsets into X)."""
    so = int_attr("MaxPool", "storage_order", storage_order, (0, 1))
    need_idx = needs_flags("MaxPool", needs, 2)[1]
    Y, idx = maxpool_forward("MaxPool", X, need_idx, auto_pad=auto_pad, ceil_mode=ceil_mode,
                             dilations=dilations, kernel_shape=kernel_shape, pads=pads,
                             strides=strides)
    if idx is not None and so == 1:
        idx = storage_order_indices(idx, X.shape)
    return select_outputs("MaxPool", (Y, idx), needs)


@register
def MaxPoolGrad(dY, Indices, *, output_shape=None, **unused_attrs):
    """MaxPoolGrad (ONNX domain, v9): ``dX = 0; dX.flat[Indices] += dY``. Inputs: dY,
    Indices. Keyword ``output_shape`` (ORT reads it from the graph; dim 0 becomes
    dY.shape[0]). Output: dX."""
    shp = _output_shape("MaxPoolGrad", output_shape, dY)
    if isinstance(dY, torch.Tensor) and dY.dim() >= 1 and shp:
        shp[0] = dY.shape[0]
    return maxpool_backward("MaxPoolGrad", dY, Indices, shp)


@register
def AveragePool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape=None,
                pads=None, strides=None):
    """ONNX AveragePool (1/2/3-D, count_include_pad, ceil_mode). Input: X. Output: Y."""
    cip = 2 * int_attr("AveragePool", "count_include_pad", count_include_pad, (0, 1))
    return avgpool_forward("AveragePool", X, cip, auto_pad=auto_pad,
                           ceil_mode=ceil_mode, kernel_shape=kernel_shape, pads=pads,
                           strides=strides)


@register
def AveragePoolGrad(dY, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape=None,
                    pads=None, strides=None, output_shape=None, **unused_attrs):
    """AveragePoolGrad (ONNX domain, v9), correct in 3-D with overlapping windows. Input: dY.
    Keyword ``output_shape`` (the forward input's shape). Output: dX."""
    shp = _output_shape("AveragePoolGrad", output_shape, dY)
    cip = 2 * int_attr("AveragePoolGrad", "count_include_pad", count_include_pad, (0, 1))
    return avgpool_backward("AveragePoolGrad", dY, shp, cip, auto_pad=auto_pad,
                            kernel_shape=kernel_shape, pads=pads, strides=strides)


def _global(op, X, kind):
    X = float_input(op, "X", X, min_rank=3)
    planes = X.shape[0] * X.shape[1]
    size = math.prod(X.shape[2:])
    if size == 0:
        raise ValueError(f"{op}: X must have non-empty spatial dims, got {fmt_shape(X)}")
    Y = empty((X.shape[0], X.shape[1]) + (1,) * (X.dim() - 2), X.dtype)
    st = native_fn("global_pool_forward", X.dtype)(ptr(X), ptr(Y), planes, size, kind,
                                                   get_num_threads())
    check_status(st, op)
    return Y


@register
def GlobalAveragePool(X):
    """ONNX GlobalAveragePool: mean over all spatial dims. Input: X [N,C,...]. Output: Y
    [N,C,1,...]."""
    return _global("GlobalAveragePool", X, 0)


@register
def GlobalMaxPool(X):
    """ONNX GlobalMaxPool: max over all spatial dims (NaN propagates). Input: X. Output: Y."""
    return _global("GlobalMaxPool", X, 1)


def global_pool_backward(op, dY, X, kind):
    """dX of GlobalAveragePool (kind 0: dY / size everywhere) or GlobalMaxPool (kind 1: dY at
    the first maximum of each plane, reading the forward input X)."""
    X = float_input(op, "X", X, min_rank=3)
    dY = float_input(op, "dY", dY)
    same_dtype(op, "X", X, "dY", dY)
    if dY.numel() != X.shape[0] * X.shape[1]:
        raise ValueError(f"{op}: dY must have N*C elements, got shape {fmt_shape(dY)}")
    size = math.prod(X.shape[2:])
    dX = empty(X.shape, X.dtype)
    st = native_fn("global_pool_backward", X.dtype)(ptr(dY), ptr(X), ptr(dX),
                                                    X.shape[0] * X.shape[1], size, kind,
                                                    get_num_threads())
    check_status(st, op)
    return dX


def is_2x2(geom) -> bool:
    """The geometry of the 2x2 stride-2 unpadded fast path (native ``pool_is_2x2``)."""
    ins, k, out, s = geom[1:4], geom[4:7], geom[7:10], geom[10:13]
    pb, d = geom[13:16], geom[19:22]
    return (k == [1, 2, 2] and s == [1, 2, 2] and pb == [0, 0, 0] and d == [1, 1, 1]
            and out[0] == ins[0] and 2 * out[1] <= ins[1] and 2 * out[2] <= ins[2])


def _code_pool_forward(native, op, X, geom, out):
    from .._native import ffi

    Y = empty((X.shape[0], X.shape[1], *out), X.dtype)
    code = torch.empty(Y.shape, dtype=torch.uint8)
    st = native_fn(native, X.dtype)(
        ptr(X), ptr(Y), ffi.cast("uint8_t *", code.data_ptr()), geom, get_num_threads())
    check_status(st, op)
    return Y, code


def _code_pool_backward(native, op, dY, code, x_shape, geom):
    from .._native import ffi

    dX = empty(tuple(x_shape), dY.dtype)
    st = native_fn(native, dY.dtype)(
        ptr(dY), ffi.cast("uint8_t *", code.data_ptr()), ptr(dX), geom, get_num_threads())
    check_status(st, op)
    return dX


def maxpool2x2_forward(op, X, geom, out):
    """(Y, code): 2x2 stride-2 max pool keeping a 1-byte argmax code per window."""
    return _code_pool_forward("maxpool2x2_forward", op, X, geom, out)


def maxpool2x2_backward(op, dY, code, x_shape, geom):
    return _code_pool_backward("maxpool2x2_backward", op, dY, code, x_shape, geom)


def is_code(geom) -> bool:
    """The geometry of the 1-byte-code max pool (native ``pool_is_code``): 1-D or 2-D,
    dilation 1, at most 256 taps, pads smaller than the kernel, every window starting
    inside the padded input."""
    ins, k, out, s = geom[1:4], geom[4:7], geom[7:10], geom[10:13]
    pb, pe, d = geom[13:16], geom[16:19], geom[19:22]
    return (ins[0] == 1 and k[0] == 1 and s[0] == 1 and pb[0] == 0 and out[0] == 1
            and d[1] == 1 and d[2] == 1 and k[1] * k[2] <= 256 and pb[1] < k[1]
            and pb[2] < k[2] and pe[1] < k[1] and pe[2] < k[2] and out[1] >= 1
            and out[2] >= 1 and (out[1] - 1) * s[1] - pb[1] < ins[1]
            and (out[2] - 1) * s[2] - pb[2] < ins[2])


def maxpool_code_forward(op, X, geom, out):
    """(Y, code): max pool keeping a 1-byte argmax code (``kh * kW + kw``) per window;
    geometry ``is_code``. 2x2 stride-2 windows: ``maxpool2x2_forward`` is faster."""
    return _code_pool_forward("maxpool_code_forward", op, X, geom, out)


def maxpool_code_backward(op, dY, code, x_shape, geom):
    return _code_pool_backward("maxpool_code_backward", op, dY, code, x_shape, geom)


def maxpool_saves_code(op, x_shape, attrs: dict) -> bool:
    """Whether ``maxpool_train_forward`` keeps 1-byte argmax codes (else int64 Indices)
    for an input of ``x_shape``: 1-D and 2-D pools with dilation 1 and at most 256 taps,
    which without ceil_mode always have the code kernels' geometry (so symbolic shapes,
    as a compiled graph's fake tensors have, decide it too); with ceil_mode it depends on
    the sizes."""
    r = len(x_shape) - 2
    k = attrs["kernel_shape"]
    if not 1 <= r <= 2 or any(d != 1 for d in attrs.get("dilations") or [1] * r) or \
            math.prod(k) > 256:
        return False
    if not attrs.get("ceil_mode"):
        return True
    geom, _ = pool_geometry(op, tuple(int(v) for v in x_shape), r, **attrs)
    return is_2x2(geom) or is_code(geom)


def maxpool_train_forward(op, X, **attrs):
    """(Y, saved) of a max pool whose dX will be asked for: ``saved`` is a 1-byte argmax
    code per window where ``maxpool_saves_code``, else the int64 Indices;
    ``maxpool_train_backward`` takes either. The Indices path compares tap by tap with a
    branch per tap (0.99 ms for a 3x3/2 pool of 16x16x32x32 at 2 threads, against
    0.05 ms for the code path)."""
    X = float_input(op, "X", X)
    r = spatial_rank(op, "X", X)
    if maxpool_saves_code(op, X.shape, attrs):
        geom, out = pool_geometry(op, X.shape, r, **attrs)
        if is_2x2(geom):
            return maxpool2x2_forward(op, X, geom, out)
        if not is_code(geom):  # maxpool_saves_code promised it: never run a wrong geometry
            raise ValueError(f"{op}: internal: no argmax-code geometry for X {fmt_shape(X)} "
                             f"and {attrs}")
        return maxpool_code_forward(op, X, geom, out)
    return maxpool_forward(op, X, True, **attrs)


def maxpool_train_backward(op, dY, saved, x_shape, **attrs):
    """dX of ``maxpool_train_forward`` from its ``saved`` codes or Indices."""
    if saved.dtype != torch.uint8:
        return maxpool_backward(op, dY.contiguous(), saved, x_shape)
    geom, _ = pool_geometry(op, x_shape, len(x_shape) - 2, **attrs)
    bwd = maxpool2x2_backward if is_2x2(geom) else maxpool_code_backward
    return bwd(op, dY.contiguous(), saved.contiguous(), tuple(x_shape), geom)
