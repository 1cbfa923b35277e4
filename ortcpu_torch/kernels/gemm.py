"""MatMul and Gemm (ONNX) on OpenBLAS or torch's MKL (``ORTCPU_GEMM``, see
``ortcpu_torch._native.blas``), float32 and float64.

Thread decision for the library (measured, README "Threads"): OpenBLAS (a pthreads build
in scipy-openblas32) is pinned to one thread when the extension loads; parallel work uses
our OpenMP threads (torch's libgomp, ``get_num_threads()``), each running single-threaded
OpenBLAS GEMMs: whole GEMMs per thread for batches (conv samples, MatMul batch dims), column
or row slabs of one GEMM otherwise. OpenBLAS's own pool would otherwise spin next to
OpenMP's on the same 2 cores. MKL, where chosen, runs on that same OpenMP pool with the
call's thread count (native/src/gemm.h).
"""

from __future__ import annotations

import torch

from .._native import empty, ffi, lib, native_fn, ptr
from ._checks import (
    check_status,
    float_attr,
    float_input,
    fmt_shape,
    get_num_threads,
    int_attr,
    same_dtype,
)
from ._registry import register


def _offsets(batch_shape, t_batch, mat_elems):
    """Element offsets of each broadcast batch entry into a contiguous tensor whose
    batch dims are ``t_batch`` (right-aligned against ``batch_shape``)."""
    nb = len(batch_shape)
    tb = (1,) * (nb - len(t_batch)) + tuple(t_batch)
    strides, acc = [], mat_elems
    for s in reversed(tb):
        strides.append(acc if s != 1 else 0)
        acc *= s
    strides.reverse()
    off = torch.zeros(batch_shape, dtype=torch.int64)
    for i, (size, st) in enumerate(zip(batch_shape, strides, strict=True)):
        if st:
            shape = [1] * nb
            shape[i] = size
            off = off + (torch.arange(size, dtype=torch.int64) * st).view(shape)
    return off.reshape(-1).contiguous()


@register
def MatMul(A, B):
    """ONNX MatMul (numpy semantics: 1-D promotion, broadcast batch dims). Inputs: A, B.
    Output: Y."""
    op = "MatMul"
    A = float_input(op, "A", A, min_rank=1)
    B = float_input(op, "B", B, min_rank=1)
    same_dtype(op, "A", A, "B", B)
    a2 = A.unsqueeze(0) if A.dim() == 1 else A
    b2 = B.unsqueeze(-1) if B.dim() == 1 else B
    m, k = a2.shape[-2], a2.shape[-1]
    k2, n = b2.shape[-2], b2.shape[-1]
    if k != k2:
        raise ValueError(f"{op}: inner dims differ: A {fmt_shape(A)} and B {fmt_shape(B)}")
    try:
        batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except RuntimeError:
        raise ValueError(f"{op}: batch dims of A {fmt_shape(A)} and B {fmt_shape(B)} do not "
                         f"broadcast") from None
    Y = empty((*batch, m, n), A.dtype)
    nb = Y.numel() // max(m * n, 1) if m * n else int(torch.Size(batch).numel())
    if Y.numel():
        a_off = _offsets(batch, a2.shape[:-2], m * k)
        b_off = _offsets(batch, b2.shape[:-2], k * n)
        st = native_fn("matmul", A.dtype)(
            ptr(A), ptr(B), ptr(Y), nb, ffi.cast("int64_t *", a_off.data_ptr()),
            ffi.cast("int64_t *", b_off.data_ptr()), m, n, k, A.numel(), B.numel(),
            get_num_threads())
        check_status(st, op)
    if A.dim() == 1:
        Y = Y.squeeze(-2)
    if B.dim() == 1:
        Y = Y.squeeze(-1)
    return Y


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *,
         trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, beta: float = 1.0,
         op: str = "Gemm") -> torch.Tensor:
    """``alpha·op(a)·op(b) + beta·c`` for contiguous 2-D ``a`` and ``b`` of one float dtype
    with matching inner dims, ``c`` None or broadcastable to the result: checked by the
    caller. Not a registry op: the core of ``Gemm`` and of the Linear front end."""
    m = a.shape[1] if trans_a else a.shape[0]
    k = a.shape[0] if trans_a else a.shape[1]
    n = b.shape[0] if trans_b else b.shape[1]
    y = empty((m, n), a.dtype)
    beta = float(beta) if c is not None else 0.0
    if beta != 0:
        y.copy_(c)  # broadcast to [m, n]
    if m == 0 or n == 0:
        return y
    if k == 0:
        y.mul_(beta) if beta else y.zero_()
        return y
    st = native_fn("gemm_mt", a.dtype)(
        int(trans_a), int(trans_b), m, n, k, float(alpha), ptr(a), a.shape[1], ptr(b),
        b.shape[1], beta, ptr(y), n, get_num_threads())
    check_status(st, op)
    return y


@register
def Gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """ONNX Gemm: ``Y = alpha·op(A)·op(B) + beta·C`` (C broadcast to [M, N]). Inputs: A, B,
    optional C. Output: Y."""
    op = "Gemm"
    A = float_input(op, "A", A)
    B = float_input(op, "B", B)
    same_dtype(op, "A", A, "B", B)
    transA = int_attr(op, "transA", transA, (0, 1))
    transB = int_attr(op, "transB", transB, (0, 1))
    alpha = float_attr(op, "alpha", alpha)
    beta = float_attr(op, "beta", beta)
    if A.dim() != 2 or B.dim() != 2:
        raise ValueError(f"{op}: A and B must be 2-D, got {fmt_shape(A)} and {fmt_shape(B)}")
    m, k = (A.shape[1], A.shape[0]) if transA else A.shape
    k2, n = (B.shape[1], B.shape[0]) if transB else B.shape
    if k != k2:
        raise ValueError(f"{op}: inner dims differ: op(A) is [{m}, {k}], op(B) is [{k2}, {n}]")
    if C is not None:
        C = float_input(op, "C", C)
        same_dtype(op, "A", A, "C", C)
        # (unidirectional broadcast; torch.broadcast_shapes costs more than a small GEMM)
        rev = tuple(reversed(C.shape))
        if C.dim() > 2 or any(c not in (1, t) for c, t in zip(rev, (n, m)[:len(rev)],
                                                              strict=True)):
            raise ValueError(f"{op}: C {fmt_shape(C)} does not broadcast to [{m}, {n}]")
    return gemm(A, B, C, trans_a=bool(transA), trans_b=bool(transB), alpha=alpha, beta=beta,
                op=op)


def bmm(op: str, a: torch.Tensor, b: torch.Tensor, trans_a: bool = False,
        trans_b: bool = False) -> torch.Tensor:
    """``[batch, m, n]`` = op(a[i]) · op(b[i]) for contiguous 3-D ``a`` (``[batch, m, k]``,
    ``[batch, k, m]`` when ``trans_a``) and ``b`` (``[batch, k, n]``, ``[batch, n, k]`` when
    ``trans_b``) of one float dtype. Not a registry op: the front ends' batched matmul."""
    a = float_input(op, "a", a)
    b = float_input(op, "b", b)
    same_dtype(op, "a", a, "b", b)
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]:
        raise ValueError(f"{op}: a and b must be 3-D with the same batch size, got "
                         f"{fmt_shape(a)} and {fmt_shape(b)}")
    m, k = (a.shape[2], a.shape[1]) if trans_a else (a.shape[1], a.shape[2])
    k2, n = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if k != k2:
        raise ValueError(f"{op}: inner dims differ: op(a) is [{m}, {k}], op(b) is [{k2}, {n}]")
    y = empty((a.shape[0], m, n), a.dtype)
    st = native_fn("bmm", a.dtype)(int(trans_a), int(trans_b), ptr(a), ptr(b), ptr(y),
                                   a.shape[0], m, n, k, get_num_threads())
    check_status(st, op)
    return y



def strided_layout(x: torch.Tensor):
    """How BLAS can read the matrices of ``x`` ``[..., r, c]`` in place: (transposed, row
    stride), or None when it cannot (a copy is needed)."""
    r, c = x.shape[-2], x.shape[-1]
    sr, sc = x.stride(-2), x.stride(-1)
    if (sc == 1 or c == 1) and (r == 1 or sr >= c):
        return False, sr if r > 1 else c
    if (sr == 1 or r == 1) and (c == 1 or sc >= r):
        return True, sc if c > 1 else r
    return None


def batch_strides(shape, *tensors):
    """The batch dims ``shape`` (shared by ``tensors``) as at most two (size, [stride of
    each tensor]) levels: size-1 dims dropped, neighbours merged where every tensor's
    strides allow; None when more than two levels remain."""
    dims = [(s, [t.stride(i) for t in tensors]) for i, s in enumerate(shape) if s != 1]
    merged: list = []
    for size, st in dims:
        if merged:
            osize, ost = merged[-1]
            if all(o == s * size for o, s in zip(ost, st, strict=True)):
                merged[-1] = (osize * size, st)
                continue
        merged.append((size, st))
    if len(merged) > 2:
        return None
    while len(merged) < 2:
        merged.insert(0, (1, [0] * len(tensors)))
    return merged


def bmm_strided(op: str, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0,
                out: torch.Tensor | None = None):
    """``[..., m, n]`` = alpha·a·b for float ``a`` ``[..., m, k]`` and ``b`` ``[..., k, n]``
    of one dtype with equal batch dims (checked by the caller), each read in place where
    BLAS can (transposed, sliced or head-split views, as attention's Q/K/V are) and copied
    where it cannot. ``out``: the result's tensor (shape ``[..., m, n]``, that dtype,
    unit column stride, distinct elements), e.g. a permuted view of the buffer the next
    Transpose would produce; written in place (through a copy when BLAS cannot address
    it). Not a registry op: the graph executor's batched MatMul."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    y = empty((*a.shape[:-1], n), a.dtype) if out is None else out
    if y.numel() == 0:
        return y
    if out is not None and not _nonoverlapping(out):
        raise RuntimeError(f"{op}: bmm_strided's out {tuple(out.shape)} with strides "
                           f"{out.stride()} overlaps itself (its elements must be distinct)")
    if out is not None and (out.stride(-1) != 1 or (m > 1 and out.stride(-2) < n) or
                            batch_strides(a.shape[:-2], out) is None):
        out.copy_(bmm_strided(op, a, b, alpha))
        return out
    la, lb = strided_layout(a), strided_layout(b)
    if la is None:
        a = a.contiguous()
        la = strided_layout(a)
    if lb is None:
        b = b.contiguous()
        lb = strided_layout(b)
    levels = batch_strides(a.shape[:-2], a, b, y)
    if levels is None:
        a, b = a.contiguous(), b.contiguous()
        levels = batch_strides(a.shape[:-2], a, b, y)
    (b0, s0), (b1, s1) = levels
    if b0 > 1 and b1 > 1 and s0[2] < s1[2]:  # the output's finer level inside (any order
        (b0, s0), (b1, s1) = (b1, s1), (b0, s0)  # of the batch entries is fine)
    ldc = y.stride(-2) if m > 1 else n
    if out is not None and not _distinct_outputs(b0, s0[2], b1, s1[2], m, n, ldc):
        out.copy_(bmm_strided(op, a, b, alpha))
        return out
    strides = ffi.new("int64_t[6]", [s0[0], s1[0], s0[1], s1[1], s0[2], s1[2]])
    st = native_fn("bmm_strided", a.dtype)(
        int(la[0]), int(lb[0]), b0, b1, m, n, k, float(alpha), ptr(a), la[1], strides,
        ptr(b), lb[1], strides + 2, ptr(y), ldc, strides + 4, get_num_threads())
    check_status(st, op)
    return y


def _nonoverlapping(t: torch.Tensor) -> bool:
    """Each stride (in increasing order) steps past everything the smaller ones reach: true
    of every permuted or sliced view of a dense buffer, so a sufficient test that no two
    elements of ``t`` share memory."""
    reach = 0
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride(), strict=True)
                               if s > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _distinct_outputs(b0, sc0, b1, sc1, m, n, ldc) -> bool:
    """The output layout ortcpu_bmm_strided accepts (its overlap rule, ortcpu.h)."""
    span = (m - 1) * ldc + n
    inner = b1 <= 1 or sc1 >= span or (sc1 >= n and (b1 - 1) * sc1 + n <= ldc)
    run = (b1 - 1) * sc1 + span if b1 > 1 else span
    return inner and (b0 <= 1 or sc0 >= run)


#: rows of A up to which the pre-packed float32 GEMM runs -- the graph executor's constant
#: weight GEMMs: measured faster than OpenBLAS (which repacks B every call) up to ~16 rows
#: with the AVX2 tile, up to ~1024 with the AVX-512 one (native/src/gemm_p16.c)
P16_MAX_ROWS = int(lib.ortcpu_gemm_p16_max_rows())


class PackedWeight:
    """A constant float32 right-hand operand ``op(B)`` ``[k, n]`` packed once for
    ``gemm_p16`` (native/src/gemm_p16.c); ``pack`` returns None where that GEMM is not
    built (below x86-64-v3) or ``b`` is not a 2-D float32 tensor."""

    __slots__ = ("n", "k", "data", "data_p", "source")

    def __init__(self, b: torch.Tensor, trans_b: bool):
        self.source = b
        self.k, self.n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
        b = b.contiguous()
        self.data = torch.empty(lib.ortcpu_gemm_p16_packed_size(self.n, self.k))
        self.data_p = ptr(self.data)  # self.data keeps it valid
        check_status(lib.ortcpu_gemm_p16_pack(int(trans_b), self.n, self.k, ptr(b),
                                              b.shape[1], self.data_p), "gemm_p16_pack")

    @classmethod
    def pack(cls, b, trans_b: bool = False):
        if not isinstance(b, torch.Tensor) or b.dtype != torch.float32 or b.dim() != 2 or \
                not b.numel() or not lib.ortcpu_gemm_p16_available():
            return None
        return cls(b, trans_b)

    def matmul(self, a: torch.Tensor, bias: torch.Tensor | None = None,
               op: str = "MatMul") -> torch.Tensor:
        """``a`` (contiguous float32 ``[m, k]``) · op(B) (+ ``bias`` ``[n]``, contiguous
        float32)."""
        return self._run(a, ptr(bias), op)

    def bind(self, bias: torch.Tensor | None = None, op: str = "MatMul"):
        """``f(a)`` = ``matmul(a, bias, op)`` with the bias's C pointer taken once: what a
        graph node calls per run (a 784-1024-1024-10 MLP at batch 1 runs three of them in
        about 0.1 ms, where each ``ptr`` is about 0.4 us)."""
        bias_p, run = ptr(bias), self._run

        def f(a: torch.Tensor) -> torch.Tensor:
            return run(a, bias_p, op)
        f.keep = (self, bias)  # the pointers' owners
        return f

    def _run(self, a: torch.Tensor, bias_p, op: str) -> torch.Tensor:
        m, n, k = a.shape[0], self.n, self.k
        y = empty((m, n), torch.float32)
        st = lib.ortcpu_gemm_p16(m, n, k, ptr(a), k, self.data_p, bias_p, ptr(y), n,
                                 get_num_threads())
        if st:
            check_status(st, op)
        return y

