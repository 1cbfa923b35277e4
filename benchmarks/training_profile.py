"""Where one on-device training step spends its time: per op type of our plans, the GEMMs'
rate against torch's (MKL) on the same operands, and the whole step on ours, ORT 1.19.2 and
torch eager -- all as CPU time of the calling thread at 1 thread, which other processes'
load does not inflate.

    python -m benchmarks.training_profile [mlp|cnn|gru] [--steps 20]

Same artifacts as ``benchmarks.training_api`` (ORT's generator); ORT's session gets
``session.intra_op.allow_spinning = 0`` and OpenMP the passive wait policy (see there).
Per-node times wrap each bound node function of our plans (an instrumentation overhead of
~1 us per node call, included in the node times).
"""

from __future__ import annotations

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import collections  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from onnx import helper  # noqa: E402

from ._util import machine_info, set_threads  # noqa: E402
from .training_api import _artifacts, _cases, _step_fn  # noqa: E402

clock = time.thread_time


def _instrument(executors: dict, on_call) -> None:
    """Replace every bound node function of the executors' plans by a wrapper calling
    ``on_call(executor_name, node, fn, args)``. Reaches into the generated program's globals
    (``f<k>`` is node k's function): a measuring tool, not an API."""
    for ex_name, ex in executors.items():
        for plan in ex._plans.values():
            glb = plan._fn.__globals__
            for k, bound in enumerate(plan.bound):
                fn = glb[f"f{k}"]

                def wrapped(*args, _fn=fn, _node=bound.node, _ex=ex_name):
                    return on_call(_ex, _node, _fn, args)
                glb[f"f{k}"] = wrapped


def _best(fn, rounds: int = 5, reps: int = 5) -> float:
    times = []
    for _ in range(rounds):
        t = clock()
        for _ in range(reps):
            fn()
        times.append((clock() - t) / reps)
    return min(times)


def _torch_gemm(node, args):
    """torch's equivalent of one ONNX Gemm call (without any fused epilogue)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    a = args[0].t() if attrs.get("transA", 0) else args[0]
    b = args[1].t() if attrs.get("transB", 0) else args[1]
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if len(args) > 2 and args[2] is not None:
        c = args[2]
        return (lambda: torch.addmm(c, a, b, alpha=alpha, beta=beta)), a.shape, b.shape
    return (lambda: torch.mm(a, b)), a.shape, b.shape


def profile(name: str, steps: int) -> None:
    import onnxruntime
    from onnxruntime.training import api as ort_api

    from ortcpu_torch.training import api

    make, shape, loss, optim, batch = _cases()[name]
    folder = tempfile.mkdtemp()
    _artifacts(folder, make, shape, loss, optim, "ort")
    state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
    module = api.Module(os.path.join(folder, "training_model.onnx"), state)
    opt = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    for _ in range(3):
        module(*batch)
        opt.step()
        module.lazy_reset_grad()

    # whole steps first (uninstrumented): ours, ORT, torch eager, alternating rounds
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    fns = {"ours": lambda: (module(*batch), opt.step(), module.lazy_reset_grad()),
           "ORT": _step_fn(ort_api, folder, batch, so)}
    if name == "mlp":
        torch.manual_seed(0)
        net = make()
        topt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        x, y = (torch.from_numpy(b) for b in batch)

        def eager():
            torch.nn.functional.cross_entropy(net(x), y).backward()
            topt.step()
            topt.zero_grad()
        fns["torch eager (AdamW)"] = eager
    for fn in fns.values():
        fn()
    whole = {k: [] for k in fns}
    for _ in range(steps):
        for k, fn in fns.items():
            whole[k].append(_best(fn, rounds=1, reps=1))
    print(f"{name}: one step, CPU time of the calling thread, 1 thread (min of {steps} "
          "alternating steps)")
    for k, v in whole.items():
        print(f"  {k:22s} {1e3 * min(v):7.2f} ms")

    # per op type of our step
    acc: dict = collections.defaultdict(float)
    gemms: dict = {}

    def timed(ex, node, fn, args):
        t = clock()
        out = fn(*args)
        acc[(ex, node.op_type)] += clock() - t
        if node.op_type == "Gemm" and node.name not in gemms:
            gemms[node.name] = (node, fn, args)
        return out

    _instrument({"module": module._train_executor, "optimizer": opt._executor}, timed)
    parts = collections.Counter()
    t_all = clock()
    for _ in range(steps):
        t0 = clock()
        module(*batch)
        t1 = clock()
        opt.step()
        t2 = clock()
        module.lazy_reset_grad()
        parts["module call"] += t1 - t0
        parts["optimizer step"] += t2 - t1
    total = clock() - t_all
    nodes = sum(acc.values())
    print(f"  ours instrumented: {1e3 * total / steps:.2f} ms/step; module call "
          f"{1e3 * parts['module call'] / steps:.2f} ms, optimizer step "
          f"{1e3 * parts['optimizer step'] / steps:.2f} ms; outside nodes (feeds, outputs, "
          f"Python) {1e3 * (total - nodes) / steps:.2f} ms")
    for (ex, op), v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"    {ex:9s} {op:30s} {1e3 * v / steps:7.2f} ms  {100 * v / total:5.1f}%")

    if not gemms:
        return
    print("  Gemm nodes: ours (incl. fused epilogues) vs torch.mm/addmm (MKL) on the same "
          "operands")
    tot_ours = tot_torch = 0.0
    for node_name, (node, fn, args) in gemms.items():
        ref, ash, bsh = _torch_gemm(node, args)
        t_ours, t_torch = _best(lambda fn=fn, args=args: fn(*args)), _best(ref)
        tot_ours += t_ours
        tot_torch += t_torch
        flop = 2 * ash[0] * ash[1] * bsh[1]
        print(f"    {node_name[:32]:32s} [{ash[0]}x{ash[1]}]@[{bsh[0]}x{bsh[1]}]  ours "
              f"{1e3 * t_ours:6.2f} ms {flop / t_ours / 1e9:5.1f} GF/s   torch "
              f"{1e3 * t_torch:6.2f} ms {flop / t_torch / 1e9:5.1f} GF/s")
    print(f"    all Gemm nodes: ours {1e3 * tot_ours:.2f} ms, torch {1e3 * tot_torch:.2f} ms "
          f"(ours/torch {tot_ours / tot_torch:.2f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", nargs="?", default="mlp", choices=sorted(_cases()))
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    set_threads(1)
    info = machine_info()
    print(f"{info.get('cpu', '?')}, load average {os.getloadavg()}; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'default')}")
    profile(args.case, args.steps)


if __name__ == "__main__":
    main()
