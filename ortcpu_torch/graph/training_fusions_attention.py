"""The attention passes of ``training_fusions``: batched products on the heads' views.

torch.export writes ``q @ k.transpose(-2, -1)`` on ``[B, H, T, D]`` heads as
Expand -> Reshape ``[B·H, T, D]`` -> 3-D MatMul -> Reshape ``[B, H, T, T]``, and the
gradient builder mirrors that chain. The head-split views are not contiguous, so each
3-D Reshape copied them (forward and backward). Then the merged heads
(``y.transpose(1, 2).reshape(B, T, C)``) and the qkv gradient (three such merges and a
Concat along the last axis) were copied once more each.

- ``batched_matmul_4d``: a MatMul of two 3-D Reshapes (optionally transposed) of 4-D
  values, read by one Reshape back to 4-D, becomes one 4-D MatMul of the 4-D values
  (the executor's batched MatMul reads strided views in place); standard ONNX.
- ``merge_heads``: ``Reshape(Transpose(MatMul(a, b), [0, 2, 1, 3]), [B, T, H·D])`` (the
  product optionally transposed in its last two dims first), alone or as the inputs of a
  last-axis Concat, becomes ``MatMulMergeHeads`` (private domain): every product written
  by the batched GEMM straight into its slice of the merged ``[B, T, k·H·D]`` output.
- ``dead_views``: view-like nodes nothing reads any more are dropped.
"""

from __future__ import annotations

from onnx import helper

from .training_rewrite import DOMAIN, Rewrite, is_onnx, node_attrs


def _perm(node) -> list[int]:
    return list(node_attrs(node).get("perm", []))


def _through_views(g: Rewrite, v: str) -> str:
    """``v`` with Identity and same-shape Expand producers looked through."""
    while True:
        p = g.producer.get(v)
        if p is not None and is_onnx(p, "Identity"):
            v = p.input[0]
        elif p is not None and is_onnx(p, "Expand") and g.shapes.get(p.input[0]) is not None \
                and g.shapes.get(p.input[0]) == g.shapes.get(v):
            v = p.input[0]
        else:
            return v


def _batch_source(g: Rewrite, v: str):
    """(x, transposed) when the 3-D value ``v`` is ``Reshape(x, [B·H, r, c])`` of a 4-D
    ``x`` ``[B, H, r, c]`` (``transposed``: v is that reshape's Transpose [0, 2, 1])."""
    p = g.producer.get(v)
    if p is None:
        return None
    if is_onnx(p, "Transpose") and _perm(p) == [0, 2, 1]:
        src = _batch_source(g, p.input[0])
        return None if src is None else (src[0], not src[1])
    if not is_onnx(p, "Reshape"):
        return None
    sx, sv = g.shapes.get(p.input[0]), g.shapes.get(v)
    if sx is None or sv is None or len(sx) != 4 or len(sv) != 3 or \
            sx[0] * sx[1] != sv[0] or list(sx[2:]) != list(sv[1:]):
        return None
    return _through_views(g, p.input[0]), False


def _swapped(shape) -> list[int]:
    return [*shape[:-2], shape[-1], shape[-2]]


def batched_matmul_4d(g: Rewrite) -> None:
    made: dict[str, str] = {}  # 4-D value -> its Transpose [0, 1, 3, 2] made by this pass
    for mm in g.nodes:
        if not is_onnx(mm, "MatMul") or g.taken(mm) or mm.output[0] in g.outputs:
            continue
        srcs = [_batch_source(g, i) for i in mm.input]
        readers = g.readers.get(mm.output[0], [])
        if None in srcs or len(readers) != 1 or not is_onnx(readers[0], "Reshape") or \
                g.taken(readers[0]):
            continue
        (xa, ta), (xb, tb) = srcs
        ea, eb = g.shapes[xa], g.shapes[xb]
        ea, eb = (_swapped(ea) if ta else list(ea)), (_swapped(eb) if tb else list(eb))
        out = readers[0].output[0]
        if ea[:2] != eb[:2] or ea[3] != eb[2] or \
                g.shapes.get(out) != [*ea[:2], ea[2], eb[3]]:
            continue
        new, ins = [], []
        for x, t, e in ((xa, ta, ea), (xb, tb, eb)):
            if t:
                if x not in made:
                    made[x] = f"{x}_swap_last2"
                    g.shapes[made[x]] = e
                    new.append(helper.make_node("Transpose", [x], [made[x]],
                                                name=made[x], perm=[0, 1, 3, 2]))
                x = made[x]
            ins.append(x)
        g.replace[id(mm)] = [*new, helper.make_node("MatMul", ins, [out], name=mm.name + "_4d")]
        g.replace[id(readers[0])] = []
        g.done.append("Reshape 3-D + MatMul + Reshape 4-D -> 4-D MatMul on the views")


def _heads_product(g: Rewrite, r):
    """(MatMul, transposed, nodes of the chain) when the Reshape ``r`` merges the heads of a
    4-D MatMul product: ``Reshape(Transpose(P, [0, 2, 1, 3]), [B, T, H·D])`` with ``P`` the
    product ``[B, H, T, D]`` or its Transpose [0, 1, 3, 2] (through Identity nodes), every
    link read only by the next."""
    if not is_onnx(r, "Reshape") or g.taken(r):
        return None
    chain, v = [r], r.input[0]
    p = g.producer.get(v)
    while p is not None and is_onnx(p, "Identity") and g.only_reader(v, chain[-1]):
        chain.append(p)
        v, p = p.input[0], g.producer.get(p.input[0])
    if p is None or not is_onnx(p, "Transpose") or _perm(p) != [0, 2, 1, 3] or \
            not g.only_reader(v, chain[-1]):
        return None
    chain.append(p)
    v, p = p.input[0], g.producer.get(p.input[0])
    transposed = p is not None and is_onnx(p, "Transpose") and _perm(p) == [0, 1, 3, 2]
    if transposed:
        if not g.only_reader(v, chain[-1]):
            return None
        chain.append(p)
        v, p = p.input[0], g.producer.get(p.input[0])
    if p is None or not is_onnx(p, "MatMul") or not g.only_reader(v, chain[-1]) or \
            g.taken(p, *chain):
        return None
    sa, sb, sp = (g.shapes.get(p.input[0]), g.shapes.get(p.input[1]), g.shapes.get(v))
    if sa is None or sb is None or sp is None or len(sa) != 4 or len(sb) != 4 or \
            sa[:2] != sb[:2] or len(sp) != 4:
        return None
    b, h, t, d = _swapped(sp) if transposed else sp
    if g.shapes.get(r.output[0]) != [b, t, h * d]:
        return None
    return p, transposed, chain, (b, t, h, d)


def _merge(g: Rewrite, found: list, out: str, name: str) -> None:
    inputs = [i for p, _, _, _ in found for i in p.input]
    node = helper.make_node("MatMulMergeHeads", inputs, [out], domain=DOMAIN,
                            name=name + "_merge_heads",
                            transposed=[int(t) for _, t, _, _ in found])
    for p, _, chain, _ in found:
        for n in chain:
            g.replace[id(n)] = []
        g.replace[id(p)] = []
    return node


def merge_heads(g: Rewrite) -> None:
    for c in g.nodes:  # the qkv gradient: three merged products concatenated
        if not is_onnx(c, "Concat") or g.taken(c):
            continue
        shape = g.shapes.get(c.output[0])
        if shape is None or int(node_attrs(c).get("axis", 0)) % len(shape) != len(shape) - 1:
            continue
        found = []
        for i in c.input:
            p = g.producer.get(i)
            f = _heads_product(g, p) if p is not None and g.only_reader(i, c) else None
            if f is None or (found and f[3] != found[0][3]) or any(f[0] is x[0] for x in found):
                break
            found.append(f)
        if len(found) != len(c.input):
            continue
        node = _merge(g, found, c.output[0], c.name)
        g.replace[id(c)] = [node]
        g.done.append(f"{len(found)} x (MatMul + merge heads) + Concat -> MatMulMergeHeads")
    for r in g.nodes:  # the attention output: one merged product
        f = _heads_product(g, r)
        if f is None or r.output[0] in g.outputs:
            continue
        p = f[0]
        # the merged value takes the place of the product; the MatMul node's slot is kept
        node = _merge(g, [f], r.output[0], r.name)
        g.replace[id(p)] = [node]
        g.done.append("MatMul + merge heads -> MatMulMergeHeads")


_VIEW_OPS = {"Reshape", "Expand", "Identity", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
             "Constant", "Shape"}


def _subgraph_reads(nodes) -> set[str]:
    """Every value the subgraphs (If / Loop / Scan bodies) of ``nodes`` read, outer-scope
    values included."""
    reads: set[str] = set()
    for n in nodes:
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                reads.update(i for m in sub.node for i in m.input if i)
                reads |= _subgraph_reads(sub.node)
    return reads


def dead_views(g: Rewrite) -> None:
    needed = set(g.outputs) | _subgraph_reads(g.nodes)
    for n in reversed(g.nodes):
        if n.domain in ("", "ai.onnx") and n.op_type in _VIEW_OPS and \
                not any(o in needed for o in n.output if o):
            g.replace[id(n)] = []
            continue
        needed.update(i for i in n.input if i)
    if g.replace:
        g.done.append(f"{len(g.replace)} unread view nodes dropped")


PASSES = [batched_matmul_4d, merge_heads, dead_views]
