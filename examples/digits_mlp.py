"""Train an MLP on scikit-learn's bundled digits data set (8x8 images, 10 classes;
shipped inside the scikit-learn package, no download) twice from the same
initialisation: once with ortcpu_torch's GELU and log-softmax kernels, once in
plain torch. Prints test accuracy and the median time per training step of each.

    python examples/digits_mlp.py [--epochs 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import ortcpu_torch


class MLP(torch.nn.Module):
    def __init__(self, act: torch.nn.Module, log_softmax, hidden: int = 256):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, hidden)
        self.act1 = copy.deepcopy(act)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.act2 = copy.deepcopy(act)
        self.fc3 = torch.nn.Linear(hidden, 10)
        self.log_softmax = log_softmax

    def forward(self, x):
        x = self.act1(self.fc1(x))
        x = self.act2(self.fc2(x))
        return self.log_softmax(self.fc3(x), 1)


def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_test = len(x) // 5
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def train(model, train_set, test_set, epochs: int, batch: int, seed: int):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    xs, ys = train_set
    g = torch.Generator().manual_seed(seed)
    step_times, losses = [], []
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xs), generator=g)
        for i in range(0, len(xs), batch):
            idx = perm[i : i + batch]
            t0 = time.perf_counter()
            loss = F.nll_loss(model(xs[idx]), ys[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step_times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        acc = (model(test_set[0]).argmax(1) == test_set[1]).float().mean().item()
    return acc, statistics.median(step_times) * 1e3, losses[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ortcpu_torch.set_num_threads(args.threads)

    train_set, test_set = load_data(args.seed)
    torch.manual_seed(args.seed)
    ours = MLP(ortcpu_torch.nn.GELU(), ortcpu_torch.ops.log_softmax)
    ref = MLP(torch.nn.GELU(), torch.log_softmax)
    ref.load_state_dict(ours.state_dict())

    print(f"digits: {len(train_set[0])} train / {len(test_set[0])} test images, "
          f"{args.epochs} epochs, batch {args.batch}, {args.threads} threads")
    rows = []
    for name, model in (("ortcpu_torch", ours), ("torch", ref)):
        acc, step_ms, last_loss = train(model, train_set, test_set, args.epochs, args.batch,
                                        args.seed)
        rows.append((name, acc, step_ms, last_loss))
    print(f"{'model':<14}{'test acc':>10}{'ms/step':>10}{'last loss':>11}")
    for name, acc, step_ms, last_loss in rows:
        print(f"{name:<14}{acc:>10.4f}{step_ms:>10.3f}{last_loss:>11.4f}")
    diff = abs(rows[0][1] - rows[1][1])
    print(f"accuracy difference: {diff:.4f}")


if __name__ == "__main__":
    main()
