"""``conv1d/2d/3d`` with ``torch.nn.functional``'s signatures (``padding='same'|'valid'``
included); forward is the ``Conv`` kernel, backward ``ConvGrad`` (only the gradients
autograd asks for are computed)."""

from __future__ import annotations

import torch

from ..kernels import conv as K
from ._layout import channels_last, from_order, in_order, to_format
from .activations import once_differentiable


def _tuple(name: str, v, n: int, minimum: int) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v,) * n
    try:
        vals = [int(t) if not isinstance(t, bool) and float(t) == int(t) else None for t in v]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an int or a tuple of {n} ints, got {v!r}") from None
    if len(vals) == 1 and n > 1:
        vals = vals * n
    if len(vals) != n or any(t is None for t in vals):
        raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")
    if any(t < minimum for t in vals):
        raise ValueError(f"{name} must be >= {minimum}, got {v!r}")
    return vals


#: channels-last [N, C, H, W] as the contiguous [N, H, W, C] the depthwise kernel takes
_NHWC = (0, 2, 3, 1)


def _on_nhwc(plan: K.ConvPlan, x) -> bool:
    """The plan has the channels-last depthwise kernel and x's memory is NHWC."""
    return plan.nhwc is not None and x.dim() == 4 and x.permute(_NHWC).is_contiguous()


def _taps(w):
    """A depthwise weight [C, 1, KH, KW] tap-major, [KH*KW, C], as the NHWC kernel takes it."""
    return w.reshape(w.shape[0], -1).t().contiguous()


def _nhwc_forward(plan, x, wt, b):
    y = K.dw_nhwc_forward(plan, x.permute(_NHWC), wt, None if b is None else b.contiguous())
    return from_order(y, _NHWC)


def _nhwc_backward(plan, dy, x, wt, w_shape, need):
    dx, dwt, db = K.dw_nhwc_backward(plan, in_order(dy, _NHWC), x.permute(_NHWC), wt, need)
    return (None if dx is None else from_order(dx, _NHWC),
            None if dwt is None else dwt.t().contiguous().view(w_shape), db)


def _dense(t):
    return t if t is None or t.is_contiguous() else t.contiguous()


def conv_forward(plan: K.ConvPlan, x, w, b):
    """Y of a checked plan, laid out as torch's convolution lays it out for x and w
    (channels-last where either is); on x's own memory where it is NHWC and the plan has
    the depthwise channels-last kernel. What ``ortcpu::conv`` runs."""
    if _on_nhwc(plan, x):
        return _nhwc_forward(plan, x, _taps(w), b)
    return to_format(K.conv_forward_plan(plan, _dense(x), _dense(w), _dense(b)),
                     channels_last(x, w))


def conv_backward(plan: K.ConvPlan, dy, x, w, need):
    """(dX, dW, dB) of ``conv_forward`` (None where ``need`` says no), dX laid out as x's
    channels-last layout where torch's would be."""
    if _on_nhwc(plan, x):
        return _nhwc_backward(plan, dy, x, _taps(w), w.shape, need)
    dx, dw, db = K.conv_backward_plan(plan, dy.contiguous(), _dense(x), _dense(w), need)
    return to_format(dx, channels_last(x, w)), dw, db


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, plan: K.ConvPlan):
        # shapes, dtypes and attributes checked for this signature (the plan)
        ctx.plan, ctx.has_bias = plan, b is not None
        ctx.nhwc = _on_nhwc(plan, x)
        if ctx.nhwc:  # depthwise on x's own channels-last memory: no layout copies
            wt = _taps(w)
            ctx.save_for_backward(x, wt)
            ctx.w_shape = w.shape
            return _nhwc_forward(plan, x, wt, b)
        ctx.fmt = fmt = channels_last(x, w)
        x, w = _dense(x), _dense(w)
        ctx.save_for_backward(x, w)  # (the dense copies: backward needs them too)
        return to_format(K.conv_forward_plan(plan, x, w, _dense(b)), fmt)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        n = ctx.needs_input_grad
        need = (n[0], n[1], ctx.has_bias and n[2])
        if ctx.nhwc:
            return (*_nhwc_backward(ctx.plan, dy, x, w, ctx.w_shape, need), None)
        dx, dw, db = K.conv_backward_plan(ctx.plan, dy.contiguous(), x, w, need)
        return to_format(dx, ctx.fmt), dw, db, None


# Checked plans by call signature (what _plan_key reads), so a repeated call skips the
# argument checks and the geometry (a 2x2 conv2d's call cost 66 us, 5 of them torch's;
# measured); bounded like kernels._checks.SignatureCache.
_PLANS: dict = {}
_PLANS_LIMIT = 4096
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _int_arg(v):
    """``v`` as part of a plan key: an int, a tuple of ints or a str (the spellings the
    checks take as they are); None for anything else (those calls are checked each time:
    a bool equals 1 as a dict key, and a list is unhashable)."""
    t = type(v)
    if t is int or t is str:
        return v
    if t is tuple:
        for e in v:
            if type(e) is not int:
                return None
        return v
    return None


def _tensor_key(t):
    if type(t) not in _PLAIN or not t.is_cpu or t.layout is not torch.strided:
        return None
    return t.dtype, t.shape


def _plan_key(op, input, weight, bias, stride, padding, dilation, groups):
    kx, kw = _tensor_key(input), _tensor_key(weight)
    kb = None if bias is None else _tensor_key(bias)
    args = (_int_arg(stride), _int_arg(padding), _int_arg(dilation))
    if kx is None or kw is None or (bias is not None and kb is None) or None in args or \
            type(groups) is not int:
        return None
    return op, kx, kw, kb, args, groups


def _plan(op: str, r: int, input, weight, bias, stride, padding, dilation, groups):
    """The checked plan of this call (``K.conv_plan``): every argument check runs here."""
    for name, t in (("input", input), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    unbatched = input.dim() == r + 1
    if unbatched:
        input = input.unsqueeze(0)
    if input.dim() != r + 2:
        raise ValueError(f"{op}: input must be {r + 1}-D (unbatched) or {r + 2}-D (batched), "
                         f"got shape {tuple(input.shape)}")
    if weight.dim() != r + 2:
        raise ValueError(f"{op}: weight must be {r + 2}-D, got shape {tuple(weight.shape)}")
    s = _tuple(f"{op}: stride", stride, r, 1)
    d = _tuple(f"{op}: dilation", dilation, r, 1)
    k = list(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0] * (2 * r)
        elif padding == "same":
            if any(v != 1 for v in s):
                raise ValueError(f"{op}: padding='same' is not supported for strided "
                                 f"convolutions (stride={tuple(s)})")
            total = [d[i] * (k[i] - 1) for i in range(r)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            raise ValueError(f"{op}: padding must be 'same', 'valid', an int or a tuple of "
                             f"ints, got {padding!r}")
    else:
        p = _tuple(f"{op}: padding", padding, r, 0)
        pads = p + p
    plan = K.conv_plan(op, input, weight, bias, strides=s, dilations=d, pads=pads,
                       group=groups)
    plan.unbatched = unbatched
    return plan


def plan_of(op: str, r: int, input, weight, bias, stride, padding, dilation, groups):
    """The checked ``K.ConvPlan`` of a call with ``torch.nn.functional.conv<r>d``'s
    arguments, kept per call signature (``_PLANS``); also what ``ortcpu::conv`` runs."""
    key = _plan_key(op, input, weight, bias, stride, padding, dilation, groups)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(op, r, input, weight, bias, stride, padding, dilation, groups)
        if key is not None:
            if len(_PLANS) >= _PLANS_LIMIT:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan


def _conv(op: str, r: int, input, weight, bias, stride, padding, dilation, groups):
    plan = plan_of(op, r, input, weight, bias, stride, padding, dilation, groups)
    if plan.unbatched:
        return _Conv.apply(input.unsqueeze(0), weight, bias, plan).squeeze(0)
    return _Conv.apply(input, weight, bias, plan)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Like ``torch.nn.functional.conv1d``."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Like ``torch.nn.functional.conv2d``."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Like ``torch.nn.functional.conv3d``."""
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)
