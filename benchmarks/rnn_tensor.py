"""ortcpu_torch vs PyTorch eager: LSTM, GRU and Embedding, forward + backward, float32.

    python -m benchmarks.rnn_tensor [--quick] [--threads 1,2] [name filter ...]

Cases (issue 6): ``nn.LSTM(256, 256)`` and ``nn.GRU(256, 256)`` on seq 32 x batch 32,
``nn.Embedding(50000, 512)`` on 16384 indices. Each step is what a training loop runs:
module forward, ``.sum().backward()``, gradients reset. The RNN cases run twice: with the
input a plain data tensor (``x``: no input gradient, as the first layer of a model sees
it) and with ``x.requires_grad_()`` (``xgrad``: the input gradient is computed too, as
for any layer above the first). Both sides get the same module weights.

Ours and torch alternate step by step in several rounds, each time is the median after
warm-up and the ratio is torch ÷ ours from the same run. The share of the machine's CPU
time other processes used meanwhile is reported: on a shared 2-core machine a 2-thread
ratio taken while others run means little. Results: ``benchmarks/results/rnn_tensor.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import ortcpu_torch
from ortcpu_torch import nn as onn

from ._util import ForeignLoad, isa_info, isa_line

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TARGETS = {"lstm_x": 1.0, "lstm_xgrad": 1.0, "gru_x": 1.0, "gru_xgrad": 1.0,
           "embedding": 1.5}


def _rnn_case(kind: str, xgrad: bool):
    def make():
        tm = getattr(torch.nn, kind)(256, 256)
        om = getattr(onn, kind)(256, 256)
        om.load_state_dict(tm.state_dict())
        x = torch.randn(32, 32, 256, requires_grad=xgrad)

        def step(m):
            def f():
                y = m(x)[0]
                y.sum().backward()
                m.zero_grad(set_to_none=True)
                x.grad = None
            return f
        return step(tm), step(om)
    return make


def _embedding_case():
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
    "lstm_x": _rnn_case("LSTM", False),
    "lstm_xgrad": _rnn_case("LSTM", True),
    "gru_x": _rnn_case("GRU", False),
    "gru_xgrad": _rnn_case("GRU", True),
    "embedding": _embedding_case,
}


def measure(name: str, threads: int, rounds: int, per_round: int) -> dict:
    torch.set_num_threads(threads)
    ortcpu_torch.set_num_threads(threads)
    f_torch, f_ours = CASES[name]()
    for _ in range(3):
        f_torch()
        f_ours()
    ts_t, ts_o = [], []
    load = ForeignLoad()
    for _ in range(rounds):
        for _ in range(per_round):
            t0 = time.perf_counter()
            f_torch()
            t1 = time.perf_counter()
            f_ours()
            t2 = time.perf_counter()
            ts_t.append(t1 - t0)
            ts_o.append(t2 - t1)
    share = load.report()["foreign_share"]
    mt, mo = statistics.median(ts_t), statistics.median(ts_o)
    return {"case": name, "threads": threads, "torch_ms": mt * 1e3, "ours_ms": mo * 1e3,
            "ratio": mt / mo, "target": TARGETS.get(name), "foreign_cpu_share": share,
            "samples": len(ts_t), "min_ratio_of_mins": min(ts_t) / min(ts_o)}


def _tgt(r: dict, threads: int) -> str:
    return "" if r["target"] is None or threads != 2 else f" (target {r['target']})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("filters", nargs="*")
    a = ap.parse_args(argv)
    names = [n for n in CASES if not a.filters or any(f in n for f in a.filters)]
    rounds, per_round = (3, 3) if a.quick else (5, 6)
    rows = []
    for th in [int(t) for t in a.threads.split(",")]:
        for n in names:
            r = measure(n, th, rounds, per_round)
            rows.append(r)
            print(f"{n:12s} threads={th} torch {r['torch_ms']:8.2f} ms  ours "
                  f"{r['ours_ms']:8.2f} ms  ratio {r['ratio']:5.2f}"
                  f"{_tgt(r, th)}"
                  f"  other processes used {100 * r['foreign_cpu_share']:.0f}% of the CPU",
                  flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    # a quick or filtered run must not replace the full table the README shows
    stem = "rnn_tensor_partial" if a.quick or a.filters else "rnn_tensor"
    with open(os.path.join(RESULTS, stem + ".json"), "w") as f:
        json.dump({"machine": isa_info(), "load_avg": os.getloadavg(), "rows": rows}, f,
                  indent=1)
    with open(os.path.join(RESULTS, stem + ".md"), "w") as f:
        f.write(isa_line() + "\n\n")
        f.write("| case | threads | torch ms | ours ms | torch ÷ ours | target | other CPU |\n")
        f.write("|---|---:|---:|---:|---:|---:|---:|\n")
        for r in rows:
            tgt = f"≥ {r['target']}×" if r["target"] and r["threads"] == 2 else "—"
            f.write(f"| {r['case']} | {r['threads']} | {r['torch_ms']:.1f} | "
                    f"{r['ours_ms']:.1f} | {r['ratio']:.2f}× | {tgt} | "
                    f"{100 * r['foreign_cpu_share']:.0f}% |\n")
        la = os.getloadavg()
        f.write(f"\nMedian of {rounds * per_round} alternating steps per row after warm-up; "
                f"load average {la[0]:.2f} at the end (2 cores). \"other CPU\": share of "
                "the machine's CPU time used by other processes during the row.\n")

if __name__ == "__main__":
    main()
