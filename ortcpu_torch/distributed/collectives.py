"""Collectives over MPI_COMM_WORLD: barrier, in-place broadcast and allreduce.

With one process (no mpi4py, or not launched by ``mpiexec``) they are no-ops:
``allreduce_(t, "mean")`` of one rank is ``t`` itself.
"""

from __future__ import annotations

import torch

from . import _mpi

__all__ = ["barrier", "broadcast_", "allreduce_", "REDUCE_DTYPES"]

# dtypes MPI reduces natively (as the matching numpy view); float16/bfloat16 go via float32
_NATIVE = {
    torch.float32: "f4", torch.float64: "f8", torch.int8: "i1", torch.int16: "i2",
    torch.int32: "i4", torch.int64: "i8", torch.uint8: "u1", torch.complex64: "c8",
    torch.complex128: "c16",
}
_VIA_FLOAT32 = (torch.float16, torch.bfloat16)
# allreduce_ reduces in chunks of this many bytes (of the reduction dtype); measured on
# 2 local ranks (MPICH shared memory, 64 MB float32): 1-4 MB chunks run ~2.5x faster than
# one whole-buffer Allreduce; 8 MB and 256 KB are slower (benchmarks/distributed.py)
_CHUNK_BYTES = 4 << 20
REDUCE_DTYPES = (*_NATIVE, *_VIA_FLOAT32)


def barrier() -> None:
    """Block until every rank has called ``barrier()``."""
    if _mpi.world_size() > 1:
        _mpi.comm().Barrier()


def _root(op: str, root) -> int:
    if isinstance(root, bool) or not isinstance(root, int):
        raise TypeError(f"{op}: root must be an int rank, got {type(root).__name__}")
    size = _mpi.world_size()
    if not 0 <= root < size:
        raise ValueError(f"{op}: root must be a rank in [0, {size - 1}], got {root}")
    return root


def _inplace_target(op: str, tensor) -> torch.Tensor:
    _mpi.check_tensor(op, "tensor", tensor)
    if tensor.requires_grad and tensor.is_leaf and torch.is_grad_enabled():
        raise ValueError(f"{op}: tensor is a leaf that requires grad; call it under "
                         "torch.no_grad() or on tensor.data")
    return tensor


def broadcast_(tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with rank ``root``'s values; returns it.

    Every rank must pass a tensor of the same dtype and shape (checked: a mismatch
    raises on the ranks that differ from ``root``).
    """
    op = "broadcast_"
    _inplace_target(op, tensor)
    root = _root(op, root)
    if _mpi.world_size() == 1:
        return tensor
    import numpy as np

    MPI = _mpi.mpi(required=True)
    c = MPI.COMM_WORLD
    if tensor.dim() > 62:
        raise ValueError(f"{op}: tensor rank must be <= 62, got {tensor.dim()}")
    meta = np.zeros(64, dtype=np.int64)
    meta[:2 + tensor.dim()] = [_mpi.TORCH_TO_ONNX[tensor.dtype], tensor.dim(), *tensor.shape]
    root_meta = meta.copy()
    c.Bcast([root_meta, MPI.INT64_T], root=root)
    if not np.array_equal(meta, root_meta):
        rdt = _mpi.ONNX_TO_TORCH.get(int(root_meta[0]))
        rshape = tuple(int(v) for v in root_meta[2 : 2 + int(root_meta[1])])
        err = (f"{op}: rank {_mpi.rank()} passed {_mpi.dtype_name(tensor.dtype)} "
               f"{_mpi.shape_str(tensor.shape)} but root {root} has "
               f"{_mpi.dtype_name(rdt) if rdt else '?'} {_mpi.shape_str(rshape)}")
    else:
        err = None
    # everyone learns whether anyone mismatched, so no rank is left blocked in Bcast
    bad = c.allreduce(1 if err else 0, op=MPI.SUM)
    if err:
        raise ValueError(err)
    if bad:
        raise ValueError(f"{op}: {bad} rank(s) passed a tensor whose dtype/shape differs "
                         f"from root {root}'s")
    contiguous = tensor.is_contiguous()
    buf_t = tensor.detach() if contiguous else tensor.detach().contiguous()
    c.Bcast([_mpi.as_bytes(buf_t), MPI.BYTE], root=root)
    if not contiguous:
        with torch.no_grad():
            tensor.copy_(buf_t)
    return tensor


def _mpi_op(op: str, reduce: str):
    MPI = _mpi.mpi(required=True)
    table = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN,
             "prod": MPI.PROD}
    return table[reduce]


def allreduce_(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` over all ranks in place (``op`` = "sum", "mean", "max", "min"
    or "prod"); returns it.

    float16 and bfloat16 are reduced in float32 (MPI has no bfloat16 sum) and rounded
    once at the end; "mean" of an integer tensor is an error (use "sum").
    """
    name = "allreduce_"
    _inplace_target(name, tensor)
    if op not in ("sum", "mean", "max", "min", "prod"):
        raise ValueError(f"{name}: op must be 'sum', 'mean', 'max', 'min' or 'prod', got {op!r}")
    if tensor.dtype not in REDUCE_DTYPES:
        raise TypeError(f"{name}: cannot reduce dtype {_mpi.dtype_name(tensor.dtype)}; supported: "
                        f"{', '.join(_mpi.dtype_name(d) for d in REDUCE_DTYPES)}")
    if op == "mean" and not (tensor.dtype.is_floating_point or tensor.is_complex()):
        raise TypeError(f"{name}: op='mean' needs a floating tensor, got "
                        f"{_mpi.dtype_name(tensor.dtype)}")
    if op in ("max", "min") and tensor.is_complex():
        raise TypeError(f"{name}: op={op!r} is undefined for complex tensors")
    size = _mpi.world_size()
    if size == 1:
        return tensor
    MPI = _mpi.mpi(required=True)
    c, mop = MPI.COMM_WORLD, _mpi_op(name, op)
    with torch.no_grad():
        # the reduction runs chunk by chunk over a contiguous flat view: MPI moves and
        # reduces a cache-sized chunk much faster than one huge buffer, and "mean" divides
        # each chunk right after its reduction, while it is still in cache (no extra pass
        # over memory). All ranks derive the same chunking from the same numel.
        flat = (tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous())
        flat = flat.reshape(-1)
        n = flat.numel()
        via32 = tensor.dtype in _VIA_FLOAT32
        work_itemsize = 4 if via32 else tensor.element_size()
        step = max(1, _CHUNK_BYTES // work_itemsize)
        # float16/bfloat16: each chunk is widened into a reused float32 staging buffer,
        # reduced (and divided) in float32, and rounded once on the way back
        stage = torch.empty(min(step, n), dtype=torch.float32) if via32 and n else None
        # multiplying by 1/size is bit-identical to dividing only when size is a power of 2
        exact_inv = size & (size - 1) == 0
        inv = 1.0 / size
        for s in range(0, n, step):
            e = min(n, s + step)
            chunk = flat[s:e]
            work = stage[: e - s] if via32 else chunk
            if via32:
                work.copy_(chunk)
            c.Allreduce(MPI.IN_PLACE, work.numpy(), op=mop)
            if op == "mean":
                if via32:
                    torch.div(work, size, out=chunk)  # divide in float32, round once
                elif exact_inv:
                    work.mul_(inv)  # x * 2**-k == x / 2**k exactly, at twice the speed
                else:
                    work.div_(size)
            elif via32:
                chunk.copy_(work)
        if not tensor.is_contiguous():
            tensor.copy_(flat.view(tensor.shape))
    return tensor
