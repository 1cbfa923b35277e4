"""Op-table bindings onto the kernel registry (``kernels.get(name)`` or the native core it
calls): every ONNX op with a registry kernel, and every com.microsoft registry op.

float32/float64 run on the kernels; other dtypes of ops that ONNX also defines for them
(integer MatMul, int Relu, int8 Gather, ...) take the torch path named in the binding.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import math

import onnx.defs
import torch
import torch.nn.functional as F

from .. import kernels
from .._native import check_status, empty, empty_like, ffi, get_num_threads, lib, native_fn, ptr
from ..kernels.activations import softmax_forward
from ..kernels.conv import conv_geometry
from ..kernels.gemm import P16_MAX_ROWS, PackedWeight, bmm_strided, gemm
from ..kernels.norm import rows_cols
from ..kernels.pool import pool_geometry
from ..kernels.tensor import slice_plan
from . import ops_training  # noqa: F401  (its bindings take precedence over the generic ones)
from .conv_infer import bind_static_conv
from .dtypes import ONNX_TO_TORCH
from .fusions import INTERNAL_DOMAIN, epilogue_steps
from .op_table import MS_DOMAIN, ONNX_DOMAIN, lookup, op
from .ops_torch import _wrap_indices, avg_pool_dilated, lrn_torch

FLOATS = (torch.float32, torch.float64)

# schema output counts of the multi-output kernels (for ``needs=``)
_N_OUT = {
    "Dropout": 2, "MaxPool": 2, "LayerNormalization": 3, "SimplifiedLayerNormalization": 2,
    "BatchNormInternal": 5, "SoftmaxCrossEntropyLoss": 2, "SoftmaxCrossEntropyLossInternal": 2,
    "LSTMTraining": 5, "GRUTraining": 3, "InPlaceAccumulatorV2": 2, "AdamWOptimizer": 4,
    "SGDOptimizerV2": 2, "SoftmaxCrossEntropy": 2, "SparseSoftmaxCrossEntropy": 2,
    "ConcatTraining": 2, "FakeQuant": 2, "BroadcastGradientArgs": 2, "LSTMGrad": 7,
    "GRUGrad": 5, "ConvGrad": 3, "BatchNormalizationGrad": 3, "LayerNormalizationGrad": 3,
    "InvertibleLayerNormalizationGrad": 3, "SimplifiedLayerNormalizationGrad": 2,
    "SGDOptimizer": 1, "AdamOptimizer": 6,
}
# kernels whose result must never be folded at plan time (in place, or random)
_IMPURE = {
    "AdamWOptimizer", "SGDOptimizerV2", "SGDOptimizer", "AdamOptimizer", "InPlaceAccumulator",
    "InPlaceAccumulatorV2", "ZeroGradient", "InplaceClipGradNorm", "Dropout", "Send", "Recv",
    "BitmaskDropout", "SummaryScalar", "SummaryHistogram", "SummaryMerge", "SummaryText",
}


def _kwargs(ctx, drop=()) -> dict:
    return {(k + "_" if keyword.iskeyword(k) else k): v for k, v in ctx.attrs.items()
            if k not in drop}


def bind_kernel(name: str, ctx, *, kw=None, drop=()):
    """The callable running registry kernel ``name`` for this node: attributes as keywords
    (checked against the kernel's signature now, not per run), ``needs=`` from the outputs
    the graph uses, the result cut to the node's outputs."""
    fn = kernels.get(name)
    kwargs = _kwargs(ctx, drop) if kw is None else kw
    params = inspect.signature(fn).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            raise ctx.error(f"attribute(s) {unknown} not supported by kernel {name}",
                            NotImplementedError)
    n_node = len(ctx.node.output)
    n_schema = _N_OUT.get(name)
    if n_schema and "needs" in params:
        used = list(ctx.outputs_used[:n_schema]) + [False] * (n_schema - n_node)
        used[0] = True if n_schema and not any(used) else used[0]
        if not all(used):
            kwargs["needs"] = tuple(used)
    f = functools.partial(fn, **kwargs) if kwargs else fn
    if n_schema is None or n_schema == 1:
        if n_node == 1:
            return f
        return lambda *a: _cut(f(*a), n_node)
    if n_node == 1:
        return lambda *a: f(*a)[0]
    return lambda *a: tuple(f(*a))[:n_node]


def _cut(r, n):
    if isinstance(r, tuple):
        return r[:n] if n > 1 else r[0]
    return r


_HALF = (torch.float16, torch.bfloat16)


def _float_or(kernel, fallback, ctx=None):
    """Run ``kernel`` on float32/float64 first inputs (float16/bfloat16 computed in float32
    and rounded back), ``fallback`` (torch) on other dtypes. When the planner knows the
    dtype is float32/float64, the kernel itself is returned (no per-run check)."""
    if ctx is not None and ctx.dtype(0) in FLOATS:
        return kernel

    def run(x, *rest):
        if x.dtype in FLOATS:
            return kernel(x, *rest)
        if x.dtype in _HALF:
            r = kernel(x.float(), *[t.float() if isinstance(t, torch.Tensor) and
                                    t.dtype == x.dtype else t for t in rest])
            return r.to(x.dtype) if isinstance(r, torch.Tensor) else \
                tuple(t.to(x.dtype) if t is not None and t.dtype == torch.float32 else t
                      for t in r)
        return fallback(x, *rest)
    return run


def _not_supported(op_name):
    def run(x, *rest):
        raise TypeError(f"{op_name}: input dtype {x.dtype} is not supported "
                        "(float32/float64, float16/bfloat16)")
    return run


def kernel_op(op_type, *, domain=ONNX_DOMAIN, since=1, until=10**6, pure=True):
    return op(op_type, domain=domain, since=since, until=until, kind="kernel", pure=pure)


# ---- activations ---------------------------------------------------------------------------

for _name, _fallback in (("Relu", torch.relu), ("Sigmoid", torch.sigmoid),
                         ("Tanh", torch.tanh)):
    kernel_op(_name)(lambda ctx, _n=_name, _f=_fallback:
                     _float_or(bind_kernel(_n, ctx, kw={}), _f, ctx))


@kernel_op("LeakyRelu")
def _leaky_relu(ctx):
    alpha = ctx.attr("alpha", 0.01)
    return _float_or(bind_kernel("LeakyRelu", ctx, kw={"alpha": alpha}),
                     lambda x: F.leaky_relu(x, alpha), ctx)


@kernel_op("HardSigmoid")
def _hard_sigmoid(ctx):
    kw = {"alpha": ctx.attr("alpha", 0.2), "beta": ctx.attr("beta", 0.5)}
    return _float_or(bind_kernel("HardSigmoid", ctx, kw=kw), _not_supported("HardSigmoid"),
                     ctx)


@kernel_op("HardSwish")
def _hard_swish(ctx):
    return _float_or(bind_kernel("HardSwish", ctx, kw={}), _not_supported("HardSwish"), ctx)


@kernel_op("Gelu", since=20)
def _gelu(ctx):
    approx = ctx.attr("approximate", "none")
    name = "FastGelu" if approx == "tanh" else "Gelu"
    return _float_or(bind_kernel(name, ctx, kw={}), _not_supported(name), ctx)


def _softmax(log):
    def factory(ctx):
        coerce = ctx.opset < 13
        axis = ctx.attr("axis", 1 if coerce else -1)
        name = "LogSoftmax" if log else "Softmax"
        return _float_or(functools.partial(softmax_forward, name, axis=axis, log=log,
                                           coerce_2d=coerce), _not_supported(name), ctx)
    return factory


kernel_op("Softmax")(_softmax(False))
kernel_op("LogSoftmax")(_softmax(True))


# ---- linear algebra, conv, pooling --------------------------------------------------------


@kernel_op("MatMul")
def _matmul(ctx):
    mm = kernels.get("MatMul")
    scale = ctx.attr("ortcpu_alpha")  # a scalar Mul/Div fused in (fusions.py)
    alpha = 1.0 if scale is None else float(scale)
    out_perm = ctx.attr("ortcpu_out_perm")  # a Transpose fused in (fusions.py)
    dt = ctx.dtype(0)
    if dt not in FLOATS or ctx.dtype(1) != dt:
        # dtypes unknown at plan time (or not float): the registry kernel, and the fused
        # Transpose applied to its result (the graph no longer has the Transpose node)
        f = _float_or(mm, _int_matmul, ctx)
        g = f if alpha == 1.0 else lambda a, b: f(a, b) * alpha
        return g if out_perm is None else lambda a, b: g(a, b).permute(*out_perm)

    packed = _small_batch_weight(ctx, trans_b=False) if alpha == 1.0 else None

    def matmul(a, b, c=None):
        # the registry kernel validated nothing beyond what these cases check themselves:
        # 2-D B (weights): one [(...·M), K] GEMM (a few rows: on the pre-packed weight);
        # equal 3-D/4-D batches: one batched GEMM reading strided operands in place.
        # ``c`` (fused epilogue, fusions.py): a [n] bias or a residual of the output's
        # shape, added by the GEMM itself (C prefilled, beta 1: no extra pass over Y)
        if packed is not None and b is packed.source and a.dim() >= 2 and \
                a.shape[-1] == packed.k and a.numel() <= P16_MAX_ROWS * packed.k:
            bias = c.reshape(-1) if c is not None and c.numel() == packed.n and \
                c.dtype == torch.float32 and c.is_contiguous() else None
            y = packed.matmul(a.reshape(-1, packed.k).contiguous(), bias)
            y = y.reshape(*a.shape[:-1], packed.n)
            return y if c is None or bias is not None else y.add_(c)
        if b.dim() == 2 and a.dim() >= 2 and a.shape[-1] == b.shape[0]:
            if not a.is_contiguous():
                a = a.contiguous()
            n = b.shape[1]
            cm = None
            if c is not None and c.dtype == a.dtype:
                if c.numel() == n:
                    cm = c.reshape(n)
                elif c.shape == (*a.shape[:-1], n):
                    cm = c.reshape(-1, n)
            tb = not b.is_contiguous() and b.t().is_contiguous()
            y = gemm(a.reshape(-1, a.shape[-1]), b.t() if tb else b.contiguous(), cm,
                     trans_b=tb, alpha=alpha, beta=1.0, op="MatMul")
            y = y.reshape(*a.shape[:-1], n)
            return y if c is None or cm is not None else y.add_(c)
        if a.dim() == b.dim() >= 3 and a.shape[:-2] == b.shape[:-2] and \
                a.shape[-1] == b.shape[-2] and a.numel() and b.numel():
            y = bmm_strided("MatMul", a, b, alpha)
        else:
            y = mm(a, b)
            if alpha != 1.0:
                y.mul_(alpha)
        return y if c is None else y.add_(c)

    def bias_residual(a, b, bias, res):
        """a·b + bias + res (fusions.py: a Linear's bias, then a residual of the output's
        shape): C = res + bias written once into Y, then the GEMM accumulates (beta 1)."""
        n = b.shape[-1] if b.dim() == 2 else -1
        small = packed is not None and b is packed.source and \
            a.numel() <= P16_MAX_ROWS * packed.k  # (the pre-packed GEMM, then the add)
        if not small and out_perm is None and alpha == 1.0 and b.dim() == 2 and a.dim() >= 2 and \
                a.shape[-1] == b.shape[0] and bias.numel() == n and \
                res.shape == (*a.shape[:-1], n) and a.dtype == b.dtype == bias.dtype == \
                res.dtype and a.numel() and n:
            a2 = (a if a.is_contiguous() else a.contiguous()).reshape(-1, a.shape[-1])
            tb = not b.is_contiguous() and b.t().is_contiguous()
            bt = b.t() if tb else b.contiguous()
            y = empty((a2.shape[0], n), a.dtype)
            torch.add(res.reshape(-1, n), bias.reshape(n), out=y)
            check_status(native_fn("gemm_mt", a.dtype)(
                0, int(tb), a2.shape[0], n, a2.shape[1], 1.0, ptr(a2), a2.shape[1], ptr(bt),
                bt.shape[1], 1.0, ptr(y), n, get_num_threads()), "MatMul")
            return y.reshape(res.shape)
        return matmul_fn[0](a, b, bias).add_(res)

    def with_epilogue(steps):
        """"add" (then "relu"): the addend goes into the GEMM (see ``matmul``); "add",
        "add" (a bias, then a residual): ``bias_residual``."""
        if steps == ["add", "add"]:
            return bias_residual
        if not steps or steps[0] != "add" or steps[1:] not in ([], ["relu"]):
            return None
        fn = matmul_fn[0]
        if len(steps) == 1:
            return fn
        return lambda a, b, c: fn(a, b, c).relu_()
    if out_perm is not None:
        matmul = _transposed_output(matmul, list(out_perm), alpha)
    matmul_fn = [matmul]
    matmul.with_epilogue = with_epilogue
    return matmul


def _transposed_output(matmul, perm, alpha):
    """``matmul`` followed by ``permute(perm)``: equal-batch MatMuls write their GEMMs into
    the permuted buffer (contiguous), the others permute their result (a view)."""
    inv = sorted(range(len(perm)), key=perm.__getitem__)

    def matmul_t(a, b, c=None):
        if a.dim() == b.dim() == len(perm) and a.shape[:-2] == b.shape[:-2] and \
                a.shape[-1] == b.shape[-2] and a.numel() and b.numel():
            shape = (*a.shape[:-1], b.shape[-1])
            z = empty([shape[p] for p in perm], a.dtype)
            bmm_strided("MatMul", a, b, alpha, out=z.permute(inv))
        else:
            z = matmul(a, b).permute(perm)
        return z if c is None else z.add_(c)
    return matmul_t


def _small_batch_weight(ctx, trans_b):
    """Input 1 packed for ``gemm_p16`` when it is a 2-D float32 constant and input 0's
    static shape has at most P16_MAX_ROWS rows (packing costs a copy of the weight, so
    only plans that use it pack); else None."""
    shape = ctx.input_shapes[0] if ctx.input_shapes else None
    if ctx.dtype(0) != torch.float32 or shape is None or len(shape) < 2 or \
            not all(isinstance(d, int) for d in shape):
        return None
    rows = 1
    for d in shape[:-1]:
        rows *= d
    if not 1 <= rows <= P16_MAX_ROWS:
        return None
    return PackedWeight.pack(ctx.const(1), trans_b)


def _int_matmul(a, b):
    if a.dtype in (torch.int32, torch.int64, torch.uint32, torch.uint64):
        return torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.matmul(a, b)


@kernel_op("Gemm")
def _gemm(ctx):
    kw = _kwargs(ctx, drop=("broadcast",))
    g = functools.partial(kernels.get("Gemm"), **kw)
    alpha, beta = kw.get("alpha", 1.0), kw.get("beta", 1.0)
    ta, tb = bool(kw.get("transA", 0)), bool(kw.get("transB", 0))

    def torch_gemm(a, b, c=None):
        y = alpha * ((a.t() if ta else a) @ (b.t() if tb else b))
        return y + beta * c if c is not None else y
    dt = ctx.dtype(0)
    if dt in FLOATS and ctx.dtype(1) == dt and (not ctx.has_input(2) or ctx.dtype(2) == dt):
        # dtypes known at plan time: the GEMM core directly (the registry's argument checks
        # cost more than a small GEMM); 2-D operands with matching inner dims checked here
        packed = _small_batch_weight(ctx, tb) if not ta and alpha == 1.0 else None
        bias = _gemm_bias(ctx, packed.n, beta) if packed is not None else None
        if packed is not None:
            plain_mm = packed.bind(None, op="Gemm")
            bias_mm = packed.bind(bias[1], op="Gemm") if bias is not None else None

        def gemm_known(a, b, c=None):
            if packed is not None and b is packed.source and (c is None or bias is not None
                                                              and c is bias[0]) and \
                    a.dim() == 2 and a.shape[1] == packed.k and a.shape[0] <= P16_MAX_ROWS:
                return (plain_mm if c is None else bias_mm)(
                    a if a.is_contiguous() else a.contiguous())
            if a.dim() != 2 or b.dim() != 2 or a.shape[0 if ta else 1] != b.shape[1 if tb else 0]:
                return g(a, b, c)  # the registry kernel's error
            return gemm(a if a.is_contiguous() else a.contiguous(),
                        b if b.is_contiguous() else b.contiguous(), c, trans_a=ta,
                        trans_b=tb, alpha=alpha, beta=beta)
        return gemm_known
    return lambda a, b, c=None: g(a, b, c) if a.dtype in FLOATS else torch_gemm(a, b, c)


def _gemm_bias(ctx, n, beta):
    """(C as given, C as a contiguous [n] row) when Gemm's C is a float32 constant of n
    elements along the output's last dim ([n] or [1, n]) and beta is 1; else None."""
    c = ctx.const(2) if ctx.has_input(2) else None
    if c is None or beta != 1.0 or c.dtype != torch.float32 or c.numel() != n or \
            c.dim() not in (1, 2) or c.shape[-1] != n:
        return None
    return c, c.reshape(-1).contiguous()


@kernel_op("FusedMatMul", domain=MS_DOMAIN)
def _fused_matmul(ctx):
    alpha = ctx.attr("alpha", 1.0)
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    tba, tbb = ctx.attr("transBatchA", 0), ctx.attr("transBatchB", 0)
    mm = kernels.get("MatMul")

    def prep(x, trans, trans_batch):
        if trans_batch and x.dim() > 2:  # [b..., m, k] -> [m..., k, b] style permutation
            x = x.permute(*range(1, x.dim() - 1), 0, x.dim() - 1)
        if trans:
            x = x.transpose(-1, -2)
        return x

    def fused(a, b):
        y = mm(prep(a, ta, tba), prep(b, tb, tbb))
        return y if alpha == 1.0 else y.mul_(alpha)
    return fused


@kernel_op("Conv")
def _conv(ctx):
    offset = ctx.attrs.pop("ortcpu_out_offset", None)  # Concat in place (fusions.py)
    generic = _float_or(bind_kernel("Conv", ctx), _not_supported("Conv"), ctx)
    conv = _conv_static(ctx, generic) or generic
    steps = epilogue_steps(ctx.node)
    packed = None
    if conv is not generic and ctx.has_input(1):  # the inference kernel, where it measures faster
        packed = bind_static_conv(conv, ctx.const(1), *conv.geometry, ctx.dtype(0), steps,
                                  offset is not None)
    if offset is None:
        if packed is None:
            return conv
        packed.with_epilogue = lambda s: packed if s == steps else None
        return packed
    out_shape = ctx.output_shapes[0] if ctx.output_shapes else None
    if out_shape is None or not all(isinstance(d, int) for d in out_shape):
        raise ctx.error("a Conv written into its Concat needs a static output shape")
    lead = out_shape[0]
    per_sample = math.prod(out_shape) // lead if lead else 0

    def conv_into(x, w, b, buf):
        """Y in its slice of the Concat's buffer ``buf``: ``offset`` elements into each
        sample (a contiguous run at batch 1, a channel slice of every sample beyond)."""
        y = buf.view(lead, -1)[:, offset:offset + per_sample].view(out_shape)
        if packed is not None:
            return packed(x, w, b, y)
        flat = y.is_contiguous()
        r = conv(x, w, b, out=y) if conv is not generic and flat else conv(x, w, b)
        if r is not y:
            y.copy_(r)
        return y
    if packed is not None:
        conv_into.with_epilogue = lambda s: conv_into if s == steps else None
        conv_into.choice = packed
    return conv_into


@kernel_op("ConcatBuffer", domain=INTERNAL_DOMAIN, pure=False)
def _concat_buffer(ctx):
    shape, dt = tuple(ctx.attr("shape")), ONNX_TO_TORCH[ctx.attr("dtype")]
    return lambda: empty(shape, dt)


@kernel_op("ConcatInPlace", domain=INTERNAL_DOMAIN)
def _concat_in_place(ctx):
    return lambda buf, *parts: buf  # the parts were written into it by their producers


def _static_shape(ctx, i):
    """Input ``i``'s shape known at plan time (from shape inference or its constant)."""
    if not ctx.has_input(i):
        return None
    c = ctx.const(i)
    if isinstance(c, torch.Tensor):
        return tuple(c.shape)
    return ctx.input_shapes[i] if i < len(ctx.input_shapes) else None


def _conv_static(ctx, generic):
    """With float32/float64 and X's and W's (and B's) static shapes known at plan time:
    the geometry checked once (``conv_geometry``) and the native forward called directly
    (the registry's per-call checks cost ~45 µs a node, more than squeezenet's small
    convolutions); inputs whose run-time shape, dtype or layout differ take ``generic``.
    None when the plan cannot know, or the attributes are invalid (the kernel reports it
    at run time)."""
    dt = ctx.dtype(0)
    shapes = [_static_shape(ctx, i) for i in range(3)]
    if dt not in FLOATS or any(ctx.dtype(i) != dt for i in range(3) if ctx.has_input(i)) or \
            any(s is None or not all(isinstance(d, int) for d in s)
                for i, s in enumerate(shapes) if i < 2 or ctx.has_input(i)):
        return None
    xs, ws = torch.Size(shapes[0]), torch.Size(shapes[1])
    bs = torch.Size(shapes[2]) if ctx.has_input(2) else None
    try:
        geom, out_shape = conv_geometry("Conv", torch.empty(xs, device="meta"),
                                        torch.empty(ws, device="meta"), **_kwargs(ctx))
    except (TypeError, ValueError):
        return None
    if bs is not None and bs != (ws[0],):
        return None
    cgeom = ffi.new("int64_t[]", geom)
    fwd = native_fn("conv_forward", dt)

    def conv(x, w, b=None, out=None):
        if x.dtype != dt or x.shape != xs or w.dtype != dt or w.shape != ws or \
                not x.is_contiguous() or not w.is_contiguous() or \
                (b is not None and (b.dtype != dt or b.shape != bs or not b.is_contiguous())):
            return generic(x, w, b)
        y = empty(out_shape, dt) if out is None else out
        check_status(fwd(ptr(x), ptr(w), ptr(b), ptr(y), cgeom, get_num_threads()), "Conv")
        return y
    conv.keep = cgeom
    conv.geometry = (geom, out_shape, xs, bs)
    return conv


@kernel_op("MaxPool")
def _maxpool(ctx):
    k = bind_kernel("MaxPool", ctx)

    def int_maxpool(x):  # integer maps (int8/uint8 in ONNX): exact in float64
        r = k(x.double())
        return r.to(x.dtype) if isinstance(r, torch.Tensor) else (r[0].to(x.dtype), *r[1:])
    generic = _float_or(k, int_maxpool, ctx)
    if len(ctx.outputs_used) > 1 and ctx.outputs_used[1]:
        return generic  # Indices wanted: the registry kernel
    kw = _kwargs(ctx, drop=("storage_order",))
    static = _pool_static(ctx, generic, "maxpool_forward", kw,
                          lambda f, x, y, g, nt: f(ptr(x), ptr(y), ffi.NULL, g, nt))
    if static is None or len(ctx.node.output) == 1:
        return static or generic
    return lambda x: (static(x), None)


def _pool_static(ctx, generic, native, kw, call):
    """A pool over float32/float64 X of a static shape known at plan time: the geometry
    checked once (``pool_geometry``) and the native forward ``native`` run directly through
    ``call(fn, x, y, geom, nthreads)`` (the registry's per-call checks cost about as much
    as a small map's pool); other run-time inputs take ``generic``. None when the plan
    cannot know, or the attributes are invalid (the kernel reports it at run time)."""
    dt = ctx.dtype(0)
    shape = ctx.input_shapes[0] if ctx.input_shapes else None
    if dt not in FLOATS or shape is None or len(shape) < 3 or \
            not all(isinstance(d, int) for d in shape):
        return None
    try:
        geom, out = pool_geometry(ctx.node.op_type, shape, len(shape) - 2, **kw)
    except (TypeError, ValueError):
        return None
    xs, out_shape = torch.Size(shape), (shape[0], shape[1], *out)
    cgeom = ffi.new("int64_t[]", geom)
    fn = native_fn(native, dt)
    op_name = ctx.node.op_type

    def pool(x):
        if x.dtype != dt or x.shape != xs or not x.is_contiguous():
            return generic(x)
        y = empty(out_shape, dt)
        check_status(call(fn, x, y, cgeom, get_num_threads()), op_name)
        return y
    pool.keep = cgeom
    return pool


@kernel_op("AveragePool")
def _avgpool(ctx):
    dil = ctx.attr("dilations")
    if dil and any(v != 1 for v in dil):  # opset 19; the kernel has no dilations
        kw = _kwargs(ctx)
        ctx.kind = "torch"
        return lambda x: avg_pool_dilated(x, **kw)
    kw = _kwargs(ctx, drop=("dilations",))
    generic = _float_or(bind_kernel("AveragePool", ctx, kw=kw), _not_supported("AveragePool"),
                        ctx)
    try:
        cip = 2 * int(kw.pop("count_include_pad", 0))
    except (TypeError, ValueError):
        return generic
    if cip not in (0, 2):
        return generic
    shape = ctx.input_shapes[0] if ctx.input_shapes else None
    if shape is not None and len(shape) >= 3 and list(kw.get("kernel_shape") or []) == \
            list(shape[2:]) and not any(kw.get("pads") or []) and \
            kw.get("auto_pad", "NOTSET") in ("NOTSET", "VALID", b"NOTSET", b"VALID"):
        # one unpadded window over the whole map (resnet50's 7x7 head): a global average
        whole = _global_static(ctx, 0, generic)
        if whole is not None:
            return whole
    return _pool_static(ctx, generic, "avgpool_forward", kw,
                        lambda f, x, y, g, nt: f(ptr(x), ptr(y), g, cip, 0, nt)) or generic


def _global_static(ctx, kind, generic):
    """Average (``kind`` 0) / max (1) over all of X's spatial dims, the native global pool
    called directly for a float X of a static shape known at plan time (the registry's
    per-call checks cost more than a [1, 1000, 13, 13] pool); other run-time inputs take
    ``generic``. None when the plan cannot know."""
    dt = ctx.dtype(0)
    shape = ctx.input_shapes[0] if ctx.input_shapes else None
    if dt not in FLOATS or shape is None or len(shape) < 3 or \
            not all(isinstance(d, int) for d in shape) or math.prod(shape[2:]) < 1:
        return None
    xs, out_shape = torch.Size(shape), (shape[0], shape[1], *[1] * (len(shape) - 2))
    planes, size = shape[0] * shape[1], math.prod(shape[2:])
    fn, op_name = native_fn("global_pool_forward", dt), ctx.node.op_type

    def global_pool(x):
        if x.dtype != dt or x.shape != xs or not x.is_contiguous():
            return generic(x)
        y = empty(out_shape, dt)
        check_status(fn(ptr(x), ptr(y), planes, size, kind, get_num_threads()), op_name)
        return y
    return global_pool


def _global_pool(name, kind):
    def factory(ctx):
        generic = _float_or(bind_kernel(name, ctx), _not_supported(name), ctx)
        return _global_static(ctx, kind, generic) or generic
    return factory


for _kind, _name in enumerate(("GlobalAveragePool", "GlobalMaxPool")):
    kernel_op(_name)(_global_pool(_name, _kind))


# ---- normalisation ---------------------------------------------------------------------------


@kernel_op("BatchNormalization")
def _batchnorm(ctx):
    if ctx.opset < 9 and ctx.attr("spatial", 1) == 0:
        raise ctx.error("spatial=0 (per-activation statistics) is not supported",
                        NotImplementedError)
    kw = _kwargs(ctx, drop=("consumed_inputs", "is_test", "spatial"))
    if ctx.opset < 14:
        kw.pop("training_mode", None)
        if len(ctx.node.output) > 1 and any(ctx.outputs_used[1:]):
            raise ctx.error("training outputs of BatchNormalization before opset 14 are not "
                            "supported", NotImplementedError)
        kw["training_mode"] = 0
    if kw.get("training_mode", 0):
        n = len(ctx.node.output)
        f = functools.partial(kernels.get("BatchNormalization"), **kw)
        return lambda *a: f(*a)[:n] if n > 1 else f(*a)[0]
    f = functools.partial(kernels.get("BatchNormalization"), **kw)
    if len(ctx.node.output) == 1:
        return f
    return lambda *a: (f(*a),) + (None,) * (len(ctx.node.output) - 1)


@kernel_op("LayerNormalization")
def _layer_norm(ctx):
    """The registry kernel; when only Y is used, the data float32/float64 and Scale (and B)
    constants of its dtype, the native forward called directly on contiguous X with the
    constants' pointers taken once (the registry's checks and its Mean/InvStdDev outputs
    cost about as much as the kernel at transformer sizes)."""
    generic = bind_kernel("LayerNormalization", ctx)
    dt = ctx.dtype(0)
    shape = ctx.input_shapes[0] if ctx.input_shapes else None
    params = [ctx.const(i) if ctx.has_input(i) else None for i in (1, 2)]
    if dt not in FLOATS or any(ctx.outputs_used[1:]) or shape is None or \
            not all(isinstance(d, int) for d in shape) or not shape or params[0] is None or \
            (ctx.has_input(2) and params[1] is None):
        return generic
    try:
        _, rows, cols = rows_cols("LayerNormalization", torch.empty(shape, device="meta"),
                                  ctx.attr("axis", -1))
    except ValueError:
        return generic  # the kernel reports it at run time
    eps = float(ctx.attr("epsilon", 1e-5))
    scale, bias = (None if p is None else p.contiguous() for p in params)
    if not eps >= 0 or any(p is not None and (p.dtype != dt or p.numel() != cols)
                           for p in (scale, bias)):
        return generic
    fwd = native_fn("layernorm_forward", dt)
    pscale, pbias, shape = ptr(scale), ptr(bias), torch.Size(shape)

    def layer_norm(x, *_params):
        if x.dtype != dt or x.shape != shape or not x.is_contiguous():
            return generic(x, *_params)
        y = empty_like(x)
        check_status(fwd(ptr(x), pscale, pbias, ptr(y), ffi.NULL, ffi.NULL, rows, cols, eps,
                         0, get_num_threads()), "LayerNormalization")
        return y
    layer_norm.keep = (scale, bias)  # the pointers' storage
    return layer_norm


@kernel_op("RMSNormalization", since=23)
def _rms_norm(ctx):  # ONNX-23 RMSNormalization is ORT's SimplifiedLayerNormalization
    kw = {"axis": ctx.attr("axis", -1), "epsilon": ctx.attr("epsilon", 1e-5),
          "stash_type": ctx.attr("stash_type", 1), "needs": (True, False)}
    f = functools.partial(kernels.get("SimplifiedLayerNormalization"), **kw)
    return _float_or(lambda x, s: f(x, s)[0], _not_supported("RMSNormalization"), ctx)
kernel_op("SimplifiedLayerNormalization")(
    lambda ctx: bind_kernel("SimplifiedLayerNormalization", ctx))


@kernel_op("Dropout", pure=False)
def _dropout(ctx):
    n = len(ctx.node.output)
    mask_used = n > 1 and ctx.outputs_used[1]
    if ctx.opset < 12:  # inference only before opset 12
        return _dropout_identity(n, mask_used)
    if not ctx.has_input(2) or (ctx.const(2) is not None and not bool(ctx.const(2).item())):
        return _dropout_identity(n, mask_used)
    return bind_kernel("Dropout", ctx)


def _dropout_identity(n, mask_used):
    if n == 1:
        return lambda x, *rest: x
    if not mask_used:  # (squeezenet's: an all-true mask nobody reads cost ~50 µs a run)
        return lambda x, *rest: (x, None)
    return lambda x, *rest: (x, torch.ones(x.shape, dtype=torch.bool))


# ---- tensor ops -------------------------------------------------------------------------------


@kernel_op("Gather")
def _gather(ctx):
    axis = ctx.attr("axis", 0)
    g = functools.partial(kernels.get("Gather"), axis=axis)

    def gather(data, idx):
        if data.element_size() in (4, 8) and not data.dtype.is_complex:
            return g(data, idx)
        a = axis + data.dim() if axis < 0 else axis
        i = _wrap_indices("Gather", idx, data.shape[a])
        return data.index_select(a, i.reshape(-1)).reshape(
            data.shape[:a] + idx.shape + data.shape[a + 1:])
    return gather


@kernel_op("GatherElements")
def _gather_elements(ctx):
    axis = ctx.attr("axis", 0)
    g = functools.partial(kernels.get("GatherElements"), axis=axis)

    def gather_elements(data, idx):
        if data.dtype in FLOATS:
            return g(data, idx)
        a = axis + data.dim() if axis < 0 else axis
        return torch.gather(data, a, _wrap_indices("GatherElements", idx, data.shape[a]))
    return gather_elements


@kernel_op("GatherND")
def _gather_nd(ctx):
    bd = ctx.attr("batch_dims", 0)
    g = functools.partial(kernels.get("GatherND"), batch_dims=bd)
    return _float_or(g, lambda data, idx: _gather_nd_torch(data, idx, bd))


def _gather_nd_torch(data, idx, bd):
    k = idx.shape[-1]
    batch = data.shape[:bd]
    nb = int(torch.tensor(batch).prod()) if bd else 1
    d = data.reshape(nb, *data.shape[bd:])
    ix = idx.reshape(nb, -1, k).long()
    outs = []
    for b in range(nb):
        cols = [_wrap_indices("GatherND", ix[b, :, j], d.shape[1 + j]) for j in range(k)]
        outs.append(d[b][tuple(cols)])
    return torch.stack(outs).reshape(*idx.shape[:-1], *data.shape[bd + k:])


@kernel_op("Slice")
def _slice(ctx):
    s = kernels.get("Slice")
    if ctx.opset < 10:
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
        view = _static_slice(ctx, starts, ends, axes, None)
        return view or (lambda x: s(x, starts, ends, axes))
    params = [ctx.const(i) if ctx.has_input(i) else None for i in range(1, 5)]
    if all(p is not None for p in params[:2]) and \
            all(p is not None for i, p in enumerate(params) if ctx.has_input(i + 1)):
        view = _static_slice(ctx, *[p.tolist() if p is not None else None for p in params])
        if view is not None:
            return view
    return s


def _static_slice(ctx, starts, ends, axes, steps):
    """With the data shape and every parameter known at plan time and positive steps: the
    slice as a torch view (no copy; consumers that need contiguous data copy), else None."""
    shape = ctx.input_shapes[0] if ctx.input_shapes else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    try:
        plan = slice_plan("Slice", list(shape), starts, ends, axes, steps)
    except (TypeError, ValueError):
        return None  # the kernel reports it at run time
    if any(st < 1 for _, st, _ in plan):
        return None
    idx = tuple(slice(b, b + n * st, st) for b, st, n in plan)
    return lambda x, *params: x[idx]


@kernel_op("Split")
def _split(ctx):
    axis = ctx.attr("axis", 0)
    n = len(ctx.node.output)
    s = kernels.get("Split")
    if ctx.opset < 13:
        split = ctx.attr("split")
        if split is None and ctx.has_input(1):
            return lambda x, sp: _tuple(s(x, sp, axis=axis, num_outputs=n))
        return lambda x: _tuple(s(x, split, axis=axis, num_outputs=n))
    num = ctx.attr("num_outputs")
    if num is None:
        return lambda x, sp=None: _tuple(s(x, sp, axis=axis, num_outputs=n))

    def split_n(x, sp=None):  # opset 18: the last chunk may be smaller
        dim = x.shape[axis]
        chunk = -(-dim // num)
        sizes = [min(chunk, max(dim - chunk * i, 0)) for i in range(num)]
        return _tuple(s(x, sizes, axis=axis))
    return split_n


def _tuple(r):
    return r[0] if len(r) == 1 else tuple(r)


@kernel_op("Concat")
def _concat(ctx):
    axis = ctx.attr("axis", 1 if ctx.opset < 4 else None)
    c = kernels.get("Concat")
    generic = lambda *xs: c(*xs, axis=axis)  # noqa: E731
    return _concat_static(ctx, axis, generic) or generic


def _concat_static(ctx, axis, generic):
    """With every input's static shape and one dtype known at plan time: the registry's
    native strided copy, its index arrays built once (the registry call costs ~20 µs of
    checks and set-up per node, squeezenet's fire modules have 8); inputs whose run-time
    shape, dtype or layout differ take ``generic``. None when the plan cannot know."""
    shapes = ctx.input_shapes
    dts = ctx.input_dtypes
    if not shapes or any(sh is None or not all(isinstance(d, int) for d in sh) or not sh
                         for sh in shapes) or dts[0] is None or any(d != dts[0] for d in dts) \
            or axis is None or not all(len(sh) == len(shapes[0]) for sh in shapes):
        return None
    rank = len(shapes[0])
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank or any(sh[:ax] != shapes[0][:ax] or sh[ax + 1:] != shapes[0][ax + 1:]
                                 for sh in shapes):
        return None
    outer = math.prod(shapes[0][:ax])
    inner = math.prod(shapes[0][ax + 1:])
    total = sum(sh[ax] for sh in shapes)
    out_shape = (*shapes[0][:ax], total, *shapes[0][ax + 1:])
    esz = torch.empty((), dtype=dts[0]).element_size()
    dst_strides = ffi.new("int64_t[2]", [total * inner, 1])
    pieces, off = [], 0
    for sh in shapes:
        n = sh[ax] * inner
        pieces.append((torch.Size(sh), off * esz, ffi.new("int64_t[2]", [outer, n]),
                       ffi.new("int64_t[2]", [n, 1])))
        off += n
    dt, nt = dts[0], get_num_threads

    def concat(*xs):
        if len(xs) != len(pieces) or any(
                x.dtype != dt or x.shape != p[0] or not x.is_contiguous()
                for x, p in zip(xs, pieces, strict=False)):
            return generic(*xs)
        y = empty(out_shape, dt)
        base = y.data_ptr()
        for x, (_, boff, shp, sst) in zip(xs, pieces, strict=True):
            if shp[0] and shp[1]:
                check_status(lib.ortcpu_strided_copy(
                    ffi.cast("char *", x.data_ptr()), ffi.cast("char *", base + boff), 2, shp,
                    sst, dst_strides, esz, nt()), "Concat")
        return y
    concat.keep = (dst_strides, pieces)  # the index arrays' memory
    return concat


@kernel_op("LRN")
def _lrn(ctx):
    """Native (``lrn.c``: one pass) on contiguous float32 [N, C, ...]; torch ops else."""
    alpha, beta = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75))
    bias, size = float(ctx.attr("bias", 1.0)), ctx.attr("size")
    fallback = lrn_torch(alpha, beta, bias, size)

    def lrn(x):
        if x.dtype != torch.float32 or x.dim() < 3 or not x.is_contiguous():
            return fallback(x)
        y = empty(tuple(x.shape), x.dtype)
        check_status(lib.ortcpu_lrn_f32(ptr(x), ptr(y), x.shape[0], x.shape[1],
                                        math.prod(x.shape[2:]), size, alpha, beta, bias,
                                        get_num_threads()), "LRN")
        return y
    return lrn


@kernel_op("SoftmaxCrossEntropyLoss", since=12)
def _sce_loss(ctx):
    return bind_kernel("SoftmaxCrossEntropyLoss", ctx)


# ---- recurrent --------------------------------------------------------------------------------


def _rnn(kind):
    def factory(ctx):
        kw = _kwargs(ctx, drop=("layout",))
        layout = ctx.attr("layout", 0)
        name = "LSTMTraining" if kind == "LSTM" else "GRUTraining"
        n_out = len(ctx.node.output)
        n_schema = 3 if kind == "LSTM" else 2
        used = list(ctx.outputs_used) + [False] * (n_schema - n_out)
        extra = [False] * (2 if kind == "LSTM" else 1)
        # ONNX LSTM/GRU inputs are LSTMTraining/GRUTraining's, in the same order
        f = functools.partial(kernels.get(name), needs=tuple(used[:n_schema] + extra), **kw)

        def rnn(X, W, R, B=None, SL=None, *rest):
            if SL is not None:
                if not bool((SL == X.shape[1 if layout else 0]).all()):
                    raise ValueError(f"{kind}: per-sequence lengths (sequence_lens) other "
                                     "than the full length are not supported")
                SL = None
            if layout:
                X = X.transpose(0, 1)
                rest = tuple(r.transpose(0, 1) if r is not None else None for r in rest)
            outs = list(f(X, W, R, B, SL, *rest)[:n_schema])
            if layout:
                if outs[0] is not None:
                    outs[0] = outs[0].permute(2, 0, 1, 3)
                outs[1:] = [o.transpose(0, 1) if o is not None else None for o in outs[1:]]
            return outs[0] if n_out == 1 else tuple(outs[:n_out])
        return rnn
    return factory


kernel_op("LSTM", since=7)(_rnn("LSTM"))
kernel_op("GRU", since=7)(_rnn("GRU"))


# ---- com.microsoft (and ORT's default-domain training ops) -------------------------------------

def _generic(name):
    def factory(ctx):
        return bind_kernel(name, ctx)
    return factory


def _pool_grad(name):
    """MaxPoolGrad / AveragePoolGrad: the output (the forward input's) shape comes from the
    graph's shapes (value_info, as ORT's gradient builder records it); N and C, when only
    those are symbolic there, from dY at run time."""
    def factory(ctx):
        shape = ctx.output_shapes[0] if ctx.output_shapes else None
        if shape is None or len(shape) < 3 or \
                not all(isinstance(d, int) for d in shape[2:]):
            raise ctx.error(f"the shape of output {ctx.node.output[0]!r} (the forward "
                            "input's shape) must be known from the graph: give the model "
                            "value_info for it")
        kw = _kwargs(ctx)
        if all(isinstance(d, int) for d in shape):
            return bind_kernel(name, ctx, kw={**kw, "output_shape": list(shape)})
        f = kernels.get(name)
        spatial = list(shape[2:])

        def pool_grad(dy, *rest):
            return f(dy, *rest, output_shape=[*dy.shape[:2], *spatial], **kw)
        return pool_grad
    return factory


@kernel_op("SplitTraining", domain=MS_DOMAIN)
def _split_training(ctx):
    axis = ctx.attr("axis", 0)
    n = len(ctx.node.output)
    s = kernels.get("SplitTraining")
    num = ctx.attr("num_outputs", n)
    return lambda x, sp: _tuple(s(x, sp, axis=axis, num_outputs=num))


@kernel_op("ConcatTraining", domain=MS_DOMAIN)
def _concat_training(ctx):
    c = functools.partial(kernels.get("ConcatTraining"), axis=ctx.attr("axis"))
    n = len(ctx.node.output)
    return (lambda *xs: c(*xs)[0]) if n == 1 else (lambda *xs: tuple(c(*xs)))


def _register_registry_ops():
    # onnx.defs.has per name, not a set from get_all_schemas_with_history(): that list of
    # every schema object costs ~12 MB of RSS that the process keeps (measured)
    onnx_names = {name for name in kernels.names() if onnx.defs.has(name)}
    for name in kernels.names():
        if name in ("Split", "Concat", "ConcatTraining", "SplitTraining"):
            continue
        pure = name not in _IMPURE
        factory = _pool_grad(name) if name in ("MaxPoolGrad", "AveragePoolGrad") \
            else _generic(name)
        if name in ("Gelu", "LayerNormalization", "SimplifiedLayerNormalization") or \
                name not in onnx_names:
            if lookup(MS_DOMAIN, name, 1) is None:
                kernel_op(name, domain=MS_DOMAIN, pure=pure)(factory)
        if name not in onnx_names and lookup(ONNX_DOMAIN, name, 1) is None:
            # ORT registers several training ops in the default domain (MaxPoolGrad,
            # SparseSoftmaxCrossEntropy, ...); accept them there too
            kernel_op(name, domain=ONNX_DOMAIN, pure=pure)(factory)


_register_registry_ops()
