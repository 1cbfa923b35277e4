"""Distributed benchmarks (issue 9), launched through ``mpiexec`` from this driver.

    python -m benchmarks.distributed [--quick] [--blocks 7] [--steps 10]

1. ``allreduce_`` of 64 MB float32 on 2 local ranks vs a raw mpi4py
   ``Allreduce(IN_PLACE)`` of the same buffer (target: >= 0.9x its throughput).
2. DataParallel training on digits (the model of ``examples/ddp_digits.py``, global
   batch 64) as 1 process x 1 thread, 1 process x 2 threads, and 2 ranks x 1 thread in
   each overlap mode (``benchmarks/_ddp_worker.py``: the modes alternate block by block
   in one job). Cases: the digits CNN with one 25 MB bucket (the whole model) and with
   0.25 MB buckets, and a wide digits MLP (hidden 2048, 17 MB of gradients) where the
   allreduce is large enough for overlap to matter, and a deep 1024-wide MLP with one
   4 MB bucket per layer, where backward is long enough to overlap. Reports samples/s, the scaling
   efficiency (2 ranks vs 2x one 1-thread process) and the allreduce time left waiting
   after backward (``DataParallel.stats``), which is what overlap hides.

Each number is a median over interleaved blocks; the CPU time other processes used
meanwhile is recorded (this 2-core machine is shared).
Writes ``benchmarks/results/distributed.{json,md}`` (``--quick`` or ``--case``:
``distributed_partial.{json,md}``, not committed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ._util import ForeignLoad, isa_info, isa_line

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def env(threads: int) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = str(threads)
    return e


def bench_allreduce(reps: int) -> dict:
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
           str(ROOT / "benchmarks" / "_allreduce_worker.py"), str(64 << 20), str(reps)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env(1), timeout=600,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_worker(ranks: int, threads: int, model: str, bucket_mb: float, blocks: int,
               steps: int, gbatch: int = 64) -> dict:
    script = str(ROOT / "benchmarks" / "_ddp_worker.py")
    args = [model, str(gbatch), str(bucket_mb), str(blocks), str(steps), str(threads)]
    if ranks == 1:
        cmd = [sys.executable, script, *args]
    else:
        cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", script, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env(threads), timeout=900,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# (model, bucket_mb): the digits CNN (0.28 M params, one 1.1 MB bucket at 25 MB; three at
# 0.25 MB), a wide digits MLP (hidden 2048: 4.3 M params, 17 MB of gradients) where
# communication is large enough for overlap to matter; and a deep 1024-wide MLP (5.3 M
# params, 4 MB buckets: one per layer) where backward is long enough to overlap
CASES = [("cnn", 25.0), ("cnn", 0.25), ("mlp2048", 4.0), ("deep", 4.0)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer blocks and repetitions")
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--case", action="append", default=None,
                   help="only these models (cnn, mlp2048, deep); repeatable")
    args = p.parse_args()
    blocks, reps = (3, 8) if args.quick else (args.blocks, 20)
    load = ForeignLoad()

    ar = bench_allreduce(reps)
    print(f"allreduce_ 64 MB, 2 ranks: raw mpi4py {ar['GB_per_s']['raw_mpi4py']} GB/s, "
          f"allreduce_ sum {ar['GB_per_s']['allreduce_sum']} GB/s "
          f"(x{ar['ratio_vs_raw']['allreduce_sum']}), mean {ar['GB_per_s']['allreduce_mean']}"
          f" GB/s (x{ar['ratio_vs_raw']['allreduce_mean']})", flush=True)

    rows = []
    for model, bucket_mb in CASES:
        if args.case and model not in args.case:
            continue
        one = run_worker(1, 1, model, bucket_mb, blocks, args.steps)
        two_thr = run_worker(1, 2, model, bucket_mb, blocks, args.steps)
        ddp = run_worker(2, 1, model, bucket_mb, blocks, args.steps)
        s1, s2 = one["samples_s"]["False"], two_thr["samples_s"]["False"]
        row = {"model": model, "params": ddp["params"], "bucket_mb": bucket_mb,
               "buckets": ddp["buckets"], "1proc_1thr": s1, "1proc_2thr": s2}
        for mode, label in (("poll", "overlap"), ("thread", "overlap_thread"),
                            ("False", "no_overlap")):
            s = ddp["samples_s"][mode]
            row[f"2rank_{label}"] = s
            row[f"2rank_{label}_wait_ms"] = ddp["wait_ms"][mode]
            row[f"2rank_{label}_vs_1proc_2thr"] = round(s / s2, 3)
            row[f"2rank_{label}_scaling_eff"] = round(s / (2 * s1), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"machine": isa_info(), "allreduce": ar, "global_batch": 64, "blocks": blocks,
              "steps_per_block": args.steps, "ddp": rows, "load": load.report(),
              "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "distributed_partial" if (args.quick or args.case) else "distributed"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = ["# Distributed benchmarks", "", isa_line(result["machine"]), "",
          f"`python -m benchmarks.distributed{' --quick' if args.quick else ''}` — "
          f"{result['when']}; other processes used {result['load']['foreign_share']:.0%} of "
          "the machine's CPU time during the run (shared 2-core machine: treat the "
          "DataParallel numbers as indicative).", "",
          "## allreduce_ vs raw mpi4py Allreduce, 64 MB float32, 2 local ranks", "",
          "| side | median ms | GB/s | throughput vs raw |", "|---|---:|---:|---:|"]
    for k in ar["median_ms"]:
        md.append(f"| {k} | {ar['median_ms'][k]} | {ar['GB_per_s'][k]} | "
                  f"{ar['ratio_vs_raw'][k]} |")
    md += ["", f"## DataParallel on digits, global batch 64, samples/s (median of {blocks} "
           f"interleaved blocks of {args.steps} steps)", "",
           "Scaling efficiency = 2-rank samples/s ÷ (2 × 1 process × 1 thread). "
           "Wait = allreduce time left after backward returned, ms/step (what overlap hides; "
           "it also absorbs the ranks' skew).", "",
           "| model (buckets) | 1p×1t | 1p×2t | 2r×1t overlap | 2r×1t overlap=thread | "
           "2r×1t no overlap | eff. overlap / none | vs 1p×2t overlap / none | "
           "wait ms overlap / thread / none |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(
            f"| {r['model']} {r['params'] / 1e6:.2f}M ({r['buckets']} × ≤{r['bucket_mb']} MB) "
            f"| {r['1proc_1thr']} | {r['1proc_2thr']} | {r['2rank_overlap']} | "
            f"{r['2rank_overlap_thread']} | {r['2rank_no_overlap']} | "
            f"{r['2rank_overlap_scaling_eff']} / {r['2rank_no_overlap_scaling_eff']} | "
            f"{r['2rank_overlap_vs_1proc_2thr']} / {r['2rank_no_overlap_vs_1proc_2thr']} | "
            f"{r['2rank_overlap_wait_ms']} / {r['2rank_overlap_thread_wait_ms']} / "
            f"{r['2rank_no_overlap_wait_ms']} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
