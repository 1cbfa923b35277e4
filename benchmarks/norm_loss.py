"""ortcpu_torch vs torch eager: LayerNorm, RMSNorm, BatchNorm2d, cross_entropy, Dropout
(forward + backward, float32), the cases and targets of issue 4.

    python -m benchmarks.norm_loss [--quick] [--threads 2] [--cpu] [name filter ...]

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
speak of and no faults. Writes ``benchmarks/results/norm_loss.{json,md}`` (partial runs:
``norm_loss_partial.*``).
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


class _Foreign:
    """CPU seconds other processes used during the measurement (/proc/stat busy time
    minus ours)."""

    def __init__(self):
        self.start = self._snap()

    @staticmethod
    def _snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
        me = resource.getrusage(resource.RUSAGE_SELF)
        return busy, me.ru_utime + me.ru_stime, time.monotonic()

    def share(self) -> float:
        b, o, w = (y - x for x, y in zip(self.start, self._snap(), strict=True))
        return round(max(0.0, b - o) / (max(w, 1e-9) * (os.cpu_count() or 1)), 3)


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--cpu", action="store_true",
                    help="1 thread, CPU time of the calling thread instead of wall time "
                         "(robust to other processes on a loaded machine)")
    ap.add_argument("filter", nargs="*")
    a = ap.parse_args(argv)
    if a.cpu:
        a.threads = 1
    clock = time.thread_time if a.cpu else time.perf_counter
    torch.set_num_threads(a.threads)
    ot.set_num_threads(a.threads)
    reps = a.reps or (5 if a.quick else 15)
    out = []
    for name, target, ours, theirs, floor in cases(a.quick):
        if a.filter and not any(f in name for f in a.filter):
            continue
        fl = _Foreign()
        load = os.getloadavg()[0]
        o, t = measure(ours, theirs, reps, clock=clock)
        row = {"case": name, "threads": a.threads, "clock": "cpu" if a.cpu else "wall",
               "ours_ms": round(o["ms"], 3), "torch_ms": round(t["ms"], 3),
               "ratio": round(t["ms"] / o["ms"], 2), "target": target,
               "ours_min_ms": round(o["min_ms"], 3), "torch_min_ms": round(t["min_ms"], 3),
               "ratio_min": round(t["min_ms"] / o["min_ms"], 2),
               "ours_faults": int(o["faults"]), "torch_faults": int(t["faults"]),
               "floor_ms": None, "loadavg": round(load, 2)}
        if floor is not None:
            row["floor_ms"] = round(statistics.median(_util.timed(floor, reps, 3)) * 1e3, 3)
        row["foreign_share"] = fl.share()
        out.append(row)
        fl_txt = f"  floor {row['floor_ms']:.2f} ms" if floor is not None else ""
        print(f"{name:32s} ours {o['ms']:7.2f} ms  torch {t['ms']:7.2f} ms  "
              f"{row['ratio']:5.2f}x (target {target}x)  min: {row['ratio_min']:5.2f}x  "
              f"faults {row['ours_faults']}/{row['torch_faults']}{fl_txt}  load {load:.1f} "
              f"foreign {row['foreign_share']:.0%}", flush=True)
    partial = a.quick or bool(a.filter)
    stem = ("norm_loss_partial" if partial else "norm_loss") + ("_cpu1" if a.cpu else "")
    os.makedirs(RESULTS, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": a.threads, "reps": reps,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": a.quick}
    with open(os.path.join(RESULTS, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": out}, f, indent=1)
    with open(os.path.join(RESULTS, stem + ".md"), "w") as f:
        f.write("| case (fwd+bwd, float32) | threads | clock | ours ms | torch ms | "
                "torch ÷ ours | target | torch min ÷ ours min | faults/step ours, torch | "
                "floor ms | load | foreign |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in out:
            floor = "" if r["floor_ms"] is None else r["floor_ms"]
            f.write(f"| {r['case']} | {r['threads']} | {r['clock']} | {r['ours_ms']} | "
                    f"{r['torch_ms']} | {r['ratio']}x | ≥{r['target']}x | "
                    f"{r['ratio_min']}x | {r['ours_faults']}, {r['torch_faults']} | "
                    f"{floor} | {r['loadavg']} | {r['foreign_share']:.0%} |\n")
    return out


if __name__ == "__main__":
    main()
