"""Per-node profile of the graph executor next to onnxruntime's own (``enable_profiling``),
for the models of ``benchmarks.graph``: time per op type and the slowest nodes, ours and
ORT's, both medians over ``--rounds`` alternating rounds of ``--reps`` runs per side.

ORT fuses nodes (Conv + BatchNormalization + Add + Relu, ...) and names the fused node
after its last output: rows are matched to ours by walking back from that output to the
node of ORT's op type; op types are compared in total.

    python -m benchmarks.graph_profile [--threads N] [--batch B] [--rounds R] [--reps N]
                                       [--cpu] [--min] [--top K] model ..."""

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


def ours_samples(sess: InferenceSession, feeds: dict, reps: int, clock,
                 samples: dict) -> None:
    """Adds ``reps`` profiled runs to ``samples``: node name -> (op type, [seconds])."""
    sess.run(None, feeds)
    ex = sess.executor
    vals = ex.positional({k: torch.from_numpy(v) for k, v in feeds.items()})
    plan = ex.plan_for(vals)
    for _ in range(reps):
        _, rows = plan.profile(*vals, clock=clock)
        for node, t in rows:
            samples.setdefault(node.name or node.output[0], (node.op_type, []))[1].append(t)


def ort_samples(path: str, warmup: int) -> dict:
    """node name -> (op type, [seconds]) from onnxruntime's profile file, without the
    first ``warmup`` runs."""
    samples: dict[str, tuple] = {}
    for e in json.load(open(path)):
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        key = e["name"][: -len("_kernel_time")]
        samples.setdefault(key, (e["args"].get("op_name", "?"), []))[1].append(e["dur"] * 1e-6)
    return {k: (op, v[warmup:] or v) for k, (op, v) in samples.items()}


def profiles(model: onnx.ModelProto, feeds: dict, rounds: int, reps: int, threads: int,
             clock, stat=statistics.median) -> tuple[dict, dict, onnx.ModelProto]:
    """(ours, ORT's) node name -> (op type, ``stat`` of its seconds), and our executor's
    model:
    ``rounds`` rounds of ``reps`` runs of ours then ``reps`` of ORT's, so a drift of the
    shared host's speed reaches both sides alike."""
    sess = InferenceSession(model)
    tmp = tempfile.mkdtemp(prefix="ortprof")
    ort = ort_session(model, threads, profile_prefix=os.path.join(tmp, "p"))
    for _ in range(2):
        ort.run(None, feeds)
    ours: dict = {}
    for _ in range(rounds):
        ours_samples(sess, feeds, reps, clock, ours)
        for _ in range(reps):
            ort.run(None, feeds)
    path = ort.end_profiling()
    theirs = ort_samples(path, warmup=2)
    for f in glob.glob(os.path.join(tmp, "*")):
        os.remove(f)
    os.rmdir(tmp)

    def summary(d):
        return {k: (op, stat(v)) for k, (op, v) in d.items()}
    return summary(ours), summary(theirs), sess.executor.model


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
    ap.add_argument("--reps", type=int, default=5, help="runs per side and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--cpu", action="store_true", help="ours in thread CPU time")
    ap.add_argument("--min", action="store_true",
                    help="each node's fastest run instead of its median (a host whose speed "
                         "swings between phases: the quiet phase's figures)")
    args = ap.parse_args()
    set_threads(args.threads)
    clock = time.thread_time if args.cpu else time.perf_counter
    for name in args.models:
        m = CASES[name](args.batch)
        feeds = feeds_for(m)
        ours, theirs, our_model = profiles(m, feeds, args.rounds, args.reps, args.threads,
                                           clock, min if args.min else statistics.median)
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
            by_ours_name[fused_root(our_model, base, v[0])] = v
        for k, (op, t) in sorted(ours.items(), key=lambda kv: -kv[1][1])[: args.top]:
            ort_t = by_ours_name.get(k, (None, None))[1]
            ort_s = f"{ort_t * 1e3:.3f}" if ort_t is not None else "-"
            print(f"  {k[:40]:<40} {op:<18}{t * 1e3:>9.3f}{ort_s:>10}")


if __name__ == "__main__":
    main()
