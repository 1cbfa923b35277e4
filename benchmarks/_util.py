"""Helpers shared by the benchmark scripts: thread settings, the streaming-copy
bandwidth probe, robust statistics, a description of the machine, and measuring in
several fresh processes."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import ortcpu_torch
from ortcpu_torch._native import lib, loader, openblas_core, ptr

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def set_threads(n: int) -> None:
    """Same thread count for torch's intra-op pool and for our kernels."""
    torch.set_num_threads(n)
    ortcpu_torch.set_num_threads(n)


def layer_clock(threads: int, wall: bool):
    """Set the thread count and pick the clock of a per-layer benchmark: CPU time of this
    thread (the default, so only one thread) or wall clock. Returns (clock, header)."""
    if not wall and threads != 1:
        raise SystemExit("CPU time (the default) measures one thread: use --threads 1 or "
                         "--wall")
    set_threads(threads)
    clock = time.perf_counter if wall else time.thread_time
    return clock, (f"{isa_line().rstrip('.')}; {threads} thread(s), "
                   f"{'wall clock' if wall else 'CPU time'}")


def timed(fn, reps: int, warmup: int = 2) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def layernorm_buffers(rows: int, cols: int, generator: torch.Generator) -> dict:
    """Inputs (x, w, b, dy: random) and outputs (y, dx [rows, cols]; mean, inv [rows]; ds,
    db [cols]) of one float32 LayerNorm forward + backward, for the kernels' raw calls."""
    x = torch.randn(rows, cols, generator=generator)
    w, b = torch.randn(cols, generator=generator), torch.randn(cols, generator=generator)
    dy = torch.randn(rows, cols, generator=generator)
    return {"x": x, "w": w, "b": b, "dy": dy, "y": torch.empty_like(x),
            "dx": torch.empty_like(x), "mean": torch.empty(rows), "inv": torch.empty(rows),
            "ds": torch.empty(cols), "db": torch.empty(cols)}


def quantiles(samples: list[float]) -> dict:
    """Median and quartiles (same unit as ``samples``)."""
    s = sorted(samples)
    if len(s) == 1:
        return {"median": s[0], "p25": s[0], "p75": s[0]}
    q = statistics.quantiles(s, n=4, method="inclusive")
    return {"median": statistics.median(s), "p25": q[0], "p75": q[2]}


class Copier:
    """The native multi-threaded streaming copy on buffers far larger than the last-level
    cache (both already touched); ``once`` returns GB/s counting read + write."""

    def __init__(self, nbytes: int = 64 << 20):
        self.n = nbytes // 4
        self.src = torch.rand(self.n)
        self.dst = torch.zeros(self.n)

    def once(self, nthreads: int) -> float:
        t0 = time.perf_counter()
        st = lib.ortcpu_stream_copy_f32(ptr(self.src), ptr(self.dst), self.n, nthreads)
        t1 = time.perf_counter()
        if st != 0:
            raise RuntimeError(f"ortcpu_stream_copy_f32 failed with status {st}")
        return 2 * self.n * 4 / (t1 - t0) / 1e9


def copy_bandwidth(nthreads: int, reps: int = 15, copier: Copier | None = None) -> float:
    """Median GB/s of ``reps`` streaming copies (after 3 warm-up copies)."""
    c = copier or Copier()
    samples = [c.once(nthreads) for _ in range(reps + 3)][3:]
    return statistics.median(samples)


def _cpuinfo(field: str) -> str:
    """The first ``field`` value of /proc/cpuinfo, or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform.processor()."""
    return _cpuinfo("model name") or platform.processor()


_ISA_NAMES = {"baseline": "baseline x86-64", "avx2": "AVX2", "avx512": "AVX-512"}


def isa_info() -> dict:
    """Which build of the kernels ran (the ISA they dispatched to), what the CPU has, the
    ORTCPU_ISA cap, and the CPU model: two results are comparable only if these match."""
    return {"cpu": cpu_model(), "kernel_isa": loader.ISA, "cpu_isa": loader.CPU_ISA,
            "isa_cap": loader.CAP or "none"}


def isa_line(info: dict | None = None) -> str:
    """One markdown line for a results file: the CPU model and the ISA our kernels ran
    (``info``: a result's ``isa_info()`` / ``machine_info()``; default: this process)."""
    i = info or isa_info()
    def name(k):
        return _ISA_NAMES.get(i.get(k), "?")
    cap = i.get("isa_cap", "none")
    capped = f", capped by ORTCPU_ISA={cap}" if cap != "none" else ""
    blas = f" OpenBLAS ran its {i['openblas_core']} kernels." if i.get("openblas_core") else ""
    return (f"CPU: {i.get('cpu', '?')} ({name('cpu_isa')}); our kernels ran their "
            f"{name('kernel_isa')} build{capped}.{blas}")


def machine_info() -> dict:
    """Enough context to interpret (and not over-interpret) the numbers."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=os.path.dirname(RESULTS), timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    ext = ""
    try:
        with open(loader.PATH, "rb") as f:  # the build that ran
            ext = hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError:
        pass
    return {
        **isa_info(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "ortcpu_torch": ortcpu_torch.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "extension_sha256": ext,  # the native code measured (the tree may be ahead of commit)
        "openblas_core": openblas_core(),  # the kernels our OpenBLAS copy runs
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loadavg": [round(v, 2) for v in os.getloadavg()],
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                            "GOMP_SPINCOUNT", "GLIBC_TUNABLES")
                if k in os.environ},
    }


def openmp_runtimes() -> list[str]:
    """Distinct OpenMP runtime files mapped into this process (/proc/self/maps)."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6:
                name = os.path.basename(parts[5])
                if ("gomp" in name or "iomp" in name or name.startswith("libomp")) \
                        and parts[5] not in found:
                    found.append(parts[5])
    return found


class ForeignLoad:
    """CPU time that *other* processes used while we measured: the machine's busy time
    (/proc/stat) minus this process's and its waited-for children's. On a shared 2-core
    machine this is the first thing to look at when numbers jump."""

    def __init__(self):
        self.start = self._snapshot()

    @staticmethod
    def _snapshot() -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        busy = (sum(v) - v[3] - v[4]) / hz  # everything but idle and iowait
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        return busy, own, time.monotonic()

    def report(self) -> dict:
        busy, own, wall = (b - a for a, b in zip(self.start, self._snapshot(), strict=True))
        cpus = os.cpu_count() or 1
        foreign = max(0.0, busy - own)
        return {"wall_s": round(wall, 1), "own_cpu_s": round(own, 1),
                "foreign_cpu_s": round(foreign, 1),
                "foreign_share": round(foreign / (wall * cpus), 3) if wall > 0 else 0.0}


def wait_quiet(max_seconds: float, busy_limit: float = 0.03, window: int = 5) -> bool:
    """Wait (at most ``max_seconds``) until the whole machine has been below
    ``busy_limit`` CPU use for ``window`` consecutive 2-second samples."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4], sum(v)

    deadline, quiet = time.monotonic() + max_seconds, 0
    while time.monotonic() < deadline:
        a = sample()
        time.sleep(2)
        b = sample()
        quiet = quiet + 1 if (b[0] - a[0]) / max(1, b[1] - a[1]) < busy_limit else 0
        if quiet >= window:
            return True
    return False


def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo (``"GenuineIntel"``, ``"AuthenticAMD"``), or
    ``""`` where it cannot be read."""
    return _cpuinfo("vendor_id")


def machine_kind() -> str | None:
    """``"avx512"`` or ``"avx2"`` (AMD EPYC, the kinds the targets name) or
    ``"intel-avx512"`` / ``"intel-avx2"``: the kind of machine this is (its CPU's best ISA
    and vendor, since torch's MKL and oneDNN pick other kernels on Intel), or None where the
    numbers stand for no kind (an ORTCPU_ISA cap, a baseline CPU)."""
    if loader.CAP is not None or loader.CPU_ISA not in ("avx512", "avx2"):
        return None
    prefix = "intel-" if cpu_vendor() == "GenuineIntel" else ""
    return prefix + loader.CPU_ISA


def write_results(stem: str, result: dict, markdown_text: str) -> None:
    """benchmarks/results/<stem>.json and <stem>.md, plus <stem>.<kind>.md for this machine
    kind (``machine_kind()``): the README shows the latest table of each kind, since speed
    ratios on AVX-512 and AVX2-only machines differ and neither stands for the other."""
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    names = [stem + ".md"]
    kind = machine_kind()
    if kind is not None and "partial" not in stem:  # a partial run stands for no kind
        names.append(f"{stem}.{kind}.md")
    for name in names:
        with open(os.path.join(RESULTS, name), "w") as f:
            f.write(markdown_text)
    print(f"\nwrote benchmarks/results/{stem}.json and {', '.join(names)}")



def rows_from_processes(module: str, child_args: list[str], procs: int) -> list[list[dict]]:
    """Run ``python -m <module> --procs 1 --json PATH <child_args>`` in ``procs`` fresh
    processes and return each one's rows. Each process gets its own physical pages, and
    on this machine a memory-bound loop runs up to 2x faster on some than on others
    (``python -m benchmarks.placement``): a ratio measured in one process is one draw."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(procs):
            path = os.path.join(tmp, f"{i}.json")
            print(f"-- process {i + 1}/{procs}", flush=True)
            subprocess.run([sys.executable, "-m", module, "--procs", "1", "--json", path,
                            *child_args], check=True, cwd=root)
            with open(path) as f:
                out.append(json.load(f))
    return out


def median_over_processes(per_process: list[list[dict]], key, numeric: tuple[str, ...],
                          ratio: str = "ratio", maximum: tuple[str, ...] = ()) -> list[dict]:
    """One row per ``key(row)``, in first-seen order: the first process's row with each
    ``numeric`` field replaced by its median over the processes (None entries skipped),
    each ``maximum`` field by its maximum, plus ``<ratio>_lo`` / ``<ratio>_hi`` (the range
    of ``ratio``) and ``processes``."""
    groups: dict = {}
    for rows in per_process:
        for r in rows:
            groups.setdefault(key(r), []).append(r)
    merged = []
    for rows in groups.values():
        row = dict(rows[0])
        for k in numeric:
            vals = [r[k] for r in rows if r.get(k) is not None]
            row[k] = statistics.median(vals) if vals else None
        for k in maximum:
            row[k] = max(r[k] for r in rows)
        row[ratio + "_lo"] = min(r[ratio] for r in rows)
        row[ratio + "_hi"] = max(r[ratio] for r in rows)
        row["processes"] = len(rows)
        merged.append(row)
    return merged
