"""ortcpu_torch vs torch eager: LayerNorm, RMSNorm, BatchNorm2d, cross_entropy, Dropout
(forward + backward, float32), the cases and targets of issue 4.

    python -m benchmarks.norm_loss [--quick] [--threads 2] [--cpu] [name filter ...]

Each row times one training step of the op as users run it: forward through the
functional / module API, then ``torch.autograd.grad`` of the output w.r.t. the input and
the parameters with a fixed upstream gradient. Ours and torch alternate call by call
(after warm-up) so both see the same machine state; the ratio is torch ÷ ours of the
medians. The machine is shared (2 cores): the load average and the CPU time other
processes used while measuring ("foreign share") are recorded; above ~5 % the 2-thread
numbers are unreliable. Writes ``benchmarks/results/norm_loss.{json,md}`` (partial runs:
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
                     _step(lambda x, w, b, c=c: F.layer_norm(x, (c,), w, b), (x, w, b), dy)))
        rms_t = torch.nn.RMSNorm(c)
        rms_o = ot.nn.RMSNorm(c)
        rows.append((f"rms_norm {r}x{c}", 2.0,
                     _step(lambda x, w, m=rms_o: m(x), (x, rms_o.weight), dy),
                     _step(lambda x, w, m=rms_t: m(x), (x, rms_t.weight), dy)))
    x = torch.randn(8 if quick else 32, 64, 56, 56, generator=g, requires_grad=True)
    dy = torch.randn(x.shape, generator=g)
    bn_t, bn_o = torch.nn.BatchNorm2d(64), ot.nn.BatchNorm2d(64)
    rows.append((f"batch_norm2d train {'x'.join(map(str, x.shape))}", 1.8,
                 _step(lambda x, w, b, m=bn_o: m(x), (x, bn_o.weight, bn_o.bias), dy),
                 _step(lambda x, w, b, m=bn_t: m(x), (x, bn_t.weight, bn_t.bias), dy)))
    for n, c in [(4096, 1000), (2048, 32000)]:
        x = torch.randn(n, c, generator=g, requires_grad=True)
        t = torch.randint(0, c, (n,), generator=g)
        one = torch.tensor(1.0)
        rows.append((f"cross_entropy {n}x{c}", 2.0,
                     _step(lambda x, t=t: ot.ops.cross_entropy(x, t), (x,), one),
                     _step(lambda x, t=t: F.cross_entropy(x, t), (x,), one)))
    x = torch.randn(8192, 1024, generator=g, requires_grad=True)
    dy = torch.randn(8192, 1024, generator=g)
    rows.append(("dropout p=0.1 8192x1024", 1.5,
                 _step(lambda x: ot.ops.dropout(x, 0.1), (x,), dy),
                 _step(lambda x: F.dropout(x, 0.1), (x,), dy)))
    return rows


def measure(ours, theirs, reps: int, warmup: int = 3, clock=time.perf_counter):
    for _ in range(warmup):
        ours()
        theirs()
    to, tt = [], []
    for _ in range(reps):
        t0 = clock()
        ours()
        t1 = clock()
        theirs()
        t2 = clock()
        to.append(t1 - t0)
        tt.append(t2 - t1)
    return statistics.median(to) * 1e3, statistics.median(tt) * 1e3


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
    for name, target, ours, theirs in cases(a.quick):
        if a.filter and not any(f in name for f in a.filter):
            continue
        fl = _Foreign()
        load = os.getloadavg()[0]
        t_ours, t_torch = measure(ours, theirs, reps, clock=clock)
        row = {"case": name, "threads": a.threads, "clock": "cpu" if a.cpu else "wall",
               "ours_ms": round(t_ours, 3),
               "torch_ms": round(t_torch, 3), "ratio": round(t_torch / t_ours, 2),
               "target": target, "loadavg": round(load, 2), "foreign_share": fl.share()}
        out.append(row)
        print(f"{name:36s} ours {t_ours:8.2f} ms  torch {t_torch:8.2f} ms  "
              f"{row['ratio']:5.2f}x (target {target}x)  load {load:.1f} "
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
                "torch ÷ ours | target | load | foreign |\n"
                "|---|---|---|---|---|---|---|---|---|\n")
        for r in out:
            f.write(f"| {r['case']} | {r['threads']} | {r['clock']} | {r['ours_ms']} | "
                    f"{r['torch_ms']} | "
                    f"{r['ratio']}x | ≥{r['target']}x | {r['loadavg']} | "
                    f"{r['foreign_share']:.0%} |\n")
    return out


if __name__ == "__main__":
    main()
