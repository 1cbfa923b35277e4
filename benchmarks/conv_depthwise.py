"""Depthwise convolution (issue 14): our depthwise kernel vs our grouped im2col path vs
PyTorch eager, float32, forward + backward (dX, dW, dB), at MobileNetV3 shapes (N8,
C16..96, 56/28/14/7 maps, 3x3 and 5x5, stride 1 and 2), ConvNeXt's (7x7, pad 3, C32..96
on 28/14 maps) and the small maps of benchmarks/models.py's 32x32 models.

    python -m benchmarks.conv_depthwise [--threads 2] [--reps 11] [--cpu-time]

``ours`` is ``ortcpu_torch.ops.conv2d`` through autograd (auto lowering: the depthwise
kernel); ``im2col`` is the registry's Conv + ConvGrad forced to ``algo="im2col"`` (no
autograd: its time is a lower bound of what that path costs a user). The three sides
alternate call by call; each time is the median over ``--reps`` rounds after warm-up;
ratios are torch / ours and im2col / ours (> 1: ours faster). Where the auto lowering
does not pick the depthwise kernel (stride 2 with a 3x3 kernel and an output under 14x14,
see conv_dw_pays in native/src/conv.c) "ours" is the im2col path too.
``--cpu-time`` (implies 1 thread) times with ``time.thread_time()``, which other
processes on a loaded machine disturb much less than the wall clock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch import ops
from ortcpu_torch.kernels import conv as KC

from ._util import ForeignLoad, isa_line, set_threads

#: (label, C, map side, kernel, stride); N = 8, padding k // 2
SHAPES = [
    ("mnv3 C16 56 k3 s1", 16, 56, 3, 1),
    ("mnv3 C16 56 k3 s2", 16, 56, 3, 2),
    ("mnv3 C72 28 k5 s2", 72, 28, 5, 2),
    ("mnv3 C48 28 k3 s1", 48, 28, 3, 1),
    ("mnv3 C96 14 k5 s1", 96, 14, 5, 1),
    ("mnv3 C96 14 k3 s2", 96, 14, 3, 2),
    ("mnv3 C96 7 k5 s1", 96, 7, 5, 1),
    ("convnext C32 28 k7", 32, 28, 7, 1),
    ("convnext C64 28 k7", 64, 28, 7, 1),
    ("convnext C64 14 k7", 64, 14, 7, 1),
    ("convnext C96 14 k7", 96, 14, 7, 1),
    # the small maps of benchmarks/models.py's 32x32 ConvNeXt / MobileNetV3
    ("convnext C32 8 k7", 32, 8, 7, 1),
    ("convnext C64 4 k7", 64, 4, 7, 1),
    ("mnv3 C48 8 k5 s1", 48, 8, 5, 1),
    ("mnv3 C64 8 k5 s2", 64, 8, 5, 2),
    ("mnv3 C48 16 k3 s2", 48, 16, 3, 2),
]
N = 8
#: the issue's rule: the depthwise kernel is used where it beats both other paths
TARGET = 1.0


def _sides(c, h, k, s):
    p = k // 2
    x = torch.randn(N, c, h, h, requires_grad=True)
    w = torch.randn(c, 1, k, k, requires_grad=True)
    b = torch.randn(c, requires_grad=True)
    g = torch.randn_like(F.conv2d(x, w, b, s, p, 1, c))

    def autograd(fn):
        def run():
            x.grad = w.grad = b.grad = None
            fn(x, w, b, s, p, 1, c).backward(g)
        return run

    xd, wd, bd = x.detach(), w.detach(), b.detach()
    attrs = {"strides": [s, s], "pads": [p] * 4, "group": c, "algo": "im2col"}

    def im2col():
        _, geom = KC.conv_forward_geom("Conv", xd, wd, bd, **attrs)
        KC.conv_backward("ConvGrad", g, xd, wd, geom=geom)

    return {"torch": autograd(F.conv2d), "ours": autograd(ops.conv2d), "im2col": im2col}


def bench(threads: int, reps: int, cpu_time: bool) -> list[dict]:
    clock = time.thread_time if cpu_time else time.perf_counter
    if cpu_time:
        threads = 1
    set_threads(threads)
    print(f"{isa_line()}\nthreads={threads}, clock: "
          f"{'thread CPU time' if cpu_time else 'wall'}, reps={reps}, "
          f"loadavg {os.getloadavg()[0]:.2f}")
    load = ForeignLoad()
    rows = []
    print(f"{'case':22s} {'torch ms':>9s} {'im2col ms':>10s} {'ours ms':>8s} "
          f"{'torch/ours':>10s} {'im2col/ours':>11s}")
    for label, c, h, k, s in SHAPES:
        fns = _sides(c, h, k, s)
        for fn in fns.values():
            fn()
            fn()
        times = {name: [] for name in fns}
        for _ in range(reps):
            for name, fn in fns.items():
                t = clock()
                fn()
                times[name].append(clock() - t)
        med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        row = {"case": label, **med, "vs_torch": med["torch"] / med["ours"],
               "vs_im2col": med["im2col"] / med["ours"]}
        rows.append(row)
        print(f"{label:22s} {med['torch']:9.3f} {med['im2col']:10.3f} {med['ours']:8.3f} "
              f"{row['vs_torch']:9.2f}x {row['vs_im2col']:10.2f}x  target >= {TARGET}x")
    share = load.report()["foreign_share"]
    geo = statistics.geometric_mean([r["vs_torch"] for r in rows])
    print(f"geometric mean torch/ours {geo:.2f}x; other processes used {share:.0%} of the "
          "machine's CPU time during the run")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--cpu-time", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    ortcpu_torch.set_num_threads(a.threads)
    bench(a.threads, a.reps, a.cpu_time)
