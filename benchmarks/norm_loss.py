"""ortcpu_torch vs torch eager: LayerNorm, RMSNorm, BatchNorm2d, cross_entropy, Dropout
(forward + backward, float32), the cases and targets of issue 4.

    python -m benchmarks.norm_loss [--quick] [--threads 2] [--cpu] [--procs 3] [filter ...]

Each row times one training step of the op as users run it: forward through the
functional / module API, then ``torch.autograd.grad`` of the output w.r.t. the input and
the parameters with a fixed upstream gradient. Ours and torch alternate call by call
(after warm-up) so both see the same machine state; the ratio is torch ÷ ours of the
medians. The machine is shared (2 cores): the load average and the CPU time other
processes used while measuring ("foreign share") are recorded; above ~5 % the 2-thread
numbers are unreliable.

Each side's page faults per step are recorded too: torch's large outputs come from glibc,
which sometimes hands back freshly mapped memory (thousands of faults, several times the
step's time) and sometimes reuses it, so torch's median swings between runs; its fastest
step ("torch min") is the fault-free time. LayerNorm rows also time their memory floor:
torch's own elementwise passes with the same traffic into preallocated outputs
(``mul`` reads x and writes y, ``add`` reads dy and x and writes dx), no arithmetic to
speak of and no faults.

The whole measurement runs in ``--procs`` fresh processes (default 3) and each case
reports the medians over them with the ratio's range: on this machine the same memory-
bound loop runs up to 2x faster in one process than another, depending on the physical
pages it gets (``python -m benchmarks.placement``). Writes
``benchmarks/results/norm_loss.{json,md}`` (partial runs: ``norm_loss_partial.*``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.nn.functional as F

import ortcpu_torch as ot

from . import _util

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _step(fn, inputs, grad):
    def run():
        out = fn(*inputs)
        torch.autograd.grad(out, inputs, grad)
    return run


def _ln_floor(x, dy):
    """The traffic of a LayerNorm forward + backward at the speed of torch's elementwise
    kernels: read x / write y, then read dy and x / write dx."""
    y, dx = torch.empty_like(x), torch.empty_like(x)

    def run():
        with torch.no_grad():
            torch.mul(x, 2.0, out=y)
            torch.add(dy, x, out=dx)
    return run


def cases(quick: bool):
    g = torch.Generator().manual_seed(0)
    rows = []
    # the transformer of issue 18 (batch 16 x seq 128 x d 256): LayerNorm only
    x = torch.randn(2048, 256, generator=g, requires_grad=True)
    w = torch.randn(256, generator=g, requires_grad=True)
    b = torch.randn(256, generator=g, requires_grad=True)
    dy = torch.randn(2048, 256, generator=g)
    rows.append(("layer_norm 2048x256", 1.15,
                 _step(lambda x, w, b: ot.ops.layer_norm(x, (256,), w, b), (x, w, b), dy),
                 _step(lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, b), dy),
                 _ln_floor(x, dy)))
    for r, c in [(8192, 768), (8192, 1024)]:
        x = torch.randn(r, c, generator=g, requires_grad=True)
        w = torch.randn(c, generator=g, requires_grad=True)
        b = torch.randn(c, generator=g, requires_grad=True)
        dy = torch.randn(r, c, generator=g)
        rows.append((f"layer_norm {r}x{c}", 2.0,
                     _step(lambda x, w, b, c=c: ot.ops.layer_norm(x, (c,), w, b), (x, w, b), dy),
                     _step(lambda x, w, b, c=c: F.layer_norm(x, (c,), w, b), (x, w, b), dy),
                     _ln_floor(x, dy)))
        rms_t = torch.nn.RMSNorm(c)
        rms_o = ot.nn.RMSNorm(c)
        rows.append((f"rms_norm {r}x{c}", 2.0,
                     _step(lambda x, w, m=rms_o: m(x), (x, rms_o.weight), dy),
                     _step(lambda x, w, m=rms_t: m(x), (x, rms_t.weight), dy), None))
    x = torch.randn(8 if quick else 32, 64, 56, 56, generator=g, requires_grad=True)
    dy = torch.randn(x.shape, generator=g)
    bn_t, bn_o = torch.nn.BatchNorm2d(64), ot.nn.BatchNorm2d(64)
    rows.append((f"batch_norm2d train {'x'.join(map(str, x.shape))}", 1.8,
                 _step(lambda x, w, b, m=bn_o: m(x), (x, bn_o.weight, bn_o.bias), dy),
                 _step(lambda x, w, b, m=bn_t: m(x), (x, bn_t.weight, bn_t.bias), dy), None))
    for n, c in [(4096, 1000), (2048, 32000)]:
        x = torch.randn(n, c, generator=g, requires_grad=True)
        t = torch.randint(0, c, (n,), generator=g)
        one = torch.tensor(1.0)
        rows.append((f"cross_entropy {n}x{c}", 2.0,
                     _step(lambda x, t=t: ot.ops.cross_entropy(x, t), (x,), one),
                     _step(lambda x, t=t: F.cross_entropy(x, t), (x,), one), None))
    x = torch.randn(8192, 1024, generator=g, requires_grad=True)
    dy = torch.randn(8192, 1024, generator=g)
    rows.append(("dropout p=0.1 8192x1024", 1.5,
                 _step(lambda x: ot.ops.dropout(x, 0.1), (x,), dy),
                 _step(lambda x: F.dropout(x, 0.1), (x,), dy), None))
    return rows


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(ours, theirs, reps: int, warmup: int = 3, clock=time.perf_counter):
    """Per side: median ms, min ms and median page faults per step."""
    for _ in range(warmup):
        ours()
        theirs()
    to, tt, fo, ft = [], [], [], []
    for _ in range(reps):
        f0 = _faults()
        t0 = clock()
        ours()
        t1 = clock()
        f1 = _faults()
        theirs()
        t2 = clock()
        ft.append(_faults() - f1)
        fo.append(f1 - f0)
        to.append(t1 - t0)
        tt.append(t2 - t1)
    med = statistics.median
    return ({"ms": med(to) * 1e3, "min_ms": min(to) * 1e3, "faults": med(fo)},
            {"ms": med(tt) * 1e3, "min_ms": min(tt) * 1e3, "faults": med(ft)})


def run_cases(a, reps: int) -> list[dict]:
    """Measure the selected cases in this process; one row per case."""
    clock = time.thread_time if a.cpu else time.perf_counter
    out = []
    for name, target, ours, theirs, floor in cases(a.quick):
        if a.filter and not any(f in name for f in a.filter):
            continue
        fl = _util.ForeignLoad()
        load = os.getloadavg()[0]
        o, t = measure(ours, theirs, reps, clock=clock)
        row = {"case": name, "threads": a.threads, "clock": "cpu" if a.cpu else "wall",
               "ours_ms": o["ms"], "torch_ms": t["ms"], "ratio": t["ms"] / o["ms"],
               "target": target, "ratio_min": t["min_ms"] / o["min_ms"],
               "ours_faults": o["faults"], "torch_faults": t["faults"], "floor_ms": None,
               "loadavg": load}
        if floor is not None:
            row["floor_ms"] = statistics.median(_util.timed(floor, reps, 3)) * 1e3
        row["foreign_share"] = fl.report()["foreign_share"]
        out.append(row)
        fl_txt = f"  floor {row['floor_ms']:.2f} ms" if floor is not None else ""
        print(f"{name:32s} ours {o['ms']:7.2f} ms  torch {t['ms']:7.2f} ms  "
              f"{row['ratio']:5.2f}x (target {target}x)  min: {row['ratio_min']:5.2f}x  "
              f"faults {row['ours_faults']:.0f}/{row['torch_faults']:.0f}{fl_txt}  "
              f"load {load:.1f} foreign {row['foreign_share']:.0%}", flush=True)
    return out


def _child_args(a) -> list[str]:
    argv = ["--threads", str(a.threads)] + ["--quick"] * a.quick + ["--cpu"] * a.cpu
    argv += ["--reps", str(a.reps)] if a.reps else []
    return argv + list(a.filter)


def run_in_processes(a) -> list[dict]:
    """Each case measured in ``a.procs`` fresh processes; per case the medians over the
    processes, and the range of the ratio."""
    per_process = _util.rows_from_processes("benchmarks.norm_loss", _child_args(a), a.procs)
    return _util.median_over_processes(
        per_process, key=lambda r: r["case"],
        numeric=("ours_ms", "torch_ms", "ratio", "ratio_min", "ours_faults", "torch_faults",
                 "floor_ms", "loadavg"), maximum=("foreign_share",))


def _write(a, reps: int, out: list[dict]) -> None:
    partial = a.quick or bool(a.filter)
    stem = ("norm_loss_partial" if partial else "norm_loss") + ("_cpu1" if a.cpu else "")
    os.makedirs(RESULTS, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": a.threads, "reps": reps,
            "processes": a.procs, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "quick": a.quick, **_util.isa_info()}
    with open(os.path.join(RESULTS, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": out}, f, indent=1)
    with open(os.path.join(RESULTS, stem + ".md"), "w") as f:
        f.write(f"float32, forward + backward; {a.threads} thread(s), {meta['reps']} "
                f"alternating steps per side in each of {a.procs} fresh process(es); "
                "per case the median over the processes (ratio: its range in brackets); "
                f"torch {torch.__version__}, {meta['date']}.\n{_util.isa_line(meta)}\n\n")
        f.write("| case | ours ms | torch ms | torch ÷ ours | target | fastest steps' "
                "ratio | faults/step ours, torch | floor ms | load | foreign |\n"
                "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
        for r in out:
            floor = "" if r["floor_ms"] is None else f"{r['floor_ms']:.2f}"
            rng = (f" [{r['ratio_lo']:.2f}-{r['ratio_hi']:.2f}]" if a.procs > 1 else "")
            f.write(f"| {r['case']} | {r['ours_ms']:.2f} | {r['torch_ms']:.2f} | "
                    f"{r['ratio']:.2f}x{rng} | ≥ {r['target']}x | {r['ratio_min']:.2f}x | "
                    f"{r['ours_faults']:.0f}, {r['torch_faults']:.0f} | {floor} | "
                    f"{r['loadavg']:.2f} | {r['foreign_share']:.0%} |\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--cpu", action="store_true",
                    help="1 thread, CPU time of the calling thread instead of wall time "
                         "(robust to other processes on a loaded machine)")
    ap.add_argument("--procs", type=int, default=3,
                    help="fresh processes per case (memory speed differs between them)")
    ap.add_argument("--json", help=argparse.SUPPRESS)  # a child's rows go here
    ap.add_argument("filter", nargs="*")
    a = ap.parse_args(argv)
    if a.cpu:
        a.threads = 1
    reps = a.reps or (5 if a.quick else 15)
    if a.procs > 1:
        out = run_in_processes(a)
    else:
        torch.set_num_threads(a.threads)
        ot.set_num_threads(a.threads)
        out = run_cases(a, reps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
        return out
    _write(a, reps, out)
    return out


if __name__ == "__main__":
    main()
