"""The standard long tail on torch tensor ops: one table, ONNX semantics.

Each ``@op`` factory runs once per node at plan time (attributes parsed, constant inputs
read) and returns the run-time callable. Where ONNX and torch differ the ONNX rule is
implemented here: integer Div truncates, Mod follows ``fmod``, Slice clamps, Gather wraps
negative indices, Range counts ``ceil((limit-start)/delta)``, TopK breaks ties by lower
index, Resize maps coordinates by ``coordinate_transformation_mode``.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
import torch.nn.functional as F

from .dtypes import torch_dtype
from .op_table import op

# ---- helpers ----------------------------------------------------------------------------


def _int_list(t) -> list[int]:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return [int(v) for v in t.reshape(-1).tolist()]
    return [int(v) for v in t]


def _scalar(t):
    return None if t is None else t.reshape(-1)[0].item()


def _ints_arg(ctx, i: int, attr: str | None):
    """An int-list operand that moved from an attribute (old opsets) to input ``i``:
    returns (static list or None, dynamic: bool)."""
    if attr is not None and attr in ctx.attrs:
        return ctx.attrs[attr], False
    if ctx.has_input(i):
        c = ctx.const(i)
        if c is not None:
            return _int_list(c), False
        return None, True
    return None, False


def _axes(axes, rank):
    return [a + rank if a < 0 else a for a in axes]


_WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def _via_int64(fn):
    """``fn`` on uint16/32/64 inputs (torch has few kernels for them): computed in int64
    (uint64 reinterpreted, exact below 2**63) and cast back."""
    def run(*xs):
        dt = next((x.dtype for x in xs if isinstance(x, torch.Tensor)), None)
        if dt not in _WIDE_UNSIGNED:
            return fn(*xs)
        ys = [x.view(torch.int64) if x.dtype == torch.uint64 else x.to(torch.int64)
              if isinstance(x, torch.Tensor) and x.dtype in _WIDE_UNSIGNED else x for x in xs]
        y = fn(*ys)
        if y.dtype == torch.int64:
            y = y.view(torch.uint64) if dt == torch.uint64 else y.to(dt)
        return y
    return run


def _uint_safe(ctx, fn):
    """``fn`` itself when the first input's dtype is known and torch handles it; a
    dtype-checking wrapper otherwise."""
    dt = ctx.dtype(0)
    if dt is not None and dt not in _WIDE_UNSIGNED:
        return fn
    return _via_int64(fn)


# ---- elementwise ------------------------------------------------------------------------

_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Ceil": torch.ceil, "Floor": torch.floor,
    "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal,
    "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Asin": torch.asin,
    "Acos": torch.acos, "Atan": torch.atan, "Sinh": torch.sinh, "Cosh": torch.cosh,
    "Asinh": torch.asinh, "Acosh": torch.acosh, "Atanh": torch.atanh, "Erf": torch.erf,
    "Sign": torch.sign, "Round": torch.round, "IsNaN": torch.isnan,
    "Not": torch.logical_not, "BitwiseNot": torch.bitwise_not,
    "Softsign": lambda x: x / (1 + x.abs()),
    "Softplus": lambda x: torch.where(x > 30, x, torch.log1p(torch.exp(x))),
    "Mish": lambda x: x * torch.tanh(F.softplus(x)),
}
for _name, _fn in _UNARY.items():
    op(_name)(lambda ctx, _f=_fn: _uint_safe(ctx, _f))

_BINARY = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Equal": torch.eq,
    "Greater": torch.gt, "Less": torch.lt, "GreaterOrEqual": torch.ge, "LessOrEqual": torch.le,
    "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
    "BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
    "BitwiseXor": torch.bitwise_xor,
}
for _name, _fn in _BINARY.items():
    op(_name)(lambda ctx, _f=_fn: _uint_safe(ctx, _f))


@op("Div")
def _div(ctx):
    if ctx.dtype(0) is not None and ctx.dtype(0).is_floating_point:
        return torch.div

    def div(a, b):
        if a.dtype.is_floating_point:
            return torch.div(a, b)
        return torch.div(a, b, rounding_mode="trunc")  # C integer division, as ORT
    return _via_int64(div)


@op("Mod")
def _mod(ctx):
    # fmod=1: sign of the dividend (C fmod); fmod=0: sign of the divisor (Python's %)
    return _via_int64(torch.fmod if ctx.attr("fmod", 0) else torch.remainder)


@op("Pow")
def _pow(ctx):
    def pow_(a, b):
        y = torch.pow(a, b)
        return y if y.dtype == a.dtype else y.to(a.dtype)
    return pow_


@op("BitShift")
def _bitshift(ctx):
    left = ctx.attr("direction") == "LEFT"
    return _via_int64((lambda a, b: a << b) if left else (lambda a, b: a >> b))


def _variadic(fn):
    def run(*xs):
        return functools.reduce(fn, xs) if len(xs) > 1 else xs[0].clone()
    return run


op("Max")(lambda ctx: _via_int64(_variadic(torch.maximum)))
op("Min")(lambda ctx: _via_int64(_variadic(torch.minimum)))
op("Sum")(lambda ctx: _via_int64(_variadic(torch.add)))


@op("Mean")
def _mean(ctx):
    s = _variadic(torch.add)
    return lambda *xs: s(*xs) / len(xs)


@op("Where")
def _where(ctx):
    return torch.where


@op("IsInf")
def _isinf(ctx):
    neg, pos = ctx.attr("detect_negative", 1), ctx.attr("detect_positive", 1)
    if neg and pos:
        return torch.isinf
    if pos:
        return torch.isposinf
    if neg:
        return torch.isneginf
    return lambda x: torch.zeros(x.shape, dtype=torch.bool)


@op("PRelu")
def _prelu(ctx):
    legacy = ctx.opset < 7  # a 1-D slope is per channel (dim 1), not numpy-broadcast

    def prelu(x, slope):
        if legacy and slope.dim() == 1 and slope.numel() > 1 and x.dim() > 2:
            slope = slope.reshape([-1] + [1] * (x.dim() - 2))
        return torch.where(x < 0, x * slope, x)
    return prelu


@op("Clip")
def _clip(ctx):
    if ctx.opset < 11:
        lo, hi = ctx.attr("min", -math.inf), ctx.attr("max", math.inf)
        return lambda x: torch.clamp(x, lo, hi)
    def clip(x, lo=None, hi=None):
        y = x
        if lo is not None:
            y = torch.maximum(y, lo.reshape(()).to(x.dtype))
        if hi is not None:
            y = torch.minimum(y, hi.reshape(()).to(x.dtype))
        return y if y is not x else x.clone()
    return clip


@op("Elu")
def _elu(ctx):
    a = ctx.attr("alpha", 1.0)
    return lambda x: torch.where(x < 0, a * torch.expm1(x), x)


@op("Celu")
def _celu(ctx):
    a = ctx.attr("alpha", 1.0)
    return lambda x: torch.clamp(x, min=0) + torch.clamp(a * torch.expm1(x / a), max=0)


@op("Selu")
def _selu(ctx):
    a = ctx.attr("alpha", 1.67326319217681884765625)
    g = ctx.attr("gamma", 1.05070102214813232421875)
    return lambda x: torch.where(x > 0, g * x, g * a * torch.expm1(x))


@op("ThresholdedRelu")
def _thresholded_relu(ctx):
    a = ctx.attr("alpha", 1.0)
    return lambda x: torch.where(x > a, x, torch.zeros((), dtype=x.dtype))


@op("Shrink")
def _shrink(ctx):
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    def shrink(x):
        z = torch.zeros((), dtype=x.dtype)
        return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, z)).to(x.dtype)
    return shrink


_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)


def cast_to(x: torch.Tensor, dt: torch.dtype, saturate: bool = True) -> torch.Tensor:
    """ONNX Cast to ``dt``; to a float8 type out-of-range values (and ±inf) become ±max
    with ``saturate``, else NaN (or ±inf for float8e5m2, the one type that has it)."""
    if dt not in _FLOAT8 or not x.dtype.is_floating_point:
        return x.to(dt)
    y = x.float()
    top = torch.finfo(dt).max
    if saturate:
        y = torch.where(torch.isnan(y), y, y.clamp(-top, top))
    else:
        big = y.abs() > top
        over = torch.copysign(torch.tensor(math.inf), y) if dt == torch.float8_e5m2 else \
            torch.full_like(y, math.nan)
        y = torch.where(big, over, y)
    return y.to(dt)


@op("Cast")
def _cast(ctx):
    dt = torch_dtype(ctx.attr("to"), f"Cast node {ctx.name!r}")
    sat = bool(ctx.attr("saturate", 1))
    if dt in _FLOAT8:
        return lambda x: cast_to(x, dt, sat)
    return lambda x: x.to(dt)


@op("CastLike")
def _cast_like(ctx):
    sat = bool(ctx.attr("saturate", 1))
    return lambda x, like: cast_to(x, like.dtype, sat)


@op("Identity")
def _identity(ctx):
    return lambda x: x


# ---- shape and data movement -----------------------------------------------------------


@op("Shape")
def _shape(ctx):
    start, end = ctx.attr("start", 0), ctx.attr("end")
    return lambda x: torch.tensor(list(x.shape)[start:end], dtype=torch.int64)


@op("Size")
def _size(ctx):
    return lambda x: torch.tensor(x.numel(), dtype=torch.int64)


def _reshape_target(shape, in_shape, allowzero):
    out = list(shape)
    if not allowzero:
        for i, s in enumerate(out):
            if s == 0:
                out[i] = in_shape[i]
    return out


@op("Reshape")
def _reshape(ctx):
    allowzero = ctx.attr("allowzero", 0)
    if ctx.opset < 5:
        shape = ctx.attr("shape")
        return lambda x: x.reshape(_reshape_target(shape, x.shape, allowzero))
    c = ctx.const(1)
    if c is not None:
        shape = _int_list(c)
        if not allowzero and 0 not in shape:
            return lambda x, _s: x.reshape(shape)
        return lambda x, _s: x.reshape(_reshape_target(shape, x.shape, allowzero))
    return lambda x, s: x.reshape(_reshape_target(_int_list(s), x.shape, allowzero))


@op("Flatten")
def _flatten(ctx):
    axis = ctx.attr("axis", 1)
    def flatten(x):
        a = axis + x.dim() if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))
    return flatten


@op("Squeeze")
def _squeeze(ctx):
    axes, dyn = _ints_arg(ctx, 1, "axes")
    def squeeze(x, a=None):
        ax = _int_list(a) if dyn else axes
        if ax is None:
            return x.reshape([s for s in x.shape if s != 1])
        ax = set(_axes(ax, x.dim()))
        for i in ax:
            if x.shape[i] != 1:
                raise ValueError(f"Squeeze: axis {i} has size {x.shape[i]}, not 1")
        return x.reshape([s for i, s in enumerate(x.shape) if i not in ax])
    return squeeze


@op("Unsqueeze")
def _unsqueeze(ctx):
    axes, dyn = _ints_arg(ctx, 1, "axes")
    def unsqueeze(x, a=None):
        ax = _int_list(a) if dyn else axes
        rank = x.dim() + len(ax)
        ax = sorted(_axes(ax, rank))
        shape = list(x.shape)
        for i in ax:
            shape.insert(i, 1)
        return x.reshape(shape)
    return unsqueeze


@op("Transpose")
def _transpose(ctx):
    perm = ctx.attr("perm")
    if perm is None:
        return lambda x: x.permute(list(range(x.dim() - 1, -1, -1)))
    return lambda x: x.permute(perm)


@op("Expand")
def _expand(ctx):
    def expand(x, shape):
        s = _int_list(shape)
        return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(s)))
    return expand


@op("Tile")
def _tile(ctx):
    return lambda x, reps: x.repeat(_int_list(reps)) if x.dim() else x.clone()


@op("ConstantOfShape")
def _constant_of_shape(ctx):
    v = ctx.attr("value")
    if v is None:
        v = torch.zeros(1, dtype=torch.float32)
    val, dt = v.reshape(-1)[0].item(), v.dtype
    return lambda shape: torch.full(_int_list(shape), val, dtype=dt)


@op("Constant")
def _constant(ctx):
    a = ctx.attrs
    if "value" in a:
        v = a["value"]
    elif "value_float" in a:
        v = torch.tensor(a["value_float"], dtype=torch.float32)
    elif "value_floats" in a:
        v = torch.tensor(a["value_floats"], dtype=torch.float32)
    elif "value_int" in a:
        v = torch.tensor(a["value_int"], dtype=torch.int64)
    elif "value_ints" in a:
        v = torch.tensor(a["value_ints"], dtype=torch.int64)
    else:
        raise ctx.error(f"unsupported Constant attribute(s) {sorted(a)}", NotImplementedError)
    return lambda: v


@op("Range")
def _range(ctx):
    def range_(start, limit, delta):
        s, lim, d = start.item(), limit.item(), delta.item()
        n = max(math.ceil((lim - s) / d), 0)
        return (s + d * torch.arange(n, dtype=torch.float64)).to(start.dtype) \
            if start.dtype.is_floating_point else \
            torch.arange(n, dtype=torch.int64).mul_(d).add_(s).to(start.dtype)
    return range_


@op("EyeLike")
def _eye_like(ctx):
    k, dt = ctx.attr("k", 0), ctx.attr("dtype")
    def eye(x):
        dtype = torch_dtype(dt) if dt is not None else x.dtype
        n, m = x.shape
        return torch.ones(n, m, dtype=dtype).tril(k).triu(k) if n and m else \
            torch.zeros(n, m, dtype=dtype)
    return eye


@op("Trilu")
def _trilu(ctx):
    upper = ctx.attr("upper", 1)
    def trilu(x, k=None):
        kk = int(k.item()) if k is not None else 0
        return torch.triu(x, kk) if upper else torch.tril(x, kk)
    return trilu


@op("DepthToSpace")
def _depth_to_space(ctx):
    b, mode = ctx.attr("blocksize"), ctx.attr("mode", "DCR")
    def d2s(x):
        n, c, h, w = x.shape
        if mode == "DCR":
            y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
        return y.reshape(n, c // (b * b), h * b, w * b)
    return d2s


@op("SpaceToDepth")
def _space_to_depth(ctx):
    b, mode = ctx.attr("blocksize"), ctx.attr("mode", "DCR")
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)

    def s2d(x):
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // b, b, w // b, b).permute(*perm)
        return y.reshape(n, c * b * b, h // b, w // b)
    return s2d


@op("NonZero")
def _nonzero(ctx):
    return lambda x: torch.nonzero(x).t().contiguous() if x.dim() else \
        torch.zeros((0, int(bool(x))), dtype=torch.int64)


@op("Einsum")
def _einsum(ctx):
    eq = ctx.attr("equation").replace(" ", "")
    return lambda *xs: torch.einsum(eq, *xs)


@op("CumSum")
def _cumsum(ctx):
    excl, rev = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    def cumsum(x, axis):
        a = int(axis.item())
        a = a + x.dim() if a < 0 else a
        y = x.flip(a) if rev else x
        s = torch.cumsum(y, a, dtype=x.dtype)
        if excl:
            s = s - y
        return s.flip(a) if rev else s
    return cumsum


# ---- reductions --------------------------------------------------------------------------


def _reduce(kind):
    def factory(ctx):
        keep = bool(ctx.attr("keepdims", 1))
        noop = ctx.attr("noop_with_empty_axes", 0)
        attr_axes = ctx.attr("axes")
        from_input = ctx.opset >= (13 if kind == "ReduceSum" else 18)
        static = None if from_input else attr_axes
        if from_input and ctx.has_input(1) and ctx.const(1) is not None:
            static, from_input = _int_list(ctx.const(1)), False

        def run(x, axes=None):
            ax = _int_list(axes) if from_input and axes is not None else static
            if not ax:
                if noop:
                    return x
                ax = list(range(x.dim()))
            ax = sorted(set(_axes(ax, x.dim())))
            return _REDUCERS[kind](x, ax, keep)
        return run
    return factory


def _amax(x, ax, keep, fn):
    if x.numel() == 0:
        shape = [1 if i in ax else s for i, s in enumerate(x.shape)] if keep else \
            [s for i, s in enumerate(x.shape) if i not in ax]
        fill = -math.inf if fn is torch.amax else math.inf
        if not x.dtype.is_floating_point:
            info = torch.iinfo(x.dtype) if x.dtype != torch.bool else None
            fill = (info.min if fn is torch.amax else info.max) if info else (fn is torch.amin)
        return torch.full(shape, fill, dtype=x.dtype)
    return fn(x, ax, keepdim=keep) if ax else x


def _prod(x, ax, keep):
    for a in sorted(ax, reverse=True):
        x = torch.prod(x, a, keepdim=keep)
    return x


_REDUCERS = {
    "ReduceSum": lambda x, ax, k: torch.sum(x, ax, keepdim=k, dtype=x.dtype),
    "ReduceMean": lambda x, ax, k: torch.mean(x, ax, keepdim=k),
    "ReduceMax": lambda x, ax, k: _amax(x, ax, k, torch.amax),
    "ReduceMin": lambda x, ax, k: _amax(x, ax, k, torch.amin),
    "ReduceProd": _prod,
    "ReduceSumSquare": lambda x, ax, k: torch.sum(x * x, ax, keepdim=k, dtype=x.dtype),
    "ReduceL1": lambda x, ax, k: torch.sum(x.abs(), ax, keepdim=k, dtype=x.dtype),
    "ReduceL2": lambda x, ax, k: torch.sqrt(torch.sum(x * x, ax, keepdim=k)).to(x.dtype)
    if x.dtype.is_floating_point else torch.sqrt(torch.sum(x * x, ax, keepdim=k).double())
    .to(x.dtype),
    "ReduceLogSum": lambda x, ax, k: torch.log(torch.sum(x, ax, keepdim=k)),
    "ReduceLogSumExp": lambda x, ax, k: torch.logsumexp(x, ax, keepdim=k)
    if x.numel() else torch.log(torch.sum(torch.exp(x), ax, keepdim=k)),
}
for _name in _REDUCERS:
    op(_name)(_reduce(_name))


def _arg(fn):
    def factory(ctx):
        axis, keep = ctx.attr("axis", 0), bool(ctx.attr("keepdims", 1))
        last = ctx.attr("select_last_index", 0)
        def run(x):
            a = axis + x.dim() if axis < 0 else axis
            if last:
                n = x.shape[a]
                return (n - 1) - fn(x.flip(a), a, keepdim=keep)
            return fn(x, a, keepdim=keep)
        return run
    return factory


op("ArgMax")(_arg(torch.argmax))
op("ArgMin")(_arg(torch.argmin))


@op("TopK")
def _topk(ctx):
    axis, largest = ctx.attr("axis", -1), ctx.attr("largest", 1)
    k_attr = ctx.attr("k") if ctx.opset < 10 else None
    def topk(x, k=None):
        kk = k_attr if k_attr is not None else int(k.reshape(-1)[0].item())
        a = axis + x.dim() if axis < 0 else axis
        if not 0 <= kk <= x.shape[a]:
            raise ValueError(f"TopK: k={kk} out of range for axis of size {x.shape[a]}")
        v, i = torch.sort(x, dim=a, descending=bool(largest), stable=True)
        return v.narrow(a, 0, kk), i.narrow(a, 0, kk)
    return topk


@op("Hardmax")
def _hardmax(ctx):
    axis = ctx.attr("axis", 1 if ctx.opset < 13 else -1)
    coerce = ctx.opset < 13
    def hardmax(x):
        a = axis + x.dim() if axis < 0 else axis
        y = x.reshape(math.prod(x.shape[:a]), -1) if coerce else x
        d = 1 if coerce else a
        idx = torch.argmax(y, d, keepdim=True)
        out = torch.zeros_like(y).scatter_(d, idx, 1)
        return out.reshape(x.shape)
    return hardmax


# ---- normalisation ------------------------------------------------------------------------


@op("InstanceNormalization")
def _instance_norm(ctx):
    eps = ctx.attr("epsilon", 1e-5)
    def inorm(x, scale, b):
        dims = list(range(2, x.dim()))
        xd = x.double()
        mean = xd.mean(dims, keepdim=True)
        var = ((xd - mean) ** 2).mean(dims, keepdim=True)
        shp = [1, -1] + [1] * (x.dim() - 2)
        y = (xd - mean) / torch.sqrt(var + eps) * scale.double().reshape(shp) + \
            b.double().reshape(shp)
        return y.to(x.dtype)
    return inorm


def lrn_torch(alpha: float, beta: float, bias: float, size: int):
    """ONNX LRN as torch ops (float64 and other inputs the native float32 kernel,
    ops_kernels' LRN, does not take)."""
    lo = (size - 1) // 2
    hi = size - 1 - lo

    def lrn(x):
        # x / (bias + alpha/size * (sum of squares over the channel window)) ** beta, the
        # window summed in place from one zero-padded copy of x²
        c = x.shape[1]
        sq = F.pad(x * x, (0, 0) * (x.dim() - 2) + (lo, hi))
        acc = sq[:, lo:lo + c].clone()
        for j in range(size):
            if j != lo:
                acc += sq[:, j:j + c]
        acc.mul_(alpha / size).add_(bias)
        if beta == 0.75:  # x^-3/4 = rsqrt(x)·sqrt(rsqrt(x)): 3x faster than pow (GoogLeNet)
            acc.rsqrt_()
            acc.mul_(acc.sqrt())
        else:
            acc.pow_(-beta)
        return acc.mul_(x)
    return lrn


@op("MeanVarianceNormalization")
def _mvn(ctx):
    axes = ctx.attr("axes", [0, 2, 3])
    def mvn(x):
        m = x.mean(axes, keepdim=True)
        v = ((x - m) ** 2).mean(axes, keepdim=True)
        return (x - m) / (torch.sqrt(v) + 1e-9)
    return mvn


@op("LpNormalization")
def _lp_norm(ctx):
    axis, p = ctx.attr("axis", -1), ctx.attr("p", 2)
    def lp_norm(x):
        norm = torch.linalg.vector_norm(x, p, dim=axis, keepdim=True)
        return torch.where(norm == 0, torch.zeros((), dtype=x.dtype), x / norm)
    return lp_norm


# ---- indexing -----------------------------------------------------------------------------


def _wrap_indices(op_name, idx, dim):
    if idx.numel():
        bad = (idx < -dim) | (idx >= dim)
        if bool(bad.any()):
            v = int(idx[bad][0])
            raise IndexError(f"{op_name}: index {v} out of range for a dimension of size "
                             f"{dim} (valid: [{-dim}, {dim - 1}])")
    return torch.where(idx < 0, idx + dim, idx).long()


@op("ScatterElements")
def _scatter_elements(ctx):
    axis, red = ctx.attr("axis", 0), ctx.attr("reduction", "none")
    def scatter(data, indices, updates):
        a = axis + data.dim() if axis < 0 else axis
        idx = _wrap_indices("ScatterElements", indices, data.shape[a])
        out = data.clone()
        if red == "none":
            return out.scatter_(a, idx, updates)
        r = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[red]
        return out.scatter_reduce_(a, idx, updates, r, include_self=True)
    return scatter


op("Scatter", until=10)(_scatter_elements)


@op("ScatterND")
def _scatter_nd(ctx):
    red = ctx.attr("reduction", "none")
    def scatter_nd(data, indices, updates):
        k = indices.shape[-1]
        lead = data.shape[:k]
        idx = indices.reshape(-1, k).long()
        lin = torch.zeros(idx.shape[0], dtype=torch.int64)
        for j in range(k):
            lin = lin * lead[j] + _wrap_indices("ScatterND", idx[:, j], lead[j])
        out = data.clone()
        flat = out.reshape(math.prod(lead), *data.shape[k:])
        upd = updates.reshape(-1, *data.shape[k:])
        if red == "none":
            flat[lin] = upd
        elif red == "add":
            flat.index_add_(0, lin, upd)
        else:
            r = {"mul": "prod", "max": "amax", "min": "amin"}[red]
            flat.index_reduce_(0, lin, upd, r, include_self=True)
        return flat.reshape(data.shape)
    return scatter_nd


@op("OneHot")
def _one_hot(ctx):
    axis = ctx.attr("axis", -1)
    def one_hot(indices, depth, values):
        d = int(depth.reshape(-1)[0].item())
        idx = indices.long()
        idx = torch.where(idx < 0, idx + d, idx)
        valid = (idx >= 0) & (idx < d)
        oh = F.one_hot(torch.where(valid, idx, 0), d).bool() & valid.unsqueeze(-1)
        off, on = values.reshape(-1)[0], values.reshape(-1)[1]
        y = torch.where(oh, on, off)
        a = axis + y.dim() if axis < 0 else axis
        return y.movedim(-1, a)
    return one_hot


# ---- padding and resizing --------------------------------------------------------------


def _pad_index(n, b, e, mode):
    i = torch.arange(-b, n + e)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return i % n
    # reflect (without repeating the edge)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    i = i % period
    return torch.where(i >= n, period - i, i)


@op("Pad")
def _pad(ctx):
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pads_attr, value_attr = ctx.attr("pads") or ctx.attr("paddings"), ctx.attr("value", 0.0)
    else:
        pads_attr = value_attr = None

    def pad(x, pads=None, value=None, axes=None):
        p = pads_attr if pads_attr is not None else _int_list(pads)
        r = x.dim()
        ax = _axes(_int_list(axes), r) if axes is not None else list(range(r))
        n = len(ax)
        begin = dict(zip(ax, p[:n], strict=True))
        end = dict(zip(ax, p[n:], strict=True))
        if mode == "constant":
            v = value_attr if value_attr is not None else (_scalar(value) if value is not None
                                                           and value.numel() else 0)
            spec = []
            for d in range(r - 1, -1, -1):
                spec += [begin.get(d, 0), end.get(d, 0)]
            if x.numel() == 0 and any(s > 0 for s in spec):
                shape = [x.shape[d] + begin.get(d, 0) + end.get(d, 0) for d in range(r)]
                return torch.full(shape, v, dtype=x.dtype)
            return F.pad(x, spec, value=v)
        y = x
        for d in ax:
            b, e = begin[d], end[d]
            if b < 0:
                y, b = y.narrow(d, -b, y.shape[d] + b), 0
            if e < 0:
                y, e = y.narrow(d, 0, y.shape[d] + e), 0
            if b or e:
                y = y.index_select(d, _pad_index(y.shape[d], b, e, mode))
        return y if y is not x else x.clone()
    return pad


def _resize_axis(x, axis, out_n, scale, roi, attrs):
    """Resample ``x`` along ``axis`` to ``out_n`` elements (ONNX Resize, one axis)."""
    mode, ctm = attrs["mode"], attrs["ctm"]
    n = x.shape[axis]
    i = torch.arange(out_n, dtype=torch.float64)
    if ctm == "half_pixel":
        src = (i + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        adj = out_n / (scale * n) if n else 1.0
        center = n / 2
        off = center * (1 - adj)
        src = off + (i + 0.5) / scale - 0.5
    elif ctm == "pytorch_half_pixel":
        src = (i + 0.5) / scale - 0.5 if out_n > 1 else torch.zeros_like(i)
    elif ctm == "align_corners":  # ONNX uses the unrounded resized length n·scale
        src = i * (n - 1) / (n * scale - 1) if n * scale != 1 else torch.zeros_like(i)
    elif ctm == "asymmetric":
        src = i / scale
    elif ctm == "tf_half_pixel_for_nn":
        src = (i + 0.5) / scale
    elif ctm == "tf_crop_and_resize":
        s, e = roi
        src = (s * (n - 1) + i * (e - s) * (n - 1) / (out_n - 1)) if out_n > 1 else \
            torch.full_like(i, 0.5 * (s + e) * (n - 1))
    else:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode {ctm!r}")
    outside = (src < 0) | (src > n - 1) if ctm == "tf_crop_and_resize" else None
    if mode == "nearest":
        nm = attrs["nearest_mode"]
        if nm == "round_prefer_floor":
            idx = torch.ceil(src - 0.5)
        elif nm == "round_prefer_ceil":
            idx = torch.floor(src + 0.5)
        elif nm == "floor":
            idx = torch.floor(src)
        else:
            idx = torch.ceil(src)
        y = x.index_select(axis, idx.clamp(0, n - 1).long())
    else:
        f = torch.floor(src)
        t = src - f
        if attrs["antialias"] and scale < 1:
            # downsampling with antialias: the filter stretched by 1/scale (more taps)
            if mode == "linear":
                start = math.floor(-1 / scale) + 1
                offs = range(start, 2 - start)
                w = [torch.clamp(1 - ((i - t) * scale).abs(), 0, 1) for i in offs]
            else:
                start = math.floor(-2 / scale) + 1
                offs = range(start, 2 - start)
                w = [_cubic((i - t) * scale, attrs["cubic_a"]) for i in offs]
            taps = [f + i for i in offs]
            tot = sum(w)
            w = [ww / tot for ww in w]
        elif mode == "linear":
            taps = [f, f + 1]
            w = [1 - t, t]
        else:  # cubic
            a = attrs["cubic_a"]
            taps = [f - 1, f, f + 1, f + 2]
            d = [t + 1, t, 1 - t, 2 - t]
            w = [_cubic(dd, a) for dd in d]
        if attrs["exclude_outside"]:
            w = [torch.where((tp < 0) | (tp > n - 1), 0.0, ww) for tp, ww in zip(taps, w,
                                                                               strict=True)]
            tot = sum(w)
            w = [ww / tot for ww in w]
        y = None
        shp = [1] * x.dim()
        shp[axis] = out_n
        xd = x.double() if x.dtype.is_floating_point else x.double()
        for tp, ww in zip(taps, w, strict=True):
            term = xd.index_select(axis, tp.clamp(0, n - 1).long()) * ww.reshape(shp)
            y = term if y is None else y + term
    if outside is not None:
        shp = [1] * x.dim()
        shp[axis] = out_n
        y = torch.where(outside.reshape(shp), attrs["extrapolation_value"], y.double())
    return y


def _cubic(d, a):
    d = d.abs()
    return torch.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                       torch.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a,
                                   torch.zeros_like(d)))


def _resize_factory(ctx, upsample=False):
    a = ctx.attrs
    attrs = {
        "mode": a.get("mode", "nearest"),
        "ctm": "asymmetric" if upsample or ctx.opset < 11 else
        a.get("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": a.get("nearest_mode", "round_prefer_floor" if not
                              (upsample or ctx.opset < 11) else "floor"),
        "cubic_a": a.get("cubic_coeff_a", -0.75), "exclude_outside": a.get("exclude_outside", 0),
        "extrapolation_value": a.get("extrapolation_value", 0.0),
        "antialias": a.get("antialias", 0), "policy": a.get("keep_aspect_ratio_policy", "stretch"),
    }
    if attrs["mode"] in ("bilinear", "trilinear"):
        attrs["mode"] = "linear"
    axes_attr = a.get("axes")
    scales_attr = a.get("scales")
    if upsample and ctx.opset < 9:
        def resize_up(x):
            return _resize(x, None, torch.tensor(scales_attr), None, attrs, None)
        return resize_up
    if upsample:
        return lambda x, scales: _resize(x, None, scales, None, attrs, None)
    if ctx.opset < 11:
        return lambda x, scales: _resize(x, None, scales, None, attrs, None)

    def resize(x, roi=None, scales=None, sizes=None):
        return _resize(x, roi, scales, sizes, attrs, axes_attr)
    return resize


def _resize(x, roi, scales, sizes, attrs, axes):
    r = x.dim()
    ax = _axes(axes, r) if axes else list(range(r))
    k = len(ax)
    sc = [1.0] * r
    out = list(x.shape)
    if sizes is not None and sizes.numel():
        sz = _int_list(sizes)
        if attrs["policy"] != "stretch":
            ratios = [sz[j] / x.shape[d] for j, d in enumerate(ax)]
            s = min(ratios) if attrs["policy"] == "not_larger" else max(ratios)
            sz = [int(math.floor(s * x.shape[d] + 0.5)) for d in ax]
            for d in ax:
                sc[d] = s
        else:
            for j, d in enumerate(ax):
                sc[d] = sz[j] / x.shape[d] if x.shape[d] else 1.0
        for j, d in enumerate(ax):
            out[d] = sz[j]
    else:
        s = [float(v) for v in scales.reshape(-1).tolist()]
        for j, d in enumerate(ax):
            sc[d] = s[j]
            out[d] = int(math.floor(x.shape[d] * s[j]))
    rois = [(0.0, 1.0)] * r
    if roi is not None and roi.numel():
        rv = [float(v) for v in roi.reshape(-1).tolist()]
        for j, d in enumerate(ax):
            rois[d] = (rv[j], rv[j + k])
    y = x
    for d in range(r):
        if out[d] != x.shape[d] or sc[d] != 1.0 or attrs["ctm"] == "tf_crop_and_resize":
            if attrs["mode"] == "nearest" and attrs["ctm"] != "tf_crop_and_resize" and \
                    out[d] == x.shape[d] and sc[d] == 1.0:
                continue
            y = _resize_axis(y, d, out[d], sc[d], rois[d], attrs)
    if y.dtype != x.dtype:
        y = y.round().clamp(torch.iinfo(x.dtype).min, torch.iinfo(x.dtype).max).to(x.dtype) \
            if not x.dtype.is_floating_point else y.to(x.dtype)
    return y if y is not x else x.clone()


op("Resize")(_resize_factory)
op("Upsample", until=9)(lambda ctx: _resize_factory(ctx, upsample=True))


@op("ConvTranspose")
def _conv_transpose(ctx):
    a = ctx.attrs
    group = a.get("group", 1)
    def conv_t(x, w, b=None):
        nd = x.dim() - 2
        ks = a.get("kernel_shape") or list(w.shape[2:])
        strides = a.get("strides") or [1] * nd
        dil = a.get("dilations") or [1] * nd
        opad = a.get("output_padding") or [0] * nd
        pads = a.get("pads") or [0] * (2 * nd)
        auto = a.get("auto_pad", "NOTSET")
        in_sp = x.shape[2:]
        if a.get("output_shape") is not None:
            osh = a["output_shape"][-nd:]
            total = [strides[i] * (in_sp[i] - 1) + opad[i] + ((ks[i] - 1) * dil[i] + 1) - osh[i]
                     for i in range(nd)]
            pads = _split_pads(total, auto)
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            osh = [in_sp[i] * strides[i] for i in range(nd)]
            total = [strides[i] * (in_sp[i] - 1) + opad[i] + ((ks[i] - 1) * dil[i] + 1) - osh[i]
                     for i in range(nd)]
            pads = _split_pads(total, auto)
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
        y = fn(x, w, None, stride=strides, groups=group, dilation=dil)
        # the full output, output_padding appended at the end, then ONNX's pads cropped
        # (a negative pad, from an output_shape larger than the full output, extends)
        spec = []
        for i in range(nd - 1, -1, -1):
            spec += [-pads[i], opad[i] - pads[i + nd]]
        if any(spec):
            y = F.pad(y, spec)
        if b is not None:
            y = y + b.reshape([1, -1] + [1] * nd)
        return y.contiguous()
    return conv_t


def _split_pads(total, auto):
    nd = len(total)
    begin = [0] * nd
    end = [0] * nd
    for i, t in enumerate(total):
        if auto == "SAME_UPPER":
            begin[i], end[i] = t // 2, t - t // 2
        else:
            begin[i], end[i] = t - t // 2, t // 2
    return begin + end


# ---- sequences ----------------------------------------------------------------------------


op("SequenceConstruct")(lambda ctx: lambda *xs: list(xs))
op("SequenceLength")(lambda ctx: lambda s: torch.tensor(len(s), dtype=torch.int64))


@op("SequenceEmpty")
def _seq_empty(ctx):
    return lambda: []


@op("SequenceAt")
def _seq_at(ctx):
    return lambda s, i: s[int(i.item())]


@op("SequenceInsert")
def _seq_insert(ctx):
    def insert(s, t, pos=None):
        out = list(s)
        out.insert(len(out) if pos is None else int(pos.item()), t)
        return out
    return insert


@op("SequenceErase")
def _seq_erase(ctx):
    def erase(s, pos=None):
        out = list(s)
        del out[-1 if pos is None else int(pos.item())]
        return out
    return erase


@op("ConcatFromSequence")
def _concat_from_seq(ctx):
    axis, new = ctx.attr("axis"), ctx.attr("new_axis", 0)
    return (lambda s: torch.stack(list(s), axis)) if new else \
        (lambda s: torch.cat(list(s), axis))


@op("SplitToSequence")
def _split_to_seq(ctx):
    axis, keep = ctx.attr("axis", 0), ctx.attr("keepdims", 1)
    def split(x, split=None):
        a = axis + x.dim() if axis < 0 else axis
        if split is None:
            parts = list(torch.split(x, 1, a))
            return parts if keep else [p.squeeze(a) for p in parts]
        sp = _int_list(split)
        if split.dim() == 0:
            return list(torch.split(x, sp[0], a))
        return list(torch.split(x, sp, a))
    return split


# ---- later additions to the standard set ---------------------------------------------------


@op("Swish")
def _swish(ctx):
    alpha = ctx.attr("alpha", 1.0)
    return lambda x: x * torch.sigmoid(alpha * x)


@op("CumProd")
def _cumprod(ctx):
    excl, rev = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    def cumprod(x, axis):
        a = int(axis.item())
        a = a + x.dim() if a < 0 else a
        y = x.flip(a) if rev else x
        if excl:  # shift right by one, filling with the identity 1
            y = torch.cat([torch.ones_like(y.narrow(a, 0, 1)), y.narrow(a, 0, y.shape[a] - 1)], a)
        p = torch.cumprod(y, a, dtype=x.dtype)
        return p.flip(a) if rev else p
    return cumprod


@op("Compress")
def _compress(ctx):
    axis = ctx.attr("axis")
    def compress(x, cond):
        c = cond.bool().reshape(-1)
        if axis is None:
            flat = x.reshape(-1)
            return flat[: c.numel()][c[: flat.numel()]]
        a = axis + x.dim() if axis < 0 else axis
        idx = torch.nonzero(c[: x.shape[a]]).reshape(-1)
        return x.index_select(a, idx)
    return compress


@op("GroupNormalization", since=18)
def _group_norm(ctx):
    eps, groups = ctx.attr("epsilon", 1e-5), ctx.attr("num_groups")
    per_group_affine = ctx.opset < 21  # opset 18: scale/bias per group; 21: per channel
    def group_norm(x, scale, bias):
        n, c = x.shape[:2]
        xg = x.double().reshape(n, groups, -1)
        mean = xg.mean(-1, keepdim=True)
        var = ((xg - mean) ** 2).mean(-1, keepdim=True)
        y = ((xg - mean) / torch.sqrt(var + eps)).reshape(x.shape)
        shp = [1, c] + [1] * (x.dim() - 2)
        if per_group_affine:
            scale = scale.repeat_interleave(c // groups)
            bias = bias.repeat_interleave(c // groups)
        return (y * scale.double().reshape(shp) + bias.double().reshape(shp)).to(x.dtype)
    return group_norm


@op("Det")
def _det(ctx):
    return lambda x: torch.linalg.det(x)


@op("ReverseSequence")
def _reverse_sequence(ctx):
    batch_axis, time_axis = ctx.attr("batch_axis", 1), ctx.attr("time_axis", 0)
    def reverse(x, lens):
        y = x.clone()
        for b, n in enumerate(lens.tolist()):
            src = x.select(batch_axis, b)
            dst = y.select(batch_axis, b)
            t = time_axis if time_axis < batch_axis else time_axis - 1
            dst.narrow(t, 0, n).copy_(src.narrow(t, 0, n).flip(t))
        return y
    return reverse


@op("NegativeLogLikelihoodLoss", since=12)
def _nll_loss(ctx):
    reduction, ignore = ctx.attr("reduction", "mean"), ctx.attr("ignore_index")
    def nll(x, target, weight=None):
        t = target.long()
        mask = torch.ones_like(t, dtype=torch.bool) if ignore is None else t != ignore
        tc = torch.where(mask, t, 0)
        if tc.numel() and (bool((tc < 0).any()) or bool((tc >= x.shape[1]).any())):
            raise IndexError(f"NegativeLogLikelihoodLoss: target holds a class outside "
                             f"[0, {x.shape[1] - 1}]")
        picked = x.gather(1, tc.unsqueeze(1)).squeeze(1)
        w = weight[tc] if weight is not None else torch.ones_like(picked)
        w = w * mask.to(w.dtype)
        loss = -picked * w
        if reduction == "none":
            return loss
        if reduction == "sum":
            return loss.sum()
        return loss.sum() / w.sum()
    return nll


def avg_pool_dilated(x, kernel_shape, strides=None, dilations=None, pads=None,
                     auto_pad="NOTSET", ceil_mode=0, count_include_pad=0):
    """ONNX AveragePool with dilations (opset 19) on torch ops: the sum over the kernel
    offsets of strided slices of the zero-padded input, divided by the number of counted
    positions (pads count only with ``count_include_pad``; positions that ``ceil_mode``
    adds past the padding never count)."""
    nd = x.dim() - 2
    k = list(kernel_shape)
    s = list(strides or [1] * nd)
    d = list(dilations or [1] * nd)
    p = list(pads or [0] * (2 * nd))
    size = list(x.shape[2:])
    span = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-size[i] // s[i]) for i in range(nd)]
        for i in range(nd):
            total = max((out[i] - 1) * s[i] + span[i] - size[i], 0)
            small, big = total // 2, total - total // 2
            p[i], p[i + nd] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        p = [0] * (2 * nd)
    out = []
    for i in range(nd):
        room = size[i] + p[i] + p[i + nd] - span[i]
        o = (-(-room // s[i]) if ceil_mode else room // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= size[i] + p[i]:
            o -= 1  # the last window may not start inside the end padding
        out.append(o)
    extra = [max((out[i] - 1) * s[i] + span[i] - (size[i] + p[i] + p[i + nd]), 0)
             for i in range(nd)]
    spec, mspec = [], []
    for i in range(nd - 1, -1, -1):
        spec += [p[i], p[i + nd] + extra[i]]
    xp = F.pad(x, spec)
    mask = torch.ones([1, 1] + size, dtype=x.dtype)
    if count_include_pad:
        mask = F.pad(mask, [v for i in range(nd - 1, -1, -1) for v in (p[i], p[i + nd])],
                     value=1.0)
        for i in range(nd - 1, -1, -1):
            mspec += [0, extra[i]]
    else:
        mspec = spec
    mp = F.pad(mask, mspec)
    total = counted = None
    for offs in itertools.product(*[range(kk) for kk in k]):
        idx = tuple([slice(None), slice(None)] + [
            slice(offs[i] * d[i], offs[i] * d[i] + (out[i] - 1) * s[i] + 1, s[i])
            for i in range(nd)])
        total = xp[idx] if total is None else total + xp[idx]
        counted = mp[idx] if counted is None else counted + mp[idx]
    return total / counted
