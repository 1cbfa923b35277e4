"""The main job (`make demo`): train the digits CNN and the character transformer three
times from the same seed -- plain torch with ``torch.optim.AdamW(fused=True)``, the same
script after ``ortcpu_torch.optimize(model, optimizer)`` (eager wrap), and with
``ortcpu_torch.ORTModule(model)`` (captured, forward + backward graph-wide on our kernels,
torch's fused AdamW) -- and compare loss curves, accuracy and time per step. The three sides
of a model run interleaved, ``--block`` steps each in turn, so that drift of the host's
speed during the job enters every side alike. If ORTModule falls back to eager torch on a
model (or fails), the job still completes and says so.
TensorBoard logs go to ``runs/`` and a figure to ``runs/demo.png``.

    python examples/main_job.py [--threads 2] [--cnn-steps 300] [--lm-steps 200] [--block 10]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import traceback
import warnings
from types import SimpleNamespace

import torch

import ortcpu_torch

import _common as C
import char_transformer
import digits_cnn


def figure(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results) + 1, figsize=(5 * (len(results) + 1), 4))
    for ax, (name, sides) in zip(axes, results.items(), strict=False):
        for (label, res), ls in zip(sides.items(), ("-", "--", ":"), strict=False):
            if res is not None:
                ax.plot(res.losses, label=label, lw=1.2, ls=ls)
        ax.set_title(f"{name}: training loss")
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend()
    ax = axes[-1]
    names = list(results)
    xs = range(len(names))
    width = 0.8 / len(SIDES)
    for k, label in enumerate(SIDES):
        ax.bar([x - 0.4 + width * (k + 0.5) for x in xs],
               [results[n][label].median_step_ms if results[n][label] else 0 for n in names],
               width, label=label)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("median ms / training step")
    ax.set_title("time per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


SIDES = {"torch": False, "ortcpu (eager wrap)": True, "ORTModule": "ortmodule"}


class Side:
    """One side of a model's comparison. For ORTModule a fallback warning or a failure is
    recorded, not fatal: the job goes on with the other sides and models."""

    def __init__(self, session, run_args, wrap, writer, progress, extra):
        self.wrap, self.note, self.caught = wrap, "", []
        self.training = self._guarded(session, run_args, wrap=wrap, writer=writer,
                                      progress=progress, **extra) or None

    @property
    def running(self) -> bool:
        return self.training is not None and not self.training.done

    def advance(self, n: int) -> None:
        if self._guarded(self.training.advance, n) is False:
            self.training = None

    def result(self):
        res = self._guarded(self.training.result) if self.training else None
        if not res:
            return None
        if self.wrap == "ortmodule" and not self.note:
            fell_back = [str(w.message) for w in self.caught
                         if issubclass(w.category, ortcpu_torch.FallbackWarning)]
            self.note = ("fell back to eager torch: " + fell_back[0]) if fell_back else \
                res.graph.splitlines()[0].split(";")[0]
        return res

    def _guarded(self, fn, *args, **kwargs):
        if self.wrap != "ortmodule":
            return fn(*args, **kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ortcpu_torch.FallbackWarning)
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # the demo reports it and goes on
                traceback.print_exc()
                self.note = f"ORTModule FAILED: {type(e).__name__}: {e}"
                return False
            finally:
                self.caught += caught


def interleave(sides: dict, block: int) -> None:
    """Runs the sides ``block`` steps at a time in turn, the order reversed every round,
    until all have finished: the host's speed drifts over a run (other VMs, page placement),
    and interleaving lets each side see the same drift."""
    order = list(sides.values())
    while any(s.running for s in order):
        for side in order:
            if side.running:
                side.advance(block)
        order.reverse()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--cnn-steps", type=int, default=300)
    p.add_argument("--lm-steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block", type=int, default=10,
                   help="steps each side runs before the next side's turn")
    p.add_argument("--log-dir", default="runs")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    C.set_threads(args.threads)
    log_dir = pathlib.Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)

    jobs = {
        # dropout off in the comparison: ours and torch draw different dropout masks, which
        # would make the two loss curves differ by noise rather than by arithmetic
        "digits_cnn": (digits_cnn.session, SimpleNamespace(steps=args.cnn_steps, batch=64, lr=3e-3,
                                                       seed=args.seed), {"dropout": 0.0}),
        "char_transformer": (char_transformer.session,
                             SimpleNamespace(steps=args.lm_steps, batch=32, lr=3e-3,
                                             seed=args.seed), {}),
    }
    results, notes = {}, {}
    for name, (session, run_args, extra) in jobs.items():
        writers = {label: C.summary_writer(os.fspath(log_dir / name / C.side_name(wrap)))
                   for label, wrap in SIDES.items()}
        sides = {label: Side(session, run_args, wrap, writers[label], args.progress, extra)
                 for label, wrap in SIDES.items()}
        interleave(sides, args.block)
        results[name] = {label: side.result() for label, side in sides.items()}
        for label, side in sides.items():
            writers[label].close()
            if side.note:
                notes[name] = side.note

    print(f"\nmain job: {args.threads} threads, torch {torch.__version__}; loss curves "
          f"compared step by step with plain torch")
    header = (f"{'model':<18}{'side':<21}{'final loss':>11}{'max |Δ loss|':>14}"
              f"{'metric':>20}{'ms/step':>9}{'speed-up':>10}")
    print(header)
    print("-" * len(header))
    for name, sides in results.items():
        ref = sides["torch"]
        key = next(iter(ref.metrics))
        for label, res in sides.items():
            if res is None:
                print(f"{name:<18}{label:<21}{'(failed, see below)':>11}")
                continue
            diff = max(abs(a - b) for a, b in zip(ref.losses, res.losses, strict=True))
            print(f"{name:<18}{label:<21}{res.losses[-1]:>11.4f}{diff:>14.2e}"
                  f"{key:>12} {res.metrics[key]:.4f}{res.median_step_ms:>9.2f}"
                  f"{ref.median_step_ms / res.median_step_ms:>9.2f}x")
    for name, note in notes.items():
        print(f"ORTModule on {name}: {note}")
    fig_path = log_dir / "demo.png"
    figure(results, fig_path)
    print(f"\nfigure: {fig_path}")
    print(f"TensorBoard logs: tensorboard --logdir {log_dir}")


if __name__ == "__main__":
    main()
