"""Per-node profile of the graph executor next to onnxruntime's own (``enable_profiling``),
for the models of ``benchmarks.graph``: time per op type and the slowest nodes, ours and
ORT's, both medians over ``--reps`` runs.

ORT fuses nodes (Conv+Relu, MatMul+Add, ...) under the first node's name, so per-node rows
are matched by name where they exist and op types are compared in total.

    python -m benchmarks.graph_profile [--threads N] [--batch B] [--cpu] [--top K] model ...
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import time

import onnx
import torch

from benchmarks._util import set_threads
from benchmarks.graph import CASES, feeds_for, ort_session
from ortcpu_torch.graph import InferenceSession


def ours_profile(sess: InferenceSession, feeds: dict, reps: int, clock) -> dict:
    """node name -> (op type, median seconds)."""
    sess.run(None, feeds)
    ex = sess.executor
    vals = ex.positional({k: torch.from_numpy(v) for k, v in feeds.items()})
    plan = ex.plan_for(vals)
    samples: dict[str, list] = {}
    ops: dict[str, str] = {}
    ours_profile.model = ex.model
    for _ in range(reps):
        _, rows = plan.profile(*vals, clock=clock)
        for node, t in rows:
            key = node.name or node.output[0]
            samples.setdefault(key, []).append(t)
            ops[key] = node.op_type
    return {k: (ops[k], statistics.median(v)) for k, v in samples.items()}


def ort_profile(model: onnx.ModelProto, feeds: dict, reps: int, threads: int) -> dict:
    """node name -> (op type, median seconds) from onnxruntime's profile."""
    tmp = tempfile.mkdtemp(prefix="ortprof")
    s = ort_session(model, threads, profile_prefix=os.path.join(tmp, "p"))
    for _ in range(reps + 2):
        s.run(None, feeds)
    path = s.end_profiling()
    events = json.load(open(path))
    for f in glob.glob(os.path.join(tmp, "*")):
        os.remove(f)
    os.rmdir(tmp)
    samples: dict[str, list] = {}
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        key = e["name"][: -len("_kernel_time")]
        samples.setdefault(key, []).append(e["dur"] * 1e-6)
        ops[key] = e["args"].get("op_name", "?")
    # drop the 2 warm-up runs
    return {k: (ops[k], statistics.median(v[2:] or v)) for k, v in samples.items()}


def fused_root(model: onnx.ModelProto, output: str, op_type: str) -> str:
    """The name of the ``op_type`` node that onnxruntime fused into the node it named
    after ``output`` (Conv + BatchNormalization + Add + Relu under the Relu's output), found
    by walking first inputs back from the producer of ``output``; ``output`` if none."""
    producer = {o: n for n in model.graph.node for o in n.output}
    node = producer.get(output)
    while node is not None and node.op_type != op_type and node.input:
        node = producer.get(node.input[0])
    if node is None or node.op_type != op_type:
        return output
    return node.name or node.output[0]


def by_op(prof: dict) -> dict:
    out: dict[str, float] = {}
    for op, t in prof.values():
        out[op] = out.get(op, 0.0) + t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help=f"of {list(CASES)}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--cpu", action="store_true", help="ours in thread CPU time")
    args = ap.parse_args()
    set_threads(args.threads)
    clock = time.thread_time if args.cpu else time.perf_counter
    for name in args.models:
        m = CASES[name](args.batch)
        feeds = feeds_for(m)
        ours = ours_profile(InferenceSession(m), feeds, args.reps, clock)
        theirs = ort_profile(m, feeds, args.reps, args.threads)
        print(f"== {name} batch {args.batch}, {args.threads} thread(s): ours "
              f"{sum(t for _, t in ours.values()) * 1e3:.2f} ms in nodes, ORT "
              f"{sum(t for _, t in theirs.values()) * 1e3:.2f} ms in nodes")
        a, b = by_op(ours), by_op(theirs)
        print(f"{'op type':<28}{'ours ms':>10}{'ORT ms':>10}")
        for op in sorted(set(a) | set(b), key=lambda o: -a.get(o, 0)):
            print(f"{op:<28}{a.get(op, 0) * 1e3:>10.3f}{b.get(op, 0) * 1e3:>10.3f}")
        print(f"slowest {args.top} of ours (ORT's node of the same name, if it kept one):")
        by_ours_name = {}
        for k, v in theirs.items():
            base = k[: -len("_nchwc")] if k.endswith("_nchwc") else k
            by_ours_name[fused_root(ours_profile.model, base, v[0])] = v
        for k, (op, t) in sorted(ours.items(), key=lambda kv: -kv[1][1])[: args.top]:
            ort_t = by_ours_name.get(k, (None, None))[1]
            ort_s = f"{ort_t * 1e3:.3f}" if ort_t is not None else "-"
            print(f"  {k[:40]:<40} {op:<18}{t * 1e3:>9.3f}{ort_s:>10}")


if __name__ == "__main__":
    main()
