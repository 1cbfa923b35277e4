"""Pipeline parallelism with autograd-aware send/recv: an MLP on scikit-learn's digits
split into two stages on two ranks.

    mpiexec -n 2 python -m mpi4py examples/pipeline_mlp.py    # stage 0 on rank 0, 1 on 1
    python examples/pipeline_mlp.py                            # whole model, one process

Rank 0 runs the first half and sends its activations; ``send`` returns a zero scalar
whose backward receives the activations' gradient from rank 1. Rank 1 receives the
activations (a tensor whose backward sends the gradient back), runs the second half
and the loss. Both ranks build the full model from the same seed and keep their half,
so the printed loss curve equals the single-process one.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import ortcpu_torch
import ortcpu_torch.distributed as dist


def build(hidden: int):
    act = ortcpu_torch.nn.GELU
    stage0 = torch.nn.Sequential(torch.nn.Linear(64, hidden), act(),
                                 torch.nn.Linear(hidden, hidden), act())
    stage1 = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), act(),
                                 torch.nn.Linear(hidden, 10))
    return stage0, stage1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=int, default=10)
    args = p.parse_args()
    rank, world = dist.rank(), dist.world_size()
    if world > 2:
        raise SystemExit("this example uses 1 or 2 ranks")

    digits = load_digits()
    xs = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    ys = torch.tensor(digits.target, dtype=torch.int64)
    torch.manual_seed(args.seed)
    stage0, stage1 = build(args.hidden)
    if world == 1:
        params = [*stage0.parameters(), *stage1.parameters()]
    else:
        params = list((stage0 if rank == 0 else stage1).parameters())
    opt = torch.optim.AdamW(params, lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    if rank == world - 1:
        print(f"pipeline MLP: {world} stage(s)/rank(s), batch {args.batch}", flush=True)
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, len(xs), (args.batch,), generator=g)
        x, y = xs[idx], ys[idx]
        opt.zero_grad(set_to_none=True)
        if world == 1:
            loss = F.cross_entropy(stage1(stage0(x)), y)
            loss.backward()
        elif rank == 0:
            signal = dist.send(stage0(x), dst=1)  # forward: activations to rank 1
            signal.backward()  # backward: their gradient from rank 1
        else:
            h = dist.recv(src=0)  # requires grad: its backward sends dL/dh to rank 0
            loss = F.cross_entropy(stage1(h), y)
            loss.backward()
        opt.step()
        if rank == world - 1 and (step % args.print_every == 0 or step == 1):
            print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
