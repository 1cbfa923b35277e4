"""The graph executor's pre-packed constant-weight kernels on their own: ``gemm_p16``
(MatMul/Gemm with a constant weight) against OpenBLAS and ``torch.mm``, and each Conv
candidate of ``graph.conv_infer`` (the AVX-512 ``"gemm"`` implicit GEMM, the ``"packed"``
row tiles, the ``"channels"`` tiles, the training kernel) and torch's ``conv2d`` on
resnet50's and squeezenet's shapes. Operands warm (repeated calls), float32, bias and ReLU
fused where the kernel fuses them; the sides alternate within each shape, medians of
``--rounds``; GFLOP/s in brackets.

    python -m benchmarks.packed_gemm [--threads 1] [--rounds 7] [--quick]

Writes ``benchmarks/results/packed_gemm.{json,md}``. A side a build lacks (the GEMM
candidate below AVX-512, channel tiles on large maps) is left out of its row.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ortcpu_torch._native import lib
from ortcpu_torch.graph.conv_infer import GemmConv, PackedConv, channel_tiles, gemm_candidate
from ortcpu_torch.kernels.conv import conv_forward
from ortcpu_torch.kernels.gemm import PackedWeight, gemm

from ._util import ForeignLoad, isa_line, machine_info, set_threads, write_results

# (k, n) weights and the row counts m: the MLP's layers and the transformer's projections
GEMMS = [((784, 1024), (1, 8, 32)), ((1024, 1024), (1, 8, 32)),
         ((256, 768), (8, 128, 1024)), ((1024, 256), (8, 128, 1024))]
# (N, C, M, H=W, kernel, stride, pad): resnet50's 3x3 and 1x1 stages, its stem, squeezenet's
CONVS = [(1, 64, 64, 56, 3, 1, 1), (1, 128, 128, 28, 3, 1, 1), (1, 256, 256, 14, 3, 1, 1),
         (1, 512, 512, 7, 3, 1, 1), (1, 256, 256, 28, 3, 2, 1), (1, 512, 512, 14, 3, 2, 1),
         (1, 3, 64, 224, 7, 2, 3), (1, 256, 64, 56, 1, 1, 0), (1, 1024, 256, 14, 1, 1, 0),
         (1, 512, 2048, 7, 1, 1, 0), (1, 512, 1024, 28, 1, 2, 0), (1, 16, 64, 55, 3, 1, 1),
         (1, 64, 16, 55, 1, 1, 0), (1, 512, 1000, 13, 1, 1, 0), (8, 512, 512, 7, 3, 1, 1)]


def _median_us(sides: dict, rounds: int, min_s: float = 2e-3) -> dict:
    """name -> median µs per call; each round times every side once (alternating order)
    over enough calls to last ``min_s``."""
    reps = {}
    for name, f in sides.items():
        f()
        t0 = time.perf_counter()
        f()
        reps[name] = max(1, int(min_s / max(time.perf_counter() - t0, 1e-7)))
    times = {name: [] for name in sides}
    order = list(sides)
    for _ in range(rounds):
        for name in order:
            f, n = sides[name], reps[name]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
        order.reverse()
    return {name: statistics.median(v) for name, v in times.items()}


def _gemm_sides(a, w, pw) -> dict:
    sides = {"openblas": lambda: gemm(a, w, None), "torch.mm": lambda: torch.mm(a, w)}
    if pw is not None and a.shape[0] <= lib.ortcpu_gemm_p16_max_rows():
        sides = {"gemm_p16": lambda: pw.matmul(a), **sides}
    return sides


def _conv_sides(x, w, b, geom) -> dict:
    """Every candidate the executor's measured choice weighs for this Conv, and torch's."""
    s, p = geom[10], geom[12]
    out = (geom[0], geom[4], geom[8], geom[9])
    kernels = {}
    if gemm_candidate(geom, torch.float32):
        kernels["gemm"] = GemmConv(w, geom, out)
    kernels["packed"] = PackedConv(w, geom, out)
    if channel_tiles(geom, torch.float32):
        kernels["channels"] = PackedConv(w, geom, out, 1)
    sides = {name: (lambda kc=kc: kc.run(x, b, None, True)) for name, kc in kernels.items()}
    sides["training"] = lambda: conv_forward("Conv", x, w, b, pads=[p] * 4,
                                             strides=[s, s]).relu_()
    sides["torch"] = lambda: F.conv2d(x, w, b, s, p).relu_()
    return sides


def gemm_rows(rounds: int, quick: bool) -> list[dict]:
    rows = []
    g = torch.Generator().manual_seed(0)
    for (k, n), ms in GEMMS[:2] if quick else GEMMS:
        w = torch.randn(k, n, generator=g)
        pw = PackedWeight.pack(w)
        for m in ms:
            us = _median_us(_gemm_sides(torch.randn(m, k, generator=g), w, pw), rounds)
            rows.append({"shape": f"m{m} k{k} n{n}", "flops": 2 * m * k * n, "us": us})
    return rows


def conv_rows(rounds: int, quick: bool) -> list[dict]:
    rows = []
    g = torch.Generator().manual_seed(1)
    for nb, c, m, hw, k, s, p in CONVS[::3] if quick else CONVS:
        x = torch.randn(nb, c, hw, hw, generator=g)
        w, b = torch.randn(m, c, k, k, generator=g), torch.randn(m, generator=g)
        oh = (hw + 2 * p - k) // s + 1
        us = _median_us(_conv_sides(x, w, b, [nb, c, hw, hw, m, 1, k, k, oh, oh, s, s, p, p,
                                              1, 1]), rounds)
        rows.append({"shape": f"N{nb} {c}->{m} {k}x{k}/{s} on {hw}x{hw}",
                     "flops": 2 * nb * c * m * k * k * oh * oh, "us": us})
    return rows


def _table(title: str, rows: list[dict], cols: list[str]) -> list[str]:
    lines = [f"**{title}** (µs per call [GFLOP/s])", "",
             "| shape | " + " | ".join(cols) + " |", "|---|" + "--:|" * len(cols)]
    for r in rows:
        cells = [f"{r['us'][c]:.1f} [{r['flops'] / r['us'][c] / 1e3:.0f}]" if c in r["us"]
                 else "—" for c in cols]
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="a third of the shapes")
    args = ap.parse_args()
    set_threads(args.threads)
    load = ForeignLoad()
    gemms, convs = gemm_rows(args.rounds, args.quick), conv_rows(args.rounds, args.quick)
    fl = load.report()
    info = machine_info()
    lines = ["<!-- generated by `python -m benchmarks.packed_gemm`; do not edit by hand -->",
             isa_line(info), "",
             f"{args.threads} thread(s), warm operands, medians of {args.rounds} alternating "
             f"rounds; other processes used {fl['foreign_share']:.0%} of the machine's CPU "
             "time.", ""]
    lines += _table("Constant-weight GEMM", gemms, ["gemm_p16", "openblas", "torch.mm"])
    lines += _table("Inference Conv candidates (bias + ReLU)", convs,
                    ["gemm", "packed", "channels", "training", "torch"])
    text = "\n".join(lines)
    print(text)
    write_results("packed_gemm", {"machine": info, "threads": args.threads, "gemm": gemms,
                                  "conv": convs, "load": fl}, text)


if __name__ == "__main__":
    main()
