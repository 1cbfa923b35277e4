"""The main job (`make demo`): train the digits CNN and the character transformer twice
from the same seed -- plain torch with ``torch.optim.AdamW(fused=True)``, then the same
script after ``ortcpu_torch.optimize(model, optimizer)`` -- and compare loss curves,
accuracy and time per step. TensorBoard logs go to ``runs/`` and a figure to
``runs/demo.png``.

    python examples/main_job.py [--threads 2] [--cnn-steps 300] [--lm-steps 200]
"""

from __future__ import annotations

import argparse
import os
import pathlib
from types import SimpleNamespace

import torch

import _common as C
import char_transformer
import digits_cnn


def figure(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results) + 1, figsize=(5 * (len(results) + 1), 4))
    for ax, (name, (ref, ours)) in zip(axes, results.items(), strict=False):
        ax.plot(ref.losses, label="torch", lw=1.2)
        ax.plot(ours.losses, label="ortcpu_torch", lw=1.2, ls="--")
        ax.set_title(f"{name}: training loss")
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend()
    ax = axes[-1]
    names = list(results)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [results[n][0].median_step_ms for n in names], 0.4,
           label="torch")
    ax.bar([x + 0.2 for x in xs], [results[n][1].median_step_ms for n in names], 0.4,
           label="ortcpu_torch")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("median ms / training step")
    ax.set_title("time per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--cnn-steps", type=int, default=300)
    p.add_argument("--lm-steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default="runs")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    C.set_threads(args.threads)
    log_dir = pathlib.Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)

    jobs = {
        # dropout off in the comparison: ours and torch draw different dropout masks, which
        # would make the two loss curves differ by noise rather than by arithmetic
        "digits_cnn": (digits_cnn.run, SimpleNamespace(steps=args.cnn_steps, batch=64, lr=3e-3,
                                                       seed=args.seed), {"dropout": 0.0}),
        "char_transformer": (char_transformer.run,
                             SimpleNamespace(steps=args.lm_steps, batch=32, lr=3e-3,
                                             seed=args.seed), {}),
    }
    results = {}
    for name, (run, run_args, extra) in jobs.items():
        pair = []
        for wrap in (False, True):
            tag = "ortcpu_torch" if wrap else "torch"
            writer = C.summary_writer(os.fspath(log_dir / name / tag))
            pair.append(run(run_args, wrap=wrap, writer=writer, progress=args.progress, **extra))
            writer.close()
        results[name] = tuple(pair)

    print(f"\nmain job: {args.threads} threads, torch {torch.__version__}")
    header = (f"{'model':<18}{'final loss torch/ours':>24}{'max |Δ loss|':>14}"
              f"{'metric torch/ours':>26}{'ms/step torch/ours':>22}{'speed-up':>10}")
    print(header)
    print("-" * len(header))
    for name, (ref, ours) in results.items():
        diff = max(abs(a - b) for a, b in zip(ref.losses, ours.losses, strict=True))
        key = next(iter(ref.metrics))
        print(f"{name:<18}{ref.losses[-1]:>12.4f}/{ours.losses[-1]:<11.4f}{diff:>14.2e}"
              f"{key:>12} {ref.metrics[key]:.4f}/{ours.metrics[key]:<7.4f}"
              f"{ref.median_step_ms:>11.2f}/{ours.median_step_ms:<10.2f}"
              f"{ref.median_step_ms / ours.median_step_ms:>9.2f}x")
    fig_path = log_dir / "demo.png"
    figure(results, fig_path)
    print(f"\nfigure: {fig_path}")
    print(f"TensorBoard logs: tensorboard --logdir {log_dir}")


if __name__ == "__main__":
    main()
