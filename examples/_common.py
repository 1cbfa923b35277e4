"""Shared pieces of the examples: command line, package-shipped data, the training loop
with a progress bar and TensorBoard logging through ``ortcpu_torch.summary``."""

from __future__ import annotations

import argparse
import inspect
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

import ortcpu_torch
import ortcpu_torch.summary


def parse_args(description: str, steps: int, batch: int, lr: float) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--wrap", action=argparse.BooleanOptionalAction, default=True,
                   help="run on ortcpu_torch kernels and optimizer (default) or plain torch")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default=None, help="TensorBoard run directory (default: none)")
    args = p.parse_args()
    set_threads(args.threads)
    return args


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    ortcpu_torch.set_num_threads(n)


# ---- data shipped inside installed packages (no downloads) --------------------------------


def digits(seed: int, as_images: bool):
    """scikit-learn's digits: 1797 8x8 images, 10 classes; 80/20 train/test split."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    if as_images:
        x = x.view(-1, 1, 8, 8)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_test = len(x) // 5
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def stdlib_text() -> str:
    """English prose available offline: the docstrings of a fixed list of standard-library
    modules and their public classes and functions, in a fixed order."""
    import importlib

    names = ("argparse", "collections", "csv", "datetime", "decimal", "email.message",
             "fractions", "functools", "heapq", "http.client", "inspect", "itertools", "json",
             "logging", "os", "pathlib", "random", "shutil", "statistics", "string",
             "subprocess", "tarfile", "textwrap", "threading", "typing", "unittest", "zipfile")
    parts = []
    for mod in (importlib.import_module(n) for n in names):
        parts.append(inspect.getdoc(mod) or "")
        for name in sorted(vars(mod)):
            obj = getattr(mod, name)
            if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            doc = inspect.getdoc(obj)
            if doc:
                parts.append(doc)
    return "\n\n".join(p for p in parts if p)


class Batches:
    """Endless shuffled mini-batches of (x, y), reproducible from a seed."""

    def __init__(self, x, y, batch: int, seed: int):
        self.x, self.y, self.batch = x, y, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.perm, self.pos = torch.randperm(len(x), generator=self.gen), 0

    def __call__(self):
        if self.pos + self.batch > len(self.x):
            self.perm, self.pos = torch.randperm(len(self.x), generator=self.gen), 0
        idx = self.perm[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return self.x[idx], self.y[idx]


# ---- training loop -------------------------------------------------------------------------


@dataclass
class RunResult:
    losses: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    graph: str = ""  # ORTModule: what ran graph-wide or why it fell back to eager torch

    @property
    def median_step_ms(self) -> float:
        return statistics.median(self.step_ms[len(self.step_ms) // 10 :])  # skip warm-up


def grad_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


class Training:
    """One training run (zero_grad + forward + backward + step per batch) advanced a few
    steps at a time, so that the main job can interleave its sides and drift of the host's
    speed enters each side alike. Logs loss, learning rate and gradient norm every step and
    weight/gradient histograms every ``hist_every`` steps. Each run keeps its own state of
    torch's global generator (dropout masks), so interleaved runs draw what they would
    draw alone. ``finish(model, result)`` adds metrics when the run ends."""

    def __init__(self, model: torch.nn.Module, optimizer, next_batch: Callable,
                 loss_fn: Callable, steps: int, *, writer=None, desc: str = "train",
                 hist_every: int = 50, scheduler=None, progress: bool = True,
                 finish: Callable | None = None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.next_batch, self.loss_fn, self.steps = next_batch, loss_fn, steps
        self.writer, self.desc, self.hist_every, self.finish = writer, desc, hist_every, finish
        self.res = RunResult()
        self.rng = torch.get_rng_state()
        self.bar = tqdm(total=steps, desc=desc, disable=not progress, leave=False,
                        mininterval=0.5)

    @property
    def done(self) -> bool:
        return len(self.res.losses) >= self.steps

    def advance(self, n: int) -> None:
        """Up to ``n`` more steps."""
        outer = torch.get_rng_state()
        torch.set_rng_state(self.rng)
        self.model.train()
        try:
            for _ in range(min(n, self.steps - len(self.res.losses))):
                self._step()
        finally:
            self.rng = torch.get_rng_state()
            torch.set_rng_state(outer)

    def _step(self) -> None:
        model, optimizer, res, writer = self.model, self.optimizer, self.res, self.writer
        step = len(res.losses)
        x, y = self.next_batch()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        res.step_ms.append((time.perf_counter() - t0) * 1e3)
        value = loss.item()
        res.losses.append(value)
        if writer is not None:
            writer.add_scalar("loss/train", value, step)
            writer.add_scalar("lr", optimizer.param_groups[0]["lr"], step)
            writer.add_scalar("grad_norm", grad_norm(model), step)
            if step % self.hist_every == 0 or step == self.steps - 1:
                ortcpu_torch.summary.log_model(writer, model, step, weights=True, grads=True)
        self.bar.update(1)
        if step % 10 == 0:
            self.bar.set_postfix(loss=f"{value:.4f}")

    def result(self) -> RunResult:
        """The finished run's losses, step times and metrics."""
        self.bar.close()
        res = self.res
        if isinstance(self.model, ortcpu_torch.ORTModule):
            res.graph = self.model.report()
        if not all(math.isfinite(v) for v in res.losses):
            raise RuntimeError(f"{self.desc}: the loss became non-finite")
        if self.finish is not None:
            self.finish(self.model, res)
        return res

    def run(self) -> RunResult:
        """All remaining steps, then the result."""
        self.advance(self.steps)
        return self.result()


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


def side_name(wrap: bool | str) -> str:
    """The label of a ``wrap`` setting: torch, ortcpu (eager wrap) or ortmodule."""
    return "ortmodule" if wrap == "ortmodule" else ("ortcpu" if wrap else "torch")


def make_optimizer(model: torch.nn.Module, lr: float, wrap: bool | str):
    """torch's fused AdamW; with ``wrap=True`` the model is wrapped and the optimizer replaced
    by ortcpu_torch's through ``ortcpu_torch.optimize`` (the one-line change); with
    ``wrap="ortmodule"`` the model becomes ``ortcpu_torch.ORTModule(model)`` (captured and run
    graph-wide) and torch's fused AdamW updates its unchanged parameters."""
    if wrap == "ortmodule":
        model = ortcpu_torch.ORTModule(model)
        return model, torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    if wrap:
        model, optimizer = ortcpu_torch.optimize(model, optimizer)
    return model, optimizer


def summary_writer(log_dir: str | None):
    return ortcpu_torch.summary.SummaryWriter(log_dir) if log_dir else None


def print_final(name: str, res: RunResult) -> None:
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in res.metrics.items())
    print(f"{name}: final loss {res.losses[-1]:.4f}  {metrics}  "
          f"{res.median_step_ms:.2f} ms/step ({len(res.losses)} steps)")
