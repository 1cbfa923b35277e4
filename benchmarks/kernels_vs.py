"""Shared native kernels, kernel level, against torch's and onnxruntime's in one process:
GELU (erf) value and slope, softmax rows and the attention's masked scaled softmax,
LayerNorm forward and backward, the transformer's GEMMs and the attention's small batched
GEMMs, float32; plus GELU's accuracy against a float64 evaluation (issues 14, 15, 16).

    python -m benchmarks.kernels_vs [--threads 1] [--rounds 7] [--quick] [filter ...]

Every side is called on preallocated outputs (torch's ``out=`` overloads, onnxruntime
through IO binding of the same buffers, ours through the C entry points the registry,
the graph executor and ORTModule call), so no side pays allocation or page faults. Each
round times every side once (median of a few calls), sides alternating; a row reports
each side's best round (CPU time of the process at 1 thread, wall time at more) and the
ratios torch/ours and ort/ours (> 1: ours faster). The machine is shared: the load and
the CPU time other processes took meanwhile are printed. Targets (issues 14-16): ours
no slower than the fastest other side on GELU, softmax and LayerNorm rows, and auto's
GEMM choice within 5 % of the faster backend. Writes
``benchmarks/results/kernels_vs_<threads>t.{json,md}`` (filtered or --quick runs:
``kernels_vs_<threads>t_partial.*``).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np
import torch

from ortcpu_torch._native import lib, ptr
from ortcpu_torch.kernels.activations import uint8_ptr

from ._util import ForeignLoad, layernorm_buffers, machine_info, set_threads, write_results

try:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError:  # the extras are optional: torch-only rows then
    ort = None


# ---- onnxruntime single-node sessions on our buffers ----------------------------------

def _ort_node(op: str, inputs: dict, out: torch.Tensor, domain: str = "", **attrs):
    """A callable running one onnxruntime node on ``inputs`` (name -> tensor) into ``out``
    through IO binding (no copies, no allocation), or None without onnxruntime."""
    if ort is None:
        return None
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(t.shape))
          for n, t in inputs.items()]
    node = helper.make_node(op, list(inputs), ["out"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info(
        "out", TensorProto.FLOAT, list(out.shape))])
    model = helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    for n, t in inputs.items():
        io.bind_input(n, "cpu", 0, np.float32, list(t.shape), t.data_ptr())
    io.bind_output("out", "cpu", 0, np.float32, list(out.shape), out.data_ptr())
    return lambda: sess.run_with_iobinding(io)


def _check(st: int, what: str) -> None:
    if st != 0:
        raise RuntimeError(f"{what}: native status {st}")


# ---- cases: (group, name, {side: fn}) --------------------------------------------------

def gelu_cases(shapes):
    g = torch.Generator().manual_seed(0)
    nt = torch.get_num_threads()
    for r, c in shapes:
        x = torch.randn(r, c, generator=g)
        dy = torch.randn(r, c, generator=g)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        yield "gelu", f"gelu fwd {r}x{c}", {
            "ours": lambda x=x, y=y, r=r, c=c: _check(lib.ortcpu_gelu_forward_f32(
                ptr(x), ptr(None), ptr(y), r, c, 0, nt), "gelu_forward"),
            "torch": lambda x=x, y=y: torch.ops.aten.gelu.out(x, out=y),
            "ort": _ort_node("Gelu", {"x": x}, y, domain="com.microsoft"),
        }
        yield "gelu", f"gelu bwd {r}x{c}", {
            "ours": lambda x=x, dy=dy, dx=dx, r=r, c=c: _check(lib.ortcpu_gelu_backward_f32(
                ptr(dy), ptr(x), ptr(None), ptr(dx), ptr(None), r, c, 0, nt), "gelu_backward"),
            "torch": lambda x=x, dy=dy, dx=dx: torch.ops.aten.gelu_backward.grad_input(
                dy, x, grad_input=dx),
            "ort": _ort_node("GeluGrad", {"dy": dy, "x": x}, dx, domain="com.microsoft"),
        }


def softmax_cases(shapes):
    g = torch.Generator().manual_seed(1)
    nt = torch.get_num_threads()
    for r, c in shapes:
        x = torch.randn(r, c, generator=g) * 3
        dy = torch.randn(r, c, generator=g)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        yy = torch.softmax(x, -1)
        yield "softmax", f"softmax fwd {r}x{c}", {
            "ours": lambda x=x, y=y, r=r, c=c: _check(lib.ortcpu_softmax_forward_f32(
                ptr(x), ptr(y), r, c, 1, 0, nt), "softmax_forward"),
            "torch": lambda x=x, y=y: torch.ops.aten._softmax.out(x, -1, False, out=y),
            "ort": _ort_node("Softmax", {"x": x}, y, axis=-1),
        }
        yield "softmax", f"softmax bwd {r}x{c}", {
            "ours": lambda yy=yy, dy=dy, dx=dx, r=r, c=c: _check(lib.ortcpu_softmax_backward_f32(
                ptr(dy), ptr(yy), ptr(dx), r, c, 1, 0, nt), "softmax_backward"),
            "torch": lambda yy=yy, dy=dy, dx=dx: torch.ops.aten._softmax_backward_data.out(
                dy, yy, -1, torch.float32, grad_input=dx),
            "ort": _ort_node("SoftmaxGrad_13", {"dy": dy, "y": yy}, dx, domain="com.microsoft",
                             axis=-1),
        }
    # the attention's causal masked, scaled softmax: [b*h*q, k] scores, mask [q, k]
    r, c = shapes[0]
    x = torch.randn(r, c, generator=g)
    mask = torch.ones(c, c, dtype=torch.bool).tril()
    keep = mask.to(torch.uint8)
    y = torch.empty_like(x)
    scale = 1 / math.sqrt(64)
    x3 = x.view(-1, c, c)
    y3 = y.view(-1, c, c)
    tmp = torch.empty_like(x3)
    nmask = ~mask

    def torch_msm():
        torch.mul(x3, scale, out=tmp)
        tmp.masked_fill_(nmask, float("-inf"))
        torch.ops.aten._softmax.out(tmp, -1, False, out=y3)

    yield "softmax", f"masked scaled softmax fwd {r}x{c}", {
        "ours": lambda: _check(lib.ortcpu_masked_softmax_forward_f32(
            ptr(x), uint8_ptr(keep), ptr(y), r, c, c, scale, float("-inf"), 0, nt),
            "masked_softmax_forward"),
        "torch": torch_msm,
    }


def layernorm_cases(shapes):
    g = torch.Generator().manual_seed(2)
    nt = torch.get_num_threads()
    for r, c in shapes:
        t = layernorm_buffers(r, c, g)
        x, w, b, dy, y, dx = (t[k] for k in ("x", "w", "b", "dy", "y", "dx"))
        mean, inv, ds, db = (t[k] for k in ("mean", "inv", "ds", "db"))
        tm, tr = torch.empty(r, 1), torch.empty(r, 1)
        tdw, tdb = torch.empty(c), torch.empty(c)
        _check(lib.ortcpu_layernorm_forward_f32(ptr(x), ptr(w), ptr(b), ptr(y), ptr(mean),
                                                ptr(inv), r, c, 1e-5, 0, nt), "ln")
        torch.ops.aten.native_layer_norm.out(x, [c], w, b, 1e-5, out0=y, out1=tm, out2=tr)
        yield "layernorm", f"layernorm fwd {r}x{c}", {
            "ours": lambda x=x, w=w, b=b, y=y, mean=mean, inv=inv, r=r, c=c: _check(
                lib.ortcpu_layernorm_forward_f32(ptr(x), ptr(w), ptr(b), ptr(y), ptr(mean),
                                                 ptr(inv), r, c, 1e-5, 0, nt), "ln fwd"),
            "torch": lambda x=x, w=w, b=b, y=y, tm=tm, tr=tr, c=c:
                torch.ops.aten.native_layer_norm.out(x, [c], w, b, 1e-5, out0=y, out1=tm,
                                                     out2=tr),
            "ort": _ort_node("LayerNormalization", {"x": x, "w": w, "b": b}, y, axis=-1,
                             epsilon=1e-5),
        }
        yield "layernorm", f"layernorm bwd {r}x{c}", {
            "ours": lambda x=x, w=w, b=b, dy=dy, dx=dx, ds=ds, db=db, mean=mean, inv=inv, r=r,
            c=c: _check(lib.ortcpu_layernorm_backward_f32(
                ptr(dy), ptr(x), ptr(w), ptr(b), ptr(mean), ptr(inv), ptr(dx), ptr(ds),
                ptr(db), r, c, 0, nt), "ln bwd"),
            "torch": lambda x=x, w=w, b=b, dy=dy, dx=dx, tm=tm, tr=tr, tdw=tdw, tdb=tdb, c=c:
                torch.ops.aten.native_layer_norm_backward.out(
                    dy, x, [c], tm, tr, w, b, [True, True, True], out0=dx, out1=tdw, out2=tdb),
        }


# name, trans_a, trans_b, m, n, k (C = op(A) op(B)); batch > 0: bmm over the batch
GEMMS = [
    ("qkv fwd", 0, 1, 2048, 768, 256, 0), ("qkv dX", 0, 0, 2048, 256, 768, 0),
    ("qkv dW", 1, 0, 768, 256, 2048, 0),
    ("ff1 fwd", 0, 1, 2048, 1024, 256, 0), ("ff1 dX", 0, 0, 2048, 256, 1024, 0),
    ("ff1 dW", 1, 0, 1024, 256, 2048, 0),
    ("ff2 fwd", 0, 1, 2048, 256, 1024, 0), ("ff2 dX", 0, 0, 2048, 1024, 256, 0),
    ("ff2 dW", 1, 0, 256, 1024, 2048, 0),
    ("attn QK^T b8", 0, 1, 128, 128, 64, 32), ("attn PV b8", 0, 0, 128, 64, 128, 32),
    ("attn dP b8", 0, 1, 128, 128, 64, 32), ("attn dV b8", 1, 0, 128, 64, 128, 32),
]


def gemm_cases(quick: bool):
    g = torch.Generator().manual_seed(3)
    nt = torch.get_num_threads()
    for name, ta, tb, m, n, k, batch in GEMMS[::3] if quick else GEMMS:
        nb = max(batch, 1)
        a = torch.randn(nb, k, m, generator=g) if ta else torch.randn(nb, m, k, generator=g)
        b = torch.randn(nb, n, k, generator=g) if tb else torch.randn(nb, k, n, generator=g)
        c = torch.empty(nb, m, n)
        at = a.transpose(1, 2) if ta else a
        bt = b.transpose(1, 2) if tb else b

        def ours(backend, a=a, b=b, c=c, ta=ta, tb=tb, m=m, n=n, k=k, batch=batch):
            def run():
                prev = lib.ortcpu_gemm_get_backend()
                _check(lib.ortcpu_gemm_set_backend(backend), "set_backend")
                try:
                    if batch:
                        st = lib.ortcpu_bmm_f32(ta, tb, ptr(a), ptr(b), ptr(c), batch, m, n, k,
                                                nt)
                    else:
                        st = lib.ortcpu_gemm_mt_f32(ta, tb, m, n, k, 1.0, ptr(a),
                                                    m if ta else k, ptr(b), k if tb else n,
                                                    0.0, ptr(c), n, nt)
                    _check(st, "gemm")
                finally:
                    lib.ortcpu_gemm_set_backend(prev)
            return run

        if batch:
            def torch_side(at=at, bt=bt, c=c):
                torch.bmm(at, bt, out=c)
        else:
            def torch_side(at=at[0], bt=bt[0], c=c[0]):
                torch.mm(at, bt, out=c)
        sides = {"auto": ours(lib.ORTCPU_GEMM_AUTO), "openblas": ours(lib.ORTCPU_GEMM_OPENBLAS)}
        if lib.ortcpu_gemm_mkl_available() & 1:
            sides["mkl"] = ours(lib.ORTCPU_GEMM_MKL)
        sides["torch"] = torch_side
        shape = f"{batch}x" if batch else ""
        yield "gemm", f"gemm {name} {shape}{m}x{n}x{k}", sides


# ---- timing ------------------------------------------------------------------------------

def _clock(threads: int):
    return time.process_time if threads == 1 else time.perf_counter


def _one(fn, clock, calls: int) -> float:
    ts = []
    for _ in range(calls):
        t = clock()
        fn()
        ts.append(clock() - t)
    return statistics.median(ts)


def measure(sides: dict, rounds: int, threads: int, target_s: float = 0.02) -> dict:
    clock = _clock(threads)
    live = {k: f for k, f in sides.items() if f is not None}
    for f in live.values():  # warm-up (and auto's first-use choice)
        f()
        f()
    per = max(_one(f, time.perf_counter, 1) for f in live.values())
    calls = max(3, min(50, int(target_s / max(per, 1e-6))))
    best = {k: math.inf for k in live}
    names = list(live)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for k in order:
            best[k] = min(best[k], _one(live[k], clock, calls))
    return {k: v * 1e3 for k, v in best.items()}


# ---- GELU accuracy against float64 -----------------------------------------------------

GELU_RANGES = [(-13, -10), (-10, -5), (-5, -4), (-4, -2), (-2, -0.5), (-0.5, 0.5), (0.5, 3),
               (3, 10)]


def _ulps(got: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """max |got - ref| in units of the float32 spacing at max(|ref|, floor), over normal
    floats (below 2^-126 the spacing is the denormal one)."""
    mag = torch.clamp(ref.abs(), min=floor).float()
    spacing = (torch.nextafter(mag, torch.tensor(math.inf)) - mag).double()
    return float(((got.double() - ref).abs() / spacing).max())


def gelu_accuracy() -> list[dict]:
    nt = torch.get_num_threads()
    rows = []
    for lo, hi in GELU_RANGES:
        x = torch.linspace(lo, hi, 100001, dtype=torch.float32)
        xd = x.double()
        ref = xd * 0.5 * torch.erfc(-xd / math.sqrt(2))
        ref_slope = 0.5 * torch.erfc(-xd / math.sqrt(2)) + xd * torch.exp(-0.5 * xd * xd) / \
            math.sqrt(2 * math.pi)
        y, s = torch.empty_like(x), torch.empty_like(x)
        _check(lib.ortcpu_gelu_forward_f32(ptr(x), ptr(None), ptr(y), 1, x.numel(), 0, nt), "g")
        ones = torch.ones_like(x)
        _check(lib.ortcpu_gelu_backward_f32(ptr(ones), ptr(x), ptr(None), ptr(s), ptr(None), 1,
                                            x.numel(), 0, nt), "g")
        ty = torch.nn.functional.gelu(x)
        ts = torch.ops.aten.gelu_backward(ones, x)
        # the slope crosses 0 at x = -0.7518: ulps of max(|slope|, 0.05) in that range
        floor = 0.05 if lo < -0.7518 < hi else 0.0
        rows.append({"range": f"[{lo}, {hi}]",
                     "ours_fwd_ulp": _ulps(y, ref), "torch_fwd_ulp": _ulps(ty, ref),
                     "ours_slope_ulp": _ulps(s, ref_slope, floor),
                     "torch_slope_ulp": _ulps(ts, ref_slope, floor)})
    return rows


# ---- main --------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true")
    p.add_argument("filter", nargs="*", help="substrings of row names to run")
    args = p.parse_args(argv)
    set_threads(args.threads)
    rounds = 3 if args.quick else args.rounds

    def groups():
        yield from gelu_cases([(2048, 1024)] if args.quick else [(2048, 1024), (2048, 3072)])
        yield from softmax_cases([(4096, 128), (2048, 512)])
        yield from layernorm_cases([(2048, 256), (2048, 768)])
        yield from gemm_cases(args.quick)

    info = machine_info()
    print(f"{info.get('cpu', '?')}; {args.threads} thread(s); "
          f"{'CPU' if args.threads == 1 else 'wall'} time, best of {rounds} rounds")
    rows = []
    load = ForeignLoad()
    for group, name, sides in groups():
        if args.filter and not any(f in name for f in args.filter):
            continue
        ms = measure(sides, rounds, args.threads)
        ref = ms.get("ours", ms.get("auto"))
        row = {"group": group, "name": name, "ms": ms}
        if group == "gemm":
            fastest = min(v for k, v in ms.items() if k in ("openblas", "mkl"))
            row["auto_vs_best"] = ms["auto"] / fastest
            row["torch_over_auto"] = ms["torch"] / ms["auto"]
            ratios = f"auto/best backend {row['auto_vs_best']:.2f}  torch/auto " \
                     f"{row['torch_over_auto']:.2f}"
        else:
            row["torch_over_ours"] = ms["torch"] / ref
            if "ort" in ms:
                row["ort_over_ours"] = ms["ort"] / ref
            ratios = "  ".join(f"{k}/ours {ms[k] / ref:.2f}" for k in ("torch", "ort") if k in ms)
        rows.append(row)
        print(f"{name:36s} " + "  ".join(f"{k} {v:8.3f}" for k, v in ms.items())
              + f"   ms | {ratios}", flush=True)
    acc = []
    if not args.filter or any("accuracy" in f for f in args.filter):
        print("\nGELU (erf) max error vs float64 in float32 ulps (slope around its root at -0.75: "
              "ulps of max(|slope|, 0.05))")
        for a in gelu_accuracy():
            acc.append(a)
            print(f"  {a['range']:14s} fwd ours {a['ours_fwd_ulp']:9.3g} torch "
                  f"{a['torch_fwd_ulp']:9.3g} | slope ours {a['ours_slope_ulp']:9.3g} torch "
                  f"{a['torch_slope_ulp']:9.3g}")
    foreign = load.report()["foreign_share"]
    print(f"\nother processes' CPU share while measuring: {foreign:.0%} "
          f"(load average {os.getloadavg()[0]:.2f})")
    result = {"machine": info, "threads": args.threads, "rounds": rounds, "rows": rows,
              "gelu_accuracy": acc, "foreign_share": foreign}
    md = [f"Kernel-level, {args.threads} thread(s), {info.get('cpu', '?')}, other processes' "
          f"CPU share {foreign:.0%}.", "", "| row | " + " | ".join(["sides (ms)", "ratios"])
          + " |", "|---|---|---|"]
    for r in rows:
        sides = ", ".join(f"{k} {v:.3f}" for k, v in r["ms"].items())
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k.endswith(("_ours", "_auto",
                                                                                "_best")))
        md.append(f"| {r['name']} | {sides} | {ratios} |")
    stem = f"kernels_vs_{args.threads}t" + ("_partial" if args.filter or args.quick else "")
    write_results(stem, result, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
