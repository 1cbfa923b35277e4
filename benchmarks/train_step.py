"""Full training step, wrapped vs torch eager: zero_grad + forward + backward + optimizer step.

    python -m benchmarks.train_step [--quick] [--threads 2] [--procs 3] [--profile]
                                    [--wait-quiet S] [case ...]

Each case builds one model twice from the same seed. ``torch``: the plain model with
``torch.optim.AdamW(fused=True)``. ``ours``: the same model and optimizer passed through
``ortcpu_torch.optimize(model, optimizer)`` -- the one line a user adds -- which swaps the
supported modules, routes supported functionals while the model runs and replaces the
optimizer by ``ortcpu_torch.optim.AdamW`` when that exists (otherwise torch's fused AdamW
stays, and the report says so). Steps alternate between the two sides, in several rounds
spread over the run, so machine noise hits both alike; each time is the median step.
ratio = torch ms / ours ms (> 1: ours is faster).

A third side, ``ortmodule``: the same model wrapped as ``ortcpu_torch.ORTModule(model)``
(captured once as an ONNX training graph; forward and backward run graph-wide on our
kernels) with torch's ``AdamW(fused=True)`` on its (unchanged) parameters; it alternates
with the other two in the same run. ``ortmodule ratio`` = torch ms / ORTModule ms. Its
first step includes capture + gradient graph + planning; ``capture_s`` is that first step
minus the median step. ``--rss`` also measures the peak RSS of a few steps in a fresh
process per side (torch eager vs ORTModule).

Cases:
- ``transformer``: the issue's GPT-style language model: vocab 1000, d_model 256, 4 heads,
  ff 1024, seq 128, batch 16 (2 blocks; pre-norm, nn.Embedding, nn.LayerNorm, a causal
  self-attention written with ``torch.softmax`` as minGPT does, nn.GELU MLP, nn.Dropout(0),
  F.cross_entropy loss). Dropout is 0 so both sides do the same arithmetic.
- ``cnn``: MNIST-sized CNN, 2 conv + 2 fc (GELU, MaxPool2d, Dropout(0)), batch 64.
- ``lstm``: LSTM(28, 128) classifier reading 28x28 images row by row, batch 64.
- ``digits``: the main job's digits CNN (``examples/digits_cnn.py``: 2 conv + BatchNorm +
  GELU + maxpool, fc 256-128-10, Dropout(0)) on 1x8x8 images, batch 64, where eager
  per-op overhead dominates.

The whole measurement runs in ``--procs`` fresh processes (default 3) and each number is
the median over them, with the range of each ratio: each process gets its own physical
pages, and on the 2-core VMs here torch's own GEMM steps ran 16-18 ms in some processes
and 25-27 ms in others (Linear 256->768 forward + backward, nothing of ours imported), so
the ratio of one process is one draw. The placement lists are the first process's
(``select``'s choices can differ between processes).

``--profile`` adds torch.profiler's top operators (self CPU time) of one ours step: where
the remaining time goes. Writes ``benchmarks/results/train_step.{json,md}`` (``--quick``
or a case filter: ``train_step_partial.{json,md}``, not committed).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch.wrap.policy import STATE_ATTR

from ._util import (
    ForeignLoad,
    isa_line,
    machine_info,
    median_over_processes,
    openmp_runtimes,
    quantiles,
    rows_from_processes,
    set_threads,
    wait_quiet,
    write_results,
)

NOISY_SHARE = 0.05
TARGETS = {"transformer": 1.05, "cnn": 1.5, "lstm": 1.1}  # issue 18 (eager wrap), 2 threads
ORTMODULE_TARGETS = {"transformer": 1.15, "cnn": 1.5, "lstm": 1.1, "digits": 1.3}  # issue 16
EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "examples")


# ---- models ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ff, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=1000, d=256, heads=4, ff=1024, seq=128, layers=2, dropout=0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, heads, ff, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T)))
        for b in self.blocks:
            x = b(x, self.mask[:T, :T])
        return self.head(self.ln_f(x))


def _transformer():
    gen = torch.Generator().manual_seed(0)
    model = TinyGPT()
    idx = torch.randint(0, 1000, (16, 128), generator=gen)
    tgt = torch.randint(0, 1000, (16, 128), generator=gen)

    def loss_fn(m):
        return F.cross_entropy(m(idx).flatten(0, 1), tgt.flatten())

    return model, loss_fn


class MnistCNN(nn.Module):
    """2 conv + 2 fc on 1x28x28 (the issue's MNIST-sized CNN)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.GELU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.GELU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.GELU(), nn.Dropout(0.0),
            nn.Linear(128, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


class LSTMClassifier(nn.Module):
    """An LSTM reading each 28x28 image row by row, last hidden state -> 10 classes."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(28, 128, batch_first=True)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def _images(model, shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen)
    y = torch.randint(0, 10, (shape[0],), generator=gen)

    def loss_fn(m):
        return F.cross_entropy(m(x), y)

    return model, loss_fn


def _digits():
    if EXAMPLES_DIR not in sys.path:
        sys.path.insert(0, EXAMPLES_DIR)
    from digits_cnn import DigitsCNN

    return _images(DigitsCNN(dropout=0.0), (64, 1, 8, 8))


@dataclass
class Case:
    name: str
    make: Callable  # () -> (model, loss_fn(model) -> loss)
    shape: str


CASES = [
    Case("transformer", _transformer,
         "vocab 1000, d 256, 4 heads, ff 1024, seq 128, batch 16, 2 blocks"),
    Case("cnn", lambda: _images(MnistCNN(), (64, 1, 28, 28)),
         "conv 1-32-64 (3x3, GELU, maxpool 2), fc 3136-128-10, batch 64, 1x28x28"),
    Case("lstm", lambda: _images(LSTMClassifier(), (64, 28, 28)),
         "LSTM(28, 128) over 28 rows, fc 128-10, batch 64"),
    Case("digits", _digits,
         "examples/digits_cnn.py: conv 1-32-64 (3x3, BN, GELU, maxpool 2), fc 256-128-10, "
         "batch 64, 1x8x8"),
]


# ---- timing ---------------------------------------------------------------------------


class Side:
    def __init__(self, model, loss_fn, optimizer):
        self.model, self.loss_fn, self.opt = model, loss_fn, optimizer
        self.ms: list[float] = []
        self.losses: list[float] = []

    def step(self) -> float:
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model)
        loss.backward()
        self.opt.step()
        t1 = time.perf_counter()
        self.losses.append(loss.item())
        return (t1 - t0) * 1e3


def build(case: Case, sides=("torch", "ours", "ortmodule")) -> dict[str, Side]:
    torch.manual_seed(0)
    model, loss_fn = case.make()
    out = {}
    for name in sides:
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
        if name == "ours":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ortcpu_torch.FallbackWarning)
                m, opt = ortcpu_torch.optimize(m, opt)
        elif name == "ortmodule":
            m = ortcpu_torch.ORTModule(m)  # falls back to eager with a warning
        out[name] = Side(m, loss_fn, opt)
    return out


def measure(sides: dict[str, Side], rounds: int, reps: int, warmup: int) -> dict[str, float]:
    """Alternating steps (the order rotates every step); returns each side's first step ms."""
    first = {k: s.step() for k, s in sides.items()}
    for _ in range(warmup - 1):
        for s in sides.values():
            s.step()
    # select's in-model check alternates its arms over the steps after the choices settle:
    # warm-up too (every side steps along, so the loss curves stay in step)
    ours = sides.get("ours")
    state = getattr(ours.model, STATE_ATTR, None) if ours is not None else None
    for _ in range(64):
        if state is None or state.check is None:
            break
        for s in sides.values():
            s.step()
    for s in sides.values():
        s.losses.clear()
    names = list(sides)
    for r in range(rounds):
        gc.collect()
        gc.disable()
        try:
            for i in range(reps):
                j = r * reps + i
                for k in names[j % len(names):] + names[: j % len(names)]:
                    sides[k].ms.append(sides[k].step())
        finally:
            gc.enable()
    return first


def profile_ours(side: Side, top: int = 15) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    side.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        side.step()
    rows = []
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]:
        rows.append({"op": e.key, "calls": e.count,
                     "self_ms": round(e.self_cpu_time_total / 1e3, 3),
                     "share": round(e.self_cpu_time_total / total, 3) if total else 0.0})
    return rows


def run_case(case: Case, threads: int, rounds: int, reps: int, warmup: int,
             want_profile: bool) -> dict:
    set_threads(threads)
    sides = build(case)
    first = measure(sides, rounds, reps, warmup)
    q = {k: quantiles(s.ms) for k, s in sides.items()}
    pair = [t / o for o, t in zip(sides["ours"].ms, sides["torch"].ms, strict=True)]
    pair_om = [t / o for o, t in zip(sides["ortmodule"].ms, sides["torch"].ms, strict=True)]
    lt, lo, lm = (sides[k].losses for k in ("torch", "ours", "ortmodule"))
    rep = ortcpu_torch.report(sides["ours"].model, file=None)
    om = sides["ortmodule"].model
    row = {
        "case": case.name,
        "shape": case.shape,
        "threads": threads,
        "ours_ms": round(q["ours"]["median"], 2),
        "torch_ms": round(q["torch"]["median"], 2),
        "ratio": round(q["torch"]["median"] / q["ours"]["median"], 3),
        "ours_iqr_ms": [round(q["ours"]["p25"], 2), round(q["ours"]["p75"], 2)],
        "torch_iqr_ms": [round(q["torch"]["p25"], 2), round(q["torch"]["p75"], 2)],
        "pair_ratio_median": round(quantiles(pair)["median"], 3),
        "steps": len(pair),
        "max_loss_diff": max(abs(a - b) for a, b in zip(lt, lo, strict=True)),
        "on_our_kernels": [f"{m['name']} ({m['type']})" for m in rep.modules
                           if m["calls_ours"]]
        + [f["name"] for f in rep.functionals if f["calls_ours"]],
        "on_torch": sorted({f"{d['type']}: {d['reason']}" for d in rep.skipped}
                           | {f"{k} x{len(v)}" for k, v in rep.no_counterpart.items()}
                           | {f"{d['name']} x{d['calls']}" for d in rep.torch_functions
                              if not d["metadata"]}
                           | {f"{f['name']}: {next(iter(f['reasons']))}"
                              for f in rep.functionals if f["calls_torch"]}
                           | {f"{m['name']} ({m['type']}): {next(iter(m['reasons']), 'torch')}"
                              for m in rep.modules if m["calls_torch"] and not m["calls_ours"]}),
        "optimizer": rep.optimizer,
        "ortmodule_ms": round(q["ortmodule"]["median"], 2),
        "ortmodule_ratio": round(q["torch"]["median"] / q["ortmodule"]["median"], 3),
        "ortmodule_iqr_ms": [round(q["ortmodule"]["p25"], 2),
                             round(q["ortmodule"]["p75"], 2)],
        "ortmodule_pair_ratio_median": round(quantiles(pair_om)["median"], 3),
        "ortmodule_max_loss_diff": max(abs(a - b) for a, b in zip(lt, lm, strict=True)),
        "ortmodule_graph_wide": om._fallback_reason is None,
        "ortmodule_report": om.report(),
        "ortmodule_first_step_ms": round(first["ortmodule"], 1),
        "capture_s": round((first["ortmodule"] - q["ortmodule"]["median"]) / 1e3, 3),
    }
    if want_profile:
        row["profile_ours"] = profile_ours(sides["ours"])
    return row


# ---- reporting ------------------------------------------------------------------------


def _range(r: dict, ratio: str) -> str:
    """`` [lo-hi]``: the range of a ratio over the processes (empty for one process)."""
    if r.get("processes", 1) < 2:
        return ""
    return f" [{r[ratio + '_lo']:.2f}-{r[ratio + '_hi']:.2f}]"


def _line(r: dict) -> str:
    return (f"{r['case']:<12} {r['threads']:>3}  {r['ours_ms']:>9.1f}  {r['torch_ms']:>9.1f}  "
            f"{r['ratio']:>6.2f}x{_range(r, 'ratio')}  (pairwise {r['pair_ratio_median']:.2f}x, "
            f"{r['steps']} steps, max |loss diff| {r['max_loss_diff']:.1e})\n"
            f"{'  ortmodule':<12} {r['threads']:>3}  {r['ortmodule_ms']:>9.1f}  "
            f"{r['torch_ms']:>9.1f}  {r['ortmodule_ratio']:>6.2f}x"
            f"{_range(r, 'ortmodule_ratio')}  (pairwise "
            f"{r['ortmodule_pair_ratio_median']:.2f}x, max |loss diff| "
            f"{r['ortmodule_max_loss_diff']:.1e}, capture+plan {r['capture_s']:.2f} s"
            f"{'' if r['ortmodule_graph_wide'] else ', FELL BACK to eager'})")


def markdown(result: dict) -> str:
    m = result["machine"]
    fl = m["foreign_load"]
    lines = [
        "<!-- generated by `python -m benchmarks.train_step`; do not edit by hand -->",
        isa_line(m),
        "",
        "Full training step (zero_grad + forward + backward + optimizer step), float32: "
        "`ortcpu_torch.optimize(model, AdamW(fused=True))` vs torch eager + "
        f"`AdamW(fused=True)`; median of {result['rounds'] * result['reps']} alternating "
        f"steps per side after {result['warmup']} warm-up steps in each of "
        f"{result.get('processes', 1)} fresh process(es), then the median over the "
        f"processes (ratios: their range in brackets); {m['cpu']}, {m['cpus']} "
        f"CPUs, torch {m['torch']}, commit {m['commit'] or '?'}, {m['date']}. Other "
        f"processes used {100 * fl['foreign_share']:.0f}% of the machine's CPU time"
        + (" — **busy machine: unreliable**." if fl["foreign_share"] > NOISY_SHARE else "."),
        "",
        "| case | threads | ours ms | torch ms | torch/ours | target | ORTModule ms | "
        "torch/ORTModule | target | ORTModule capture+plan s |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in result["rows"]:
        t = TARGETS.get(r["case"])
        to = ORTMODULE_TARGETS.get(r["case"])
        fb = "" if r["ortmodule_graph_wide"] else " (fell back)"
        lines.append(f"| {r['case']} | {r['threads']} | {r['ours_ms']:.1f} | "
                     f"{r['torch_ms']:.1f} | {r['ratio']:.2f}x{_range(r, 'ratio')} | "
                     f"{f'≥ {t}x' if t and r['threads'] == 2 else ''} | "
                     f"{r['ortmodule_ms']:.1f}{fb} | {r['ortmodule_ratio']:.2f}x"
                     f"{_range(r, 'ortmodule_ratio')} | "
                     f"{f'≥ {to}x' if to and r['threads'] == 2 else ''} | "
                     f"{r['capture_s']:.2f} |")
    lines.append("")
    if result.get("rss"):
        lines.append("Peak RSS, fresh process per side (MB; whole run incl. imports and "
                     "ORTModule's capture / peak of the steps after 2 warm-up steps): "
                     + "; ".join(_rss_text(c, v) for c, v in result["rss"].items()) + ".")
        lines.append("")
    if result.get("processes", 1) > 1:
        lines.append("Placement (the first process's; select's timed choices can differ "
                     "between processes):")
        lines.append("")
    for r in result["rows"]:
        lines.append(f"- {r['case']} ({r['shape']}), {r['threads']} thr: on our kernels: "
                     f"{', '.join(r['on_our_kernels']) or 'nothing'}; on torch: "
                     f"{'; '.join(r['on_torch']) or 'nothing'}; optimizer: {r['optimizer']}.")
        if r.get("profile_ours"):
            top = ", ".join(f"{p['op']} {100 * p['share']:.0f}%" for p in r["profile_ours"][:8])
            lines.append(f"  - ours, top self-CPU ops: {top}")
    return "\n".join(lines) + "\n"


def isa() -> str:
    """The SIMD level that matters for our kernels: avx512f or only avx2."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return "unknown ISA"
    return "avx512f" if "avx512f" in flags else ("avx2, no avx512f" if "avx2" in flags
                                                 else "no avx2")


def _vm_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(key + ":"))


def _rss_child(case_name: str, side: str, threads: int, steps: int = 5) -> None:
    """Runs in a fresh process: a few steps of one side, prints three numbers in MB: the
    peak RSS of the whole run (imports, model, capture and planning for ORTModule, the
    steps), the RSS after the warm-up steps, and the peak of the later steps alone.

    VmHWM, not ``ru_maxrss``: Linux carries ``ru_maxrss`` over from the forking parent;
    writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS."""
    set_threads(threads)
    case = next(c for c in CASES if c.name == case_name)
    s = build(case, sides=(side,))[side]
    for _ in range(2):
        s.step()
    whole_so_far = _vm_kb("VmHWM")
    settled = _vm_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # no reset: the step peak below is the run's peak
    for _ in range(steps):
        s.step()
    step_peak = _vm_kb("VmHWM")
    print(max(whole_so_far, step_peak) / 1024, settled / 1024, step_peak / 1024)


def peak_rss(cases: list[Case], threads: int) -> dict:
    import subprocess

    out = {}
    for c in cases:
        out[c.name] = {}
        for side in ("torch", "ortmodule"):
            res = subprocess.run([sys.executable, "-m", "benchmarks.train_step", "--rss-child",
                                  c.name, side, str(threads)], capture_output=True, text=True,
                                 check=True, cwd=os.path.dirname(EXAMPLES_DIR))
            whole, settled, step = map(float, res.stdout.strip().splitlines()[-1].split())
            out[c.name][side] = whole
            out[c.name][f"{side}_settled"] = settled
            out[c.name][f"{side}_steps"] = step
    return out


def _rss_text(case: str, v: dict) -> str:
    whole = f"torch {v['torch']:.0f}, ORTModule {v['ortmodule']:.0f} " \
            f"({v['ortmodule'] / v['torch']:.2f}x)"
    if "torch_steps" not in v:
        return f"{case}: {whole}"
    return (f"{case}: {whole} / torch {v['torch_steps']:.0f}, ORTModule "
            f"{v['ortmodule_steps']:.0f} ({v['ortmodule_steps'] / v['torch_steps']:.2f}x)")


def _rows_in_processes(args) -> list[dict]:
    """run_case's rows measured in ``args.procs`` fresh processes: per case and thread count
    the medians over the processes, with the range of each ratio."""
    child = [*args.cases, "--threads", *map(str, args.threads)]
    child += ["--quick"] if args.quick else []
    child += ["--profile"] if args.profile else []
    per_process = rows_from_processes("benchmarks.train_step", child, args.procs)
    def key(r):
        return r["case"], r["threads"]
    rows = median_over_processes(
        per_process, key,
        numeric=("ours_ms", "torch_ms", "ratio", "pair_ratio_median", "ortmodule_ms",
                 "ortmodule_ratio", "ortmodule_pair_ratio_median", "capture_s"),
        maximum=("max_loss_diff", "ortmodule_max_loss_diff"))
    for row in rows:
        same = [r for rs in per_process for r in rs if key(r) == key(row)]
        om = [r["ortmodule_ratio"] for r in same]
        row["ortmodule_ratio_lo"], row["ortmodule_ratio_hi"] = min(om), max(om)
        row["ortmodule_graph_wide"] = all(r["ortmodule_graph_wide"] for r in same)
    return rows


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--rss-child"]:
        _rss_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_step",
                                description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps")
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--profile", action="store_true", help="top ops of one ours step")
    p.add_argument("--rss", action="store_true",
                   help="peak RSS of a step, fresh process per side (torch vs ORTModule)")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                   help="first wait (at most SECONDS) until the machine is idle")
    p.add_argument("--procs", type=int, default=3,
                   help="fresh processes to measure in (median over them; default 3)")
    p.add_argument("--json", help=argparse.SUPPRESS)  # a child's rows go here
    p.add_argument("cases", nargs="*", help="run cases whose name contains any of these")
    args = p.parse_args(argv)
    if args.procs < 1:
        p.error(f"--procs must be >= 1, got {args.procs}")
    sel = [c for c in CASES if not args.cases or any(f in c.name for f in args.cases)]
    if not sel:
        raise SystemExit(f"no case matches {args.cases}; cases: "
                         + ", ".join(c.name for c in CASES))
    rounds, reps, warmup = (2, 4, 2) if args.quick else (4, 5, 3)

    if args.wait_quiet > 0 and not wait_quiet(args.wait_quiet):
        print(f"warning: the machine did not go idle within {args.wait_quiet:.0f} s",
              file=sys.stderr)
    load = ForeignLoad()
    machine = machine_info()
    machine["isa"] = isa()
    print(f"{machine['cpu']} ({machine['isa']}), {machine['cpus']} CPUs, "
          f"torch {machine['torch']}, "
          f"OpenMP runtimes mapped: {', '.join(openmp_runtimes())}")
    print(f"{rounds} rounds of {reps} alternating steps per side after {warmup} warm-up\n")
    print(f"{'case':<12} {'thr':>3}  {'ours ms':>9}  {'torch ms':>9}  {'ratio':>7}")
    if args.procs > 1:
        rows = _rows_in_processes(args)
        for row in rows:
            print(_line(row), flush=True)
    else:
        rows = []
        for case in sel:
            for n in args.threads:
                row = run_case(case, n, rounds, reps, warmup, args.profile)
                rows.append(row)
                print(_line(row), flush=True)
        if args.json:  # a child of _rows_in_processes
            with open(args.json, "w") as f:
                json.dump(rows, f)
            return 0
    machine["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    machine["foreign_load"] = load.report()
    result = {"machine": machine, "rounds": rounds, "reps": reps, "warmup": warmup,
              "processes": args.procs, "rows": rows}
    if args.rss:
        result["rss"] = peak_rss(sel, args.threads[0])
        for c, v in result["rss"].items():
            print(f"peak RSS {c} (MB, target <= 1.1x): {_rss_text(c, v)}")
    for r in rows:
        print(f"\n{r['case']} ({r['threads']} thr): on our kernels: "
              f"{', '.join(r['on_our_kernels']) or 'nothing'}")
        print(f"  on torch: {'; '.join(r['on_torch']) or 'nothing'}")
        print(f"  optimizer: {r['optimizer']}")
        print(f"  ORTModule: {r['ortmodule_report'].splitlines()[1][:160]}")
        for prow in r.get("profile_ours", []):
            print(f"    {prow['op']:<40} {prow['calls']:>5} calls {prow['self_ms']:>9.2f} ms "
                  f"{100 * prow['share']:>5.1f}%")
    fl = machine["foreign_load"]
    print(f"\nother processes used {100 * fl['foreign_share']:.1f}% of the machine's CPU time "
          f"during the run ({fl['foreign_cpu_s']} CPU-s in {fl['wall_s']} s)")
    if fl["foreign_share"] > NOISY_SHARE:
        print("WARNING: the machine was busy; the numbers are unreliable", file=sys.stderr)
    for r in rows:
        t = TARGETS.get(r["case"])
        if t and r["threads"] == 2:
            print(f"target {r['case']}: {r['ratio']:.2f}x (need {t}x): "
                  f"{'met' if r['ratio'] >= t else 'NOT MET'}")
        to = ORTMODULE_TARGETS.get(r["case"])
        if to and r["threads"] == 2:
            print(f"target ORTModule {r['case']}: {r['ortmodule_ratio']:.2f}x (need {to}x): "
                  f"{'met' if r['ortmodule_ratio'] >= to else 'NOT MET'}")
    stem = "train_step" if not args.quick and not args.cases else "train_step_partial"
    write_results(stem, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
