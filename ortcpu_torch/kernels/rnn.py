"""Recurrent kernels (spec §8): LSTMTraining / LSTMGrad, GRUTraining / GRUGrad.

ORT's layouts and gate orders: X [S,B,I]; LSTM W [D,4H,I], R [D,4H,H], B [D,8H],
P [D,3H], gates [i,o,f,c]; GRU W [D,3H,I], R [D,3H,H], B [D,6H], gates [z,r,h];
states [D,B,H]; HAll [S,D,B,H]. Beyond ORT 1.19.2 (which accepts only ``forward``):
``direction`` may be ``"reverse"`` or ``"bidirectional"``, LSTMGrad takes the peephole
weights (``P=``) and differentiates through them, and everything runs in float64 too.
Sequence lengths, ``clip``, ``input_forget`` and non-default activations are rejected
as in ORT.

``lstm_forward`` / ``lstm_backward`` / ``gru_forward`` / ``gru_backward`` are the
single-direction entry points the autograd functions and ``nn.LSTM``/``nn.GRU`` use
(2-D weights, 1-D biases, [B,H] states, no direction axis). With ``torch_gates=True``
they take torch's gate orders instead of ORT's (LSTM [i,f,g,o], GRU [r,z,n]) for the
weights, biases, saved gate values and gradients: ``nn.LSTM``/``nn.GRU`` pass their
parameters as they are.
"""

from __future__ import annotations

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

_DIRS = {"forward": (0,), "reverse": (1,), "bidirectional": (0, 1)}


# ---- single-direction entry points ---------------------------------------------------


def lstm_forward(x, w, r, b=None, p=None, h0=None, c0=None, reverse=False, torch_gates=False):
    """x [S,B,I], w [4H,I], r [4H,H], b [8H], p [3H], h0/c0 [B,H] (already validated,
    contiguous, one dtype). Returns (HAll [S,B,H], CAll [S,B,H], iofc [S,B,4H])."""
    S, B, n_in = x.shape
    H = r.shape[1]
    hall = empty((S, B, H), x.dtype)
    call = empty((S, B, H), x.dtype)
    iofc = empty((S, B, 4 * H), x.dtype)
    st = native_fn("lstm_forward", x.dtype)(
        ptr(x), ptr(w), ptr(r), ptr(b), ptr(p), ptr(h0), ptr(c0), ptr(hall), ptr(call),
        ptr(iofc), S, B, n_in, H, int(reverse), int(torch_gates), get_num_threads())
    check_status(st, "LSTMTraining")
    return hall, call, iofc


def _grad_buffers(x, H: int, gates: int, needs) -> list:
    """dX, dW, dR, dB, dH0 outputs shared by LSTM (4 gates) and GRU (3 gates); None where
    ``needs`` is False."""
    S, B, n_in = x.shape
    shapes = ((S, B, n_in), (gates * H, n_in), (gates * H, H), (2 * gates * H,), (B, H))
    return [empty(shape, x.dtype) if need else None
            for shape, need in zip(shapes, needs[:5], strict=True)]


def lstm_backward(x, w, r, p, h0, c0, hall, call, iofc, dhall, dhfinal, dcfinal,
                  reverse=False, needs=(True,) * 7, torch_gates=False):
    """Gradients (dX, dW, dR, dB [8H], dH0, dC0, dP [3H]) of one LSTM direction; entries
    of ``needs`` that are False come back as None. dP is the gradient at ``p`` (at zero
    peepholes when ``p`` is None, as ORT reports it)."""
    S, B, n_in = x.shape
    H = r.shape[1]
    dt = x.dtype
    dx, dw, dr, db, dh0 = _grad_buffers(x, H, 4, needs)
    dc0 = empty((B, H), dt) if needs[5] else None
    dp = empty((3 * H,), dt) if needs[6] else None   # dL/dP at P (at 0 when p is None)
    st = native_fn("lstm_backward", dt)(
        ptr(x), ptr(w), ptr(r), ptr(p), ptr(h0), ptr(c0), ptr(hall), ptr(call), ptr(iofc),
        ptr(dhall), ptr(dhfinal), ptr(dcfinal), ptr(dx), ptr(dw), ptr(dr), ptr(db), ptr(dh0),
        ptr(dc0), ptr(dp), S, B, n_in, H, int(reverse), int(torch_gates),
        get_num_threads())
    check_status(st, "LSTMGrad")
    return dx, dw, dr, db, dh0, dc0, dp


def gru_forward(x, w, r, b=None, h0=None, linear_before_reset=0, reverse=False,
                torch_gates=False):
    """x [S,B,I], w [3H,I], r [3H,H], b [6H], h0 [B,H]. Returns (HAll, ZRH [S,B,3H])."""
    S, B, n_in = x.shape
    H = r.shape[1]
    hall = empty((S, B, H), x.dtype)
    zrh = empty((S, B, 3 * H), x.dtype)
    st = native_fn("gru_forward", x.dtype)(
        ptr(x), ptr(w), ptr(r), ptr(b), ptr(h0), ptr(hall), ptr(zrh), S, B, n_in, H,
        int(bool(linear_before_reset)), int(reverse), int(torch_gates), get_num_threads())
    check_status(st, "GRUTraining")
    return hall, zrh


def gru_backward(x, w, r, b, h0, hall, zrh, dhall, dhfinal, linear_before_reset=0,
                 reverse=False, needs=(True,) * 5, torch_gates=False):
    """Gradients (dX, dW, dR, dB [6H], dH0) of one GRU direction."""
    S, B, n_in = x.shape
    H = r.shape[1]
    dt = x.dtype
    dx, dw, dr, db, dh0 = _grad_buffers(x, H, 3, needs)
    st = native_fn("gru_backward", dt)(
        ptr(x), ptr(w), ptr(r), ptr(b), ptr(h0), ptr(hall), ptr(zrh), ptr(dhall),
        ptr(dhfinal), ptr(dx), ptr(dw), ptr(dr), ptr(db), ptr(dh0), S, B, n_in, H,
        int(bool(linear_before_reset)), int(reverse), int(torch_gates), get_num_threads())
    check_status(st, "GRUGrad")
    return dx, dw, dr, db, dh0


# ---- validation ------------------------------------------------------------------------


_LSTM_ACTS = ["Sigmoid", "Tanh", "Tanh"]
_GRU_ACTS = ["Sigmoid", "Tanh"]


def _attrs(op, hidden_size, direction, activations, clip, defaults, input_forget=0):
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size <= 0:
        raise ValueError(f"{op}: hidden_size must be a positive int, got {hidden_size!r}")
    if direction not in _DIRS:
        raise ValueError(f"{op}: direction must be 'forward', 'reverse' or 'bidirectional', "
                         f"got {direction!r}")
    if clip is not None:
        raise ValueError(f"{op}: clip is not supported (ORT's training kernels reject it too)")
    if int_attr(op, "input_forget", input_forget) != 0:
        raise ValueError(f"{op}: input_forget must be 0 (as in ORT)")
    if activations is not None:
        if not isinstance(activations, (list, tuple)):
            raise TypeError(f"{op}: activations must be a list of names, got "
                            f"{type(activations).__name__}")
        acts = [a.decode() if isinstance(a, bytes) else a for a in activations]
        if not all(isinstance(a, str) for a in acts):
            raise TypeError(f"{op}: activations must be a list of names (str), got {acts!r}")
        nd = len(_DIRS[direction])
        if [a.lower() for a in acts] != [d.lower() for d in defaults * nd]:
            raise ValueError(f"{op}: only the default activations {defaults} are supported, "
                             f"got {acts}")
    return _DIRS[direction]


def _opt(op, name, t, ref, shape):
    if t is None:
        return None
    t = float_input(op, name, t)
    same_dtype(op, "X", ref, name, t)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {fmt_shape(t)}")
    return t


def _req(op, name, t, ref, shape):
    if t is None:
        raise ValueError(f"{op}: {name} is required")
    return _opt(op, name, t, ref, shape)


def _inputs(op, X, W, R, SL, gates, hidden_size, direction, activations, clip, defaults,
            input_forget=0):
    """Checked attributes and X / W / R of an RNN op: (directions, X, W, R, S, B, I, H, D)."""
    dirs = _attrs(op, hidden_size, direction, activations, clip, defaults, input_forget)
    X = float_input(op, "X", X)
    if X.dim() != 3:
        raise ValueError(f"{op}: X must be [seq_length, batch_size, input_size], got "
                         f"{fmt_shape(X)}")
    if SL is not None:
        raise ValueError(f"{op}: sequence lengths (SL) are not supported (ORT requires the "
                         "input to be absent)")
    S, B, n_in = X.shape
    H, D = hidden_size, len(dirs)
    W = float_input(op, "W", W)
    same_dtype(op, "X", X, "W", W)
    if tuple(W.shape) != (D, gates * H, n_in):
        raise ValueError(f"{op}: W must have shape {(D, gates * H, n_in)}, got {fmt_shape(W)}")
    R = _req(op, "R", R, X, (D, gates * H, H))
    return dirs, X, W, R, S, B, n_in, H, D


def _stack_dir(ts, S_axis=True):
    """per-direction [S,B,X] -> [S,D,B,X] (or [B,X] -> [D,B,X])."""
    if len(ts) == 1:
        return ts[0].unsqueeze(1) if S_axis else ts[0].unsqueeze(0)
    return torch.stack(ts, 1 if S_axis else 0)


def _final(hall, reverse):
    return hall[0] if reverse else hall[-1]


# ---- LSTM -------------------------------------------------------------------------------


@register
def LSTMTraining(X, W, R, B=None, SL=None, H0=None, C0=None, P=None, *, hidden_size,
                 direction="forward", activations=None, activation_alpha=None,
                 activation_beta=None, clip=None, input_forget=0, needs=None):
    """com.microsoft LSTMTraining: LSTM forward keeping what the gradient needs.
    Inputs: X [S,B,I], W [D,4H,I], R [D,4H,H], B [D,8H], SL (must be None), H0, C0 [D,B,H],
    P [D,3H]; gate order [i,o,f,c]. Outputs: HAll [S,D,B,H], HFinal, CFinal [D,B,H],
    CAll [S,D,B,H], iofc [S,D,B,4H] (post-activation gates)."""
    op = "LSTMTraining"
    dirs, X, W, R, S, Bt, n_in, H, D = _inputs(op, X, W, R, SL, 4, hidden_size, direction,
                                               activations, clip, _LSTM_ACTS, input_forget)
    B = _opt(op, "B", B, X, (D, 8 * H))
    H0 = _opt(op, "H0", H0, X, (D, Bt, H))
    C0 = _opt(op, "C0", C0, X, (D, Bt, H))
    P = _opt(op, "P", P, X, (D, 3 * H))
    res = []
    for d, rev in enumerate(dirs):
        res.append(lstm_forward(
            X, W[d], R[d], None if B is None else B[d], None if P is None else P[d],
            None if H0 is None else H0[d], None if C0 is None else C0[d], reverse=rev))
    hall = _stack_dir([r[0] for r in res])
    call = _stack_dir([r[1] for r in res])
    iofc = _stack_dir([r[2] for r in res])
    hfin = torch.stack([_final(r[0], rev) for r, rev in zip(res, dirs, strict=True)])
    cfin = torch.stack([_final(r[1], rev) for r, rev in zip(res, dirs, strict=True)])
    return select_outputs(op, (hall, hfin, cfin, call, iofc), needs)


@register
def LSTMGrad(X, W, R, SL=None, Ht0=None, Ct0=None, HAll=None, CAll=None, iofc=None,
             dHAll=None, dHFinal=None, dCFinal=None, *, hidden_size, direction="forward",
             activations=None, activation_alpha=None, activation_beta=None, clip=None,
             input_forget=0, P=None, needs=None):
    """com.microsoft LSTMGrad: backpropagation through time of LSTMTraining.
    Inputs (ORT 1.19.2's 12): X, W, R, SL (None), Ht0, Ct0, HAll, CAll, iofc, dHAll,
    dHFinal, dCFinal; keyword ``P=`` (peepholes, [D,3H]) makes the gradient exact when
    the forward used them. Outputs: dX, dW, dR, dB [D,8H] (halves equal), dH0, dC0,
    dP [D,3H]."""
    op = "LSTMGrad"
    dirs, X, W, R, S, Bt, n_in, H, D = _inputs(op, X, W, R, SL, 4, hidden_size, direction,
                                               activations, clip, _LSTM_ACTS, input_forget)
    Ht0 = _opt(op, "Ht0", Ht0, X, (D, Bt, H))
    Ct0 = _opt(op, "Ct0", Ct0, X, (D, Bt, H))
    HAll = _req(op, "HAll", HAll, X, (S, D, Bt, H))
    CAll = _req(op, "CAll", CAll, X, (S, D, Bt, H))
    iofc = _req(op, "iofc", iofc, X, (S, D, Bt, 4 * H))
    dHAll = _opt(op, "dHAll", dHAll, X, (S, D, Bt, H))
    dHFinal = _opt(op, "dHFinal", dHFinal, X, (D, Bt, H))
    dCFinal = _opt(op, "dCFinal", dCFinal, X, (D, Bt, H))
    P = _opt(op, "P", P, X, (D, 3 * H))
    want = needs_flags(op, needs, 7)

    def per_dir(t, d):
        return None if t is None else t[:, d].contiguous()

    outs = []
    for d, rev in enumerate(dirs):
        outs.append(lstm_backward(
            X, W[d], R[d], None if P is None else P[d], None if Ht0 is None else Ht0[d],
            None if Ct0 is None else Ct0[d], per_dir(HAll, d), per_dir(CAll, d),
            per_dir(iofc, d), per_dir(dHAll, d), None if dHFinal is None else dHFinal[d],
            None if dCFinal is None else dCFinal[d], reverse=rev,
            needs=want))
    dx = None
    if want[0]:
        dx = outs[0][0]
        for o in outs[1:]:
            dx = dx + o[0]
    res = [dx] + [None if not want[k] else torch.stack([o[k] for o in outs])
                  for k in range(1, 7)]
    return tuple(res)


# ---- GRU ----------------------------------------------------------------------------------


@register
def GRUTraining(X, W, R, B=None, SL=None, H0=None, *, hidden_size, direction="forward",
                linear_before_reset=0, activations=None, activation_alpha=None,
                activation_beta=None, clip=None, needs=None):
    """com.microsoft GRUTraining: GRU forward keeping the gates.
    Inputs: X [S,B,I], W [D,3H,I], R [D,3H,H], B [D,6H], SL (None), H0 [D,B,H]; gate order
    [z,r,h]. Outputs: HAll [S,D,B,H], HFinal [D,B,H], ZRH [S,D,B,3H]."""
    op = "GRUTraining"
    dirs, X, W, R, S, Bt, n_in, H, D = _inputs(op, X, W, R, SL, 3, hidden_size, direction,
                                               activations, clip, _GRU_ACTS)
    B = _opt(op, "B", B, X, (D, 6 * H))
    H0 = _opt(op, "H0", H0, X, (D, Bt, H))
    res = [gru_forward(X, W[d], R[d], None if B is None else B[d],
                       None if H0 is None else H0[d], linear_before_reset, reverse=rev)
           for d, rev in enumerate(dirs)]
    hall = _stack_dir([r[0] for r in res])
    zrh = _stack_dir([r[1] for r in res])
    hfin = torch.stack([_final(r[0], rev) for r, rev in zip(res, dirs, strict=True)])
    return select_outputs(op, (hall, hfin, zrh), needs)


@register
def GRUGrad(X, W, R, B=None, SL=None, H0=None, HAll=None, ZRH=None, dHAll=None,
            dHFinal=None, *, hidden_size, direction="forward", linear_before_reset=0,
            activations=None, activation_alpha=None, activation_beta=None, clip=None,
            needs=None):
    """com.microsoft GRUGrad: backpropagation through time of GRUTraining.
    Inputs: X, W, R, B, SL (None), H0, HAll, ZRH, dHAll, dHFinal. Outputs: dX, dW, dR,
    dB [D,6H], dH0."""
    op = "GRUGrad"
    dirs, X, W, R, S, Bt, n_in, H, D = _inputs(op, X, W, R, SL, 3, hidden_size, direction,
                                               activations, clip, _GRU_ACTS)
    B = _opt(op, "B", B, X, (D, 6 * H))
    H0 = _opt(op, "H0", H0, X, (D, Bt, H))
    HAll = _req(op, "HAll", HAll, X, (S, D, Bt, H))
    ZRH = _req(op, "ZRH", ZRH, X, (S, D, Bt, 3 * H))
    dHAll = _opt(op, "dHAll", dHAll, X, (S, D, Bt, H))
    dHFinal = _opt(op, "dHFinal", dHFinal, X, (D, Bt, H))
    want = needs_flags(op, needs, 5)

    def per_dir(t, d):
        return None if t is None else t[:, d].contiguous()

    outs = [gru_backward(X, W[d], R[d], None if B is None else B[d],
                         None if H0 is None else H0[d], per_dir(HAll, d), per_dir(ZRH, d),
                         per_dir(dHAll, d), None if dHFinal is None else dHFinal[d],
                         linear_before_reset, reverse=rev, needs=want)
            for d, rev in enumerate(dirs)]
    dx = None
    if want[0]:
        dx = outs[0][0]
        for o in outs[1:]:
            dx = dx + o[0]
    return tuple([dx] + [None if not want[k] else torch.stack([o[k] for o in outs])
                         for k in range(1, 5)])
