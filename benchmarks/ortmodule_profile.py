"""Where an ORTModule training step spends its time, next to eager torch's step.

    python -m benchmarks.ortmodule_profile [--threads 1] [--steps 10] [--wall] [case ...]

Same cases and step as ``benchmarks.train_step`` (zero_grad + forward + loss + backward +
fused AdamW). For ORTModule, three steps after ``--steps`` timed ones are profiled per node with
each bound node call wrapped in a timer for the profiled steps only (~1 us per node of
instrumentation included in the node times); the rest of the step ("outside the graphs":
feeds, the autograd.Function boundary, the loss, ``.grad`` accumulation, the optimizer) is
the step time minus the two executors' time. For torch, torch.profiler's self CPU time per
aten op. Default clock: CPU time of the calling thread (``time.thread_time``, robust to other
processes' load; at 1 thread it is the whole step's CPU time); ``--wall`` for wall time.
"""

from __future__ import annotations

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import collections  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from ._util import set_threads  # noqa: E402
from .train_step import CASES, build  # noqa: E402

GEMM_NODES = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "Conv", "ConvGrad", "LSTMTraining",
              "LSTMGrad", "GRUTraining", "GRUGrad",
              # graph/training_fusions.py's LSTM in torch's gate order
              "LSTMTorchGatesTraining", "LSTMTorchGatesGrad",
              # graph/training_fusions_attention.py: batched GEMMs into merged heads
              "MatMulMergeHeads"}
TORCH_GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
              "aten::linear", "aten::mkldnn_convolution", "aten::convolution_backward",
              "aten::_convolution", "aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward"}


class _Recorder:
    """Times every node of an ORTModule entry's forward and backward plans while active.

    Swaps each plan's bound node functions (``f<k>`` in the generated program's globals)
    for timing wrappers and puts the originals back on exit: the plain run is untouched
    outside the ``with`` block. A measuring tool reaching into the plan, not an API."""

    def __init__(self, entry, clock):
        self.entry, self.clock = entry, clock
        self.each: dict[tuple[str, int], list] = {}  # (part, k) -> [node, shapes, seconds]
        self._saved: list = []

    def __enter__(self):
        for part in ("forward", "backward"):
            for plan in getattr(self.entry, part)._plans.values():
                glb = plan._fn.__globals__
                for k, bound in enumerate(plan.bound):
                    rec = self.each.setdefault((part, k), [bound.node, None, 0.0])
                    self._saved.append((glb, f"f{k}", glb[f"f{k}"]))
                    glb[f"f{k}"] = self._timed(glb[f"f{k}"], rec)
        return self

    def _timed(self, fn, rec):
        clock = self.clock

        def run(*args):
            rec[1] = [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
            t0 = clock()
            try:
                return fn(*args)
            finally:
                rec[2] += clock() - t0
        return run

    def __exit__(self, *exc):
        for glb, name, fn in self._saved:
            glb[name] = fn

    def graph_seconds(self) -> float:
        return sum(r[2] for r in self.each.values())


def _timed_step(side, clock) -> float:
    t0 = clock()
    side.step()
    return clock() - t0


def profile_case(case, steps: int, clock) -> dict:
    sides = build(case, sides=("torch", "ortmodule"))
    torch_side, om_side = sides["torch"], sides["ortmodule"]
    for _ in range(3):
        torch_side.step()
        om_side.step()
    om = om_side.model
    if om._fallback_reason is not None:
        return {"case": case.name, "fell_back": om._fallback_reason}
    entry = next(iter(om._cache.values()))
    times = {"torch": [], "ortmodule": []}
    for _ in range(steps):
        times["torch"].append(_timed_step(torch_side, clock))
        times["ortmodule"].append(_timed_step(om_side, clock))
    med = {k: statistics.median(v) for k, v in times.items()}
    rec = _Recorder(entry, clock)
    n = 3
    t_total = 0.0
    with rec:
        for _ in range(n):
            t_total += _timed_step(om_side, clock)
    step_s, graph_s = t_total / n, rec.graph_seconds() / n
    nodes: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0.0, 0])
    for (part, _), (node, _, s) in rec.each.items():
        nodes[(part, node.op_type)][0] += s / n
        nodes[(part, node.op_type)][1] += 1
    each = sorted(((part, node, shapes, s / n) for (part, _), (node, shapes, s)
                   in rec.each.items()), key=lambda r: -r[3])

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch_side.step()
    tops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    torch_total = sum(e.self_cpu_time_total for e in tops) / 1e6
    torch_gemm = sum(e.self_cpu_time_total for e in tops if e.key in TORCH_GEMM) / 1e6
    ours_gemm = sum(s for (_, op), (s, _) in nodes.items() if op in GEMM_NODES)
    split = gemm_split(each)
    from ortcpu_torch.graph import conv_infer

    conv_grad = [(list(k[1][4:7]), list(k[1][:3]), v) for k, v in conv_infer.decisions().items()
                 if k[0] == "ConvGrad"]
    return {
        "conv_grad_choices": conv_grad,
        "case": case.name, "torch_ms": med["torch"] * 1e3, "ortmodule_ms": med["ortmodule"] * 1e3,
        "profiled_step_ms": step_s * 1e3, "graph_ms": graph_s * 1e3,
        "nodes": nodes, "each": each, "torch_top": [(e.key, e.count, e.self_cpu_time_total / 1e3)
                                      for e in tops[:25]],
        "torch_profiled_ms": torch_total * 1e3, "torch_gemm_share": torch_gemm / torch_total,
        "ours_gemm_share": ours_gemm / step_s,
        "gemm_split_ms": {k: v * 1e3 for k, v in split.items()},
    }


def gemm_split(each) -> dict[str, float]:
    """Seconds per step of the GEMM-type nodes by part and kind, and of everything else in
    the graphs: ``attention`` is a product of 4-D operands (batched over heads: QK^T, P·V
    and their gradients), ``dense`` every other GEMM node (Linear / conv / RNN)."""
    out = collections.defaultdict(float)
    for part, node, shapes, s in each:
        if node.op_type not in GEMM_NODES:
            out[f"{part} other"] += s
            continue
        ranks = [len(x) for x in shapes or () if x is not None]
        kind = "attention" if ranks and min(ranks) == 4 and node.op_type in (
            "MatMul", "MatMulMergeHeads") else "dense"
        out[f"{part} {kind}"] += s
    return dict(sorted(out.items()))


def print_case(r: dict, top_nodes: int = 0) -> None:
    if "fell_back" in r:
        print(f"{r['case']}: ORTModule fell back: {r['fell_back']}")
        return
    print(f"\n== {r['case']}: torch {r['torch_ms']:.2f} ms, ORTModule {r['ortmodule_ms']:.2f} ms "
          f"({r['torch_ms'] / r['ortmodule_ms']:.2f}x); profiled ORTModule step "
          f"{r['profiled_step_ms']:.2f} ms, in the graphs {r['graph_ms']:.2f} ms, outside "
          f"{r['profiled_step_ms'] - r['graph_ms']:.2f} ms")
    print(f"   GEMM-type share of the step: ORTModule {100 * r['ours_gemm_share']:.0f}%, "
          f"torch {100 * r['torch_gemm_share']:.0f}% (of profiled self CPU)")
    split = r["gemm_split_ms"]
    print("   ORTModule ms/step in the graphs: " + ", ".join(
        f"{k} {v:.1f} ({100 * v / r['profiled_step_ms']:.0f}%)" for k, v in split.items()))
    print("   ORTModule per node type (part, op, calls/step, ms/step):")
    for (part, op), (s, c) in sorted(r["nodes"].items(), key=lambda kv: -kv[1][0]):
        print(f"     {part:<8} {op:<34} {c:>4} {s * 1e3:>8.3f}")
    if top_nodes:
        print(f"   ORTModule top {top_nodes} nodes (ms/step, input shapes):")
        for part, node, shapes, s in r["each"][:top_nodes]:
            shapes = ", ".join("-" if x is None else "x".join(map(str, x)) or "()"
                               for x in shapes or ())
            print(f"     {part:<8} {node.op_type:<22} {s * 1e3:>8.3f}  {shapes}  {node.name}")
    if r.get("conv_grad_choices"):
        print("   ConvGrad measured choices (input dims, [N, C, M], kernel): " + "; ".join(
            f"{'x'.join(map(str, d))} {ncm}: {v}" for d, ncm, v in r["conv_grad_choices"]))
    print(f"   torch top self-CPU ops (total {r['torch_profiled_ms']:.2f} ms under the profiler):")
    for key, count, ms in r["torch_top"]:
        print(f"     {key:<40} {count:>4} {ms:>8.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ortmodule_profile",
                                description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--wall", action="store_true", help="wall time instead of thread CPU time")
    p.add_argument("--nodes", type=int, default=0, metavar="N",
                   help="also list the N most expensive single nodes with input shapes")
    p.add_argument("cases", nargs="*")
    args = p.parse_args(argv)
    set_threads(args.threads)
    clock = time.perf_counter if args.wall else time.thread_time
    sel = [c for c in CASES if not args.cases or any(f in c.name for f in args.cases)]
    print(f"{args.threads} thread(s), clock: {'wall' if args.wall else 'thread CPU'} time")
    for case in sel:
        print_case(profile_case(case, args.steps, clock), args.nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
