"""LSTM and GRU as ONNX LSTM/GRU nodes, one per layer.

torch stores gates as (i, f, g, o) for LSTM and (r, z, n) for GRU; ONNX wants (i, o, f, c) and
(z, r, h). The reorder is Split/Concat *inside the graph* on the torch-shaped parameters, so
the parameters stay graph inputs under their own names and gradients land on them.
Sequences run time-major; ``batch_first`` becomes Transposes around the stack.
"""

from __future__ import annotations

import torch

from .lowering import Lowering, LoweringError, lowers
from .lowering_nn import dropout_mask_input

aten = torch.ops.aten

LSTM_ORDER = (0, 3, 1, 2)  # torch i,f,g,o -> ONNX i,o,f,c
GRU_ORDER = (1, 0, 2)      # torch r,z,n   -> ONNX z,r,h


def _reorder(ctx: Lowering, w: str, order) -> str:
    chunks = ctx.op("Split", [w], n_out=len(order), axis=0)
    return ctx.op("Concat", [chunks[i] for i in order], axis=0)


def _reverse_time(ctx, seq):
    return ctx.op("Slice", [seq, ctx.ints([-1]), ctx.ints([-(2**63 - 1)]), ctx.ints([0]),
                            ctx.ints([-1])])


def _stack_dirs(ctx, values):
    ups = [ctx.op("Unsqueeze", [v, ctx.ints([0])]) for v in values]
    return ups[0] if len(ups) == 1 else ctx.op("Concat", ups, axis=0)


def _rnn(ctx, node, a, kind: str):
    gates, order = (4, LSTM_ORDER) if kind == "LSTM" else (3, GRU_ORDER)
    x = a["input"]
    params = list(a["params"])
    layers, bidir = int(a["num_layers"]), bool(a["bidirectional"])
    dirs = 2 if bidir else 1
    per = 4 if a["has_biases"] else 2
    if kind == "LSTM" and len(params) == layers * dirs * (per + 1):
        return _lstm_projected(ctx, a, layers, dirs, per + 1)
    if len(params) != layers * dirs * per:
        raise LoweringError(f"{kind}: unexpected parameter list ({len(params)} tensors)")
    hidden = int(ctx.shape(params[1])[1])
    if int(ctx.shape(params[1])[0]) != gates * hidden:
        raise LoweringError(f"{kind} weight_hh has an unexpected shape")
    if kind == "LSTM":
        h0, c0 = ctx.v(a["hx"][0]), ctx.v(a["hx"][1])
    else:
        h0, c0 = ctx.v(a["hx"]), None
    seq = ctx.v(x)
    if a["batch_first"]:
        seq = ctx.op("Transpose", [seq], perm=[1, 0, 2])
    t, b = ctx.shape(x)[:2] if not a["batch_first"] else ctx.shape(x)[1::-1]
    hs, cs = [], []
    extra = {"linear_before_reset": 1} if kind == "GRU" else {}
    for layer in range(layers):
        ys = []
        for d in range(dirs):
            # one forward-direction node per direction (ORT's LSTMGrad/GRUGrad take only
            # forward); the reverse direction runs on the time-reversed sequence
            k = layer * dirs + d
            p = params[k * per:(k + 1) * per]
            w = _stack_dirs(ctx, [_reorder(ctx, ctx.v(p[0]), order)])
            r = _stack_dirs(ctx, [_reorder(ctx, ctx.v(p[1]), order)])
            bias = None
            if a["has_biases"]:
                bias = _stack_dirs(ctx, [ctx.op("Concat", [_reorder(ctx, ctx.v(p[2]), order),
                                                           _reorder(ctx, ctx.v(p[3]), order)],
                                                axis=0)])
            lo, hi, axis0 = ctx.ints([k]), ctx.ints([k + 1]), ctx.ints([0])
            ins = [seq if d == 0 else _reverse_time(ctx, seq), w, r, bias, None,
                   ctx.op("Slice", [h0, lo, hi, axis0])]
            if kind == "LSTM":
                ins.append(ctx.op("Slice", [c0, lo, hi, axis0]))
            outs = ctx.op(kind, ins, n_out=3 if kind == "LSTM" else 2, hidden_size=hidden,
                          direction="forward", **extra)
            y = ctx.op("Squeeze", [outs[0], ctx.ints([1])])  # [T, 1, B, H] -> [T, B, H]
            ys.append(y if d == 0 else _reverse_time(ctx, y))
            hs.append(outs[1])
            if kind == "LSTM":
                cs.append(outs[2])
        seq = ys[0] if dirs == 1 else ctx.op("Concat", ys, axis=2)
        if a["train"] and a["dropout"] > 0 and layer < layers - 1:
            mask = dropout_mask_input(ctx, (t, b, dirs * hidden), float(a["dropout"]),
                                      ctx.dtype(x))
            seq = ctx.op("Mul", [seq, mask])
    out = ctx.op("Transpose", [seq], perm=[1, 0, 2]) if a["batch_first"] else seq
    h_n = hs[0] if len(hs) == 1 else ctx.op("Concat", hs, axis=0)
    if kind == "GRU":
        return out, h_n
    c_n = cs[0] if len(cs) == 1 else ctx.op("Concat", cs, axis=0)
    return out, h_n, c_n


def _lstm_projected(ctx, a, layers: int, dirs: int, per: int):
    """LSTM with ``proj_size`` (h = W_hr·(o ⊙ tanh c), which ONNX LSTM has no form for),
    unrolled over the (static) time steps in standard ops: one MatMul of the whole
    sequence with W_ih, then per step the recurrent MatMul, the gates (torch's i, f, g, o
    order, so no reorder) and the projection. Gradients flow through the standard rules."""
    x, params = a["input"], list(a["params"])
    seq = ctx.v(x)
    if a["batch_first"]:
        seq = ctx.op("Transpose", [seq], perm=[1, 0, 2])
    t = (ctx.shape(x)[1] if a["batch_first"] else ctx.shape(x)[0])
    b = (ctx.shape(x)[0] if a["batch_first"] else ctx.shape(x)[1])
    if not isinstance(t, int):
        raise LoweringError("LSTM with proj_size over a symbolic sequence length")
    h0, c0 = ctx.v(a["hx"][0]), ctx.v(a["hx"][1])
    hs, cs = [], []
    for layer in range(layers):
        ys = []
        for d in range(dirs):
            k = layer * dirs + d
            p = params[k * per:(k + 1) * per]
            w_ih, w_hh = (ctx.op("Transpose", [ctx.v(w)], perm=[1, 0]) for w in p[:2])
            w_hr = ctx.op("Transpose", [ctx.v(p[-1])], perm=[1, 0])
            xs = seq if d == 0 else _reverse_time(ctx, seq)
            gates_x = ctx.op("MatMul", [xs, w_ih])  # [T, B, 4H]
            if a["has_biases"]:
                gates_x = ctx.op("Add", [gates_x, ctx.op("Add", [ctx.v(p[2]), ctx.v(p[3])])])
            lo, hi, axis0 = ctx.ints([k]), ctx.ints([k + 1]), ctx.ints([0])
            h = ctx.op("Squeeze", [ctx.op("Slice", [h0, lo, hi, axis0]), axis0])
            c = ctx.op("Squeeze", [ctx.op("Slice", [c0, lo, hi, axis0]), axis0])
            steps = []
            for i in range(t):
                g = ctx.op("Add", [ctx.op("Gather", [gates_x, ctx.const(i, torch.int64)],
                                          axis=0), ctx.op("MatMul", [h, w_hh])])
                gi, gf, gg, go = ctx.op("Split", [g], n_out=4, axis=-1)
                c = ctx.op("Add", [ctx.op("Mul", [ctx.op("Sigmoid", [gf]), c]),
                                   ctx.op("Mul", [ctx.op("Sigmoid", [gi]),
                                                  ctx.op("Tanh", [gg])])])
                h = ctx.op("MatMul", [ctx.op("Mul", [ctx.op("Sigmoid", [go]),
                                                     ctx.op("Tanh", [c])]), w_hr])
                steps.append(ctx.op("Unsqueeze", [h, axis0]))
            y = steps[0] if len(steps) == 1 else ctx.op("Concat", steps, axis=0)
            ys.append(y if d == 0 else _reverse_time(ctx, y))
            hs.append(ctx.op("Unsqueeze", [h, axis0]))
            cs.append(ctx.op("Unsqueeze", [c, axis0]))
        seq = ys[0] if dirs == 1 else ctx.op("Concat", ys, axis=2)
        if a["train"] and a["dropout"] > 0 and layer < layers - 1:
            width = int(ctx.shape(params[per - 1])[0]) * dirs
            mask = dropout_mask_input(ctx, (t, b, width), float(a["dropout"]), ctx.dtype(x))
            seq = ctx.op("Mul", [seq, mask])
    out = ctx.op("Transpose", [seq], perm=[1, 0, 2]) if a["batch_first"] else seq
    h_n = hs[0] if len(hs) == 1 else ctx.op("Concat", hs, axis=0)
    c_n = cs[0] if len(cs) == 1 else ctx.op("Concat", cs, axis=0)
    return out, h_n, c_n


@lowers(aten.lstm.input)
def _lstm(ctx, node, a):
    return _rnn(ctx, node, a, "LSTM")


@lowers(aten.gru.input)
def _gru(ctx, node, a):
    return _rnn(ctx, node, a, "GRU")
