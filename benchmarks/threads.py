"""Threads study: do torch's OpenMP pool and our OpenMP kernels get in each other's way?

    python -m benchmarks.threads [--quick]

Writes ``benchmarks/results/threads.json`` and ``threads_data.md`` (generated tables);
the conclusions drawn from them are in ``threads.md`` (written by hand).

1. Runtime: which OpenMP runtime files are mapped into the process and how many threads
   exist after a parallel torch op and a parallel kernel of ours (one shared libgomp pool
   means main + 1 worker on 2 threads), also when our extension is loaded before torch.
2. Interleaving: per-iteration time of ``torch.add(a, b, out=c)`` alone, of our GELU
   (native call, preallocated output) alone, and of the two alternating, for 1K..8M
   float32 elements at 2 threads; the same with torch's own ``gelu.out`` in place of ours
   as a control. A penalty is alternating minus the sum of the two alone.
3. Grain: our GELU and LeakyReLU (the cheapest kernel) at 1 and 2 threads around the
   parallel threshold (32768 elements), to see whether splitting pays.
4. Idle gaps: one 2-thread call after the main thread did pure-Python work for a gap of
   0..10 ms (the pool's worker spins, then sleeps on a futex), plus the CPU time the
   process burns per wall second in a loop of small calls with gaps (a spinning worker
   takes the other core from e.g. a DataLoader worker).

2-4 run in a child process per OpenMP setting (default, OMP_WAIT_POLICY=PASSIVE /
ACTIVE, GOMP_SPINCOUNT=0 / 10000), since libgomp reads them once at load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial

CONFIGS = [
    ("default", {}),
    ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("OMP_WAIT_POLICY=ACTIVE", {"OMP_WAIT_POLICY": "ACTIVE"}),
    ("GOMP_SPINCOUNT=0", {"GOMP_SPINCOUNT": "0"}),
    ("GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}),
]
SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 23]
GRAIN_SIZES = [1 << 14, 1 << 15, 3 << 14, 1 << 16, 1 << 17, 1 << 18]
GAPS_US = [0, 10, 100, 1000, 10000]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_PROC_BIND")


def _size(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


# ---- 1. runtime check (parent process and a reversed-import child) -----------------------

_LOAD_ORDER_CHILD = r"""
import ctypes, glob, json, os
import scipy_openblas32
ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(),
            f"lib{scipy_openblas32.get_library()}.so"), mode=ctypes.RTLD_GLOBAL)
so = glob.glob(os.path.join(ROOT, "ortcpu_torch", "_native", "_ortcpu*.so"))[0]
ctypes.CDLL(so)  # our extension first: its libgomp.so.1 comes from the system search path
import torch
torch.set_num_threads(2)
torch.add(torch.ones(1 << 20), 1)
libs = sorted({l.split()[5] for l in open("/proc/self/maps")
               if len(l.split()) >= 6 and "gomp" in os.path.basename(l.split()[5])})
print(json.dumps(libs))
"""


def runtime_check() -> dict:
    import torch

    import ortcpu_torch
    from ortcpu_torch._native import ffi, lib, ptr

    from ._util import openmp_runtimes

    def nthreads_now() -> int:
        return len(os.listdir("/proc/self/task"))

    out = {"threads_after_import": nthreads_now()}
    torch.set_num_threads(2)
    ortcpu_torch.set_num_threads(2)
    x = torch.randn(1 << 22)
    torch.add(x, 1.0)
    out["threads_after_torch_op"] = nthreads_now()
    y = torch.empty_like(x)
    lib.ortcpu_gelu_forward_f32(ptr(x), ffi.NULL, ptr(y), 1024, x.numel() // 1024, 0, 2)
    out["threads_after_our_kernel"] = nthreads_now()
    out["openmp_runtimes"] = openmp_runtimes()
    child = subprocess.run(
        [sys.executable, "-c", f"ROOT = {ROOT!r}\n" + _LOAD_ORDER_CHILD],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    out["extension_loaded_first"] = (json.loads(child.stdout) if child.returncode == 0
                                     else f"failed: {child.stderr.strip()[-300:]}")
    return out


# ---- 2-4. measurements in one child per OpenMP setting --------------------------------


def _per_iter_us(fn, iters: int, reps: int) -> float:
    """Median over ``reps`` of the mean time per iteration of ``fn`` (µs)."""
    res = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        res.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(res)


def _iters(n: int, quick: bool) -> int:
    budget = 0.02 if quick else 0.06  # seconds per repetition, roughly
    per_call = 2e-6 + n * 0.6e-9
    return max(3, int(budget / per_call))


def _interleave(n: int, quick: bool, reps: int, ours_gelu) -> dict:
    """torch.add alone, a GELU alone (ours / torch's), and the two alternating."""
    import torch

    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    x, y, z = torch.randn(n), torch.empty(n), torch.empty(n)

    def add():
        torch.add(a, b, out=c)

    ours = ours_gelu(x, y, 2)

    def theirs():
        torch.ops.aten.gelu.out(x, out=z)

    def mixed():
        add()
        ours()

    def control():
        add()
        theirs()

    fns = {"add": add, "ours": ours, "torch_gelu": theirs, "add+ours": mixed,
           "add+torch_gelu": control}
    iters = _iters(n, quick)
    for f in fns.values():  # warm-up
        _per_iter_us(f, max(1, iters // 10), 1)
    t = {k: [] for k in fns}
    for _ in range(reps):  # cycle through all five so drift hits them alike
        for k, f in fns.items():
            t[k].append(_per_iter_us(f, iters, 1))
    m = {k: statistics.median(v) for k, v in t.items()}
    return {
        "n": n, **{k: round(v, 3) for k, v in m.items()},
        "penalty_ours_us": round(m["add+ours"] - m["add"] - m["ours"], 3),
        "penalty_torch_us": round(m["add+torch_gelu"] - m["add"] - m["torch_gelu"], 3),
    }


def measure(quick: bool) -> dict:
    import torch

    import ortcpu_torch
    from ortcpu_torch._native import ffi, lib, ptr

    reps = 3 if quick else 5
    out: dict = {"interleave": [], "grain": [], "gaps": []}

    def ours_gelu(x, y, nthreads):
        px, py, n = ptr(x), ptr(y), x.numel()
        f = lib.ortcpu_gelu_forward_f32
        return lambda: f(px, ffi.NULL, py, 1, n, 0, nthreads)

    def ours_leaky(x, y, nthreads):
        px, py, n = ptr(x), ptr(y), x.numel()
        f = lib.ortcpu_act_forward_f32
        return lambda: f(4, px, py, n, 0.01, nthreads)

    # 2. interleaving, at 2 threads
    torch.set_num_threads(2)
    ortcpu_torch.set_num_threads(2)
    for n in SIZES:
        out["interleave"].append(_interleave(n, quick, reps, ours_gelu))

    # 3. grain: 1 vs 2 threads around the parallel threshold
    for n in GRAIN_SIZES:
        x, y = torch.randn(n), torch.empty(n)
        row = {"n": n}
        for name, mk in (("gelu", ours_gelu), ("leaky_relu", ours_leaky)):
            fns = {k: mk(x, y, k) for k in (1, 2)}
            iters = _iters(n, quick)
            for f in fns.values():
                _per_iter_us(f, max(1, iters // 10), 1)
            t = {1: [], 2: []}
            for _ in range(reps):
                for k in (1, 2):
                    t[k].append(_per_iter_us(fns[k], iters, 1))
            row[f"{name}_1t_us"] = round(statistics.median(t[1]), 3)
            row[f"{name}_2t_us"] = round(statistics.median(t[2]), 3)
        out["grain"].append(row)

    # 4. idle gaps before a 2-thread call, and CPU burnt per wall second
    for n in (1 << 16, 1 << 20):
        x, y = torch.randn(n), torch.empty(n)
        call = ours_gelu(x, y, 2)
        for _ in range(20):
            call()
        base = _per_iter_us(call, 200, 3)
        row = {"n": n, "back_to_back_us": round(base, 2)}
        for gap in GAPS_US:
            samples = []
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(30 if gap >= 10000 else 200):
                end = time.perf_counter() + gap * 1e-6
                while time.perf_counter() < end:  # the main thread is busy in Python
                    pass
                t0 = time.perf_counter()
                call()
                samples.append((time.perf_counter() - t0) * 1e6)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            row[f"gap_{gap}us_call_us"] = round(statistics.median(samples), 2)
            # the main thread is always busy, so anything above 1.0 is the worker
            row[f"gap_{gap}us_cpu_per_wall"] = round(cpu / wall, 2)
        out["gaps"].append(row)
    return out


def contention(quick: bool) -> list[dict]:
    """Our GELU and torch's at 1 and 2 threads (per-call median and mean, µs); the parent
    runs this once on a quiet machine and once beside a busy-looping process."""
    import torch

    import ortcpu_torch
    from ortcpu_torch._native import ffi, lib, ptr

    from ._util import timed

    rows = []
    for n in (1 << 16, 1 << 20, 1 << 23):
        x, y = torch.randn(n), torch.empty(n)
        px, py = ptr(x), ptr(y)
        calls = max(20, min(400, int((0.1 if quick else 0.3) / (n * 1e-9 + 5e-6))))
        for nthreads in (1, 2):
            torch.set_num_threads(nthreads)
            ortcpu_torch.set_num_threads(nthreads)
            fns = {
                "ours": partial(lib.ortcpu_gelu_forward_f32, px, ffi.NULL, py, 1, n, 0, nthreads),
                "torch": partial(torch.ops.aten.gelu.out, x, out=y),
            }
            for impl, f in fns.items():
                samples = [t * 1e6 for t in timed(f, calls, warmup=5)]
                rows.append({"n": n, "impl": impl, "threads": nthreads,
                             "median_us": round(statistics.median(samples), 2),
                             "mean_us": round(statistics.fmean(samples), 2)})
    return rows


# ---- reporting ----------------------------------------------------------------------------


def markdown(res: dict) -> str:
    from ._util import isa_line

    rt = res["runtime"]
    lines = [
        "<!-- generated by `python -m benchmarks.threads`; do not edit by hand -->",
        isa_line(res["machine"]),
        "",
        f"{res['machine']['cpu']}, {res['machine']['cpus']} CPUs, torch "
        f"{res['machine']['torch']}, {res['machine']['date']}, load average at start "
        f"{res['machine']['loadavg']}.",
        "",
        "## OpenMP runtime",
        "",
        f"- mapped OpenMP runtimes (torch imported first, as ortcpu_torch does): "
        f"{', '.join(f'`{p}`' for p in rt['openmp_runtimes'])}",
        f"- our extension loaded before torch: {rt['extension_loaded_first']}",
        f"- threads in the process: {rt['threads_after_import']} after import, "
        f"{rt['threads_after_torch_op']} after a 2-thread torch op, "
        f"{rt['threads_after_our_kernel']} after a 2-thread kernel of ours",
        "",
    ]
    for name, d in res["configs"].items():
        fl = d["foreign_load"]
        lines += [f"## {name}", "", f"Other processes used {100 * fl['foreign_share']:.0f}% "
                  f"of the machine's CPU time while this was measured "
                  f"({fl['foreign_cpu_s']} CPU-s in {fl['wall_s']} s).", "",
                  "Interleaving at 2 threads (µs per iteration; "
                  "penalty = alternating − sum of each alone):", "",
                  "| elements | add | ours gelu | torch gelu | add+ours | penalty | "
                  "add+torch gelu | penalty |",
                  "|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for r in d["interleave"]:
            lines.append(
                f"| {_size(r['n'])} | {r['add']:.2f} | {r['ours']:.2f} | {r['torch_gelu']:.2f} "
                f"| {r['add+ours']:.2f} | {r['penalty_ours_us']:+.2f} "
                f"| {r['add+torch_gelu']:.2f} | {r['penalty_torch_us']:+.2f} |")
        lines += ["", "Grain: our kernels at 1 and 2 threads (µs per call):", "",
                  "| elements | gelu 1t | gelu 2t | leaky_relu 1t | leaky_relu 2t |",
                  "|--:|--:|--:|--:|--:|"]
        for r in d["grain"]:
            lines.append(f"| {r['n']} | {r['gelu_1t_us']:.2f} | {r['gelu_2t_us']:.2f} | "
                         f"{r['leaky_relu_1t_us']:.2f} | {r['leaky_relu_2t_us']:.2f} |")
        lines += ["", "Idle gap before a 2-thread gelu call (median µs per call; CPU-seconds "
                  "per wall-second of the loop, 1.0 = main thread only):", "",
                  "| elements | back to back | " + " | ".join(
                      f"gap {g} µs" for g in GAPS_US) + " |",
                  "|--:|--:|" + "--:|" * len(GAPS_US)]
        for r in d["gaps"]:
            lines.append(f"| {_size(r['n'])} | {r['back_to_back_us']:.1f} | " + " | ".join(
                f"{r[f'gap_{g}us_call_us']:.1f} (cpu {r[f'gap_{g}us_cpu_per_wall']:.2f})"
                for g in GAPS_US) + " |")
        lines.append("")
    if "contention" in res:
        c = res["contention"]
        labels = list(c)
        lines += ["## Contention (default settings)", "",
                  "GELU forward per call, µs (median / mean), alone and beside one "
                  "busy-looping process: " + "; ".join(
                      f"{lab}: other processes used "
                      f"{100 * c[lab]['foreign_load']['foreign_share']:.0f}% of the CPU time"
                      for lab in labels) + ".", "",
                  "| elements | impl | threads | " + " | ".join(labels) + " |",
                  "|--:|---|--:|" + "--:|" * len(labels)]
        for i, r in enumerate(c[labels[0]]["rows"]):
            cells = [f"{c[lab]['rows'][i]['median_us']:.0f} / {c[lab]['rows'][i]['mean_us']:.0f}"
                     for lab in labels]
            lines.append(f"| {_size(r['n'])} | {r['impl']} | {r['threads']} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def run_contention(quick: bool, env: dict) -> dict:
    """The contention child twice: alone, and beside one busy-looping process of ours (the
    stand-in for a DataLoader worker or any other job on the machine)."""
    from ._util import ForeignLoad

    print("measuring contention ...", flush=True)
    cmd = [sys.executable, "-m", "benchmarks.threads", "--child-contention"]
    cmd += ["--quick"] if quick else []
    out = {}
    for label in ("quiet", "beside a busy process"):
        hog = None
        if label != "quiet":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            load = ForeignLoad()
            proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                                  check=True)
            report = load.report()
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        out[label] = {"rows": json.loads(proc.stdout), "foreign_load": report}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.threads",
                                description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer and shorter repetitions")
    p.add_argument("--configs", nargs="*", help="only these OpenMP settings (by name)")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                   help="first wait up to this long for the machine to be idle")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-contention", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        print(json.dumps(measure(args.quick)))
        return 0
    if args.child_contention:
        print(json.dumps(contention(args.quick)))
        return 0

    from ._util import RESULTS, ForeignLoad, machine_info, wait_quiet

    if args.wait_quiet > 0 and not wait_quiet(args.wait_quiet):
        print(f"warning: the machine did not go idle within {args.wait_quiet:.0f} s",
              file=sys.stderr)
    res = {"machine": machine_info(), "runtime": runtime_check(), "configs": {}}
    print(json.dumps(res["runtime"], indent=1))
    base_env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    for name, extra in CONFIGS:
        if args.configs and name not in args.configs:
            continue
        print(f"measuring with {name} ...", flush=True)
        load = ForeignLoad()
        cmd = [sys.executable, "-m", "benchmarks.threads", "--child"]
        cmd += ["--quick"] if args.quick else []
        proc = subprocess.run(cmd, env={**base_env, **extra}, cwd=ROOT, capture_output=True,
                              text=True, check=True)
        res["configs"][name] = json.loads(proc.stdout)
        res["configs"][name]["foreign_load"] = load.report()
    if not args.configs or "contention" in args.configs:
        res["contention"] = run_contention(args.quick, base_env)
    md = markdown(res)
    print(md)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "threads.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    with open(os.path.join(RESULTS, "threads_data.md"), "w") as f:
        f.write(md)
    print("wrote benchmarks/results/threads.json and threads_data.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
