"""ortcpu_torch.training.api vs onnxruntime.training.api (1.19.2) on the same artifacts.

    python -m benchmarks.training_api [--quick] [--threads 1,2] [--steps 30]
                                      [--generator ort|ours] [case ...]

One training step = ``module(x, y)`` + ``optimizer.step()`` + ``module.lazy_reset_grad()``,
timed on the same artifact files with both libraries in one process, steps alternating
between them. Cases (float32, AdamW unless noted):

- ``mlp``: 784-1024-1024-10 MLP, CrossEntropy, batch 128;
- ``cnn``: two [Conv 3x3 + BatchNorm + ReLU + MaxPool 2] blocks (1->16->32 channels),
  Linear(32*7*7 -> 10) on 28x28 images, CrossEntropy, SGD, batch 64;
- ``gru``: GRU(32 -> 128) over 32 steps, Linear(128 -> 10), MSE, batch 64.

The ONNX models are captured with ``ortcpu_torch.graph.export(train=True)``; the artifacts come
from ORT's own ``generate_artifacts`` (``--generator ort``, the default: what applications
built on ORT have) or from ours. ORT's sessions get ``session.intra_op.allow_spinning = 0``:
ORT's pool threads otherwise spin after every run and, on 2 cores, starve the other
library's threads. For the same reason ours (OpenMP) runs with ``OMP_WAIT_POLICY=PASSIVE``
unless ``--spin`` is given: on this loaded 2-core machine, OpenMP's default spin-then-sleep
made our 2-thread MLP step 6x slower (555 vs 91 ms), every parallel region waiting for a
worker thread that had no CPU. Target: ours >= 1.5x ORT on each case. The foreign CPU share (other
processes on this shared machine) is reported; above ~5% the 2-thread numbers are
unreliable. Writes ``benchmarks/results/training_api.{json,md}`` (a filter or ``--quick``:
``training_api_partial.*``).
"""

from __future__ import annotations

import os
import sys

# Neither library's threads spin while idle: ORT's sessions get allow_spinning = 0 below,
# and OpenMP (ours and torch's, one libgomp) the passive wait policy. It must be set before
# libgomp starts, i.e. before torch is imported; --spin keeps OpenMP's default.
if "--spin" not in sys.argv and "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402

from ortcpu_torch.graph import export  # noqa: E402

from ._util import ForeignLoad, machine_info, set_threads, write_results  # noqa: E402

TARGET = 1.5


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(784, 1024), torch.nn.Linear(1024, 1024),
                                        torch.nn.Linear(1024, 10))

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        def block(cin, cout):
            return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, padding=1),
                                       torch.nn.BatchNorm2d(cout), torch.nn.ReLU(),
                                       torch.nn.MaxPool2d(2))

        self.features = torch.nn.Sequential(block(1, 16), block(16, 32))
        self.fc = torch.nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class GRU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(32, 128, batch_first=True)
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x):
        _, h = self.gru(x)
        return self.fc(h[-1])


def _cases():
    rng = np.random.default_rng(0)
    return {
        "mlp": (MLP, (128, 784), "CrossEntropyLoss", "AdamW",
                (rng.standard_normal((128, 784)).astype(np.float32),
                 rng.integers(0, 10, 128).astype(np.int64))),
        "cnn": (CNN, (64, 1, 28, 28), "CrossEntropyLoss", "SGD",
                (rng.standard_normal((64, 1, 28, 28)).astype(np.float32),
                 rng.integers(0, 10, 64).astype(np.int64))),
        "gru": (GRU, (64, 32, 32), "MSELoss", "AdamW",
                (rng.standard_normal((64, 32, 32)).astype(np.float32),
                 rng.standard_normal((64, 10)).astype(np.float32))),
    }


def _artifacts(folder, make, shape, loss, optim, generator) -> None:
    torch.manual_seed(0)
    model = make().train()
    path = os.path.join(folder, "model.onnx")
    graph = export(model, (torch.zeros(shape),), path, train=True)
    params = [n for n, _ in model.named_parameters()]
    if generator == "ort":
        from onnxruntime.training import artifacts as gen
    else:
        from ortcpu_torch.training import artifacts as gen
    gen.generate_artifacts(onnx.load(path), requires_grad=params,
                           loss=gen.LossType[loss], optimizer=gen.OptimType[optim],
                           artifact_directory=folder,
                           loss_input_names=graph.user_outputs[:1])
    opt_path = os.path.join(folder, "optimizer_model.onnx")
    opt = onnx.load(opt_path)  # ORT's generator writes onnx's IR version, which ORT refuses
    opt.ir_version = min(opt.ir_version, 10)
    onnx.save(opt, opt_path)


def _step_fn(lib, folder, batch, session_options=None):
    kw = {} if session_options is None else {"session_options": session_options}
    state = lib.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
    module = lib.Module(os.path.join(folder, "training_model.onnx"), state, **kw)
    opt = lib.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)

    def step():
        module(*batch)
        opt.step()
        module.lazy_reset_grad()
    return step


def measure(name, case, threads, steps, generator) -> dict:
    import onnxruntime
    from onnxruntime.training import api as ort_api

    from ortcpu_torch.training import api

    make, shape, loss, optim, batch = case
    with tempfile.TemporaryDirectory() as folder:
        _artifacts(folder, make, shape, loss, optim, generator)
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        fns = {"ours": _step_fn(api, folder, batch), "ort": _step_fn(ort_api, folder, batch, so)}
        for fn in fns.values():
            for _ in range(3):
                fn()
        times = {k: [] for k in fns}
        cpu = {k: [] for k in fns}
        load = ForeignLoad()
        for _ in range(steps):
            for k, fn in fns.items():
                t, c = time.perf_counter(), time.thread_time()
                fn()
                cpu[k].append(time.thread_time() - c)
                times[k].append(time.perf_counter() - t)
    ours, ort = (statistics.median(times[k]) * 1e3 for k in ("ours", "ort"))
    row = {"case": name, "threads": threads, "ours_ms": round(ours, 2), "ort_ms": round(ort, 2),
           "ort/ours": round(ort / ours, 2), "target": TARGET, **load.report()}
    if threads == 1:  # all work is on the calling thread: its CPU time ignores other load
        row["cpu_ratio"] = round(statistics.median(cpu["ort"]) / statistics.median(cpu["ours"]),
                                 2)
    print(f"{name:4s} {threads} thr: ours {ours:8.2f} ms  ORT {ort:8.2f} ms  "
          f"ORT/ours {ort / ours:5.2f}x"
          + (f" (CPU time {row['cpu_ratio']:.2f}x)" if "cpu_ratio" in row else "")
          + f"  (foreign CPU share {row['foreign_share']:.0%})", flush=True)
    return row


def _markdown(rows, info, args) -> str:
    lines = [
        "<!-- generated by `python -m benchmarks.training_api`; do not edit by hand -->",
        f"One training step (Module call + Optimizer step + lazy_reset_grad) on the same "
        f"artifacts (generated by {'ORT' if args.generator == 'ort' else 'ortcpu_torch'}), "
        f"ortcpu_torch.training.api vs onnxruntime-training 1.19.2 in one process, steps "
        f"alternating, median of {args.steps}; ORT sessions with "
        f"`session.intra_op.allow_spinning = 0`, ours with OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', '(default)')}. {info['cpu']}, {info['cpus']} CPUs, "
        f"torch {info['torch']}, commit {info['commit']}, {info['date']}, load average "
        f"{info['loadavg']}. ORT/ours > 1: ours faster. "
        f"CPU time (1 thread only): ORT/ours of the calling thread's CPU time, which other "
        f"processes' load does not inflate. foreign: CPU share used by other processes "
        f"during the row.", "",
        "| case | threads | ours ms | ORT ms | ORT/ours | CPU time | target | foreign |",
        "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        cpu = f"{r['cpu_ratio']:.2f}x" if "cpu_ratio" in r else ""
        lines.append(f"| {r['case']} | {r['threads']} | {r['ours_ms']:.2f} | {r['ort_ms']:.2f} "
                     f"| {r['ort/ours']:.2f}x | {cpu} | ≥ {r['target']:.1f}x | "
                     f"{r['foreign_share']:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help="subset of: mlp cnn gru")
    p.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")], default=[2],
                   help="thread counts, comma-separated (default: 2)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--generator", choices=("ort", "ours"), default="ort")
    p.add_argument("--quick", action="store_true", help="10 steps")
    p.add_argument("--spin", action="store_true",
                   help="keep OpenMP's default wait policy (spin, then sleep)")
    args = p.parse_args()
    if args.quick:
        args.steps = 10
    logging.getLogger().setLevel(logging.WARNING)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    print("ORT sessions use session.intra_op.allow_spinning = 0 (no spin-waiting after runs); "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(default)')} for ours")
    cases = _cases()
    names = args.cases or list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {list(cases)}")
    rows = []
    for threads in args.threads:
        set_threads(threads)
        for name in names:
            rows.append(measure(name, cases[name], threads, args.steps, args.generator))
    info = machine_info()
    stem = "training_api" if not args.cases and not args.quick else "training_api_partial"
    write_results(stem, {"machine": info, "rows": rows, "generator": args.generator},
                  _markdown(rows, {**info, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime())}, args))


if __name__ == "__main__":
    main()
