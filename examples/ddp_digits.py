"""Data-parallel training on scikit-learn's bundled digits (8x8 images, no download)
with ortcpu_torch.distributed.DataParallel.

    mpiexec -n 2 python -m mpi4py examples/ddp_digits.py      # 2 ranks
    python examples/ddp_digits.py                              # the same, one process

Every rank draws the same global batch (same seed) and trains on its contiguous
1/world share of it; DataParallel averages the gradients, so the loss curve is the
single-process curve of the same global batch (up to float32 summation order). Rank 0
prints the loss (the mean over ranks = the global-batch loss), test accuracy and
samples/s.

    --model cnn|mlp   --global-batch 64   --epochs 3   --steps N (stop early)
    --threads T       --no-overlap        --bucket-mb 25   --print-every 10
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import ortcpu_torch
import ortcpu_torch.distributed as dist


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.act = ortcpu_torch.nn.GELU()
        self.fc1 = torch.nn.Linear(64 * 4 * 4, 256)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        x = self.act(self.conv1(x.view(-1, 1, 8, 8)))
        x = F.max_pool2d(self.act(self.conv2(x)), 2)
        x = self.act(self.fc1(x.flatten(1)))
        return ortcpu_torch.ops.log_softmax(self.fc2(x), 1)


class MLP(torch.nn.Module):
    def __init__(self, hidden: int = 512):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, 10)
        self.act = ortcpu_torch.nn.GELU()

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return ortcpu_torch.ops.log_softmax(self.fc3(x), 1)


def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_test = len(x) // 5
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all)")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--no-overlap", action="store_true")
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5, help="steps excluded from samples/s")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ortcpu_torch.set_num_threads(args.threads)

    rank, world = dist.rank(), dist.world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} must divide by {world} ranks")
    local = args.global_batch // world
    (xs, ys), (xt, yt) = load_data(args.seed)
    torch.manual_seed(args.seed)
    model = CNN() if args.model == "cnn" else MLP()
    model = dist.DataParallel(model, bucket_mb=args.bucket_mb, overlap=not args.no_overlap)
    opt = ortcpu_torch.optim.AdamW(model.parameters(), lr=args.lr)  # ORT's AdamW kernel
    g = torch.Generator().manual_seed(args.seed)
    if rank == 0:
        print(f"digits {args.model}: {world} rank(s) x {args.threads} thread(s), global batch "
              f"{args.global_batch} ({local} per rank), overlap={not args.no_overlap}",
              flush=True)
    step, timed, t_start = 0, 0, None
    loss_t = torch.zeros(())
    done = False
    for _epoch in range(args.epochs):
        perm = torch.randperm(len(xs), generator=g)
        for i in range(0, len(xs) - args.global_batch + 1, args.global_batch):  # drop last
            idx = perm[i + rank * local : i + (rank + 1) * local]
            if step == args.warmup:
                dist.barrier()
                t_start, timed = time.perf_counter(), 0
                wait0 = model.stats["wait_s"]
            loss = F.nll_loss(model(xs[idx]), ys[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            timed += 1
            if step % args.print_every == 0 or step == 1:
                loss_t.copy_(loss.detach())
                dist.allreduce_(loss_t, "mean")
                if rank == 0:
                    print(f"step {step} loss {loss_t.item():.6f}", flush=True)
            if args.steps and step >= args.steps:
                done = True
                break
        if done:
            break
    dist.barrier()
    if t_start is not None and rank == 0:
        elapsed = time.perf_counter() - t_start
        wait_ms = (model.stats["wait_s"] - wait0) / max(timed, 1) * 1e3
        print(f"samples/s {timed * args.global_batch / elapsed:.1f} "
              f"({timed} timed steps, {elapsed:.3f} s; allreduce wait after backward "
              f"{wait_ms:.3f} ms/step)", flush=True)
    model.eval()
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    if rank == 0:
        print(f"test accuracy {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
