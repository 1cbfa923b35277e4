"""Rewrites of a training graph for execution on our kernels (ORTModule applies them to the
graph it runs; the training graph it saves and reports stays standard ONNX + ORT's ops).

Each pass keeps the results of the graph it rewrites (tests/graph/test_training_fusions.py
compares every rewrite with the unfused graph in float32 and float64):

- MaxPool 2x2 / stride 2 (unpadded, floor mode) whose Indices feed only MaxPoolGrad ->
  ``MaxPool2x2Train`` (Y and a 1-byte argmax code per window instead of int64 flat
  Indices) + ``MaxPool2x2TrainGrad`` (dY scattered by the code), in the private domain
  ``ortcpu_torch.training``: 8x less stash memory, and the dedicated 2x2 kernel instead of
  the generic windowed one (measured on [64, 32, 28, 28] at 1 thread: 1.8 vs 6.0 ms).
- A Gemm reading a 2-D Transpose reads the Transpose's input with its trans flag flipped,
  and a Gemm whose only reader is a 2-D Transpose computes the transposed product itself
  (``(op(A) op(B))^T = op(B)^T op(A)^T``). The gradient builder writes a Linear's backward
  as ``Gemm(dY, W^T, transB=1)`` and ``Transpose(Gemm(X, dY, transA=1))``: the first made
  the Gemm binding copy W^T contiguous every step, the second returned a transposed view as
  the weight gradient, which torch's AccumulateGrad then cloned.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper, numpy_helper

from .gradient import FORWARD_NODES_KEY

DOMAIN = "ortcpu_torch.training"
_ONNX = ("", "ai.onnx")


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    out = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = [d.dim_value for d in t.shape.dim]
    return out


def _value_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Static shapes of the graph's values: its value_info, completed by ONNX inference
    from the (static) input shapes of the captured signature."""
    from .shapes import infer_value_shapes

    shapes = _static_shapes(model)
    ins = {vi.name: tuple(shapes[vi.name]) for vi in model.graph.input if vi.name in shapes}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    inferred, _ = infer_value_shapes(model, ins, types)
    for name, dims in (inferred or {}).items():
        if dims is not None and all(isinstance(d, int) for d in dims):
            shapes.setdefault(name, list(dims))
    return shapes


def _is(node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in _ONNX


class _Rewrite:
    """One pass over a training graph: who produces and reads each value, and the
    replacements chosen so far (node -> the nodes that take its place, [] to drop it)."""

    def __init__(self, model: onnx.ModelProto, shapes: dict[str, list[int]]):
        self.model = model
        self.nodes = list(model.graph.node)  # one wrapper object per node: id() is stable
        self.shapes = shapes
        self.outputs = {o.name for o in model.graph.output}
        self.readers: dict[str, list] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        for n in self.nodes:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
            for o in n.output:
                self.producer[o] = n
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.opset = next((o.version for o in model.opset_import if o.domain in _ONNX), 0)
        self.replace: dict[int, list] = {}
        self.done: list[str] = []

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant (initializer or Constant node), else None."""
        t = self.initializers.get(name)
        p = self.producer.get(name)
        if t is None and p is not None and _is(p, "Constant") and \
                p.attribute and p.attribute[0].name == "value":
            t = p.attribute[0].t
        if t is None or t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            return None
        v = numpy_helper.to_array(t)
        return float(v.reshape(-1)[0]) if v.size == 1 else None

    def taken(self, *nodes) -> bool:
        return any(id(n) in self.replace for n in nodes)

    def only_reader(self, value: str, node) -> bool:
        """``node`` is the one consumer of ``value`` and ``value`` is no graph output."""
        r = self.readers.get(value, [])
        return len(r) == 1 and r[0] is node and value not in self.outputs

    def result(self) -> onnx.ModelProto:
        if not self.replace:
            return self.model
        meta = {p.key: p.value for p in self.model.metadata_props}
        n_fwd = int(meta.get(FORWARD_NODES_KEY, len(self.nodes)))
        new_nodes, new_fwd = [], 0
        for k, n in enumerate(self.nodes):
            part = self.replace.get(id(n), [n])
            new_nodes.extend(part)
            new_fwd += len(part) if k < n_fwd else 0
        out = onnx.ModelProto()
        out.CopyFrom(self.model)
        del out.graph.node[:]
        out.graph.node.extend(new_nodes)
        if FORWARD_NODES_KEY in meta:
            for p in out.metadata_props:
                if p.key == FORWARD_NODES_KEY:
                    p.value = str(new_fwd)
        if any(n.domain == DOMAIN for n in new_nodes) and \
                not any(o.domain == DOMAIN for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
        return out


# ---- MaxPool 2x2 ---------------------------------------------------------------------------


def _is_2x2(node, shape) -> bool:
    a = _attrs(node)
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    return (shape is not None and len(shape) == 4 and list(a.get("kernel_shape", [])) == [2, 2]
            and list(a.get("strides", [1, 1])) == [2, 2]
            and list(a.get("pads", [0, 0, 0, 0])) == [0, 0, 0, 0]
            and list(a.get("dilations", [1, 1])) == [1, 1] and not a.get("ceil_mode", 0)
            and not a.get("storage_order", 0) and auto_pad in ("NOTSET", "VALID")
            and shape[2] >= 2 and shape[3] >= 2)


def _maxpool_2x2(g: _Rewrite) -> None:
    for n in g.nodes:
        if not _is(n, "MaxPool") or len(n.output) < 2 or not n.output[1] or \
                n.output[1] in g.outputs:
            continue
        grads = g.readers.get(n.output[1], [])
        if not grads or any(r.op_type != "MaxPoolGrad" or list(r.input).index(n.output[1]) != 1
                            for r in grads):
            continue
        x_shape = g.shapes.get(n.input[0])
        if not _is_2x2(n, x_shape):
            continue
        code = n.output[1] + "_code2x2"
        g.replace[id(n)] = [helper.make_node("MaxPool2x2Train", [n.input[0]],
                                             [n.output[0], code], domain=DOMAIN,
                                             name=n.name + "_2x2")]
        for r in grads:
            g.replace[id(r)] = [helper.make_node("MaxPool2x2TrainGrad", [r.input[0], code],
                                                 list(r.output), domain=DOMAIN,
                                                 name=r.name + "_2x2", x_shape=x_shape)]
        g.done.append("MaxPool 2x2 + MaxPoolGrad -> MaxPool2x2Train + MaxPool2x2TrainGrad")


# ---- Gemm and 2-D transposes ---------------------------------------------------------------


def _transpose_2d(node) -> bool:
    return node is not None and _is(node, "Transpose") and \
        list(_attrs(node).get("perm", [])) == [1, 0]


def _gemm(inputs, outputs, name, trans_a, trans_b, a) -> onnx.NodeProto:
    kw = {k: a[k] for k in ("alpha", "beta") if k in a}
    return helper.make_node("Gemm", list(inputs), list(outputs), name=name,
                            transA=int(trans_a), transB=int(trans_b), **kw)


def _gemm_reads_transpose(g: _Rewrite) -> None:
    for n in g.nodes:
        if not _is(n, "Gemm"):
            continue
        a = _attrs(n)
        ins, flags = list(n.input), [int(a.get("transA", 0)), int(a.get("transB", 0))]
        changed = False
        for slot in (0, 1):
            p = g.producer.get(ins[slot])
            if _transpose_2d(p):
                ins[slot], flags[slot], changed = p.input[0], 1 - flags[slot], True
        if changed:
            g.replace[id(n)] = [_gemm(ins, n.output, n.name, *flags, a)]
            g.done.append("Gemm(Transpose(W)) -> Gemm(W) with the trans flag flipped")


def _gemm_transposed_output(g: _Rewrite) -> None:
    for t in g.nodes:
        if not _transpose_2d(t):
            continue
        p = g.producer.get(t.input[0])
        if p is None or not _is(p, "Gemm") or (len(p.input) > 2 and p.input[2]) or \
                not g.only_reader(p.output[0], t) or g.taken(p, t):
            continue
        a = _attrs(p)
        ta, tb = int(a.get("transA", 0)), int(a.get("transB", 0))
        g.replace[id(p)] = [_gemm([p.input[1], p.input[0]], t.output, p.name, 1 - tb, 1 - ta,
                                  {k: v for k, v in a.items() if k == "alpha"})]
        g.replace[id(t)] = []
        g.done.append("Transpose(Gemm(A, B)) -> Gemm(B, A) with the trans flags flipped")


# ---- masked, scaled softmax ----------------------------------------------------------------


def _double(v: float) -> onnx.TensorProto:
    """A float64 scalar tensor attribute (a FLOAT attribute would round a float64
    graph's constant to float32)."""
    return helper.make_tensor("value", onnx.TensorProto.DOUBLE, [], [v])


def _mask_fits(mask_shape, x_shape) -> bool:
    """A bool mask the fused kernel reads as [mask_rows, S]: right-aligned against x, its
    last dim S, the one before T or 1, every other dim 1."""
    if mask_shape is None or x_shape is None or len(mask_shape) > len(x_shape) or \
            not mask_shape or mask_shape[-1] != x_shape[-1]:
        return False
    if len(mask_shape) >= 2 and mask_shape[-2] not in (1, x_shape[-2]):
        return False
    return all(d == 1 for d in mask_shape[:-2])


def _scores_where(g: _Rewrite, w):
    """(scores, fill, masked_when) of ``Where(mask, fill, scores)`` (masked_when 1) or
    ``Where(mask, scores, fill)`` (0) with a constant fill, else None."""
    fa, fb = g.scalar(w.input[1]), g.scalar(w.input[2])
    if fa is not None and fb is None:
        return w.input[2], fa, 1
    if fb is not None and fa is None:
        return w.input[1], fb, 0
    return None


def _masked_softmax(g: _Rewrite) -> None:
    if g.opset < 13:  # older Softmax flattens to 2-D around the axis
        return
    for sm in g.nodes:
        if not _is(sm, "Softmax") or g.taken(sm):
            continue
        shape = g.shapes.get(sm.output[0])
        w = g.producer.get(sm.input[0])
        if shape is None or int(_attrs(sm).get("axis", -1)) not in (-1, len(shape) - 1) or \
                w is None or not _is(w, "Where") or not g.only_reader(w.output[0], sm):
            continue
        found = _scores_where(g, w)
        mask = w.input[0]
        if found is None or not _mask_fits(g.shapes.get(mask), shape):
            continue
        scores, fill, masked_when = found
        scale, mul = 1.0, g.producer.get(scores)
        if mul is not None and _is(mul, "Mul") and g.only_reader(scores, w):
            for k in (0, 1):
                c = g.scalar(mul.input[1 - k])
                if c is not None and g.shapes.get(mul.input[k]) == shape:
                    scale, scores = c, mul.input[k]
                    break
            else:
                mul = None
        else:
            mul = None
        if g.shapes.get(scores) != shape or g.taken(w, *([mul] if mul else [])):
            continue
        attrs = {"scale": _double(scale), "fill": _double(fill), "masked_when": masked_when}
        g.replace[id(sm)] = [helper.make_node("MaskedScaledSoftmax", [scores, mask],
                                              list(sm.output), domain=DOMAIN,
                                              name=sm.name + "_masked", **attrs)]
        g.replace[id(w)] = []
        if mul is not None:
            g.replace[id(mul)] = []
        g.done.append("[Mul +] Where + Softmax -> MaskedScaledSoftmax")
        for sg in g.readers.get(sm.output[0], []):
            _masked_softmax_grad(g, sg, sm.output[0], mask, scale, masked_when)


def _masked_softmax_grad(g: _Rewrite, sg, p: str, mask: str, scale: float,
                         masked_when: int) -> None:
    """``Mul(Where(mask, 0, SoftmaxGrad_13(dP, P)), scale)`` (the Mul only when the forward
    scaled) -> MaskedScaledSoftmaxGrad(dP, P, mask)."""
    if sg.op_type != "SoftmaxGrad_13" or len(sg.input) < 2 or sg.input[1] != p or \
            g.taken(sg):
        return
    d = sg.output[0]
    readers = g.readers.get(d, [])
    w = readers[0] if len(readers) == 1 else None
    if w is None or not _is(w, "Where") or w.input[0] != mask or not g.only_reader(d, w):
        return
    if list(w.input[1:]) != ([w.input[1], d] if masked_when else [d, w.input[2]]) or \
            g.scalar(w.input[1 if masked_when else 2]) != 0.0:
        return
    last, drop = w, [w]
    if scale != 1.0:
        readers = g.readers.get(w.output[0], [])
        mul = readers[0] if len(readers) == 1 else None
        if mul is None or not _is(mul, "Mul") or not g.only_reader(w.output[0], mul) or \
                g.scalar(mul.input[1] if mul.input[0] == w.output[0] else mul.input[0]) \
                != scale:
            return
        last, drop = mul, [w, mul]
    if g.taken(*drop):
        return
    g.replace[id(sg)] = [helper.make_node(
        "MaskedScaledSoftmaxGrad", [sg.input[0], p, mask], [last.output[0]], domain=DOMAIN,
        name=sg.name + "_masked", scale=_double(scale), masked_when=masked_when)]
    for n in drop:
        g.replace[id(n)] = []
    g.done.append("SoftmaxGrad_13 + Where [+ Mul] -> MaskedScaledSoftmaxGrad")


# ---- LSTM in torch's gate order ------------------------------------------------------------

_MS = ("com.microsoft",)
_LSTM_ATTRS = {"hidden_size", "direction"}


def _ints(g: _Rewrite, name: str) -> list[int] | None:
    t = g.initializers.get(name)
    p = g.producer.get(name)
    if t is None and p is not None and _is(p, "Constant") and p.attribute and \
            p.attribute[0].name == "value":
        t = p.attribute[0].t
    return None if t is None else [int(v) for v in numpy_helper.to_array(t).reshape(-1)]


def _equal_split(g: _Rewrite, node, parts: int) -> bool:
    """``node`` is a Split on axis 0 into ``parts`` equal pieces."""
    if not _is(node, "Split") or len(node.output) != parts or \
            int(_attrs(node).get("axis", 0)) != 0 or "split" in _attrs(node):
        return False
    if len(node.input) < 2 or not node.input[1]:
        return True
    sizes = _ints(g, node.input[1])
    return sizes is not None and len(set(sizes)) == 1 and len(sizes) == parts


def _concat0(node, inputs: list) -> bool:
    return _is(node, "Concat") and int(_attrs(node).get("axis", 0)) == 0 and \
        list(node.input) == inputs


def _from_torch_order(g: _Rewrite, value: str, used: list):
    """The torch-order tensor ``value`` = Concat(Split(src, 4)[0, 3, 1, 2]) reorders."""
    c = g.producer.get(value)
    s = g.producer.get(c.input[0]) if c is not None and c.input else None
    if s is None or not _equal_split(g, s, 4) or \
            not _concat0(c, [s.output[k] for k in (0, 3, 1, 2)]) or \
            not all(g.only_reader(o, c) for o in s.output):
        return None
    used += [c, s]
    return s.input[0]


def _unsqueezed(g: _Rewrite, value: str, readers: set, used: list):
    """``value`` = Unsqueeze(v, axes [0]) read only by ``readers``: v."""
    u = g.producer.get(value)
    if u is None or not _is(u, "Unsqueeze") or value in g.outputs or \
            not {id(r) for r in g.readers.get(value, [])} <= readers:
        return None
    axes = _ints(g, u.input[1]) if len(u.input) > 1 else list(_attrs(u).get("axes", []))
    if axes != [0] or not g.only_reader(u.input[0], u):
        return None
    used.append(u)
    return u.input[0]


def _to_torch_order(g: _Rewrite, value: str, used: list) -> str | None:
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


def _reshaped(g: _Rewrite, value: str, used: list) -> str | None:
    readers = g.readers.get(value, [])
    r = readers[0] if len(readers) == 1 else None
    if r is None or value in g.outputs or not _is(r, "Reshape"):
        return None
    used.append(r)
    return r.output[0]


def _lstm_torch_gates(g: _Rewrite) -> None:
    for lstm in g.nodes:
        if lstm.op_type != "LSTMTraining" or lstm.domain not in _MS or g.taken(lstm):
            continue
        a = _attrs(lstm)
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
            if c is None or not _is(c, "Concat") or len(c.input) != 2 or \
                    int(_attrs(c).get("axis", 0)) != 0:
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


# ---- bias + GELU ---------------------------------------------------------------------------

_GELUS = {"Gelu": ("BiasGelu", "BiasGeluGrad_dX", "GeluGrad", 0),
          "FastGelu": ("FastGelu", "BiasFastGeluGrad_dX", "FastGeluGrad", 1)}


def _bias_gelu(g: _Rewrite) -> None:
    for gelu in g.nodes:
        spec = _GELUS.get(gelu.op_type)
        if spec is None or gelu.domain not in _MS or len(gelu.input) != 1 or g.taken(gelu):
            continue
        fused_fwd, fused_bwd, grad_op, approximate = spec
        z = gelu.input[0]
        add = g.producer.get(z)
        if add is None or not _is(add, "Add") or z in g.outputs or g.taken(add):
            continue
        shape = g.shapes.get(z)
        if shape is None or not shape:
            continue
        for k in (0, 1):
            m, b = add.input[k], add.input[1 - k]
            # with b [N] and m [..., N], Add(m, b) has m's shape
            if g.shapes.get(b) == [shape[-1]] and _last_dim(g, m) == shape[-1]:
                break
        else:
            continue
        grads = [r for r in g.readers.get(z, []) if r is not gelu]
        if any(r.op_type != grad_op or r.domain not in _MS or list(r.input)[1:] != [z]
               for r in grads) or g.taken(*grads):
            continue
        g.replace[id(add)] = []
        g.replace[id(gelu)] = [helper.make_node(fused_fwd, [m, b], list(gelu.output),
                                                domain="com.microsoft",
                                                name=gelu.name + "_bias")]
        g.done.append(f"Add + {gelu.op_type} -> {fused_fwd}")
        for r in grads:
            dz = r.output[0]
            sums = [s for s in g.readers.get(dz, []) if _is(s, "ReduceSum") and
                    not g.taken(s) and _sums_to_last_axis(g, s, len(shape))]
            if sums:
                g.replace[id(sums[0])] = []
                g.replace[id(r)] = [helper.make_node(
                    "BiasGeluGradWithBiasGrad", [r.input[0], m, b], [dz, sums[0].output[0]],
                    domain=DOMAIN, name=r.name + "_bias", approximate=approximate)]
                g.done.append(f"{grad_op} + ReduceSum -> BiasGeluGradWithBiasGrad")
            else:
                g.replace[id(r)] = [helper.make_node(fused_bwd, [r.input[0], m, b], [dz],
                                                     domain="com.microsoft",
                                                     name=r.name + "_bias")]
                g.done.append(f"{grad_op} -> {fused_bwd}")


def _last_dim(g: _Rewrite, v: str) -> int | None:
    """The last dim of ``v``: from its shape, else from the weight of the MatMul / Gemm
    computing it (ONNX inference can lose a shape behind an op it has no schema for)."""
    shape = g.shapes.get(v)
    if shape:
        return shape[-1]
    p = g.producer.get(v)
    if p is None or not (_is(p, "MatMul") or _is(p, "Gemm")) or len(p.input) < 2:
        return None
    w = g.shapes.get(p.input[1])
    t = g.producer.get(p.input[1])
    if w is None and _transpose_2d(t) and g.shapes.get(t.input[0]):
        w = g.shapes[t.input[0]][::-1]
    if w is None or len(w) != 2:
        return None
    return w[0] if _is(p, "Gemm") and _attrs(p).get("transB", 0) else w[1]


def _sums_to_last_axis(g: _Rewrite, s, rank: int) -> bool:
    """``s`` is ReduceSum over every axis but the last, keepdims 0."""
    a = _attrs(s)
    axes = _ints(g, s.input[1]) if len(s.input) > 1 and s.input[1] else a.get("axes")
    if axes is None or a.get("keepdims", 1) != 0 or a.get("noop_with_empty_axes", 0):
        return False
    return sorted(x % rank for x in axes) == list(range(rank - 1))


# ---- Split into views --------------------------------------------------------------------


def _split_views(g: _Rewrite) -> None:
    for sp in g.nodes:
        if not _is(sp, "Split") or g.taken(sp) or g.opset < 13:
            continue
        shape = g.shapes.get(sp.input[0])
        if shape is None or not shape:
            continue
        a = _attrs(sp)
        axis = int(a.get("axis", 0)) % len(shape)
        sizes = _ints(g, sp.input[1]) if len(sp.input) > 1 and sp.input[1] else None
        n = len(sp.output)
        if sizes is None and "num_outputs" not in a and shape[axis] % n == 0:
            sizes = [shape[axis] // n] * n
        if sizes is None or len(sizes) != n or sum(sizes) != shape[axis] or \
                any(not o or o in g.outputs or not g.readers.get(o) or
                    any(not _is(r, "Reshape") or r.input[0] != o for r in g.readers[o])
                    for o in sp.output):
            continue
        g.replace[id(sp)] = [helper.make_node("SplitView", [sp.input[0]], list(sp.output),
                                              domain=DOMAIN, name=sp.name + "_views",
                                              axis=axis, sizes=sizes)]
        g.done.append("Split (read by Reshapes) -> SplitView")


PASSES: list[Callable[[_Rewrite], None]] = [_maxpool_2x2, _gemm_reads_transpose,
                                            _gemm_transposed_output, _masked_softmax,
                                            _lstm_torch_gates, _bias_gelu, _split_views]


def fuse_training_graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A rewritten copy of ``model`` (or ``model`` itself when nothing applies) and a
    description of each rewrite."""
    done = []
    shapes = _value_shapes(model)  # the passes keep every value they do not remove
    for rewrite in PASSES:
        g = _Rewrite(model, shapes)
        rewrite(g)
        model = g.result()
        done += g.done
    return model, done
