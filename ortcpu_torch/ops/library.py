"""Our kernels as ``torch.library`` operators (namespace ``ortcpu``), so that
``torch.compile`` (Dynamo, AOTAutograd, Inductor) keeps them in the compiled graph as
opaque calls: each op has a fake (meta) implementation giving its output shapes, and each
forward op an autograd formula (``register_autograd``) whose backward is another custom op
running ORT's gradient kernel. ``wrap()`` routes the supported functionals to these ops
while Dynamo traces (``wrap/compiled.py``); eager code keeps using the
``autograd.Function``s of ``ops`` (a dispatcher round trip costs more than they do).
Importing this module registers the ops (``wrap`` imports it); ``torch.ops.ortcpu.<name>``
exists from then on.

Op pairs (forward -> backward), all float32/float64 CPU:

==================================  ==========================================
``ortcpu::linear(x, w, b?)``        ``linear_backward`` (dX, dW, db as asked)
``ortcpu::gelu(x, approximate)``    ``gelu_backward`` (GeluGrad / FastGeluGrad)
``ortcpu::act(x, kind, alpha)``     ``act_backward`` (Relu, QuickGelu = SiLU, LeakyRelu)
``ortcpu::hard(x, kind, a, b)``     ``hard_backward`` (HardSigmoid/HardSwish/hardtanh)
``ortcpu::softmax(x, dim, log)``    ``softmax_backward`` (from the output)
``ortcpu::layer_norm``              ``layer_norm_backward`` (LayerNorm and RMSNorm)
``ortcpu::batch_norm``              ``batch_norm_backward``; ``batch_norm_update_stats``
                                    updates the running statistics in place
``ortcpu::cross_entropy``           ``cross_entropy_backward`` (class-index targets)
``ortcpu::conv``                    ``conv_backward`` (1-3 spatial dims, groups)
``ortcpu::max_pool``                ``max_pool_backward`` (from argmax codes or indices)
``ortcpu::avg_pool``                ``avg_pool_backward``
``ortcpu::global_avg_pool``         ``global_avg_pool_backward``
``ortcpu::attention``               ``attention_backward`` (scaled_dot_product_attention
                                    without dropout; ``library_attention.py``)
==================================  ==========================================

Gradients a backward op is not asked for (``mask``) come back as empty tensors and
become ``None`` for autograd. Every output is a tensor of its own (never an input or a
view of one), as custom ops require. Double backward is not supported: the backward ops
have no autograd formula of their own, so differentiating them raises.
"""

from __future__ import annotations

import math
import types
from collections import Counter
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.library import register_fake

from .._native import KernelError
from .._native.arena import empty, reshaped
from ..kernels import activations as KA
from ..kernels import batchnorm as KB
from ..kernels import gemm as KG
from ..kernels import loss as KL
from ..kernels import pool as KP
from ..kernels import tensor as KT
from ..kernels._checks import checked_signature, float_check
from . import conv as OC
from ._layout import channels_last
from .batchnorm import update_running
from .conv import plan_of
from .linear import _LINEAR_CHECKED, _check_linear
from .norm import checked_dims, ln_backward, ln_forward

NS = "ortcpu"
#: the overload name of every op, bumped whenever an op's schema or outputs change:
#: torch's compile caches key a graph on its code, which names the op and overload but
#: not the fake implementation, so a compilation cached before the change would otherwise
#: be reused after it (and fail its output shape asserts; see ``OPS``)
OVERLOAD = "v3"

_LIB = torch.library.Library(NS, "DEF")


def _qualified(name: str) -> str:
    return f"{NS}::{name}.{OVERLOAD}"


def _op(name: str, mutates_args=()):
    """Define ``ortcpu::<name>`` with the schema of the decorated function's annotations
    and make the function its CPU kernel; returns the op (``torch.ops.ortcpu.<name>``).
    A ``Library`` definition rather than ``torch.library.custom_op``: the same schema,
    fake and autograd registrations, at half custom_op's per-call cost (measured: about
    7 us against 20-30 us of dispatch around a tiny kernel), which the compiled graph
    pays on every call."""

    def define(fn):
        _LIB.define(f"{name}.{OVERLOAD}" +
                    torch.library.infer_schema(fn, mutates_args=mutates_args))
        _LIB.impl(f"{name}.{OVERLOAD}", fn, "CPU")
        _IMPLS[name] = fn
        return getattr(torch.ops.ortcpu, name)

    return define


_IMPLS: dict = {}  # op name -> its CPU kernel (the decorated Python function)
_below_autograd = torch._C._AutoDispatchBelowAutograd
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_any_requires_grad = torch._C._any_requires_grad
_grad_enabled = torch.is_grad_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active
_PLAIN = (Tensor, torch.nn.Parameter)


def _plain_call(args) -> bool:
    """Whether the CPU kernel may run straight from the Autograd key: no dispatch mode (fake
    or proxy tracing), no functorch transform, every tensor a plain CPU-side tensor (not
    fake, functional or another subclass)."""
    if _dispatch_modes() or _functorch_active():
        return False
    for a in args:
        if isinstance(a, Tensor) and type(a) not in _PLAIN:
            return False
    return True


def _autograd(op, backward, setup_context) -> None:
    """The op's Autograd kernel: with a gradient to track, an ``autograd.Function`` whose
    forward redispatches below autograd and whose ``backward(ctx, *grads)`` and
    ``setup_context(ctx, inputs, output)`` are ``register_autograd``'s; without one, on
    plain tensors, the CPU kernel called directly. (``register_autograd``'s own kernel
    redispatches through Python on every call: 10 us of a 2x2 max pool's 22 us inside a
    compiled graph, measured, where no gradient is ever tracked at run time.)"""
    name = op._qualified_op_name.split("::")[1]
    impl, overload = _IMPLS[name], getattr(op, OVERLOAD)
    arguments = overload._schema.arguments

    def full_inputs(args):
        # the dispatcher drops trailing arguments equal to their defaults
        return (*args, *(a.default_value for a in arguments[len(args):]))

    def forward(ctx, *args):
        keyset, args = args[-1], args[:-1]
        with _below_autograd():
            out = overload.redispatch(keyset & _AFTER_AUTOGRAD, *args)
        setup_context(ctx, full_inputs(args), out)
        return out

    def backward_(ctx, *grads):
        needs = ctx.needs_input_grad
        ctx.needs_input_grad = needs[:-1]  # the formula sees the op's own inputs
        try:
            g = backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs
        return (*g, None) if isinstance(g, tuple) else (g, None)

    fn = type(f"{name}_autograd", (torch.autograd.Function,),
              {"forward": staticmethod(forward), "backward": staticmethod(backward_)})

    def kernel(keyset, *args):
        if _grad_enabled() and _any_requires_grad(*args):
            return fn.apply(*args, keyset)
        if _plain_call(args):
            return impl(*args)
        with _below_autograd():
            return overload.redispatch(keyset & _AFTER_AUTOGRAD, *args)

    _LIB.impl(f"{name}.{OVERLOAD}", kernel, "Autograd", with_keyset=True)


#: forward ops traced into a compiled graph in this process, by name: counted by the fake
#: implementations, which run while torch.compile traces and never at run time
TRACED: Counter = Counter()  # name -> fake-impl runs (several per trace)



def _fresh(t: Tensor, inputs) -> Tensor:
    """``t``, or a copy when it is (a view of) one of ``inputs``: a custom op may not
    return its inputs."""
    for i in inputs:
        if i is not None and t.untyped_storage().data_ptr() == i.untyped_storage().data_ptr():
            return t.clone()
    return t


def _nothing(like: Tensor) -> Tensor:
    return like.new_empty((0,))


#: the side each ``pick``ing op call runs, by signature (``_side``): "ours" or "torch"
PICKED: dict = {}
#: the measurements behind PICKED: key -> {"side", "ours_ms", "torch_ms"}
MEASURED: dict = {}


def _side(key, run_ours, run_torch) -> str:
    """The side of a ``pick=True`` call with this signature ``key``: measured on its first
    call (``wrap.select.measure``: alternating blocks, the calling thread's CPU time, ties
    to torch; both sides run on the call's own tensors and write only fresh outputs),
    then kept. Run-time state of the op body, never read while tracing: no guard."""
    side = PICKED.get(key)
    if side is None:
        from ..wrap.select import measure  # (ops must import before wrap)

        with _no_torch_function():
            m = MEASURED[key] = measure(run_ours, run_torch, (), {})
        side = PICKED[key] = m["side"]
    return side


#: torch's side of a picking op calls ATen as eager torch does, never a torch function
#: mode a caller has entered (a wrap's kernel mode would send it back to ours)
_no_torch_function = torch._C.DisableTorchFunction


def _grads(mask, *pairs):
    """``(grad or None)`` per input: None where not asked for."""
    return tuple(g if m else None for m, g in zip(mask, pairs, strict=True))


# ---- linear ------------------------------------------------------------------------------


def _linear_ours(x, weight, bias, weight_t):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = KG.gemm(x2, weight.contiguous(), None if bias is None else bias.contiguous(),
                trans_b=not weight_t, op="linear")
    return reshaped(y, (*x.shape[:-1], weight.shape[1 if weight_t else 0]))


@_op("linear")
def linear(x: Tensor, weight: Tensor, bias: Tensor | None, pick: bool = False,
           weight_t: bool = False) -> Tensor:
    """``x·weightᵀ + bias`` (torch.nn.functional.linear) on our GEMM, or with ``weight_t``
    ``x·weight + bias`` for a weight stored [in, out] (``torch.addmm`` of a 1-D bias, as
    Hugging Face's ``Conv1D`` computes); ``pick``: on ours or torch's (ATen's ``linear``,
    what Inductor would call), whichever measured faster for this signature (``_side``)."""
    # the eager op's checks, their cache shared (an [in, out] weight keyed apart: the
    # same shapes are valid in one layout and not the other)
    key = checked_signature(x, weight, bias)
    if weight_t and key is not None:
        key += (True,)
    if key not in _LINEAR_CHECKED:
        _check_linear(x, weight.t() if weight_t else weight, bias)
        _LINEAR_CHECKED.add(key)
    if pick and _side(("linear", key),
                      lambda: _linear_ours(x, weight, bias, weight_t),
                      lambda: _linear_torch(x, weight, bias, weight_t)) == "torch":
        return _linear_torch(x, weight, bias, weight_t)
    return _linear_ours(x, weight, bias, weight_t)


def _linear_torch(x, weight, bias, weight_t):
    with _no_torch_function():
        return _fresh(torch.ops.aten.linear.default(x, weight.t() if weight_t else weight,
                                                    bias), (x, weight, bias))


@register_fake(_qualified("linear"))
def _(x, weight, bias, pick=False, weight_t=False):
    TRACED["linear"] += 1
    return x.new_empty((*x.shape[:-1], weight.shape[1 if weight_t else 0]))


@_op("linear_backward")
def linear_backward(dy: Tensor, x: Tensor, weight: Tensor, mask: Sequence[bool],
                    pick: bool = False, weight_t: bool = False
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """(dX, dW, db) of ``linear``, dW in weight's own layout ([in, out] with
    ``weight_t``); the ones ``mask`` does not ask for are empty. ``pick``: ours or torch's
    matrix products, as ``linear``."""
    args = (dy, x, weight, mask, weight_t)
    if pick:
        key = ("linear_backward", checked_signature(dy, x, weight), tuple(mask), weight_t)
        if _side(key, lambda: _linear_bwd_ours(*args),
                 lambda: _linear_bwd_torch(*args)) == "torch":
            return _linear_bwd_torch(*args)
    return _linear_bwd_ours(*args)


def _linear_bwd_torch(dy, x, weight, mask, weight_t):
    """ATen's matrix products, as eager torch's AddmmBackward computes them."""
    with _no_torch_function():
        x2 = x.reshape(-1, x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        if mask[0]:
            dx = (torch.mm(dy2, weight.t()) if weight_t else torch.mm(dy2, weight)).view(x.shape)
        else:
            dx = _nothing(x)
        if not mask[1]:
            dw = _nothing(x)
        else:
            dw = torch.mm(x2.t(), dy2) if weight_t else torch.mm(dy2.t(), x2)
        db = dy2.sum(0) if mask[2] else _nothing(x)
    return dx, dw, db


def _linear_bwd_ours(dy, x, weight, mask, weight_t):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()
    w = weight.contiguous()
    dx = reshaped(KG.gemm(dy2, w, trans_b=weight_t, op="linear"), x.shape) if mask[0] \
        else _nothing(x)
    if not mask[1]:
        dw = _nothing(x)
    elif weight_t:
        dw = KG.gemm(x2, dy2, trans_a=True, op="linear")
    else:
        dw = KG.gemm(dy2, x2, trans_a=True, op="linear")
    db = KT.sum_axis(dy2, 0, "linear", keepdim=False) if mask[2] else _nothing(x)
    return dx, dw, db


@register_fake(_qualified("linear_backward"))
def _(dy, x, weight, mask, pick=False, weight_t=False):
    return (x.new_empty(x.shape) if mask[0] else _nothing(x),
            x.new_empty(weight.shape) if mask[1] else _nothing(x),
            x.new_empty((weight.shape[1 if weight_t else 0],)) if mask[2] else _nothing(x))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, pick, weight_t = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias, ctx.pick, ctx.weight_t = bias is not None, pick, weight_t


def _linear_bwd(ctx, dy):
    x, weight = ctx.saved_tensors
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1],
            ctx.has_bias and ctx.needs_input_grad[2]]
    return (*_grads(mask, *linear_backward(dy, x, weight, mask, ctx.pick, ctx.weight_t)),
            None, None)


_autograd(linear, _linear_bwd, setup_context=_linear_setup)


# ---- GELU and pointwise activations --------------------------------------------------------


@_op("gelu")
def gelu(x: Tensor, approximate: int) -> Tensor:
    """GELU (``approximate`` 0: erf, 1: tanh) on ORT's Gelu / FastGelu kernels."""
    return KA.gelu_forward_core("gelu", float_check("gelu", "input", x).contiguous(), None,
                                approximate)


@register_fake(_qualified("gelu"))
def _(x, approximate):
    TRACED["gelu"] += 1
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_op("gelu_backward")
def gelu_backward(dy: Tensor, x: Tensor, approximate: int) -> Tensor:
    return KA.gelu_backward_core("gelu", dy.contiguous(), x.contiguous(), None, approximate,
                                 False)[0]


@register_fake(_qualified("gelu_backward"))
def _(dy, x, approximate):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _save_x(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.args = inputs[1:]


_autograd(gelu, lambda ctx, dy: (gelu_backward(dy, ctx.saved_tensors[0], *ctx.args),
                                        None), setup_context=_save_x)

_ACT_KINDS = ("Relu", "QuickGelu", "LeakyRelu")


@_op("act")
def act(x: Tensor, kind: str, alpha: float) -> Tensor:
    """``kind`` in Relu, QuickGelu (``x·sigmoid(alpha·x)``; SiLU is alpha 1), LeakyRelu."""
    if kind not in _ACT_KINDS:
        raise ValueError(f"ortcpu::act: kind must be one of {_ACT_KINDS}, got {kind!r}")
    return KA.act_forward(kind, x.contiguous(), alpha)


@register_fake(_qualified("act"))
def _(x, kind, alpha):
    TRACED[f"act[{kind}]"] += 1
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_op("act_backward")
def act_backward(dy: Tensor, x: Tensor, kind: str, alpha: float) -> Tensor:
    # the gradient from the forward input X (LeakyReluGrad tested on X: torch's rule)
    return KA.act_backward(kind + "Grad", kind, dy.contiguous(), x.contiguous(), "X", alpha)


@register_fake(_qualified("act_backward"))
def _(dy, x, kind, alpha):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_autograd(act, lambda ctx, dy: (act_backward(dy, ctx.saved_tensors[0], *ctx.args),
                                       None, None), setup_context=_save_x)

_HARD_KINDS = ("HardSigmoid", "HardSwish", "hardtanh")


@_op("hard")
def hard(x: Tensor, kind: str, a: float, b: float) -> Tensor:
    """HardSigmoid ``clamp(a·x + b, 0, 1)``, HardSwish ``x·clamp(a·x + b, 0, 1)`` or
    hardtanh ``clamp(x, a, b)``."""
    if kind not in _HARD_KINDS:
        raise ValueError(f"ortcpu::hard: kind must be one of {_HARD_KINDS}, got {kind!r}")
    return KA.hard_forward(kind, kind, x.contiguous(), a, b)


@register_fake(_qualified("hard"))
def _(x, kind, a, b):
    TRACED[f"hard[{kind}]"] += 1
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_op("hard_backward")
def hard_backward(dy: Tensor, x: Tensor, kind: str, a: float, b: float) -> Tensor:
    return KA.hard_backward(kind, kind, dy.contiguous(), x.contiguous(), a, b)


@register_fake(_qualified("hard_backward"))
def _(dy, x, kind, a, b):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_autograd(hard, lambda ctx, dy: (hard_backward(dy, ctx.saved_tensors[0], *ctx.args),
                                        None, None, None), setup_context=_save_x)


# ---- softmax -------------------------------------------------------------------------------


@_op("softmax")
def softmax(x: Tensor, dim: int, log: bool) -> Tensor:
    """Softmax (``log``: log-softmax) along ``dim`` (ORT Softmax-13 / LogSoftmax-13)."""
    return KA.softmax_forward("log_softmax" if log else "softmax", x.contiguous(), dim, log)


@register_fake(_qualified("softmax"))
def _(x, dim, log):
    TRACED["log_softmax" if log else "softmax"] += 1
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_op("softmax_backward")
def softmax_backward(dy: Tensor, y: Tensor, dim: int, log: bool) -> Tensor:
    """dX from the forward's output Y (SoftmaxGrad_13 / LogSoftmaxGrad_13)."""
    return KA.softmax_backward("softmax", dy.contiguous(), y.contiguous(), dim, log, False)


@register_fake(_qualified("softmax_backward"))
def _(dy, y, dim, log):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.dim, ctx.log = inputs[1], inputs[2]


_autograd(softmax,
    lambda ctx, dy: (softmax_backward(dy, ctx.saved_tensors[0], ctx.dim, ctx.log), None, None),
    setup_context=_softmax_setup)


# ---- LayerNorm / RMSNorm -------------------------------------------------------------------


@_op("layer_norm")
def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, ndim: int, eps: float,
               simplified: bool) -> tuple[Tensor, Tensor]:
    """(y, stats) of LayerNorm over the last ``ndim`` dims (``simplified``: RMSNorm);
    stats [2 * rows]: mean (unused by RMSNorm), inv_std. The eager front end's core
    (``ops.norm.ln_forward``), its arguments checked once per signature."""
    op = "rms_norm" if simplified else "layer_norm"
    if not 1 <= ndim <= x.dim():
        raise ValueError(f"{op}: ndim must be in [1, {x.dim()}], got {ndim}")
    checked_dims(op, x, x.shape[x.dim() - ndim:], weight, bias, eps)
    y, _, _, stats = ln_forward(x, weight, bias, ndim, eps, simplified, op)
    if simplified:  # the mean half RMSNorm leaves unwritten: a graph output is defined
        stats[:stats.numel() // 2].zero_()
    return y, stats


def _rows(x, ndim):
    return math.prod(x.shape[:x.dim() - ndim])


@register_fake(_qualified("layer_norm"))
def _(x, weight, bias, ndim, eps, simplified):
    TRACED["rms_norm" if simplified else "layer_norm"] += 1
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty((2 * _rows(x, ndim),)))


@_op("layer_norm_backward")
def layer_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, stats: Tensor,
                        ndim: int, simplified: bool,
                        mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(dX, dweight, dbias) in one pass (LayerNormalizationGrad /
    SimplifiedLayerNormalizationGrad; ``ops.norm.ln_backward``); dweight/dbias in the
    normalized shape, empty where ``mask`` does not ask for them."""
    op = "rms_norm" if simplified else "layer_norm"
    if dy.shape != x.shape or dy.dtype != x.dtype or stats.numel() != 2 * _rows(x, ndim) or \
            stats.dtype != x.dtype:
        raise ValueError(f"{op}: dy must match x {list(x.shape)} {x.dtype} and stats have "
                         f"2 * rows elements, got dy {list(dy.shape)} {dy.dtype}, stats "
                         f"{list(stats.shape)} {stats.dtype}")
    w = None if weight is None else weight.contiguous()
    dx, dw, db = ln_backward(dy, x.contiguous(), w, stats.contiguous(), ndim, simplified,
                             weight is not None and bool(mask[1]),
                             not simplified and bool(mask[2]), op)
    return (dx if mask[0] else _nothing(x), _nothing(x) if dw is None else dw,
            _nothing(x) if db is None else db)


@register_fake(_qualified("layer_norm_backward"))
def _(dy, x, weight, stats, ndim, simplified, mask):
    shp = x.shape[x.dim() - ndim:]
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if mask[0]
            else _nothing(x),
            x.new_empty(shp) if mask[1] and weight is not None else _nothing(x),
            x.new_empty(shp) if mask[2] and not simplified else _nothing(x))


def _ln_setup(ctx, inputs, output):
    x, weight, bias, ndim, _eps, simplified = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.ndim, ctx.simplified, ctx.has_bias = ndim, simplified, bias is not None
    ctx.set_materialize_grads(True)


def _ln_bwd(ctx, dy, _dstats):
    x, weight, stats = ctx.saved_tensors
    n = ctx.needs_input_grad
    mask = [n[0], weight is not None and n[1], ctx.has_bias and n[2]]
    dx, dw, db = layer_norm_backward(dy, x, weight, stats, ctx.ndim, ctx.simplified, mask)
    return (*_grads(mask, dx, dw, db), None, None, None)


_autograd(layer_norm, _ln_bwd, setup_context=_ln_setup)


# ---- BatchNorm -----------------------------------------------------------------------------


@_op("batch_norm")
def batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None,
               running_mean: Tensor | None, running_var: Tensor | None, training: bool,
               eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, mean, inv_std, var) of BatchNorm over [N, C, ...]
    (torch.nn.functional.batch_norm): in training the batch statistics (``var`` the biased
    batch variance, for ``batch_norm_update_stats``), in eval the running ones (``var``
    empty). A functional op (autograd needs one): the running statistics are updated by
    ``batch_norm_update_stats``."""
    op = "batch_norm"
    x = KB.float_input(op, "input", x)
    n, c, s = KB.ncs(op, x, "input")
    scale = KB.channel_vec(op, "weight", weight, x, c, "input")
    shift = KB.channel_vec(op, "bias", bias, x, c, "input")
    if training:
        if n * s <= 1:
            raise ValueError(f"{op}: expected more than 1 value per channel when training, "
                             f"got input size {list(x.shape)}")
        y, mean, var, inv = KB.bn_train_core(op, x, scale, shift, eps)
        return y, mean, inv, var
    if running_mean is None or running_var is None:
        raise ValueError(f"{op}: running_mean and running_var are required when training "
                         "is False")
    rm = KB.channel_vec(op, "running_mean", running_mean, x, c, "input", cast=True)
    rv = KB.channel_vec(op, "running_var", running_var, x, c, "input", cast=True)
    y, inv = KB.bn_eval_core(op, x, scale, shift, rm, rv, eps)
    return y, _fresh(rm, (running_mean,)), inv, _nothing(x)


@_op("batch_norm_update_stats", mutates_args=("running_mean", "running_var"))
def batch_norm_update_stats(running_mean: Tensor | None, running_var: Tensor | None,
                            mean: Tensor, var: Tensor, momentum: float, count: int) -> None:
    """``running = (1 - momentum)·running + momentum·batch`` in place, with the unbiased
    batch variance (``var·count/(count - 1)``, ``count`` values per channel), as torch's
    BatchNorm does in training."""
    with torch.no_grad():
        update_running((running_mean, running_var), (mean, var), momentum,
                       (1.0, count / (count - 1)))


@register_fake(_qualified("batch_norm_update_stats"))
def _(running_mean, running_var, mean, var, momentum, count):
    return None


@register_fake(_qualified("batch_norm"))
def _(x, weight, bias, running_mean, running_var, training, eps):
    TRACED["batch_norm"] += 1
    c = x.shape[1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((c,)),
            x.new_empty((c,)), x.new_empty((c,)) if training else _nothing(x))


@_op("batch_norm_backward")
def batch_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                        inv: Tensor, training: bool,
                        mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(dX, dweight, dbias) (ORT BatchNormalizationGrad; in eval the statistics are
    constants)."""
    op = "batch_norm"
    x = x.contiguous()
    c = x.shape[1]
    scale = KB.channel_vec(op, "weight", weight, x, c, "input")
    dx, dw, db = KB.bn_backward_core(op, dy.contiguous(), x, scale, mean.contiguous(),
                                     inv.contiguous(), training, bool(mask[1]), bool(mask[2]))
    return (dx if mask[0] else _nothing(x), _nothing(x) if dw is None else dw,
            _nothing(x) if db is None else db)


@register_fake(_qualified("batch_norm_backward"))
def _(dy, x, weight, mean, inv, training, mask):
    c = x.shape[1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if mask[0]
            else _nothing(x),
            x.new_empty((c,)) if mask[1] else _nothing(x),
            x.new_empty((c,)) if mask[2] else _nothing(x))


def _bn_setup(ctx, inputs, output):
    x, weight, bias, _rm, _rv, training, _eps = inputs
    _, mean, inv, _var = output
    ctx.save_for_backward(x, weight, mean, inv)
    ctx.training, ctx.has_bias = training, bias is not None


def _bn_bwd(ctx, dy, _dmean, _dinv, _dvar):
    x, weight, mean, inv = ctx.saved_tensors
    n = ctx.needs_input_grad
    mask = [n[0], weight is not None and n[1], ctx.has_bias and n[2]]
    g = batch_norm_backward(dy, x, weight, mean, inv, ctx.training, mask)
    return (*_grads(mask, *g), None, None, None, None)


_autograd(batch_norm, _bn_bwd, setup_context=_bn_setup)


# ---- cross entropy -------------------------------------------------------------------------

REDUCTIONS = ("none", "mean", "sum")


@_op("cross_entropy")
def cross_entropy(x: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                  reduction: int, smoothing: float,
                  fused: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, dx_unit, lse, wsum) of softmax cross entropy over [N, C, d...] logits with
    int64 class-index ``target`` [N, d...] (torch.nn.functional.cross_entropy's
    semantics: class ``weight``, ``ignore_index``, label ``smoothing``; ``reduction``
    an index into ``REDUCTIONS``). ``fused`` (a scalar loss): d(loss)/d(x) for an upstream
    gradient of 1 is written in the same pass (``dx_unit``; else empty). ``lse``: per
    sample max + log Σ exp; ``wsum``: Σ weights of the non-ignored samples (float64)."""
    op = "cross_entropy"
    x = x.contiguous()
    t = target.contiguous()
    w = None if weight is None else weight.contiguous()
    try:
        return _cross_entropy(x, t, w, ignore_index, reduction, smoothing, fused)
    except KernelError:  # labels are range-checked natively: the message names them
        _n, c, _d, sshape = KL.layout(op, x, 1, "input")
        KL.labels_input(op, "target", target, sshape, c, ignore_index)
        raise


def _cross_entropy(x, t, w, ignore_index, reduction, smoothing, fused):
    op = "cross_entropy"
    if fused and reduction != 0:
        r = KL.sce_forward_grad(op, x, t, weight=w, ignore_index=ignore_index,
                                smoothing=smoothing, mean=reduction == 1)
        dx = r["dx"]
    else:
        r = KL.sce_forward(op, x, t, weight=w, ignore_index=ignore_index,
                           smoothing=smoothing, want_loss=reduction == 0, want_lse=True)
        dx = _nothing(x)
    wsum = r["wsum"]
    if reduction == 0:
        loss = r["loss"]
    else:
        total = r["total"]
        if reduction == 1:
            total = total / wsum if wsum != 0 else float("nan")
        loss = torch.tensor(total, dtype=x.dtype)
    return loss, dx, r["lse"], torch.tensor(wsum, dtype=torch.float64)


@register_fake(_qualified("cross_entropy"))
def _(x, target, weight, ignore_index, reduction, smoothing, fused):
    TRACED["cross_entropy"] += 1
    n = x.shape[0]
    d = math.prod(x.shape[2:])
    loss = x.new_empty(target.shape) if reduction == 0 else x.new_empty(())
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) \
        if fused and reduction != 0 else _nothing(x)
    return loss, dx, x.new_empty((n * d,)), x.new_empty((), dtype=torch.float64)


@_op("cross_entropy_backward")
def cross_entropy_backward(dy: Tensor, x: Tensor, target: Tensor, weight: Tensor | None,
                           lse: Tensor, wsum: Tensor, dx_unit: Tensor, ignore_index: int,
                           reduction: int, smoothing: float) -> Tensor:
    """d(loss)/d(x): ``dx_unit·dy`` when the forward wrote it (a finite scalar dy), else
    the gradient kernel from the saved ``lse``."""
    op = "cross_entropy"
    if dx_unit.numel() and math.isfinite(g := float(dy)):
        # into the arena (pages already touched): a fresh 2 MB result of `dx_unit * g`
        # took 90-670 us in compiled GPT-2's backward (page faults), 30 us warm
        return torch.mul(dx_unit, g, out=empty(dx_unit.shape, dx_unit.dtype))
    x = x.contiguous()
    w = None if weight is None else weight.contiguous()
    if reduction == 0:
        dyt, g = dy.contiguous(), 1.0
    else:
        dyt, g = None, float(dy)
        if reduction == 1:
            ws = float(wsum)
            g = g / ws if ws != 0 else float("nan")
    return KL.sce_backward(op, x, target.contiguous(), shift=lse.contiguous(), weight=w,
                           dy=dyt, dy_scale=g, ignore_index=ignore_index,
                           smoothing=smoothing)


@register_fake(_qualified("cross_entropy_backward"))
def _(dy, x, target, weight, lse, wsum, dx_unit, ignore_index, reduction, smoothing):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _ce_setup(ctx, inputs, output):
    x, target, weight, ignore_index, reduction, smoothing, _fused = inputs
    _, dx_unit, lse, wsum = output
    ctx.save_for_backward(x, target, weight, lse, wsum, dx_unit)
    ctx.args = (ignore_index, reduction, smoothing)


def _ce_bwd(ctx, dy, _ddx, _dlse, _dwsum):
    x, target, weight, lse, wsum, dx_unit = ctx.saved_tensors
    dx = cross_entropy_backward(dy, x, target, weight, lse, wsum, dx_unit, *ctx.args)
    return dx, None, None, None, None, None, None


_autograd(cross_entropy, _ce_bwd, setup_context=_ce_setup)


# ---- convolution ---------------------------------------------------------------------------


@_op("conv")
def conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int,
         pick: bool = False) -> Tensor:
    """Convolution over 1-3 spatial dims (torch.nn.functional.conv1d/2d/3d with symmetric
    integer padding), batched input [N, C, ...]; ORT Conv. ``pick``: ours or ATen's
    ``convolution`` (what Inductor calls), whichever measured faster (``_side``)."""
    if pick:
        key = ("conv", checked_signature(x, weight, bias), tuple(stride), tuple(padding),
               tuple(dilation), groups)
        args = (x, weight, bias, stride, padding, dilation, groups)
        if _side(key, lambda: _conv_ours(*args), lambda: _conv_torch(*args)) == "torch":
            return _conv_torch(*args)
    return _conv_ours(x, weight, bias, stride, padding, dilation, groups)


def _conv_plan(x, weight, bias, stride, padding, dilation, groups):
    """The eager front end's checked plan of this signature (``ops.conv.plan_of``: one
    dict lookup once seen; the schema's lists as the tuples its key takes)."""
    return plan_of("conv", x.dim() - 2, x, weight, bias, tuple(stride), tuple(padding),
                   tuple(dilation), groups)


def _conv_ours(x, weight, bias, stride, padding, dilation, groups):
    plan = _conv_plan(x, weight, bias, stride, padding, dilation, groups)
    return OC.conv_forward(plan, x, weight, bias)


def _conv_format(x, weight):
    """The memory format of conv's Y and dX, the fake kernel's and both sides' alike:
    channels-last as torch's convolution decides it (``ops._layout.channels_last``), else
    contiguous."""
    return channels_last(x, weight) or torch.contiguous_format


def _conv_torch(x, weight, bias, stride, padding, dilation, groups):
    with _no_torch_function():
        y = torch.ops.aten.convolution.default(x, weight, bias, stride, padding, dilation,
                                               False, [0] * len(stride), groups)
    return y.contiguous(memory_format=_conv_format(x, weight))  # (as the fake says)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@register_fake(_qualified("conv"))
def _(x, weight, bias, stride, padding, dilation, groups, pick=False):
    TRACED[f"conv{x.dim() - 2}d"] += 1
    # torch's own shape function (its meta kernel), so the shapes agree by construction
    y = _CONV[x.dim() - 2](x, weight, bias, stride, padding, dilation, groups)
    return torch.empty(y.shape, dtype=y.dtype, memory_format=_conv_format(x, weight))


@_op("conv_backward")
def conv_backward(dy: Tensor, x: Tensor, weight: Tensor, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], groups: int,
                  mask: Sequence[bool], pick: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """(dX, dW, dB) of ``conv`` (ORT ConvGrad), only those ``mask`` asks for; ``pick``:
    ours or ATen's ``convolution_backward``, as ``conv``."""
    args = (dy, x, weight, stride, padding, dilation, groups, mask)
    if pick:
        key = ("conv_backward", checked_signature(dy, x, weight), tuple(stride),
               tuple(padding), tuple(dilation), groups, tuple(mask))
        if _side(key, lambda: _conv_bwd_ours(*args),
                 lambda: _conv_bwd_torch(*args)) == "torch":
            return _conv_bwd_torch(*args)
    return _conv_bwd_ours(*args)


def _conv_bwd_torch(dy, x, weight, stride, padding, dilation, groups, mask):
    with _no_torch_function():
        dx, dw, db = torch.ops.aten.convolution_backward.default(
            dy, x, weight, [weight.shape[0]] if mask[2] else None, stride, padding,
            dilation, False, [0] * len(stride), groups, [bool(m) for m in mask])
    # laid out as the fake says: dX as Y, dW and dB contiguous
    return (_nothing(x) if dx is None else dx.contiguous(memory_format=_conv_format(x, weight)),
            _nothing(x) if dw is None else dw.contiguous(),
            _nothing(x) if db is None else db)


def _conv_bwd_ours(dy, x, weight, stride, padding, dilation, groups, mask):
    need = tuple(bool(m) for m in mask)
    plan = _conv_plan(x, weight, None, stride, padding, dilation, groups)
    if tuple(dy.shape) != plan.out_shape or dy.dtype != x.dtype:
        raise ValueError(f"conv_backward: dy must be {x.dtype} of the output shape "
                         f"{plan.out_shape}, got {dy.dtype} {tuple(dy.shape)}")
    dx, dw, db = OC.conv_backward(plan, dy, x, weight, need)
    return (_nothing(x) if dx is None else dx, _nothing(x) if dw is None else dw,
            _nothing(x) if db is None else db)


@register_fake(_qualified("conv_backward"))
def _(dy, x, weight, stride, padding, dilation, groups, mask, pick=False):
    return (torch.empty(x.shape, dtype=x.dtype, memory_format=_conv_format(x, weight))
            if mask[0] else _nothing(x),
            x.new_empty(weight.shape) if mask[1] else _nothing(x),
            x.new_empty((weight.shape[0],)) if mask[2] else _nothing(x))


def _conv_setup(ctx, inputs, output):
    x, weight, bias, *geometry, pick = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry, ctx.has_bias, ctx.pick = geometry, bias is not None, pick


def _conv_bwd(ctx, dy):
    x, weight = ctx.saved_tensors
    n = ctx.needs_input_grad
    mask = [n[0], n[1], ctx.has_bias and n[2]]
    g = conv_backward(dy, x, weight, *ctx.geometry, mask, ctx.pick)
    return (*_grads(mask, *g), None, None, None, None, None)


_autograd(conv, _conv_bwd, setup_context=_conv_setup)


# ---- pooling -------------------------------------------------------------------------------


def _pool_attrs(kernel_size, stride, padding, ceil_mode, dilation=None) -> dict:
    a = {"kernel_shape": list(kernel_size), "strides": list(stride),
         "pads": list(padding) + list(padding), "ceil_mode": int(ceil_mode)}
    if dilation is not None:
        a["dilations"] = list(dilation)
    return a


@_op("max_pool")
def max_pool(x: Tensor, kernel_size: Sequence[int], stride: Sequence[int],
             padding: Sequence[int], dilation: Sequence[int],
             ceil_mode: bool) -> tuple[Tensor, Tensor]:
    """(y, saved) of max pooling over 1-3 spatial dims, batched [N, C, ...] input (ORT
    MaxPool), as the eager front end runs it for training (``maxpool_train_forward``):
    ``saved`` is a uint8 argmax code per window where the geometry allows, else int64
    indices flat over the whole input, for ``max_pool_backward``."""
    return KP.maxpool_train_forward("max_pool", x, **_pool_attrs(
        kernel_size, stride, padding, ceil_mode, dilation))


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


@register_fake(_qualified("max_pool"))
def _(x, kernel_size, stride, padding, dilation, ceil_mode):
    TRACED[f"max_pool{x.dim() - 2}d"] += 1
    y = _MAX_POOL[x.dim() - 2](x, kernel_size, stride, padding, dilation, ceil_mode)
    code = KP.maxpool_saves_code("max_pool", x.shape, _pool_attrs(
        kernel_size, stride, padding, ceil_mode, dilation))
    return y.new_empty(y.shape), y.new_empty(y.shape, dtype=torch.uint8 if code
                                             else torch.int64)


@_op("max_pool_backward")
def max_pool_backward(dy: Tensor, saved: Tensor, x: Tensor, kernel_size: Sequence[int],
                      stride: Sequence[int], padding: Sequence[int],
                      dilation: Sequence[int], ceil_mode: bool) -> Tensor:
    """dX of ``max_pool`` (ORT MaxPoolGrad): dY scattered by its codes or indices."""
    return KP.maxpool_train_backward("max_pool", dy, saved, tuple(x.shape), **_pool_attrs(
        kernel_size, stride, padding, ceil_mode, dilation))


@register_fake(_qualified("max_pool_backward"))
def _(dy, saved, x, kernel_size, stride, padding, dilation, ceil_mode):
    return x.new_empty(x.shape)


def _max_pool_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], inputs[0])
    ctx.attrs = inputs[1:]


def _max_pool_bwd(ctx, dy, _didx):
    saved, x = ctx.saved_tensors
    return max_pool_backward(dy, saved, x, *ctx.attrs), None, None, None, None, None


_autograd(max_pool, _max_pool_bwd, setup_context=_max_pool_setup)


@_op("avg_pool")
def avg_pool(x: Tensor, kernel_size: Sequence[int], stride: Sequence[int],
             padding: Sequence[int], ceil_mode: bool, count_include_pad: bool) -> Tensor:
    """Average pooling over 1-3 spatial dims, batched input (ORT AveragePool)."""
    return KP.avgpool_forward("avg_pool", x.contiguous(), int(count_include_pad), 0,
                              **_pool_attrs(kernel_size, stride, padding, ceil_mode))


@register_fake(_qualified("avg_pool"))
def _(x, kernel_size, stride, padding, ceil_mode, count_include_pad):
    TRACED[f"avg_pool{x.dim() - 2}d"] += 1
    y = _AVG_POOL[x.dim() - 2](x, kernel_size, stride, padding, ceil_mode, count_include_pad)
    return y.new_empty(y.shape)


@_op("avg_pool_backward")
def avg_pool_backward(dy: Tensor, x: Tensor, kernel_size: Sequence[int],
                      stride: Sequence[int], padding: Sequence[int],
                      count_include_pad: bool) -> Tensor:
    """dX of ``avg_pool`` (ORT AveragePoolGrad; the output size is dY's)."""
    a = _pool_attrs(kernel_size, stride, padding, False)
    del a["ceil_mode"]
    return KP.avgpool_backward("avg_pool", dy.contiguous(), tuple(x.shape),
                               int(count_include_pad), 0, **a)


@register_fake(_qualified("avg_pool_backward"))
def _(dy, x, kernel_size, stride, padding, count_include_pad):
    return x.new_empty(x.shape)


def _avg_pool_setup(ctx, inputs, output):
    x, kernel_size, stride, padding, _ceil, cip = inputs
    ctx.save_for_backward(x)
    ctx.args = (kernel_size, stride, padding, cip)


def _avg_pool_bwd(ctx, dy):
    return (avg_pool_backward(dy, ctx.saved_tensors[0], *ctx.args),
            None, None, None, None, None)


_autograd(avg_pool, _avg_pool_bwd, setup_context=_avg_pool_setup)


@_op("global_avg_pool")
def global_avg_pool(x: Tensor) -> Tensor:
    """Mean over all spatial dims of [N, C, ...], kept as size 1 (ORT GlobalAveragePool;
    ``adaptive_avg_pool2d(x, 1)``)."""
    return KP.GlobalAveragePool(x.contiguous())


@register_fake(_qualified("global_avg_pool"))
def _(x):
    TRACED["global_avg_pool"] += 1
    return x.new_empty((x.shape[0], x.shape[1]) + (1,) * (x.dim() - 2))


@_op("global_avg_pool_backward")
def global_avg_pool_backward(dy: Tensor, x: Tensor) -> Tensor:
    return KP.global_pool_backward("global_avg_pool", dy.contiguous(), x.contiguous(), 0)


@register_fake(_qualified("global_avg_pool_backward"))
def _(dy, x):
    return x.new_empty(x.shape)


_autograd(global_avg_pool,
    lambda ctx, dy: global_avg_pool_backward(dy, ctx.saved_tensors[0]),
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


from . import library_attention  # noqa: E402,F401  (registers ortcpu::attention)

#: every op's current overload by name: what wrap's compile-time adapters call, so that
#: the graph Dynamo records (the key of torch's AOTAutograd and FX graph caches) names
#: ``OVERLOAD``, and a compilation cached before an op changed is not reused after it
OPS = types.SimpleNamespace(**{name: getattr(getattr(torch.ops.ortcpu, name), OVERLOAD)
                               for name in _IMPLS})
