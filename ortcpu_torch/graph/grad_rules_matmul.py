"""Gradient rules of matrix products: MatMul (batched, broadcast, 1-D operands), Gemm
(transA/transB, alpha/beta, broadcast C) and Einsum; standard ONNX ops (Gemm with
transposes where the operands allow, as ORT's builder does)."""

from __future__ import annotations

from .grad_rules_base import GradientBuildError, attr, describe, grad_rule, input_at


def _swap_last2(ctx, name: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.op("Transpose", name, perm=perm)


@grad_rule("MatMul", inputs=(0, 1))
def _matmul(ctx, node, dy, needs):
    a, b = node.input
    ra, rb = ctx.values.rank(a), ctx.values.rank(b)
    if ra is None or rb is None:
        raise GradientBuildError(f"{describe(node)}: the ranks of its inputs are unknown "
                                 "(shape inference could not tell); the MatMul gradient "
                                 "needs them")
    g = dy[0]
    if ra == 1 or rb == 1:
        return _matmul_vector(ctx, node, g, needs, ra, rb)
    da = db = None
    if ra == 2 and rb == 2:
        if needs[0]:
            da = ctx.named(ctx.op("Gemm", g, b, transB=1, hint=f"{a}_grad"), a)
        if needs[1]:
            db = ctx.named(ctx.op("Gemm", a, g, transA=1, hint=f"{b}_grad"), b)
        return [da, db]
    out_shape = ctx.values.shape(node.output[0])
    # dY's rows, flattened once for both products when B is a matrix (each graph node costs
    # a call per step, ~10 us after a large GEMM has evicted the interpreter's data)
    rows_g = ctx.op("Flatten", g, axis=ra - 1) if rb == 2 and any(needs) else None
    if needs[0]:
        if rb == 2:  # [..., N] x Bᵀ as one GEMM over the flattened rows: no copy of B
            rows = ctx.op("Gemm", rows_g, b, transB=1)
            da = ctx.named(ctx.op("Reshape", rows, ctx.shape_of(a), hint=f"{a}_grad"), a)
        else:
            prod = ctx.op("MatMul", g, _swap_last2(ctx, b, rb))
            da = ctx.reduce_to(prod, _with_last2(out_shape, a, ctx), a)
    if needs[1]:
        if rb == 2:  # a weight shared over the batch dims: one GEMM over the flattened rows
            rows_a = ctx.op("Flatten", a, axis=ra - 1)
            db = ctx.named(ctx.op("Gemm", rows_a, rows_g, transA=1, hint=f"{b}_grad"), b)
        else:
            prod = ctx.op("MatMul", _swap_last2(ctx, a, ra), g)
            db = ctx.reduce_to(prod, _with_last2(out_shape, b, ctx), b)
    return [da, db]


def _with_last2(out_shape, like, ctx):
    """The broadcast batch dims of the product followed by ``like``'s matrix dims."""
    ls = ctx.values.shape(like)
    if out_shape is None or ls is None:
        return None
    return list(out_shape[:-2]) + list(ls[-2:])


def _matmul_vector(ctx, node, g, needs, ra, rb):
    """MatMul with a 1-D operand: treat it as a matrix with a unit dim, as ONNX does."""
    a, b = node.input
    ax = ctx.op("Unsqueeze", a, ctx.ints([0])) if ra == 1 else a
    bx = ctx.op("Unsqueeze", b, ctx.ints([1])) if rb == 1 else b
    gx = g
    if ra == 1:
        gx = ctx.op("Unsqueeze", gx, ctx.ints([-1 if rb == 1 else -2]))
    if rb == 1:
        gx = ctx.op("Unsqueeze", gx, ctx.ints([-1]))
    da = db = None
    if needs[0]:
        prod = ctx.op("MatMul", gx, _swap_last2(ctx, bx, max(rb, 2)))
        da = _sum_to_vector(ctx, prod, a) if ra == 1 else ctx.named(prod, a)
    if needs[1]:
        prod = ctx.op("MatMul", _swap_last2(ctx, ax, max(ra, 2)), gx)
        db = _sum_to_vector(ctx, prod, b) if rb == 1 else ctx.named(prod, b)
    return [da, db]


def _sum_to_vector(ctx, grad, target):
    """Sum a batched [..., K] or [..., K, 1] product down to the 1-D ``target`` [K]."""
    length = ctx.values.static_shape(target)
    shape = ctx.ints([-1, length[0]]) if length is not None else ctx.op(
        "Concat", ctx.ints([-1]), ctx.op("Shape", target), axis=0)
    rows = ctx.op("Reshape", grad, shape)
    return ctx.named(ctx.op("ReduceSum", rows, ctx.ints([0]), keepdims=0,
                            hint=f"{target}_grad"), target)


@grad_rule("Gemm", inputs=(0, 1, 2))
def _gemm(ctx, node, dy, needs):
    """Y = alpha·A'·B' + beta·C with A' = A or Aᵀ (transA), B' likewise."""
    a, b = node.input[0], node.input[1]
    c = input_at(node, 2)
    alpha = float(attr(node, "alpha", 1.0))
    beta = float(attr(node, "beta", 1.0))
    ta, tb = int(attr(node, "transA", 0)), int(attr(node, "transB", 0))
    g = dy[0]
    da = db = dc = None

    def gemm(x, y, tx, ty, target):
        out = ctx.op("Gemm", x, y, transA=tx or None, transB=ty or None,
                     alpha=alpha if alpha != 1.0 else None, hint=f"{target}_grad")
        return ctx.named(out, target)

    if needs[0]:  # dA' = g·B'ᵀ
        da = gemm(g, b, 0, 1 - tb, a) if not ta else gemm(b, g, tb, 1, a)
    if needs[1]:  # dB' = A'ᵀ·g
        db = gemm(a, g, 1 - ta, 0, b) if not tb else gemm(g, a, 1, ta, b)
    if c and needs[2]:
        dc = ctx.reduce_to(ctx.mul_scalar(g, beta, c), ctx.values.shape(node.output[0]), c)
    return [da, db, dc]


@grad_rule("Einsum")
def _einsum(ctx, node, dy, needs):
    """Each operand's gradient is an einsum of dY with the other operands, read back
    into the operand's subscripts. Explicit output subscripts, no ellipsis, no repeated
    subscript within one operand; an operand's subscripts must appear in the output or in
    another operand (what is summed out of one operand alone needs an Expand: not done)."""
    eq = attr(node, "equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    if "->" not in eq or "." in eq:
        raise GradientBuildError(f"{describe(node)}: the Einsum gradient needs explicit "
                                 f"output subscripts and no ellipsis, got {eq!r}")
    lhs, out = eq.split("->")
    subs = lhs.split(",")
    res = []
    for i, (x, want) in enumerate(zip(node.input, needs, strict=True)):
        if not want:
            res.append(None)
            continue
        others = [s for k, s in enumerate(subs) if k != i]
        if len(set(subs[i])) != len(subs[i]) or not set(subs[i]) <= set(out).union(*others):
            raise GradientBuildError(f"{describe(node)}: no Einsum gradient rule for operand "
                                     f"{i} of {eq!r} (repeated or summed-alone subscripts)")
        inputs = [dy[0]] + [n for k, n in enumerate(node.input) if k != i]
        grad_eq = ",".join([out] + others) + "->" + subs[i]
        res.append(ctx.named(ctx.op("Einsum", *inputs, equation=grad_eq, hint=f"{x}_grad"), x))
    return res
