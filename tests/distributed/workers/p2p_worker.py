"""Two-rank checks of point-to-point messages, the Send/Recv kernels and collectives.

Run by tests/distributed/test_distributed_mpi.py as
``mpiexec -n 2 python -m mpi4py p2p_worker.py``. Any failed check raises, and
``python -m mpi4py`` then aborts the whole job with a non-zero exit code.
"""

import sys

import torch

import ortcpu_torch  # noqa: F401
import ortcpu_torch.distributed as dist
from ortcpu_torch import kernels
from ortcpu_torch.distributed import _mpi

rank, size = dist.rank(), dist.world_size()
assert size == 2, size
peer = 1 - rank
log = []


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g) * 3
        if x.numel() > 2:
            x.view(-1)[0] = float("inf")
            x.view(-1)[1] = float("nan")
        return x.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def same_bits(a, b):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.is_contiguous()
    assert torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8)), (a, b)


def expect_error(exc_type, words, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc_type as e:
        msg = str(e)
        for w in words:
            assert w in msg, (w, msg)
        return msg
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


# 1. every dtype, several shapes (0-d, empty, odd sizes), both directions
dtypes = list(_mpi.TORCH_TO_ONNX)
shapes = [(), (0,), (1,), (3, 5), (2, 0, 3), (67,)]
seed = 0
for src in (0, 1):
    for dt in dtypes:
        for shape in shapes:
            seed += 1
            x = sample(dt, shape, seed)
            if rank == src:
                assert dist.send(x, peer, tag=7) is None
            else:
                y = dist.recv(peer, tag=7)
                same_bits(y, x)
log.append(f"dtypes: {len(dtypes)} x {len(shapes)} shapes ok")

# 2. non-contiguous tensors arrive with their logical layout
base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
views = [base.transpose(0, 2), base[:, ::2, 1:], base[..., 0], torch.tensor(3.0).expand(4, 3),
         base.permute(2, 0, 1)[1:, :, ::3], base.to(torch.bfloat16).mT]
for i, v in enumerate(views):
    assert i < 3 or not v.is_contiguous() or i == 3
    if rank == 0:
        dist.send(v, 1, tag=1)
    else:
        got = dist.recv(0, tag=1)
        same_bits(got, v.contiguous())
log.append("non-contiguous ok")

# 3. recv into out= (contiguous and not); out of the wrong dtype/shape -> clear error, untouched
if rank == 0:
    dist.send(torch.arange(6.0).reshape(2, 3), 1)
    dist.send(torch.arange(6.0).reshape(3, 2), 1)
    dist.send(torch.arange(6.0).reshape(2, 3), 1)  # wrong dtype for the receiver
    dist.send(torch.arange(6.0).reshape(2, 3), 1)  # wrong shape for the receiver
    dist.send(torch.full((2,), 5.0), 1)  # the channel is still in sync afterwards
else:
    out = torch.zeros(2, 3)
    r = dist.recv(0, out=out)
    assert r is out and torch.equal(out, torch.arange(6.0).reshape(2, 3))
    out_nc = torch.zeros(2, 3).t()
    r = dist.recv(0, out=out_nc)
    assert r is out_nc and torch.equal(out_nc, torch.arange(6.0).reshape(3, 2))
    bad = torch.full((2, 3), -1, dtype=torch.float64)
    expect_error(TypeError, ["out", "float64", "float32", "rank 0"], dist.recv, 0, out=bad)
    assert torch.all(bad == -1)
    bad = torch.full((3, 2), -1.0)
    expect_error(ValueError, ["shape", "(3, 2)", "(2, 3)"], dist.recv, 0, out=bad)
    assert torch.all(bad == -1)
    assert torch.equal(dist.recv(0), torch.full((2,), 5.0))
log.append("out= and mismatch errors ok")

# 4. isend/irecv: several messages in flight on one tag, waited out of order
if rank == 0:
    reqs = [dist.isend(torch.full((1000 * (k + 1),), float(k)), 1, tag=3) for k in range(4)]
    for r in reqs:
        assert r.wait() is None and r.is_completed()
else:
    reqs = [dist.irecv(0, tag=3) for _ in range(4)]
    got = [reqs[k].wait() for k in (2, 0, 3, 1)]
    for k, g in zip((2, 0, 3, 1), got, strict=True):
        assert torch.equal(g, torch.full((1000 * (k + 1),), float(k))), k
# simultaneous exchange in both directions (non-blocking on both sides)
mine = torch.full((200_000,), float(rank))
s = dist.isend(mine, peer, tag=4)
r = dist.irecv(peer, tag=4)
theirs = r.wait()
s.wait()
assert torch.equal(theirs, torch.full((200_000,), float(peer)))
log.append("isend/irecv ok")

# 5. same-rank and out-of-range peers are clear errors
expect_error(ValueError, ["own rank"], dist.send, torch.ones(1), rank)
expect_error(ValueError, ["own rank"], dist.recv, rank)
expect_error(ValueError, ["[0, 1]"], dist.isend, torch.ones(1), 5)
expect_error(ValueError, ["own rank"], kernels.Send, torch.tensor(True), torch.tensor(rank),
             torch.ones(1), tag=0, element_types=[1])

# 6. Send/Recv kernels: heterogeneous variadic tensors, packed at 256-byte offsets
data = [torch.arange(5, dtype=torch.float32), torch.arange(12, dtype=torch.int64).reshape(3, 4).t(),
        torch.tensor(True), torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator()
                                        .manual_seed(1)), torch.zeros(0, 2, dtype=torch.int8)]
types = [1, 7, 9, 11, 3]
if rank == 0:
    sig = kernels.Send(torch.tensor(True), torch.tensor(1, dtype=torch.int64), *data, tag=11,
                       element_types=types)
    assert sig.dtype == torch.bool and bool(sig)
    kernels.Send(torch.tensor(True), 1, *data[:2], tag=11, element_types=[1, 7])
    kernels.Send(torch.tensor(True), 1, data[0], tag=11, element_types=[1])
else:
    out = kernels.Recv(torch.tensor(True), torch.tensor(0), tag=11, element_types=types)
    assert len(out) == 1 + len(data) and bool(out[0])
    for a, b in zip(out[1:], data, strict=True):
        same_bits(a, b.contiguous())
    expect_error(TypeError, ["Data[1]", "int32", "int64"], kernels.Recv, torch.tensor(True), 0,
                 tag=11, element_types=[1, 6])
    expect_error(ValueError, ["Data[0]", "shape", "(4,)", "(5,)"], kernels.Recv,
                 torch.tensor(True), 0, tag=11, element_types=[1], output_shapes=[(4,)])
expect_error(TypeError, ["Data[0]", "element_types[0]"], kernels.Send, torch.tensor(True),
             peer, torch.ones(2), tag=0, element_types=[11])
expect_error(ValueError, ["InputSignal"], kernels.Send, torch.tensor(False), peer,
             torch.ones(2), tag=0, element_types=[1])
log.append("Send/Recv kernels ok")

# 7. broadcast_ and allreduce_ of every reducible dtype
from ortcpu_torch.distributed.collectives import REDUCE_DTYPES  # noqa: E402

for i, dt in enumerate(REDUCE_DTYPES):
    a = sample(dt, (7, 3), 100 + i)
    b = sample(dt, (7, 3), 200 + i)
    if dt.is_floating_point or dt.is_complex:
        a = torch.where(torch.isfinite(a), a, torch.zeros_like(a)) if not dt.is_complex else a
        b = torch.where(torch.isfinite(b), b, torch.zeros_like(b)) if not dt.is_complex else b
    mine = (a if rank == 0 else b).clone()
    t = mine.clone()
    assert dist.broadcast_(t, root=1) is t
    same_bits(t, b)
    t = mine.clone().t()  # non-contiguous, reduced in place
    dist.allreduce_(t, "sum")
    if dt in (torch.float16, torch.bfloat16):
        ref = (a.float() + b.float()).to(dt).t()  # reduced in float32, rounded once
    elif dt in (torch.int8, torch.uint8, torch.int16):
        ref = (a.to(torch.int64) + b.to(torch.int64)).to(dt).t()  # wraps like C
    else:
        ref = (a + b).t()
    assert torch.equal(t, ref), (dt, t, ref)
    if dt.is_floating_point or dt.is_complex:
        t = mine.clone()
        dist.allreduce_(t, op="mean")
        ref = ((a.double() + b.double()) / 2).to(dt) if not dt.is_complex else (a + b) / 2
        torch.testing.assert_close(t, ref, rtol=1e-2 if dt in (torch.float16, torch.bfloat16)
                                   else 1e-6, atol=1e-6)
    if not dt.is_complex:
        t = mine.clone()
        dist.allreduce_(t, op="max")
        assert torch.equal(t, torch.maximum(a, b) if dt != torch.bool else a | b)
# bfloat16: the float32 path keeps precision a bf16 pairwise sum would lose
big = torch.full((4,), 256.0, dtype=torch.bfloat16) if rank == 0 else \
    torch.full((4,), 1.0, dtype=torch.bfloat16)
dist.allreduce_(big)
assert torch.equal(big, torch.full((4,), 257.0).to(torch.bfloat16))
# allreduce_ works in chunks: force tiny chunks so a 1000-element tensor spans many
# (ragged tail included); results must be bit-identical to the unchunked reduction
from ortcpu_torch.distributed import collectives as _coll  # noqa: E402

_saved_chunk = _coll._CHUNK_BYTES
_coll._CHUNK_BYTES = 96
try:
    for i, dt in enumerate((torch.float32, torch.float64, torch.bfloat16, torch.float16,
                            torch.int32, torch.complex64)):
        a, b = sample(dt, (40, 25), 300 + i), sample(dt, (40, 25), 400 + i)
        wide = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
        for op in ("sum", "mean", "max"):
            if (op == "mean" and not (dt.is_floating_point or dt.is_complex)) or \
                    (op == "max" and dt.is_complex):
                continue
            for transpose in (False, True):
                t = (a if rank == 0 else b).clone()
                t = t.t().contiguous().t() if transpose else t
                assert dist.allreduce_(t, op) is t
                A, B = a.to(wide), b.to(wide)
                ref = (A + B if op == "sum" else (A + B) / 2 if op == "mean"
                       else torch.maximum(A, B)).to(dt)
                torch.testing.assert_close(t, ref, rtol=0, atol=0, equal_nan=True,
                                           msg=f"chunked allreduce_ {dt} {op} {transpose}")
finally:
    _coll._CHUNK_BYTES = _saved_chunk
expect_error(TypeError, ["mean", "int64"], dist.allreduce_, torch.ones(2, dtype=torch.int64),
             "mean")
# broadcast_ with a mismatched shape: clear error on every rank, no hang
msg = expect_error(ValueError, ["broadcast_"], dist.broadcast_,
                   torch.zeros(3 if rank == 0 else 4))
dist.barrier()
log.append("collectives ok")

# 8. autograd-aware send/recv: rank 0 sends h = 2x, rank 1 computes sum(h^2)
x = torch.arange(1.0, 7.0).reshape(2, 3)
if rank == 0:
    xr = x.clone().requires_grad_()
    sig = dist.send(xr * 2, 1, tag=5)
    assert sig is not None and sig.requires_grad and float(sig.detach()) == 0.0
    sig.backward()
    torch.testing.assert_close(xr.grad, 8 * x)
else:
    h = dist.recv(0, tag=5)
    assert h.requires_grad
    (h ** 2).sum().backward()
# requires_grad=False on the receiver drops the backward edge (the sender's flag is ignored)
if rank == 0:
    dist.send(x.clone().requires_grad_() * 1, 1, tag=6)  # its backward is never called
else:
    h = dist.recv(0, tag=6, requires_grad=False)
    assert not h.requires_grad and torch.equal(h, x)
log.append("autograd send/recv ok")

# 9. TensorBoard: the summary writer's rank source is ours, so only rank 0 writes
if len(sys.argv) > 1:
    import os

    from ortcpu_torch import summary

    assert summary.get_rank() == rank
    w = summary.SummaryWriter(sys.argv[1])
    w.add_scalar("loss", 1.5 + rank, 0)
    w.close()
    dist.barrier()
    files = [f for _, _, fs in os.walk(sys.argv[1]) for f in fs]
    assert len(files) == 1 and "tfevents" in files[0], files
    log.append("summary writer on rank 0 only ok")

dist.barrier()
print(f"rank {rank}: " + "; ".join(log), flush=True)
