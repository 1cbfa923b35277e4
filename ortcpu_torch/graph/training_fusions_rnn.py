"""The RNN passes of ``training_fusions``.

``lstm_torch_gates``: a single-layer forward LSTM whose weights the capture reorders from
torch's gate order (Split -> Concat [i, o, f, c] -> Unsqueeze per weight and bias, and the
inverse chains on the gradients) runs as ``LSTMTorchGatesTraining`` /
``LSTMTorchGatesGrad`` on the parameters themselves.

``rnn_last_step``: the last step of a forward LSTM/GRU output (``out[:, -1]``) is read
from HFinal, its gradient entering as dHFinal (see the function)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from .training_rewrite import DOMAIN, MS_DOMAINS, Rewrite, const_ints, is_onnx, node_attrs

_LSTM_ATTRS = {"hidden_size", "direction"}


def _equal_split(g: Rewrite, node, parts: int) -> bool:
    """``node`` is a Split on axis 0 into ``parts`` equal pieces."""
    if not is_onnx(node, "Split") or len(node.output) != parts or \
            int(node_attrs(node).get("axis", 0)) != 0 or "split" in node_attrs(node):
        return False
    if len(node.input) < 2 or not node.input[1]:
        return True
    sizes = const_ints(g, node.input[1])
    return sizes is not None and len(set(sizes)) == 1 and len(sizes) == parts


def _concat0(node, inputs: list) -> bool:
    return is_onnx(node, "Concat") and int(node_attrs(node).get("axis", 0)) == 0 and \
        list(node.input) == inputs


def _from_torch_order(g: Rewrite, value: str, used: list):
    """The torch-order tensor ``value`` = Concat(Split(src, 4)[0, 3, 1, 2]) reorders."""
    c = g.producer.get(value)
    s = g.producer.get(c.input[0]) if c is not None and c.input else None
    if s is None or not _equal_split(g, s, 4) or \
            not _concat0(c, [s.output[k] for k in (0, 3, 1, 2)]) or \
            not all(g.only_reader(o, c) for o in s.output):
        return None
    used += [c, s]
    return s.input[0]


def _unsqueezed(g: Rewrite, value: str, readers: set, used: list):
    """``value`` = Unsqueeze(v, axes [0]) read only by ``readers``: v."""
    u = g.producer.get(value)
    if u is None or not is_onnx(u, "Unsqueeze") or value in g.outputs or \
            not {id(r) for r in g.readers.get(value, [])} <= readers:
        return None
    axes = const_ints(g, u.input[1]) if len(u.input) > 1 else list(node_attrs(u).get("axes", []))
    if axes != [0] or not g.only_reader(u.input[0], u):
        return None
    used.append(u)
    return u.input[0]


def _to_torch_order(g: Rewrite, value: str, used: list) -> str | None:
    """The final name of ``Concat(Split(value, 4)[0, 2, 3, 1])`` (the gradient of a
    reorder back to torch's order), None if ``value`` is not read that way."""
    readers = g.readers.get(value, [])
    s = readers[0] if len(readers) == 1 else None
    if s is None or value in g.outputs or not _equal_split(g, s, 4):
        return None
    rs = [g.readers.get(o, []) for o in s.output]
    c = rs[0][0] if rs[0] else None
    if c is None or any(r != [c] for r in rs) or any(o in g.outputs for o in s.output) or \
            not _concat0(c, [s.output[k] for k in (0, 2, 3, 1)]):
        return None
    used += [s, c]
    return c.output[0]


def _reshaped(g: Rewrite, value: str, used: list) -> str | None:
    readers = g.readers.get(value, [])
    r = readers[0] if len(readers) == 1 else None
    if r is None or value in g.outputs or not is_onnx(r, "Reshape"):
        return None
    used.append(r)
    return r.output[0]


def lstm_torch_gates(g: Rewrite) -> None:
    """The pass (module docstring)."""
    for lstm in g.nodes:
        if lstm.op_type != "LSTMTraining" or lstm.domain not in MS_DOMAINS or g.taken(lstm):
            continue
        a = node_attrs(lstm)
        ins = list(lstm.input) + [""] * (8 - len(lstm.input))
        if set(a) - _LSTM_ATTRS or a.get("direction", b"forward") not in (b"forward",
                                                                            "forward") or \
                ins[4] or ins[7] or not ins[1] or not ins[2]:
            continue
        grads = [r for r in g.readers.get(ins[1], []) if r is not lstm]
        grad = grads[0] if len(grads) == 1 and grads[0].op_type == "LSTMGrad" else None
        if grads and grad is None:
            continue
        readers = {id(lstm)} | ({id(grad)} if grad is not None else set())
        used: list = []
        srcs = []
        for k in (1, 2):
            v = _unsqueezed(g, ins[k], readers, used)
            srcs.append(v and _from_torch_order(g, v, used))
        biases = ["", ""]
        if ins[3]:
            v = _unsqueezed(g, ins[3], {id(lstm)}, used)
            c = g.producer.get(v) if v else None
            if c is None or not is_onnx(c, "Concat") or len(c.input) != 2 or \
                    int(node_attrs(c).get("axis", 0)) != 0:
                continue
            used.append(c)
            biases = [_from_torch_order(g, b, used) if g.only_reader(b, c) else None
                      for b in c.input]
        if None in srcs or None in biases:
            continue
        new = []
        if grad is not None:
            gins = list(grad.input) + [""] * (12 - len(grad.input))
            gouts = list(grad.output) + [""] * (6 - len(grad.output))
            if gins[1] != ins[1] or gins[2] != ins[2] or gins[3]:
                continue
            outs = [gouts[0], "", "", "", "", gouts[4], gouts[5]]
            ok = True
            for k, slot in ((1, 1), (2, 2)):  # dW, dR
                d = gouts[k]
                if d and g.readers.get(d) or d in g.outputs:
                    v = _reshaped(g, d, used)
                    outs[slot] = v and _to_torch_order(g, v, used)
                    ok = ok and outs[slot] is not None
            d = gouts[3]
            if ins[3] and d and (g.readers.get(d) or d in g.outputs):
                v = _reshaped(g, d, used)
                readers = g.readers.get(v, []) if v else []
                s = readers[0] if len(readers) == 1 else None
                if s is None or not _equal_split(g, s, 2) or v in g.outputs:
                    ok = False
                else:
                    used.append(s)
                    outs[3] = _to_torch_order(g, s.output[0], used)
                    outs[4] = _to_torch_order(g, s.output[1], used)
                    ok = ok and None not in outs[3:5]
            if not ok:
                continue
            new_grad = helper.make_node(
                "LSTMTorchGatesGrad", [gins[0], *srcs, *gins[4:12]], outs, domain=DOMAIN,
                name=grad.name + "_torch_gates", hidden_size=int(a["hidden_size"]))
            new.append((grad, new_grad))
        if g.taken(*used):
            continue
        new.insert(0, (lstm, helper.make_node(
            "LSTMTorchGatesTraining", [ins[0], *srcs, *biases, ins[5], ins[6]],
            list(lstm.output), domain=DOMAIN, name=lstm.name + "_torch_gates",
            hidden_size=int(a["hidden_size"]))))
        for n in used:
            g.replace[id(n)] = []
        for old, n in new:
            g.replace[id(old)] = [n]
        g.done.append("LSTMTraining (+ LSTMGrad) with gate-reorder chains -> "
                      "LSTMTorchGatesTraining (+ LSTMTorchGatesGrad)")


# ---- the last step of the sequence read from HFinal -------------------------------------

# gradient op -> its (dHAll, dHFinal) input slots
_GRAD_SLOTS = {"LSTMGrad": (9, 10), "LSTMTorchGatesGrad": (8, 9), "GRUGrad": (8, 9)}
_TRAINING = {"LSTMTraining": "LSTMGrad", "LSTMTorchGatesTraining": "LSTMTorchGatesGrad",
             "GRUTraining": "GRUGrad"}


def _single_reader(g: Rewrite, value: str):
    r = g.readers.get(value, [])
    return r[0] if len(r) == 1 and value not in g.outputs else None


def _axes(g: Rewrite, node) -> list[int] | None:
    if len(node.input) > 1 and node.input[1]:
        return const_ints(g, node.input[1])
    return list(node_attrs(node).get("axes", [])) or None


def _scalar_index(g: Rewrite, name: str) -> int | None:
    """The value of a rank-0 integer constant (a Gather index that drops its axis)."""
    vals = const_ints(g, name)
    t = g.initializers.get(name)
    p = g.producer.get(name)
    if t is None and p is not None and p.attribute:
        t = p.attribute[0].t
    return vals[0] if vals is not None and t is not None and len(t.dims) == 0 else None


def _const_node(name: str, values: list[int]):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.array(values, np.int64), name))


def _last_step_chain(g: Rewrite, rnn):
    """(nodes of HAll -> Squeeze [-> Transpose] -> Gather(last step), the Gather) when the
    recurrent node's full output is read only that way (and by its gradient), else None."""
    hall, shape = rnn.output[0], g.shapes.get(rnn.output[0])  # [S, 1, B, H] if known
    if len(rnn.output) < 2 or not rnn.output[1] or hall in g.outputs:
        return None
    readers = [r for r in g.readers.get(hall, []) if r.op_type != _TRAINING[rnn.op_type]]
    sq = readers[0] if len(readers) == 1 else None
    if sq is None or not is_onnx(sq, "Squeeze") or _axes(g, sq) != [1]:
        return None
    chain, nxt, axis = [sq], _single_reader(g, sq.output[0]), 0
    if nxt is not None and is_onnx(nxt, "Transpose") and \
            list(node_attrs(nxt).get("perm", [])) == [1, 0, 2]:
        chain.append(nxt)
        nxt, axis = _single_reader(g, nxt.output[0]), 1
    if nxt is None or not is_onnx(nxt, "Gather") or \
            int(node_attrs(nxt).get("axis", 0)) != axis:
        return None
    idx = _scalar_index(g, nxt.input[1])  # -1, or S - 1 where S is known
    if idx is None or (idx != -1 and (not shape or idx != shape[0] - 1)):
        return None
    return chain, nxt, axis


def _grad_chain(g: Rewrite, grad, dhall: str, gather, axis: int):
    """(nodes of dY -> GatherGrad [-> Transpose] -> Reshape -> dHAll, dY) mirroring the
    forward chain, else None."""
    rs = g.producer.get(dhall)
    if rs is None or not is_onnx(rs, "Reshape") or _single_reader(g, dhall) is not grad:
        return None
    chain, prev = [rs], g.producer.get(rs.input[0])
    if axis == 1:
        if prev is None or not is_onnx(prev, "Transpose") or \
                list(node_attrs(prev).get("perm", [])) != [1, 0, 2] or \
                _single_reader(g, prev.output[0]) is not rs:
            return None
        chain.append(prev)
        prev = g.producer.get(prev.input[0])
    gg = prev
    if gg is None or gg.op_type != "GatherGrad" or len(gg.input) < 3 or \
            gg.input[1] != gather.input[1] or \
            int(node_attrs(gg).get("axis", 0)) != axis or \
            _single_reader(g, gg.output[0]) is not chain[-1]:
        return None
    return chain + [gg], gg.input[2]


def rnn_last_step(g: Rewrite) -> None:
    """``y[-1]`` (or ``y[:, -1]`` batch first) of a single-direction LSTM/GRU output is its
    HFinal: the forward reads HFinal instead of slicing HAll, and the gradient enters as
    dHFinal instead of a zero [S, B, H] dHAll with one step filled (GatherGrad), which the
    recurrence's backward then reads in full."""
    for rnn in g.nodes:
        if rnn.op_type not in _TRAINING or rnn.domain not in (*MS_DOMAINS, DOMAIN) or \
                g.taken(rnn) or node_attrs(rnn).get("direction", b"forward") not in \
                (b"forward", "forward"):
            continue
        found = _last_step_chain(g, rnn)
        if found is None:
            continue
        chain, gather, axis = found
        grads = [r for r in g.readers.get(rnn.output[0], [])
                 if r.op_type == _TRAINING[rnn.op_type]]
        new, drop = [], list(chain)
        y = gather.output[0]
        axes_f = f"{y}_hfinal_axes"
        new.append((gather, [_const_node(axes_f, [0]),
                             helper.make_node("Squeeze", [rnn.output[1], axes_f], [y],
                                              name=gather.name + "_hfinal")]))
        if grads:
            grad = grads[0]
            slot_all, slot_fin = _GRAD_SLOTS[grad.op_type]
            ins = list(grad.input) + [""] * (slot_fin + 1 - len(grad.input))
            back = _grad_chain(g, grad, ins[slot_all], gather, axis) \
                if len(grads) == 1 and ins[slot_all] and not ins[slot_fin] else None
            if back is None:
                continue
            bchain, dy = back
            dfin = f"{y}_dhfinal"
            axes_b = f"{dfin}_axes"
            ins[slot_all], ins[slot_fin] = "", dfin
            new_grad = helper.make_node(grad.op_type, ins, list(grad.output), domain=grad.domain,
                                        name=grad.name)
            new_grad.attribute.extend(grad.attribute)
            gg = bchain[-1]
            new.append((gg, [_const_node(axes_b, [0]),
                             helper.make_node("Unsqueeze", [dy, axes_b], [dfin],
                                              name=gg.name + "_hfinal")]))
            new.append((grad, [new_grad]))
            drop += bchain[:-1]
        if g.taken(*drop, *(old for old, _ in new)):
            continue
        for n in drop:
            g.replace[id(n)] = []
        for old, nodes in new:
            g.replace[id(old)] = nodes
        g.done.append(f"{rnn.op_type}: last step of HAll -> HFinal (gradient as dHFinal)")
