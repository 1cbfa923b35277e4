"""Two-rank DataParallel checks: after backward, every rank's .grad equals the
single-process gradient of the concatenated global batch (computed on each rank from
the same initial weights), for several bucket sizes, overlap on/off, mixed dtypes,
an unused parameter (find_unused_parameters=True), buffers, no_sync accumulation and a
few optimizer steps. Missing gradients without find_unused_parameters: dp_unused_worker.py."""

import copy

import torch

import ortcpu_torch.distributed as dist
import ortcpu_torch.optim
from ortcpu_torch.distributed import DataParallel

rank, size = dist.rank(), dist.world_size()
assert size == 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * 8 * 8, 32)
        self.fc2 = torch.nn.Linear(32, 10).double()
        self.unused = torch.nn.Linear(3, 3)
        self.register_buffer("scale", torch.full((1,), 1.0 + rank))  # differs per rank

    def forward(self, x):
        h = torch.relu(self.conv(x * self.scale)).flatten(1)
        h = torch.tanh(self.fc1(h))
        return self.fc2(h.double())


def global_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)


def loss_fn(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def check_grads(ddp_model, ref, tag):
    for (name, p), q in zip(ddp_model.module.named_parameters(), ref.parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None, (tag, name)  # unused on every rank: stays None
            continue
        # float32 summation order differs (two half-batch means vs one full mean): ~1e-8
        # after one step; fc2 is float64 but fed by float32 activations, so the same bound
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=f"{tag}: {name}")


for bucket_mb in (25, 0.002):
    for overlap in ("thread", "poll", False):
        tag = f"bucket_mb={bucket_mb} overlap={overlap}"
        torch.manual_seed(1234 + rank)  # different init per rank: construction must sync
        model = Net()
        ddp = DataParallel(model, bucket_mb=bucket_mb, overlap=overlap,
                           find_unused_parameters=True)  # Net.unused gets no gradient
        if bucket_mb < 1:
            assert len(ddp._buckets) > 3, len(ddp._buckets)
        assert torch.equal(model.scale, torch.ones(1))  # rank 0's buffer
        ref = copy.deepcopy(model)  # the same weights on both ranks now
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            x, y = global_batch(step)
            half = slice(rank * 4, rank * 4 + 4)
            opt.zero_grad()
            loss_fn(ddp, x[half], y[half]).backward()
            ref_opt.zero_grad()
            loss_fn(ref, x, y).backward()
            check_grads(ddp, ref, f"{tag} step {step}")
            opt.step()
            ref_opt.step()
        # gradient accumulation: no_sync for the first micro-batch, reduce on the second
        opt.zero_grad()
        ref_opt.zero_grad()
        x, y = global_batch(10)
        x2, y2 = global_batch(11)
        with ddp.no_sync():
            loss_fn(ddp, x[rank * 4 : rank * 4 + 4], y[rank * 4 : rank * 4 + 4]).backward()
        loss_fn(ddp, x2[rank * 4 : rank * 4 + 4], y2[rank * 4 : rank * 4 + 4]).backward()
        loss_fn(ref, x, y).backward()
        loss_fn(ref, x2, y2).backward()
        check_grads(ddp, ref, f"{tag} no_sync")
        # parameters stayed identical on both ranks
        for p in ddp.parameters():
            other = p.detach().clone()
            dist.broadcast_(other, root=0)
            assert torch.equal(other, p.detach()), tag

# with ortcpu_torch's AdamW (ORT's AdamWOptimizer kernel) on both sides
torch.manual_seed(7)
model = Net()
ddp = DataParallel(model, bucket_mb=0.01, find_unused_parameters=True)
ref = copy.deepcopy(model)
opt = ortcpu_torch.optim.AdamW(ddp.parameters(), lr=1e-2)
ref_opt = ortcpu_torch.optim.AdamW(ref.parameters(), lr=1e-2)
for step in range(3):
    x, y = global_batch(20 + step)
    opt.zero_grad()
    loss_fn(ddp, x[rank * 4 : rank * 4 + 4], y[rank * 4 : rank * 4 + 4]).backward()
    ref_opt.zero_grad()
    loss_fn(ref, x, y).backward()
    check_grads(ddp, ref, f"ortcpu AdamW step {step}")
    opt.step()
    ref_opt.step()
for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters(), strict=True):
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"ortcpu AdamW params: {name}")

# a parameter used on rank 1 only: every rank gets the average (rank 1's grad / 2)
for overlap in ("poll", "thread", False):
    m = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 2), "b": torch.nn.Linear(3, 2)})
    ddp = DataParallel(m, bucket_mb=1e-5, overlap=overlap, find_unused_parameters=True)
    loss = m["a"].weight.sum() * (rank + 1)
    if rank == 1:
        loss = loss + 3 * m["b"].weight.sum()
    loss.backward()
    assert torch.equal(m["a"].weight.grad, torch.full((2, 3), 1.5)), overlap
    assert torch.equal(m["b"].weight.grad, torch.full((2, 3), 1.5)), overlap
    assert m["a"].bias.grad is None and m["b"].bias.grad is None, overlap

# a structural mismatch between ranks is an error on every rank, not a hang
try:
    DataParallel(torch.nn.Linear(3, 3 + rank))
except ValueError as e:
    assert "differ between ranks" in str(e), e
else:
    raise AssertionError("mismatched models were accepted")

print(f"rank {rank}: DataParallel grads match the concatenated batch", flush=True)
