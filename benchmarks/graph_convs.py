"""Per-layer Conv timings of the graph executor's models: for every Conv node (with the
epilogue fused into it: bias, residual Add, ReLU), the packed inference kernel
(native/src/conv_infer.c) vs the training kernel (conv_forward + in-place epilogue) on the
node's real inputs, both through the executor's binding, and onnxruntime 1.19.2 running
the same Conv (+ Add + Relu) as a one-node model (its NCHWc reorders at the model's edges
included, so ORT's per-layer figure is an upper bound); and which of ours the plan chose.

Thread CPU time at 1 thread by default (the machine is shared), medians of ``--reps``
alternating rounds.

    python -m benchmarks.graph_convs [--batch B] [--threads N] [--reps R] [--wall] model ...
"""

from __future__ import annotations

import argparse
import statistics
import time

import onnx
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from benchmarks._util import set_threads
from benchmarks.graph import CASES, feeds_for, ort_session
from ortcpu_torch.graph import InferenceSession, conv_infer
from ortcpu_torch.graph.ops_kernels import epilogue_steps


def conv_calls(sess: InferenceSession, feeds: dict) -> list:
    """[(node, bound fn, args)] of every Conv node of the plan, args captured in one run."""
    ex = sess.executor
    vals = ex.positional({k: torch.from_numpy(v) for k, v in feeds.items()})
    plan = ex.plan_for(vals)
    plan.run(*vals)  # the measured choices are made on this first run
    calls = []
    glb = dict(plan._globals)
    for k, b in enumerate(plan.bound):
        if b.node.op_type != "Conv":
            continue

        def capture(*args, _fn=b.fn, _node=b.node):
            calls.append((_node, _fn, [a.clone() if isinstance(a, torch.Tensor) and
                                       a.dim() == 1 and a.numel() > 1e6 else a
                                       for a in args]))
            return _fn(*args)
        glb[f"f{k}"] = capture
    exec(compile(plan.source, plan._filename, "exec"), glb)  # noqa: S102
    glb["run"](*vals)
    return calls


def one_node_model(node, args) -> tuple[onnx.ModelProto, dict]:
    """Conv (+ Add residual) (+ Relu) of ``node`` as a model, and its feeds."""
    steps = epilogue_steps(node)
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) and args[2].dim() == 1 \
        else None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
             if not a.name.startswith("ortcpu_")}
    inits = [numpy_helper.from_array(w.numpy(), "W")]
    ins = ["X", "W"]
    if b is not None:
        inits.append(numpy_helper.from_array(b.numpy(), "B"))
        ins.append("B")
    y = torch.nn.functional.conv2d(x, w, b, attrs.get("strides", [1, 1]),
                                   attrs.get("pads", [0, 0, 0, 0])[:2],
                                   attrs.get("dilations", [1, 1]), attrs.get("group", 1))
    nodes = [helper.make_node("Conv", ins, ["Y0"], **attrs)]
    graph_in = [helper.make_tensor_value_info("X", TP.FLOAT, list(x.shape))]
    feeds = {"X": x.numpy()}
    last = "Y0"
    if "add" in steps:
        graph_in.append(helper.make_tensor_value_info("R", TP.FLOAT, list(y.shape)))
        feeds["R"] = args[-1].numpy()
        nodes.append(helper.make_node("Add", [last, "R"], ["Y1"]))
        last = "Y1"
    if "relu" in steps:
        nodes.append(helper.make_node("Relu", [last], ["Y"]))
        last = "Y"
    g = helper.make_graph(nodes, "conv", graph_in,
                          [helper.make_tensor_value_info(last, TP.FLOAT, list(y.shape))],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), feeds


def timed(fn, clock, reps) -> float:
    """Median seconds of ``reps`` calls of ``fn`` after one warm-up."""
    fn()
    samples = []
    for _ in range(reps):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples)


def layer_times(fn, cargs, clock, reps) -> tuple[dict, str]:
    """{candidate: median s} of one bound Conv on its captured arguments (the candidates
    forced in turn, alternating), and the one the plan chose."""
    choice = getattr(fn, "choice", fn)
    cands = getattr(choice, "candidates", None)
    if cands is None:
        return {"training": timed(lambda: fn(*cargs), clock, reps)}, "training (no packed)"
    decided = conv_infer.decisions().get(choice.key, conv_infer.get_mode())
    samples: dict[str, list] = {n: [] for n in cands}
    for _ in range(reps):
        for n in cands:
            choice.force(n)
            samples[n].append(timed(lambda: fn(*cargs), clock, 1))
    if decided in cands:
        choice.force(decided)
    return {n: statistics.median(v) for n, v in samples.items()}, decided


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help=f"of {list(CASES)}")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--wall", action="store_true", help="wall time instead of CPU time")
    args = ap.parse_args()
    conv_infer.keep_candidates(True)  # every candidate timed after the plan's choice
    set_threads(args.threads)
    clock = time.perf_counter if args.wall else time.thread_time
    ort_clock = time.perf_counter if args.wall else time.process_time
    for name in args.models:
        m = CASES[name](args.batch)
        sess = InferenceSession(m)
        print(f"== {name} batch {args.batch}, {args.threads} thread(s), "
              f"{'wall' if args.wall else 'CPU'} time, ms")
        print(f"{'node':<10}{'X shape':<20}{'W shape':<20}{'epilogue':<10}"
              f"{'packed':>8}{'training':>9}{'chosen':>8}{'ORT':>8}  chosen")
        tot = dict.fromkeys(("packed", "training", "ort", "chosen"), 0.0)
        for node, fn, cargs in conv_calls(sess, feeds_for(m)):
            t, decided = layer_times(fn, cargs, clock, args.reps)
            om, of = one_node_model(node, cargs)
            so = ort_session(om, args.threads)
            t_ort = timed(lambda so=so, of=of: so.run(None, of), ort_clock, args.reps)
            tp, tt = t.get("packed", float("nan")), t["training"]
            ep = "+".join(epilogue_steps(node)) or "-"
            print(f"{(node.name or node.output[0])[:9]:<10}{str(list(cargs[0].shape)):<20}"
                  f"{str(list(cargs[1].shape)):<20}{ep:<10}{tp * 1e3:>8.3f}{tt * 1e3:>9.3f}"
                  f"{t.get(decided, tt) * 1e3:>8.3f}{t_ort * 1e3:>8.3f}  {decided}")
            tot["packed"] += tp if tp == tp else tt
            tot["training"] += tt
            tot["ort"] += t_ort
            tot["chosen"] += t.get(decided, tt)
        print(f"total: packed where it applies {tot['packed'] * 1e3:.2f}, training "
              f"{tot['training'] * 1e3:.2f}, chosen {tot['chosen'] * 1e3:.2f}, ORT one-node "
              f"models {tot['ort'] * 1e3:.2f}")


if __name__ == "__main__":
    main()
