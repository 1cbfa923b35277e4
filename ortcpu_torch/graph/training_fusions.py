"""Rewrites of a training graph for execution on our kernels (ORTModule applies them to the
graph it runs; the training graph it saves and reports stays standard ONNX + ORT's ops).

The passes share ``training_rewrite.Rewrite`` (the LSTM pass is ``training_fusions_rnn``,
the batched products on attention heads ``training_fusions_attention``).
Each pass keeps the results of the graph it rewrites (tests/graph/test_training_fusions.py
compares every rewrite with the unfused graph in float32 and float64):

- MaxPool 2x2 / stride 2 (unpadded, floor mode) whose Indices feed only MaxPoolGrad ->
  ``MaxPool2x2Train`` (Y and a 1-byte argmax code per window instead of int64 flat
  Indices) + ``MaxPool2x2TrainGrad`` (dY scattered by the code), in the private domain
  ``ortcpu_torch.training``: 8x less stash memory, and the dedicated 2x2 kernel instead of
  the generic windowed one (measured on [64, 32, 28, 28] at 1 thread: 1.8 vs 6.0 ms).
- Opt-in (``OPTIONAL_PASSES``, not run by default): Gelu / FastGelu feeding only such a
  pool, its GeluGrad reading only the pool's gradient: the gradient pair ->
  ``GeluMaxPool2x2TrainGrad`` (the slope evaluated at the maxima only) and, on small maps,
  the forward pair -> ``GeluMaxPool2x2Train`` (the GELU output not stored). Measured
  against the unfused pair (Gelu + MaxPool2x2Train, MaxPool2x2TrainGrad + GeluGrad) with
  the current kernels (session 11, AMD EPYC, 1 thread, CPU time, AVX-512 and AVX2 builds
  alike), the fused kernels are slower everywhere: forward 3.4x the pair's time on
  [64, 32, 8, 8], 1.1-1.9x on [64, 64, 4, 4]; backward 1.1-1.3x on 4x4 to 28x28 maps. A
  whole step ran 1.10x faster without the pass on digits and 1.04x on the MNIST CNN.
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
from onnx import helper

from . import training_fusions_attention as attention
from .training_fusions_rnn import lstm_torch_gates, rnn_last_step
from .training_rewrite import (
    DOMAIN,
    MS_DOMAINS,
    Rewrite,
    const_ints,
    is_onnx,
    node_attrs,
    value_shapes,
)

__all__ = ["DOMAIN", "OPTIONAL_PASSES", "PASSES", "fuse_training_graph"]

# ---- MaxPool 2x2 ---------------------------------------------------------------------------


def _is_2x2(node, shape) -> bool:
    a = node_attrs(node)
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    return (shape is not None and len(shape) == 4 and list(a.get("kernel_shape", [])) == [2, 2]
            and list(a.get("strides", [1, 1])) == [2, 2]
            and list(a.get("pads", [0, 0, 0, 0])) == [0, 0, 0, 0]
            and list(a.get("dilations", [1, 1])) == [1, 1] and not a.get("ceil_mode", 0)
            and not a.get("storage_order", 0) and auto_pad in ("NOTSET", "VALID")
            and shape[2] >= 2 and shape[3] >= 2)


def _maxpool_2x2(g: Rewrite) -> None:
    for n in g.nodes:
        if not is_onnx(n, "MaxPool") or len(n.output) < 2 or not n.output[1] or \
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


_GELU_GRADS = {"Gelu": ("GeluGrad", 0), "FastGelu": ("FastGeluGrad", 1)}


#: widest input map whose Gelu + 2x2 pool forward runs fused when the pass is enabled (set
#: from an earlier session's AVX2 measurement, since overtaken: see the module docstring)
_GELU_POOL_FORWARD_MAX_W = 16


def _gelu_maxpool_2x2(g: Rewrite) -> None:
    """Gelu -> MaxPool2x2Train (the GELU output read by nothing else) and, per code reader,
    MaxPool2x2TrainGrad -> GeluGrad(., X) -> GeluMaxPool2x2TrainGrad (the slope evaluated
    at the windows' maxima only: one element in four, no scattered intermediate) and, on
    maps up to ``_GELU_POOL_FORWARD_MAX_W`` wide, the forward pair -> GeluMaxPool2x2Train
    (the GELU output never stored)."""
    for mp in g.nodes:
        if mp.op_type != "MaxPool2x2Train" or mp.domain != DOMAIN or g.taken(mp):
            continue
        gelu = g.producer.get(mp.input[0])
        spec = _GELU_GRADS.get(gelu.op_type) if gelu is not None else None
        if spec is None or gelu.domain not in MS_DOMAINS or g.taken(gelu) or \
                len([i for i in gelu.input if i]) != 1 or \
                not g.only_reader(gelu.output[0], mp):
            continue
        x, (grad_op, approximate) = gelu.input[0], spec
        pool_grads = g.readers.get(mp.output[1], [])
        pairs = []
        for r in pool_grads:
            readers = g.readers.get(r.output[0], [])
            gg = readers[0] if len(readers) == 1 else None
            if r.op_type != "MaxPool2x2TrainGrad" or gg is None or gg.op_type != grad_op or \
                    gg.domain not in MS_DOMAINS or list(gg.input) != [r.output[0], x] or \
                    r.output[0] in g.outputs or g.taken(r, gg):
                break
            pairs.append((r, gg))
        if not pairs or len(pairs) != len(pool_grads):
            continue
        shape = g.shapes.get(x)
        if shape is not None and shape[-1] <= _GELU_POOL_FORWARD_MAX_W:
            g.replace[id(gelu)] = []
            g.replace[id(mp)] = [helper.make_node("GeluMaxPool2x2Train", [x], list(mp.output),
                                                  domain=DOMAIN, name=mp.name + "_gelu",
                                                  approximate=approximate)]
        for r, gg in pairs:
            g.replace[id(r)] = []
            g.replace[id(gg)] = [helper.make_node(
                "GeluMaxPool2x2TrainGrad", [r.input[0], x, mp.output[1]], list(gg.output),
                domain=DOMAIN, name=gg.name + "_pool", approximate=approximate)]
        g.done.append(f"MaxPool2x2TrainGrad + {grad_op} -> GeluMaxPool2x2TrainGrad" +
                      (f"; {gelu.op_type} + MaxPool2x2Train -> GeluMaxPool2x2Train"
                       if g.taken(mp) else ""))


# ---- Gemm and 2-D transposes ---------------------------------------------------------------


def _transpose_2d(node) -> bool:
    return node is not None and is_onnx(node, "Transpose") and \
        list(node_attrs(node).get("perm", [])) == [1, 0]


def _gemm(inputs, outputs, name, trans_a, trans_b, a) -> onnx.NodeProto:
    kw = {k: a[k] for k in ("alpha", "beta") if k in a}
    return helper.make_node("Gemm", list(inputs), list(outputs), name=name,
                            transA=int(trans_a), transB=int(trans_b), **kw)


def _gemm_reads_transpose(g: Rewrite) -> None:
    for n in g.nodes:
        if not is_onnx(n, "Gemm"):
            continue
        a = node_attrs(n)
        ins, flags = list(n.input), [int(a.get("transA", 0)), int(a.get("transB", 0))]
        changed = False
        for slot in (0, 1):
            p = g.producer.get(ins[slot])
            if _transpose_2d(p):
                ins[slot], flags[slot], changed = p.input[0], 1 - flags[slot], True
        if changed:
            g.replace[id(n)] = [_gemm(ins, n.output, n.name, *flags, a)]
            g.done.append("Gemm(Transpose(W)) -> Gemm(W) with the trans flag flipped")


def _gemm_transposed_output(g: Rewrite) -> None:
    for t in g.nodes:
        if not _transpose_2d(t):
            continue
        p = g.producer.get(t.input[0])
        if p is None or not is_onnx(p, "Gemm") or (len(p.input) > 2 and p.input[2]) or \
                not g.only_reader(p.output[0], t) or g.taken(p, t):
            continue
        a = node_attrs(p)
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


def _scores_where(g: Rewrite, w):
    """(scores, fill, masked_when) of ``Where(mask, fill, scores)`` (masked_when 1) or
    ``Where(mask, scores, fill)`` (0) with a constant fill, else None."""
    fa, fb = g.scalar(w.input[1]), g.scalar(w.input[2])
    if fa is not None and fb is None:
        return w.input[2], fa, 1
    if fb is not None and fa is None:
        return w.input[1], fb, 0
    return None


def _masked_softmax(g: Rewrite) -> None:
    if g.opset < 13:  # older Softmax flattens to 2-D around the axis
        return
    for sm in g.nodes:
        if not is_onnx(sm, "Softmax") or g.taken(sm):
            continue
        shape = g.shapes.get(sm.output[0])
        w = g.producer.get(sm.input[0])
        if shape is None or int(node_attrs(sm).get("axis", -1)) not in (-1, len(shape) - 1) or \
                w is None or not is_onnx(w, "Where") or not g.only_reader(w.output[0], sm):
            continue
        found = _scores_where(g, w)
        mask = w.input[0]
        if found is None or not _mask_fits(g.shapes.get(mask), shape):
            continue
        scores, fill, masked_when = found
        scale, mul = 1.0, g.producer.get(scores)
        if mul is not None and is_onnx(mul, "Mul") and g.only_reader(scores, w):
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


def _masked_softmax_grad(g: Rewrite, sg, p: str, mask: str, scale: float,
                         masked_when: int) -> None:
    """``Mul(Where(mask, 0, SoftmaxGrad_13(dP, P)), scale)`` (the Mul only when the forward
    scaled) -> MaskedScaledSoftmaxGrad(dP, P, mask)."""
    if sg.op_type != "SoftmaxGrad_13" or len(sg.input) < 2 or sg.input[1] != p or \
            g.taken(sg):
        return
    d = sg.output[0]
    readers = g.readers.get(d, [])
    w = readers[0] if len(readers) == 1 else None
    if w is None or not is_onnx(w, "Where") or w.input[0] != mask or not g.only_reader(d, w):
        return
    if list(w.input[1:]) != ([w.input[1], d] if masked_when else [d, w.input[2]]) or \
            g.scalar(w.input[1 if masked_when else 2]) != 0.0:
        return
    last, drop = w, [w]
    if scale != 1.0:
        readers = g.readers.get(w.output[0], [])
        mul = readers[0] if len(readers) == 1 else None
        if mul is None or not is_onnx(mul, "Mul") or not g.only_reader(w.output[0], mul) or \
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


# ---- bias + GELU ---------------------------------------------------------------------------

_GELUS = {"Gelu": ("BiasGelu", "BiasGeluGrad_dX", "GeluGrad", 0),
          "FastGelu": ("FastGelu", "BiasFastGeluGrad_dX", "FastGeluGrad", 1)}


def _bias_gelu(g: Rewrite) -> None:
    for gelu in g.nodes:
        spec = _GELUS.get(gelu.op_type)
        if spec is None or gelu.domain not in MS_DOMAINS or len(gelu.input) != 1 or g.taken(gelu):
            continue
        fused_fwd, fused_bwd, grad_op, approximate = spec
        z = gelu.input[0]
        add = g.producer.get(z)
        if add is None or not is_onnx(add, "Add") or z in g.outputs or g.taken(add):
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
        if any(r.op_type != grad_op or r.domain not in MS_DOMAINS or list(r.input)[1:] != [z]
               for r in grads) or g.taken(*grads):
            continue
        g.replace[id(add)] = []
        g.replace[id(gelu)] = [helper.make_node(fused_fwd, [m, b], list(gelu.output),
                                                domain="com.microsoft",
                                                name=gelu.name + "_bias")]
        g.done.append(f"Add + {gelu.op_type} -> {fused_fwd}")
        for r in grads:
            dz = r.output[0]
            sums = [s for s in g.readers.get(dz, []) if is_onnx(s, "ReduceSum") and
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


def _last_dim(g: Rewrite, v: str) -> int | None:
    """The last dim of ``v``: from its shape, else from the weight of the MatMul / Gemm
    computing it (ONNX inference can lose a shape behind an op it has no schema for)."""
    shape = g.shapes.get(v)
    if shape:
        return shape[-1]
    p = g.producer.get(v)
    if p is None or not (is_onnx(p, "MatMul") or is_onnx(p, "Gemm")) or len(p.input) < 2:
        return None
    w = g.shapes.get(p.input[1])
    t = g.producer.get(p.input[1])
    if w is None and _transpose_2d(t) and g.shapes.get(t.input[0]):
        w = g.shapes[t.input[0]][::-1]
    if w is None or len(w) != 2:
        return None
    return w[0] if is_onnx(p, "Gemm") and node_attrs(p).get("transB", 0) else w[1]


def _sums_to_last_axis(g: Rewrite, s, rank: int) -> bool:
    """``s`` is ReduceSum over every axis but the last, keepdims 0."""
    a = node_attrs(s)
    axes = const_ints(g, s.input[1]) if len(s.input) > 1 and s.input[1] else a.get("axes")
    if axes is None or a.get("keepdims", 1) != 0 or a.get("noop_with_empty_axes", 0):
        return False
    return sorted(x % rank for x in axes) == list(range(rank - 1))


# ---- Split into views --------------------------------------------------------------------


def _split_views(g: Rewrite) -> None:
    for sp in g.nodes:
        if not is_onnx(sp, "Split") or g.taken(sp) or g.opset < 13:
            continue
        shape = g.shapes.get(sp.input[0])
        if shape is None or not shape:
            continue
        a = node_attrs(sp)
        axis = int(a.get("axis", 0)) % len(shape)
        sizes = const_ints(g, sp.input[1]) if len(sp.input) > 1 and sp.input[1] else None
        n = len(sp.output)
        if sizes is None and "num_outputs" not in a and shape[axis] % n == 0:
            sizes = [shape[axis] // n] * n
        if sizes is None or len(sizes) != n or sum(sizes) != shape[axis] or \
                any(not o or o in g.outputs or not g.readers.get(o) or
                    any(not is_onnx(r, "Reshape") or r.input[0] != o for r in g.readers[o])
                    for o in sp.output):
            continue
        g.replace[id(sp)] = [helper.make_node("SplitView", [sp.input[0]], list(sp.output),
                                              domain=DOMAIN, name=sp.name + "_views",
                                              axis=axis, sizes=sizes)]
        g.done.append("Split (read by Reshapes) -> SplitView")


PASSES: list[Callable[[Rewrite], None]] = [_maxpool_2x2, _gemm_reads_transpose,
                                            _gemm_transposed_output, _masked_softmax,
                                            lstm_torch_gates, rnn_last_step, _bias_gelu,
                                            _split_views,
                                            *attention.PASSES]
#: correct but measured slower than the unfused graph (module docstring); a caller may
#: insert one into ``PASSES`` (after ``_maxpool_2x2``, whose nodes it rewrites)
OPTIONAL_PASSES: dict[str, Callable[[Rewrite], None]] = {"gelu_maxpool_2x2": _gelu_maxpool_2x2}


def fuse_training_graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A rewritten copy of ``model`` (or ``model`` itself when nothing applies) and a
    description of each rewrite."""
    done = []
    shapes = value_shapes(model)  # the passes keep every value they do not remove
    for rewrite in PASSES:
        g = Rewrite(model, shapes)
        rewrite(g)
        model = g.result()
        done += g.done
    return model, done
