"""Autograd functions for one direction of an LSTM or GRU in ORT's layout.

``lstm_direction(x, w, r, b, p, h0, c0, reverse)``: x [S,B,I], w [4H,I], r [4H,H],
b [8H] (Wb then Rb), p [3H] peepholes (Pi, Po, Pf), h0/c0 [B,H]; gate order [i,o,f,c].
Returns (HAll [S,B,H], h_n [B,H], c_n [B,H]); backward is LSTMGrad (exact through the
peepholes). ``gru_direction(x, w, r, b, h0, linear_before_reset, reverse)``: w [3H,I],
r [3H,H], b [6H]; gate order [z,r,h]; returns (HAll, h_n); backward is GRUGrad.
Optional arguments may be None. ``torch_gates=True``: w, r, b (and their gradients) are
in torch's gate orders instead (LSTM [i,f,g,o], GRU [r,z,n]), as ``nn.LSTM`` / ``nn.GRU``
hold them.
"""

from __future__ import annotations

import torch

from ..kernels import rnn as K
from ..kernels._checks import bool_arg, float_input, fmt_shape
from .activations import once_differentiable


def _check(op, x, w, r, b, gates, extra):
    x = float_input(op, "input", x)
    if x.dim() != 3:
        raise ValueError(f"{op}: input must be [seq, batch, input_size], got {fmt_shape(x)}")
    w = float_input(op, "w", w)
    r = float_input(op, "r", r)
    S, B, n_in = x.shape
    if r.dim() != 2 or r.shape[0] != gates * r.shape[1] or r.shape[1] == 0:
        raise ValueError(f"{op}: r must be [{gates}H, H], got {fmt_shape(r)}")
    H = r.shape[1]
    if tuple(w.shape) != (gates * H, n_in):
        raise ValueError(f"{op}: w must be {(gates * H, n_in)}, got {fmt_shape(w)}")
    out = []
    for name, t, shape in [("b", b, (2 * gates * H,))] + [
        (n, v, s(B, H)) for n, v, s in extra
    ]:
        if t is not None:
            t = float_input(op, name, t)
            if tuple(t.shape) != shape:
                raise ValueError(f"{op}: {name} must have shape {shape}, got {fmt_shape(t)}")
        out.append(t)
    for name, t in [("w", w), ("r", r)] + [("b", out[0])]:
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{op}: {name} must have the dtype of input ({x.dtype}), "
                            f"got {t.dtype}")
    for t in out[1:]:
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{op}: states and peepholes must have the dtype of input")
    return x, w, r, out


class _LSTMDir(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, r, b, p, h0, c0, reverse, torch_gates):
        ctx.set_materialize_grads(False)
        x, w, r, (b, p, h0, c0) = _check(
            "lstm", x, w, r, b, 4,
            [("p", p, lambda B, H: (3 * H,)), ("h0", h0, lambda B, H: (B, H)),
             ("c0", c0, lambda B, H: (B, H))])
        hall, call, iofc = K.lstm_forward(x, w, r, b, p, h0, c0, reverse, torch_gates)
        S = x.shape[0]
        last = 0 if reverse else S - 1
        if S:
            hn, cn = hall[last].clone(), call[last].clone()
        else:
            hn = h0.clone() if h0 is not None else x.new_zeros(x.shape[1], r.shape[1])
            cn = c0.clone() if c0 is not None else x.new_zeros(x.shape[1], r.shape[1])
        ctx.save_for_backward(x, w, r, p, h0, c0, hall, call, iofc)
        ctx.reverse, ctx.has_b, ctx.torch_gates = reverse, b is not None, torch_gates
        return hall, hn, cn

    @staticmethod
    @once_differentiable
    def backward(ctx, dhall, dhn, dcn):
        x, w, r, p, h0, c0, hall, call, iofc = ctx.saved_tensors
        nig = ctx.needs_input_grad
        needs = (nig[0], nig[1], nig[2], nig[3] and ctx.has_b, nig[5] and h0 is not None,
                 nig[6] and c0 is not None, nig[4] and p is not None)
        if x.shape[0] == 0:
            return (torch.zeros_like(x) if needs[0] else None,
                    torch.zeros_like(w) if needs[1] else None,
                    torch.zeros_like(r) if needs[2] else None,
                    x.new_zeros(8 * r.shape[1]) if needs[3] else None,
                    torch.zeros_like(p) if needs[6] else None,
                    dhn if needs[4] else None, dcn if needs[5] else None, None, None)
        c = [None if t is None else t.contiguous() for t in (dhall, dhn, dcn)]
        dx, dw, dr, db, dh0, dc0, dp = K.lstm_backward(
            x, w, r, p, h0, c0, hall, call, iofc, c[0], c[1], c[2], ctx.reverse, needs,
            ctx.torch_gates)
        return dx, dw, dr, db, dp, dh0, dc0, None, None


class _GRUDir(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, r, b, h0, linear_before_reset, reverse, torch_gates):
        ctx.set_materialize_grads(False)
        x, w, r, (b, h0) = _check("gru", x, w, r, b, 3, [("h0", h0, lambda B, H: (B, H))])
        hall, zrh = K.gru_forward(x, w, r, b, h0, linear_before_reset, reverse, torch_gates)
        S = x.shape[0]
        if S:
            hn = hall[0 if reverse else S - 1].clone()
        else:
            hn = h0.clone() if h0 is not None else x.new_zeros(x.shape[1], r.shape[1])
        ctx.save_for_backward(x, w, r, b, h0, hall, zrh)
        ctx.reverse, ctx.lbr, ctx.torch_gates = reverse, linear_before_reset, torch_gates
        return hall, hn

    @staticmethod
    @once_differentiable
    def backward(ctx, dhall, dhn):
        x, w, r, b, h0, hall, zrh = ctx.saved_tensors
        nig = ctx.needs_input_grad
        needs = (nig[0], nig[1], nig[2], nig[3] and b is not None, nig[4] and h0 is not None)
        if x.shape[0] == 0:
            return (torch.zeros_like(x) if needs[0] else None,
                    torch.zeros_like(w) if needs[1] else None,
                    torch.zeros_like(r) if needs[2] else None,
                    torch.zeros_like(b) if needs[3] else None,
                    dhn if needs[4] else None, None, None, None)
        c = [None if t is None else t.contiguous() for t in (dhall, dhn)]
        dx, dw, dr, db, dh0 = K.gru_backward(x, w, r, b, h0, hall, zrh, c[0], c[1], ctx.lbr,
                                             ctx.reverse, needs, ctx.torch_gates)
        return dx, dw, dr, db, dh0, None, None, None


def lstm_direction(x, w, r, b=None, p=None, h0=None, c0=None, reverse: bool = False,
                   torch_gates: bool = False):
    """One LSTM direction in ORT's layout (see the module docstring)."""
    op = "lstm_direction"
    return _LSTMDir.apply(x, w, r, b, p, h0, c0, bool_arg(op, "reverse", reverse),
                          bool_arg(op, "torch_gates", torch_gates))


def gru_direction(x, w, r, b=None, h0=None, linear_before_reset: int = 0,
                  reverse: bool = False, torch_gates: bool = False):
    """One GRU direction in ORT's layout (see the module docstring)."""
    op = "gru_direction"
    return _GRUDir.apply(x, w, r, b, h0, int(bool_arg(op, "linear_before_reset",
                                                      linear_before_reset)),
                         bool_arg(op, "reverse", reverse),
                         bool_arg(op, "torch_gates", torch_gates))
