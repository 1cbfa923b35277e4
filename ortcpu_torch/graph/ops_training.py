"""Plan-time bindings of the training kernels a gradient graph runs on every step
(BatchNormInternal, BatchNormalizationGrad, ConvGrad), and the private ops of
``training_fusions`` (MaxPool2x2Train, MaxPool2x2TrainGrad, MaskedScaledSoftmax,
MaskedScaledSoftmaxGrad, LSTMTorchGatesTraining, LSTMTorchGatesGrad,
BiasGeluGradWithBiasGrad, SplitView, MatMulMergeHeads, GeluMaxPool2x2Train,
GeluMaxPool2x2TrainGrad).

When the planner knows the node's input shapes and float dtype, the arguments are checked
once, here, when the plan is built (the same checks the registry kernel makes per call),
and a run calls the kernel's core directly: on digits-sized tensors the registry's per-call
validation cost 40-90 us per node, as much as the arithmetic. Nodes whose shapes are not
static, or whose arguments the fast path does not cover, get the registry kernel (checked
per call) as before. Registered ahead of ``ops_kernels``' generic registry bindings.

ConvGrad with static shapes in conv_infer's "auto" mode is a measured choice (conv_infer's
``measured_choice``: timed on the first run, decided once per geometry and thread count
for the process) between our kernel as its auto lowering runs it, through zero-padded
planes ("small_map", where it applies), and torch's own ``aten.convolution_backward``
(oneDNN) where the begin pads reproduce the output grid. On the Intel Xeon (AVX-512)
torch's wins on small maps (digits' 64x32x4x4 3x3 layer); any other mode runs ours.
"""

from __future__ import annotations

import torch

from .._native import empty, native_fn, ptr
from ..kernels import activations as kact
from ..kernels import batchnorm as bn
from ..kernels import conv as kconv
from ..kernels import pool as kpool
from ..kernels import rnn as krnn
from ..kernels._checks import check_status, get_num_threads
from ..kernels.gemm import bmm_strided
from .conv_infer import get_mode, measured_choice
from .op_table import MS_DOMAIN, ONNX_DOMAIN, op
from .training_fusions import DOMAIN as TRAINING_DOMAIN

FLOATS = (torch.float32, torch.float64)


def _generic(name, ctx):
    from .ops_kernels import bind_kernel

    return bind_kernel(name, ctx)


def _static(ctx, n: int):
    """The first ``n`` input shapes if all are fully static and inputs share one float
    dtype, else None."""
    shapes = [s if s is not None or ctx.const(i) is None else tuple(ctx.const(i).shape)
              for i, s in enumerate(ctx.input_shapes[:n])]
    if len(shapes) < n or any(s is None or not all(isinstance(d, int) for d in s)
                              for s in shapes):
        return None
    dts = [ctx.dtype(i) for i in range(n)]
    if dts[0] not in FLOATS or any(d != dts[0] for d in dts):
        return None
    return [tuple(s) for s in shapes]


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def _kernel_op(name):
    """Register in com.microsoft and, as ORT also accepts its training ops there, in the
    default domain."""
    def deco(factory):
        for domain in (MS_DOMAIN, ONNX_DOMAIN):
            op(name, domain=domain, kind="kernel")(factory)
        return factory
    return deco


@_kernel_op("BatchNormInternal")
def _bn_internal(ctx):
    shapes = _static(ctx, 5)
    if shapes is None or not ctx.attr("training_mode", 1) or len(shapes[0]) < 2:
        return _generic("BatchNormInternal", ctx)
    c = shapes[0][1]
    if any(s not in ((c,),) for s in shapes[1:5]):
        return _generic("BatchNormInternal", ctx)
    eps = float(ctx.attr("epsilon", 1e-5))
    momentum = float(ctx.attr("momentum", 0.9))
    if not eps >= 0:
        return _generic("BatchNormInternal", ctx)
    n_out = len(ctx.node.output)
    used = list(ctx.outputs_used) + [False] * (5 - n_out)
    want_running = used[1] or used[2]
    # momentum 0 with finite constant running inputs (capture's placeholders, lowering_nn):
    # running = 0·input + 1·batch is the batch mean / biased variance itself, no ops needed
    batch_is_running = momentum == 0.0 and all(
        isinstance(t, torch.Tensor) and bool(torch.isfinite(t).all())
        for t in (ctx.const(3), ctx.const(4)))

    def run(x, scale, b, mean, var):
        y, bm, bv, inv = bn.bn_train_core("BatchNormInternal", x.contiguous(),
                                          scale.contiguous(), b.contiguous(), eps)
        rm = rv = None
        if batch_is_running:
            rm, rv = bm, bv
        elif want_running:
            rm, rv = bn._running(y, mean, var, bm, bv, momentum)
        return (y, rm, rv, bm, inv)[:n_out]
    return run if n_out > 1 else (lambda *a: run(*a)[0])


@_kernel_op("BatchNormalizationGrad")
def _bn_grad(ctx):
    shapes = _static(ctx, 5)
    if shapes is None or len(shapes[0]) < 2 or shapes[0] != shapes[1]:
        return _generic("BatchNormalizationGrad", ctx)
    c = shapes[1][1]
    if any(s != (c,) for s in shapes[2:5]):
        return _generic("BatchNormalizationGrad", ctx)
    n_out = len(ctx.node.output)
    used = list(ctx.outputs_used) + [False] * (3 - n_out)

    def run(dy, x, scale, mean, inv_std):
        out = bn.bn_backward_core("BatchNormalizationGrad", dy.contiguous(), x.contiguous(),
                                  scale.contiguous(), mean.contiguous(), inv_std.contiguous(),
                                  True, used[1], used[2])
        return out[:n_out]
    return run if n_out > 1 else (lambda *a: run(*a)[0])


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@_kernel_op("ConvGrad")
def _conv_grad(ctx):
    shapes = _static(ctx, 3)
    if shapes is None:
        return _generic("ConvGrad", ctx)
    dt = ctx.dtype(0)
    attrs = {k: v for k, v in ctx.attrs.items() if k in _CONV_ATTRS}
    if len(attrs) != len(ctx.attrs):
        return _generic("ConvGrad", ctx)
    try:
        geom, out_shape = kconv.conv_geometry("ConvGrad", _meta(shapes[1], dt),
                                              _meta(shapes[2], dt), **attrs)
    except (TypeError, ValueError):
        return _generic("ConvGrad", ctx)  # reported per call, against the node
    if tuple(out_shape) != shapes[0]:
        return _generic("ConvGrad", ctx)
    n_out = len(ctx.node.output)
    need = tuple(list(ctx.outputs_used[:3]) + [False] * (3 - n_out))

    def ours(g):
        def run(dy, x, w):
            out = kconv.conv_backward("ConvGrad", dy.contiguous(), x.contiguous(),
                                      w.contiguous(), need, geom=g)
            return out[:n_out]
        return run
    cands = {"training": ours(geom)}
    if get_mode() != "auto":  # one kernel for every ConvGrad (reproducible rounding)
        run = cands["training"]
        return run if n_out > 1 else (lambda *a: run(*a)[0])
    small = _conv_algo_geom(shapes, dt, attrs, "small_map")
    if small is not None and small != geom:
        cands["small_map"] = ours(small)
    th = _torch_conv_grad(geom, shapes, need, n_out)
    if th is not None:
        cands["torch"] = th
    if len(cands) == 1:
        run = cands["training"]
        return run if n_out > 1 else (lambda *a: run(*a)[0])
    run = measured_choice(("ConvGrad", tuple(geom), dt, need, get_num_threads()), cands)
    fn = run if n_out > 1 else (lambda *a: run(*a)[0])
    # where the measured choice is torch's convolution backward, the plan's report counts
    # this node on torch (Plan.counts)
    fn.side = lambda: "torch" if run.chosen_name() == "torch" else "kernel"
    return fn


def _conv_algo_geom(shapes, dt, attrs, algo):
    """Our kernel's geometry with the lowering ``algo`` forced, None where it does not
    apply to this Conv."""
    x, w = _meta(shapes[1], dt), _meta(shapes[2], dt)
    try:
        if kconv.conv_path("ConvGrad", x, w, algo=algo, **attrs) != algo:
            return None
        return kconv.conv_geometry("ConvGrad", x, w, algo=algo, **attrs)[0]
    except (TypeError, ValueError, RuntimeError):
        return None


def _torch_conv_grad(geom, shapes, need, n_out):
    """torch's own convolution backward (``aten.convolution_backward``: oneDNN on x86) for a
    1-D to 3-D Conv whose begin pads, applied at both ends, give the same output grid (the
    candidate ``measured_choice`` weighs against ours; on Intel it wins on small maps:
    digits' 64x32x4x4 3x3 layer, 0.92 vs 1.06 ms at 1 thread), else None."""
    r = len(shapes[1]) - 2
    ins, k, out, s, p, d = (geom[4 + 3 * i: 7 + 3 * i][3 - r:] for i in range(6))
    if not 1 <= r <= 3 or any(v < 0 for v in p) or any(
            (i + 2 * pp - dd * (kk - 1) - 1) // ss + 1 != o
            for i, kk, o, ss, pp, dd in zip(ins, k, out, s, p, d, strict=True)):
        return None
    group, m = geom[3], geom[2]
    conv_bwd = torch.ops.aten.convolution_backward
    mask = [bool(v) for v in need]
    bias = [m] if need[2] else None

    def run(dy, x, w):
        out = conv_bwd(dy, x, w, bias, s, p, d, False, [0] * r, group, mask)
        return tuple(t if t is None or t.is_contiguous() else t.contiguous()
                     for t in out)[:n_out]
    return run


def _geom_2x2(x_shape):
    return kpool.pool_geometry("MaxPool", tuple(x_shape), 2, kernel_shape=[2, 2],
                               strides=[2, 2])


@op("MaxPool2x2Train", domain=TRAINING_DOMAIN, kind="kernel")
def _maxpool_2x2(ctx):
    """(Y, 1-byte argmax code) of a 2x2 / stride-2 max pool (training_fusions.py)."""
    shape = ctx.input_shapes[0] if ctx.input_shapes else None
    fixed = _geom_2x2(shape) if shape is not None and all(isinstance(d, int)
                                                          for d in shape) else None

    def run(x):
        x = kpool.float_input("MaxPool", "X", x).contiguous()
        geom, out = fixed if fixed is not None else _geom_2x2(x.shape)
        return kpool.maxpool2x2_forward("MaxPool", x, geom, out)
    return run


@op("MaxPool2x2TrainGrad", domain=TRAINING_DOMAIN, kind="kernel")
def _maxpool_2x2_grad(ctx):
    """dX of MaxPool2x2Train from dY and the code; X's shape is the ``x_shape`` attribute."""
    x_shape = tuple(ctx.attr("x_shape"))
    geom, out = _geom_2x2(x_shape)
    y_shape = (x_shape[0], x_shape[1], *out)

    def run(dy, code):
        if tuple(dy.shape) != y_shape or tuple(code.shape) != y_shape:
            raise ValueError(f"MaxPool2x2TrainGrad: dY and the code must have shape "
                             f"{list(y_shape)}, got {list(dy.shape)} and {list(code.shape)}")
        return kpool.maxpool2x2_backward("MaxPoolGrad", dy.contiguous(), code, x_shape, geom)
    return run


def _gelu_pool_planes(op: str, x: torch.Tensor) -> tuple[int, int, int]:
    """(planes, h, w) of a float [N, C, H, W] input with H, W >= 2, or ValueError."""
    if x.dtype not in FLOATS or x.dim() != 4 or x.shape[2] < 2 or x.shape[3] < 2:
        raise ValueError(f"{op}: X must be a float32/float64 [N, C, H, W] tensor with H, W "
                         f">= 2, got {x.dtype} {list(x.shape)}")
    return x.shape[0] * x.shape[1], x.shape[2], x.shape[3]


@op("GeluMaxPool2x2Train", domain=TRAINING_DOMAIN, kind="kernel")
def _gelu_maxpool_2x2(ctx):
    """(Y, 1-byte argmax code) of MaxPool 2x2 / stride 2 over Gelu(X) (``approximate`` 1:
    the tanh form), the GELU output not stored (training_fusions.py)."""
    op_name, approximate = "GeluMaxPool2x2Train", int(ctx.attr("approximate", 0))

    def run(x):
        x = x.contiguous()
        planes, h, w = _gelu_pool_planes(op_name, x)
        y = empty((x.shape[0], x.shape[1], h // 2, w // 2), x.dtype)
        code = torch.empty(y.shape, dtype=torch.uint8)
        st = native_fn("gelu_maxpool2x2_forward", x.dtype)(
            ptr(x), ptr(y), kact.uint8_ptr(code), planes, h, w, approximate, get_num_threads())
        check_status(st, op_name)
        return y, code
    return run


@op("GeluMaxPool2x2TrainGrad", domain=TRAINING_DOMAIN, kind="kernel")
def _gelu_maxpool_2x2_grad(ctx):
    """dX of GeluMaxPool2x2Train from dY, X and the code: dY * Gelu'(X) at each window's
    maximum, 0 elsewhere."""
    op_name, approximate = "GeluMaxPool2x2TrainGrad", int(ctx.attr("approximate", 0))

    def run(dy, x, code):
        x, dy = x.contiguous(), dy.contiguous()
        planes, h, w = _gelu_pool_planes(op_name, x)
        y_shape = (x.shape[0], x.shape[1], h // 2, w // 2)
        if tuple(dy.shape) != y_shape or dy.dtype != x.dtype or \
                tuple(code.shape) != y_shape or code.dtype != torch.uint8:
            raise ValueError(f"{op_name}: dY ({x.dtype}) and the uint8 code must have shape "
                             f"{list(y_shape)}, got {dy.dtype} {list(dy.shape)} and "
                             f"{code.dtype} {list(code.shape)}")
        code = code.contiguous()
        dx = empty(tuple(x.shape), x.dtype)
        st = native_fn("gelu_maxpool2x2_backward", x.dtype)(
            ptr(dy), ptr(x), kact.uint8_ptr(code), ptr(dx), planes, h, w, approximate,
            get_num_threads())
        check_status(st, op_name)
        return dx
    return run


def _mask_rows(op: str, mask: torch.Tensor, x: torch.Tensor) -> int:
    """Rows of ``mask`` as the kernel reads it ([mask_rows, S], broadcast over x's leading
    dims; training_fusions._mask_fits), or ValueError."""
    ms, xs = tuple(mask.shape), tuple(x.shape)
    if mask.dtype != torch.bool or not ms or len(ms) > len(xs) or ms[-1] != xs[-1] or \
            (len(ms) >= 2 and ms[-2] not in (1, xs[-2])) or any(d != 1 for d in ms[:-2]):
        raise ValueError(f"{op}: mask must be bool [T or 1, {xs[-1] if xs else '?'}] "
                         f"broadcast over the scores {list(xs)}, got {mask.dtype} "
                         f"{list(ms)}")
    return ms[-2] if len(ms) >= 2 else 1


def _double_attr(ctx, name: str) -> float:
    """A float64 scalar tensor attribute (training_fusions._double)."""
    v = ctx.attr(name)
    if not isinstance(v, torch.Tensor) or v.numel() != 1:
        raise ValueError(f"{ctx.node.op_type}: attribute {name!r} must be a one-element "
                         f"tensor, got {v!r}")
    return float(v.reshape(-1)[0])


@op("MaskedScaledSoftmax", domain=TRAINING_DOMAIN, kind="kernel")
def _masked_softmax(ctx):
    """softmax over the last axis of Where(mask, fill, X * scale) (``masked_when`` 1; 0:
    the fill where mask is false), one pass (training_fusions.py)."""
    op_name = "MaskedScaledSoftmax"
    scale, fill = _double_attr(ctx, "scale"), _double_attr(ctx, "fill")
    masked_when = int(ctx.attr("masked_when", 1))

    def run(x, mask):
        x = x.contiguous()
        if x.dtype not in FLOATS or not x.dim():
            raise ValueError(f"{op_name}: scores must be float32/float64 with rank >= 1, "
                             f"got {x.dtype} {list(x.shape)}")
        rows_m = _mask_rows(op_name, mask, x)
        return kact.masked_softmax_core(op_name, x, mask.contiguous(), rows_m, scale, fill,
                                      masked_when)
    return run


@op("MaskedScaledSoftmaxGrad", domain=TRAINING_DOMAIN, kind="kernel")
def _masked_softmax_grad(ctx):
    """dX of MaskedScaledSoftmax from dY and its output Y: scale * SoftmaxGrad, 0 where
    masked."""
    op_name = "MaskedScaledSoftmaxGrad"
    scale = _double_attr(ctx, "scale")
    masked_when = int(ctx.attr("masked_when", 1))

    def run(dy, y, mask):
        dy, y = dy.contiguous(), y.contiguous()
        if dy.shape != y.shape or dy.dtype != y.dtype or y.dtype not in FLOATS or not y.dim():
            raise ValueError(f"{op_name}: dY and Y must be float tensors of one shape and "
                             f"dtype, got {dy.dtype} {list(dy.shape)} and {y.dtype} "
                             f"{list(y.shape)}")
        rows_m = _mask_rows(op_name, mask, y)
        return kact.masked_softmax_grad_core(op_name, dy, y, mask.contiguous(), rows_m, scale,
                                           masked_when)
    return run


def _lstm_shapes(op: str, x, w, r, h, extra=()):
    """ValueError unless x [S, B, I], w [4H, I], r [4H, H] share a float dtype and each of
    ``extra`` ((name, tensor or None, shape)) has its shape."""
    ok = x.dim() == 3 and w.dim() == 2 and r.dim() == 2 and x.dtype in FLOATS and \
        w.shape == (4 * h, x.shape[2]) and r.shape == (4 * h, h) and \
        w.dtype == x.dtype == r.dtype
    bad = [n for n, t, s in extra if t is not None and (tuple(t.shape) != s or
                                                         t.dtype != x.dtype)]
    if not ok or bad:
        raise ValueError(f"{op}: expected X [S, B, I], W [4H, I], R [4H, H] of one float dtype "
                         f"with H={h}, got {list(x.shape)} {list(w.shape)} {list(r.shape)}"
                         + (f"; bad {', '.join(bad)}" if bad else ""))


def _c(t):
    return None if t is None else t.contiguous()


@op("LSTMTorchGatesTraining", domain=TRAINING_DOMAIN, kind="kernel")
def _lstm_torch_gates(ctx):
    """LSTMTraining (one forward direction, no peepholes) on torch-order parameters:
    inputs X, W_ih [4H, I], W_hh [4H, H], b_ih, b_hh [4H] (optional), H0, C0 [1, B, H];
    outputs as LSTMTraining's (iofc in torch's gate order, read only by the Grad below)."""
    op_name = "LSTMTorchGatesTraining"
    h = int(ctx.attr("hidden_size"))

    def run(x, w, r, bih=None, bhh=None, h0=None, c0=None):
        x, w, r = x.contiguous(), w.contiguous(), r.contiguous()
        sb = (1, x.shape[1], h) if x.dim() == 3 else None
        _lstm_shapes(op_name, x, w, r, h, (("b_ih", bih, (4 * h,)), ("b_hh", bhh, (4 * h,)),
                                           ("H0", h0, sb), ("C0", c0, sb)))
        if (bih is None) != (bhh is None):
            raise ValueError(f"{op_name}: b_ih and b_hh must both be given or both absent")
        b = None if bih is None else torch.cat([bih, bhh])
        hall, call, iofc = krnn.lstm_forward(x, w, r, b, None, None if h0 is None else
                                             _c(h0[0]), None if c0 is None else _c(c0[0]),
                                             torch_gates=True)
        return (hall.unsqueeze(1), hall[-1:].clone(), call[-1:].clone(), call.unsqueeze(1),
                iofc.unsqueeze(1))[:len(ctx.node.output)]
    return run


@op("LSTMTorchGatesGrad", domain=TRAINING_DOMAIN, kind="kernel")
def _lstm_torch_gates_grad(ctx):
    """LSTMGrad of LSTMTorchGatesTraining: inputs X, W_ih, W_hh, H0, C0, HAll, CAll, iofc,
    dHAll, dHFinal, dCFinal; outputs dX, dW_ih, dW_hh, db_ih, db_hh, dH0, dC0 (torch
    order; '' where not needed)."""
    op_name = "LSTMTorchGatesGrad"
    h = int(ctx.attr("hidden_size"))
    used = list(ctx.outputs_used) + [False] * (7 - len(ctx.outputs_used))
    needs = (used[0], used[1], used[2], used[3] or used[4], used[5], used[6], False)

    def run(x, w, r, h0=None, c0=None, hall=None, call=None, iofc=None, dhall=None,
            dhfin=None, dcfin=None):
        x, w, r = x.contiguous(), w.contiguous(), r.contiguous()
        s, b = (x.shape[0], x.shape[1]) if x.dim() == 3 else (0, 0)
        _lstm_shapes(op_name, x, w, r, h, (
            ("H0", h0, (1, b, h)), ("C0", c0, (1, b, h)), ("HAll", hall, (s, 1, b, h)),
            ("CAll", call, (s, 1, b, h)), ("iofc", iofc, (s, 1, b, 4 * h)),
            ("dHAll", dhall, (s, 1, b, h)), ("dHFinal", dhfin, (1, b, h)),
            ("dCFinal", dcfin, (1, b, h))))
        if hall is None or call is None or iofc is None:
            raise ValueError(f"{op_name}: HAll, CAll and iofc are required")

        def first(t):
            return None if t is None else _c(t[0] if t.dim() == 3 else t[:, 0])
        dx, dw, dr, db, dh0, dc0, _ = krnn.lstm_backward(
            x, w, r, None, first(h0), first(c0), first(hall), first(call), first(iofc),
            first(dhall), first(dhfin), first(dcfin), needs=needs, torch_gates=True)
        dbih = db[: 4 * h].clone() if db is not None else None
        dbhh = db[4 * h:].clone() if db is not None else None
        return (dx, dw, dr, dbih, dbhh, None if dh0 is None else dh0.unsqueeze(0),
                None if dc0 is None else dc0.unsqueeze(0))[:len(ctx.node.output)]
    return run


@op("BiasGeluGradWithBiasGrad", domain=TRAINING_DOMAIN, kind="kernel")
def _bias_gelu_grad(ctx):
    """(dX, dB) of Gelu(X + B) (``approximate`` 1: the tanh form) from dY, X, B: dB, the sum
    of dX over every axis but the last, in the same pass."""
    op_name = "BiasGeluGradWithBiasGrad"
    approximate = int(ctx.attr("approximate", 0))

    def run(dy, x, b):
        dy, x, b = dy.contiguous(), x.contiguous(), b.contiguous()
        if dy.shape != x.shape or not x.dim() or b.shape != (x.shape[-1],) or \
                x.dtype not in FLOATS or not dy.dtype == x.dtype == b.dtype:
            raise ValueError(f"{op_name}: dY and X must be float tensors of one shape and B "
                             f"1-D along their last axis, got {dy.dtype} {list(dy.shape)}, "
                             f"{x.dtype} {list(x.shape)}, {b.dtype} {list(b.shape)}")
        return kact.gelu_backward_core(op_name, dy, x, b, approximate, True)
    return run


@op("SplitView", domain=TRAINING_DOMAIN, kind="torch")
def _split_view(ctx):
    """Split along ``axis`` into ``sizes`` as views of the input (training_fusions.py
    rewrites a Split to this only when Reshapes alone read the pieces)."""
    axis, sizes = int(ctx.attr("axis")), [int(v) for v in ctx.attr("sizes")]

    def run(x):
        if x.dim() <= axis or x.shape[axis] != sum(sizes):
            raise ValueError(f"SplitView: input {list(x.shape)} does not split into {sizes} "
                             f"along axis {axis}")
        return tuple(x.split(sizes, dim=axis))
    return run


@op("MatMulMergeHeads", domain=TRAINING_DOMAIN, kind="kernel")
def _matmul_merge_heads(ctx):
    """Inputs a_1, b_1, ..., a_k, b_k (4-D, equal batch dims [B, H]); output [B, T, k·H·D]
    whose i-th block of H·D columns holds the heads of P_i = a_i @ b_i ([B, H, T, D]; with
    ``transposed[i]`` P_i is [B, H, D, T] and its transpose is merged), merged as
    ``P.transpose(1, 2).reshape(B, T, H·D)`` would: the batched GEMM writes each head's
    product into its slice in place (training_fusions_attention.py)."""
    op_name = "MatMulMergeHeads"
    transposed = [bool(t) for t in ctx.attr("transposed")]
    k = len(transposed)
    if len(ctx.node.input) != 2 * k:
        raise ValueError(f"{op_name}: {len(ctx.node.input)} inputs for {k} products "
                         f"(expected two per product)")

    def run(*ops):
        pairs = []
        for i, t in enumerate(transposed):
            a, b = ops[2 * i], ops[2 * i + 1]
            if t:  # (a @ b)^T = b^T @ a^T
                a, b = b.transpose(-1, -2), a.transpose(-1, -2)
            pairs.append((a, b))
        a0, b0 = pairs[0]
        dt = a0.dtype
        shape = (*a0.shape[:-1], b0.shape[-1]) if a0.dim() == 4 and b0.dim() == 4 else None
        for a, b in pairs:
            if shape is None or a.dim() != 4 or b.dim() != 4 or a.dtype != dt or \
                    b.dtype != dt or dt not in FLOATS or a.shape[:2] != b.shape[:2] or \
                    a.shape[-1] != b.shape[-2] or (*a.shape[:-1], b.shape[-1]) != shape:
                raise ValueError(f"{op_name}: every product must be a float [B, H, T, D] of "
                                 f"one shape from 4-D operands, got "
                                 f"{[(list(x.shape), list(y.shape)) for x, y in pairs]}")
        bsz, heads, rows, cols = shape
        out = torch.empty((bsz, rows, k * heads * cols), dtype=dt)
        for i, (a, b) in enumerate(pairs):
            dst = out[:, :, i * heads * cols:(i + 1) * heads * cols]
            bmm_strided(op_name, a, b, out=dst.view(bsz, rows, heads, cols).transpose(1, 2))
        return out
    return run
