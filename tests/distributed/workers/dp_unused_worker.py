"""Two-rank DataParallel with parameters that get no gradient on some ranks.

Without find_unused_parameters a missing gradient must be a RuntimeError on *every*
rank at the end of that backward (naming the parameters), within seconds, and the
wrapper must work again afterwards; with it, the rank without a gradient contributes
zeros. Also a rank whose backward reaches no parameter at all (the output is computed
without one): it still takes part in the reduction instead of leaving the other rank
waiting. Prints one line per check; the test counts them."""

import time

import torch

import ortcpu_torch.distributed as dist
from ortcpu_torch.distributed import DataParallel

rank, size = dist.rank(), dist.world_size()
assert size == 2


class Branchy(torch.nn.Module):
    """``a`` on every rank; ``b`` only where ``use_b``; nothing at all where ``skip``."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 2)
        self.b = torch.nn.Linear(2, 2)

    def forward(self, x, use_b=True, skip=False):
        if skip:
            return x[:, :2] * 2.0
        h = self.a(x)
        return self.b(h) if use_b else h


def expect_missing(ddp, x, tag, **kw):
    t0 = time.monotonic()
    try:
        ddp(x, **kw).sum().backward()
    except RuntimeError as e:
        msg = str(e)
        assert "find_unused_parameters=True" in msg, msg
        elapsed = time.monotonic() - t0
        assert elapsed < 10, elapsed
        return msg
    raise AssertionError(f"{tag}: a missing gradient was accepted on rank {rank}")


x = torch.ones(4, 3)
for overlap in ("poll", "thread", False):
    for bucket_mb in (25, 1e-5):  # one bucket, or one per parameter
        tag = f"overlap={overlap} bucket_mb={bucket_mb}"
        torch.manual_seed(0)
        m = Branchy()
        ddp = DataParallel(m, bucket_mb=bucket_mb, overlap=overlap)
        # a branch taken on rank 1 only: an error on both ranks, naming b's parameters
        msg = expect_missing(ddp, x, tag, use_b=rank == 1)
        assert "'b.weight' (1 of 2 ranks)" in msg and "'b.bias' (1 of 2 ranks)" in msg, msg
        assert "'a.weight'" not in msg, msg
        # the wrapper recovers: a backward where everything is used works on both ranks
        m.zero_grad(set_to_none=True)
        ddp(x * (rank + 1)).sum().backward()
        ref = Branchy()
        ref.load_state_dict(m.state_dict())
        (ref(x).sum() + ref(2 * x).sum()).backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad / 2, msg=f"{tag}: {name}")
        # rank 0's backward reaches no parameter at all: an error on both ranks too
        m.zero_grad(set_to_none=True)
        msg = expect_missing(ddp, x.clone().requires_grad_(), tag, skip=rank == 0)
        assert "'a.weight' (1 of 2 ranks)" in msg, msg
        ddp.close()

        # find_unused_parameters=True: the same two cases average with zeros
        torch.manual_seed(0)
        m = Branchy()
        ddp = DataParallel(m, bucket_mb=bucket_mb, overlap=overlap,
                           find_unused_parameters=True)
        ddp(x, use_b=rank == 1).sum().backward()
        ref = Branchy()
        ref.load_state_dict(m.state_dict())
        (ref(x, use_b=False).sum() + ref(x).sum()).backward()  # rank 0's loss + rank 1's
        for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad / 2, msg=f"{tag}: {name}")
        m.zero_grad(set_to_none=True)
        ddp(x.clone().requires_grad_(), skip=rank == 0).sum().backward()
        ref.zero_grad(set_to_none=True)
        ref(x).sum().backward()
        torch.testing.assert_close(m.a.weight.grad, ref.a.weight.grad / 2, msg=tag)
        torch.testing.assert_close(m.b.bias.grad, ref.b.bias.grad / 2, msg=tag)
        ddp.close()
        print(f"rank {rank}: {tag} unused parameters ok", flush=True)
