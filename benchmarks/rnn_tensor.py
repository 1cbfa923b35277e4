"""ortcpu_torch vs PyTorch eager: LSTM, GRU and Embedding, forward + backward, float32.

    python -m benchmarks.rnn_tensor [--quick] [--threads 2,1] [name filter ...]

Each step is what a training loop runs: module forward, ``.sum().backward()``, gradients
reset; both sides get the same module weights. Cases:

- ``lstm_x`` / ``gru_x``: ``nn.LSTM(256, 256)`` / ``nn.GRU(256, 256)`` on seq 32 x batch
  32 with the input a plain data tensor (no input gradient, as the first layer of a model
  sees it); ``_xgrad``: the same with ``x.requires_grad_()`` (as any layer above the
  first). Target (issue 18, from the RNN issue): >= 1.0x torch, 2 threads.
- ``lstm_l2bi`` / ``gru_l2bi``: the same shapes with ``num_layers=2, bidirectional=True``
  and an input gradient. Target >= 1.0x.
- ``lstm_ts`` / ``gru_ts``: the shapes of ``benchmarks.train_step``'s lstm case,
  ``LSTM(28, 128, batch_first=True)`` over 28 rows, batch 64, data input. The LSTM is
  nearly all of that model's step, and the wrap runs ours only where it measures ours
  faster, so this case carries train_step's lstm target (>= 1.1x) for the LSTM; the GRU
  at the same shapes is for comparison (>= 1.0x).
- ``embedding``: ``nn.Embedding(50000, 512)`` on 16384 indices (>= 1.5x).

Ours and torch alternate step by step in several rounds; each time is the median after
warm-up and the ratio is torch / ours from the same run. Targets apply at 2 threads (wall
time). At 1 thread the CPU time of the step (``time.thread_time``) is measured as well:
it is less sensitive to other processes than wall time. The share of the machine's CPU
time other processes used meanwhile is reported: on a shared 2-core machine a 2-thread
ratio taken while others run means little. Results:
``benchmarks/results/rnn_tensor.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass

import torch

import ortcpu_torch
from ortcpu_torch import nn as onn

from ._util import ForeignLoad, isa_info, isa_line

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BUSY_SHARE = 0.05  # other processes' CPU share above which a row is flagged


@dataclass(frozen=True)
class RNNCase:
    kind: str  # "LSTM" | "GRU"
    input_size: int
    hidden: int
    seq: int
    batch: int
    target: float
    layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False
    xgrad: bool = False

    def describe(self) -> str:
        extra = "".join([f", num_layers={self.layers}" if self.layers > 1 else "",
                         ", bidirectional" if self.bidirectional else "",
                         ", batch_first" if self.batch_first else ""])
        return (f"{self.kind}({self.input_size}, {self.hidden}{extra}) seq {self.seq} x "
                f"batch {self.batch}{', input grad' if self.xgrad else ''}")

    def make(self):
        kw = {"num_layers": self.layers, "bidirectional": self.bidirectional,
              "batch_first": self.batch_first}
        tm = getattr(torch.nn, self.kind)(self.input_size, self.hidden, **kw)
        om = getattr(onn, self.kind)(self.input_size, self.hidden, **kw)
        om.load_state_dict(tm.state_dict())
        shape = ((self.batch, self.seq) if self.batch_first else (self.seq, self.batch))
        x = torch.randn(*shape, self.input_size, requires_grad=self.xgrad)

        def step(m):
            def f():
                y = m(x)[0]
                y.sum().backward()
                m.zero_grad(set_to_none=True)
                x.grad = None
            return f
        return step(tm), step(om)


class EmbeddingCase:
    target = 1.5

    @staticmethod
    def describe() -> str:
        return "Embedding(50000, 512) on 16384 indices"

    @staticmethod
    def make():
        tm = torch.nn.Embedding(50000, 512)
        om = onn.Embedding(50000, 512)
        om.load_state_dict(tm.state_dict())
        idx = torch.randint(0, 50000, (16384,))

        def step(m):
            def f():
                m(idx).sum().backward()
                m.weight.grad = None
            return f
        return step(tm), step(om)


CASES = {
    "lstm_x": RNNCase("LSTM", 256, 256, 32, 32, 1.0),
    "lstm_xgrad": RNNCase("LSTM", 256, 256, 32, 32, 1.0, xgrad=True),
    "lstm_l2bi": RNNCase("LSTM", 256, 256, 32, 32, 1.0, layers=2, bidirectional=True,
                         xgrad=True),
    "lstm_ts": RNNCase("LSTM", 28, 128, 28, 64, 1.1, batch_first=True),
    "gru_x": RNNCase("GRU", 256, 256, 32, 32, 1.0),
    "gru_xgrad": RNNCase("GRU", 256, 256, 32, 32, 1.0, xgrad=True),
    "gru_l2bi": RNNCase("GRU", 256, 256, 32, 32, 1.0, layers=2, bidirectional=True,
                        xgrad=True),
    "gru_ts": RNNCase("GRU", 28, 128, 28, 64, 1.0, batch_first=True),
    "embedding": EmbeddingCase(),
}


def measure(name: str, threads: int, rounds: int, per_round: int) -> dict:
    torch.set_num_threads(threads)
    ortcpu_torch.set_num_threads(threads)
    case = CASES[name]
    f_torch, f_ours = case.make()
    for _ in range(3):
        f_torch()
        f_ours()
    wall = {"torch": [], "ours": []}
    cpu = {"torch": [], "ours": []}
    load = ForeignLoad()
    for _ in range(rounds):
        for _ in range(per_round):
            for side, f in (("torch", f_torch), ("ours", f_ours)):
                c0, t0 = time.thread_time(), time.perf_counter()
                f()
                wall[side].append(time.perf_counter() - t0)
                cpu[side].append(time.thread_time() - c0)
    share = load.report()["foreign_share"]
    mt, mo = statistics.median(wall["torch"]), statistics.median(wall["ours"])
    row = {"case": name, "what": case.describe(), "threads": threads,
           "torch_ms": mt * 1e3, "ours_ms": mo * 1e3, "ratio": mt / mo,
           "target": case.target if threads == 2 else None, "foreign_cpu_share": share,
           "samples": len(wall["torch"])}
    if threads == 1:  # one thread: its CPU time is the step's whole CPU cost
        ct, co = statistics.median(cpu["torch"]), statistics.median(cpu["ours"])
        row.update(torch_cpu_ms=ct * 1e3, ours_cpu_ms=co * 1e3, cpu_ratio=ct / co)
    if row["target"] is not None:
        row["met"] = row["ratio"] >= row["target"]
    return row


def _verdict(r: dict) -> str:
    if r.get("target") is None:
        return "—"
    return f"≥ {r['target']}×: {'met' if r['met'] else 'NOT MET'}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("filters", nargs="*")
    a = ap.parse_args(argv)
    names = [n for n in CASES if not a.filters or any(f in n for f in a.filters)]
    rounds, per_round = (3, 3) if a.quick else (5, 6)
    print(isa_line(), flush=True)
    rows = []
    for th in [int(t) for t in a.threads.split(",")]:
        for n in names:
            r = measure(n, th, rounds, per_round)
            rows.append(r)
            cpu = (f"  cpu torch {r['torch_cpu_ms']:7.2f} ours {r['ours_cpu_ms']:7.2f} "
                   f"ratio {r['cpu_ratio']:5.2f}" if "cpu_ratio" in r else "")
            busy = "  BUSY MACHINE" if r["foreign_cpu_share"] > BUSY_SHARE else ""
            print(f"{n:11s} threads={th} torch {r['torch_ms']:8.2f} ms  ours "
                  f"{r['ours_ms']:8.2f} ms  ratio {r['ratio']:5.2f}{cpu}  "
                  f"target {_verdict(r)}  other processes used "
                  f"{100 * r['foreign_cpu_share']:.0f}% of the CPU{busy}", flush=True)
    targeted = [r for r in rows if r.get("target") is not None]
    if targeted:
        missed = [r["case"] for r in targeted if not r["met"]]
        print(f"targets (2 threads): {len(targeted) - len(missed)}/{len(targeted)} met"
              + (f"; NOT MET: {', '.join(missed)}" if missed else ""))
    if any(r["foreign_cpu_share"] > BUSY_SHARE for r in rows):
        print("WARNING: other processes were running; the ratios are unreliable")
    os.makedirs(RESULTS, exist_ok=True)
    # a quick or filtered run must not replace the full table the README shows
    stem = "rnn_tensor_partial" if a.quick or a.filters else "rnn_tensor"
    with open(os.path.join(RESULTS, stem + ".json"), "w") as f:
        json.dump({"machine": isa_info(), "load_avg": os.getloadavg(), "rows": rows}, f,
                  indent=1)
    with open(os.path.join(RESULTS, stem + ".md"), "w") as f:
        f.write(isa_line() + "\n\n")
        f.write("| case | shapes | threads | torch ms | ours ms | torch ÷ ours | "
                "1-thread CPU time torch ÷ ours | target | other CPU |\n")
        f.write("|---|---|---:|---:|---:|---:|---:|---|---:|\n")
        for r in rows:
            cpu = f"{r['cpu_ratio']:.2f}×" if "cpu_ratio" in r else "—"
            f.write(f"| {r['case']} | {r['what']} | {r['threads']} | {r['torch_ms']:.1f} | "
                    f"{r['ours_ms']:.1f} | {r['ratio']:.2f}× | {cpu} | {_verdict(r)} | "
                    f"{100 * r['foreign_cpu_share']:.0f}% |\n")
        la = os.getloadavg()
        f.write(f"\nMedian of {rounds * per_round} alternating steps per row after warm-up; "
                f"load average {la[0]:.2f} at the end (2 cores). Targets apply at 2 "
                "threads. \"other CPU\": share of the machine's CPU time used by other "
                "processes during the row.\n")


if __name__ == "__main__":
    main()
