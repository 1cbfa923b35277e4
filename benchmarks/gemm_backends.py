"""OpenBLAS vs torch's MKL for the GEMMs the models run, float32, through our own GEMM
entry points (``ortcpu_gemm_mt_f32`` / ``ortcpu_bmm_f32``) with the backend forced, and
torch's ``mm``/``bmm`` beside them.

    python -m benchmarks.gemm_backends [--threads 2] [--rounds 5] [--quick]

Shapes (m x n x k of C = op(A) op(B), transposes as the training step has them): the
transformer's projections at 2048 tokens (d 256, qkv 768, ff 1024) forward and both
backward GEMMs, its attention bmm (64 heads x 128 x 128 x 64), the CNN's im2col GEMMs,
and the single-threaded per-step recurrence GEMMs of the LSTMs (one thread's batch slice:
what each OpenMP thread runs inside the time loop). Each round times every side once
(best of a few calls), alternating; the table gives the median over rounds, the ratio
OpenBLAS ÷ MKL (> 1: MKL faster) and what ``auto`` picked for the class. The machine's
CPU (and whether it has AVX-512) and the share of CPU time other processes used are
printed: on a shared 2-core machine the ratios are draws, not constants.
Writes ``benchmarks/results/gemm_backends.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ortcpu_torch._native import blas, lib, ptr

from ._util import ForeignLoad, machine_info, set_threads, write_results

# name, trans_a, trans_b, m, n, k, batch (0: one GEMM), threaded
SHAPES = [
    ("xfmr qkv fwd", 0, 1, 2048, 768, 256, 0, True),
    ("xfmr qkv dX", 0, 0, 2048, 256, 768, 0, True),
    ("xfmr qkv dW", 1, 0, 768, 256, 2048, 0, True),
    ("xfmr ff1 fwd", 0, 1, 2048, 1024, 256, 0, True),
    ("xfmr ff1 dX", 0, 0, 2048, 256, 1024, 0, True),
    ("xfmr ff1 dW", 1, 0, 1024, 256, 2048, 0, True),
    ("xfmr ff2 fwd", 0, 1, 2048, 256, 1024, 0, True),
    ("xfmr ff2 dX", 0, 0, 2048, 1024, 256, 0, True),
    ("xfmr ff2 dW", 1, 0, 256, 1024, 2048, 0, True),
    ("xfmr head fwd", 0, 1, 2048, 1000, 256, 0, True),
    ("attn QK^T", 0, 1, 128, 128, 64, 64, True),
    ("attn PV", 0, 0, 128, 64, 128, 64, True),
    ("attn dP", 0, 1, 128, 128, 64, 64, True),
    ("attn dV", 1, 0, 128, 64, 128, 64, True),
    ("cnn conv2 fwd", 0, 0, 64, 1568, 288, 0, True),
    ("cnn conv2 dW", 0, 1, 64, 288, 1568, 0, True),
    ("cnn conv2 dcol", 1, 0, 288, 1568, 64, 0, True),
    ("conv 32->64 4x4", 0, 0, 64, 1024, 288, 0, True),
    ("lstm128 step/thread", 0, 1, 32, 512, 128, 0, False),
    ("lstm128 dstep/thread", 0, 0, 32, 128, 512, 0, False),
    ("lstm256 step/thread", 0, 1, 16, 1024, 256, 0, False),
    ("lstm256 dstep/thread", 0, 0, 16, 256, 1024, 0, False),
]


def _operands(ta, tb, m, n, k, batch):
    bs = (batch,) if batch else ()
    a = torch.randn(*bs, *((k, m) if ta else (m, k)))
    b = torch.randn(*bs, *((n, k) if tb else (k, n)))
    return a, b, torch.empty(*bs, m, n)


def _ours(ta, tb, m, n, k, batch, threads, a, b, c):
    if batch:
        return lambda: lib.ortcpu_bmm_f32(ta, tb, ptr(a), ptr(b), ptr(c), batch, m, n, k,
                                          threads)
    lda, ldb = (m if ta else k), (k if tb else n)
    return lambda: lib.ortcpu_gemm_mt_f32(ta, tb, m, n, k, 1.0, ptr(a), lda, ptr(b), ldb, 0.0,
                                          ptr(c), n, threads)


def _torch(ta, tb, batch, a, b, c):
    at = a.transpose(-1, -2) if ta else a
    bt = b.transpose(-1, -2) if tb else b
    if batch:
        return lambda: torch.bmm(at, bt, out=c)
    return lambda: torch.mm(at, bt, out=c)


def _best(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gemm_backends")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=3, help="calls per side per round (best)")
    p.add_argument("--quick", action="store_true", help="2 rounds")
    args = p.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    set_threads(args.threads)
    info = machine_info()
    avx512 = "avx512f" in open("/proc/cpuinfo").read()
    print(f"CPU: {info['cpu']}  ISA: {'AVX-512' if avx512 else 'AVX2 (no AVX-512)'}  "
          f"threads {args.threads}  MKL: {blas.mkl_available()}")
    saved = blas.get_gemm_backend()
    load = ForeignLoad()
    rows = []
    try:
        for name, ta, tb, m, n, k, batch, threaded in SHAPES:
            t = args.threads if threaded else 1
            a, b, c = _operands(ta, tb, m, n, k, batch)
            ours = _ours(ta, tb, m, n, k, batch, t, a, b, c)
            sides = {"openblas": [], "mkl": [], "torch": []}
            if t > 1 and not batch:  # one GEMM on MKL's own threads, beside the slabs
                sides["mkl_threaded"] = []
            torch_fn = _torch(ta, tb, batch, a, b, c)
            for _ in range(rounds):
                for side in sides:
                    if side == "torch":
                        torch.set_num_threads(t)
                        sides[side].append(_best(torch_fn, args.calls))
                        torch.set_num_threads(args.threads)
                    else:
                        blas.set_gemm_backend(side)
                        ours()
                        sides[side].append(_best(ours, args.calls))
            blas.set_gemm_backend("auto")
            ours()
            flops = 2.0 * m * n * k
            pick = blas.auto_choice(torch.float32, m, n, k, trans_a=bool(ta), trans_b=bool(tb),
                                    threaded=t > 1 and not batch and flops >= 4e6)
            med = {s: statistics.median(v) for s, v in sides.items()}
            flops *= max(batch, 1)
            row = {"name": name, "shape": f"{'T' if ta else 'N'}{'T' if tb else 'N'} "
                   f"{m}x{n}x{k}" + (f" x{batch}" if batch else ""), "threads": t,
                   **{f"{s}_us": round(v * 1e6, 1) for s, v in med.items()},
                   "openblas_gflops": round(flops / med["openblas"] / 1e9, 1),
                   "mkl_gflops": round(flops / med["mkl"] / 1e9, 1),
                   "openblas_over_mkl": round(med["openblas"] / med["mkl"], 2),
                   "mkl_threaded_over_mkl": round(med["mkl_threaded"] / med["mkl"], 2)
                   if "mkl_threaded" in med else None,
                   "auto": pick}
            rows.append(row)
            print(f"{name:22s} {row['shape']:24s} t{t} openblas {row['openblas_us']:9.1f} us "
                  f"mkl {row['mkl_us']:9.1f} us torch {row['torch_us']:9.1f} us  "
                  f"openblas/mkl {row['openblas_over_mkl']:.2f}  "
                  + (f"mkl threads {row['mkl_threaded_us']:9.1f} us (/slabs "
                     f"{row['mkl_threaded_over_mkl']:.2f})  " if "mkl_threaded" in med else "")
                  + f"auto: {pick}", flush=True)
    finally:
        blas.set_gemm_backend(saved)
    foreign = load.report()
    print(f"other processes used {foreign['foreign_share']:.0%} of the machine meanwhile")
    md = [f"CPU: {info['cpu']}, {'AVX-512' if avx512 else 'AVX2, no AVX-512'}; "
          f"{args.threads} threads; other processes' share of the CPU during the run: "
          f"{foreign['foreign_share']:.0%}.", "",
          "| GEMM | shape | threads | OpenBLAS µs | MKL µs | MKL threads µs | torch µs | "
          "OpenBLAS ÷ MKL | MKL threads ÷ MKL | auto |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['name']} | {r['shape']} | {r['threads']} | {r['openblas_us']} | "
                  f"{r['mkl_us']} | {r.get('mkl_threaded_us', '')} | {r['torch_us']} | "
                  f"{r['openblas_over_mkl']} | {r['mkl_threaded_over_mkl'] or ''} | "
                  f"{r['auto']} |")
    write_results("gemm_backends", {"machine": info, "avx512": avx512, "load": foreign,
                                    "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
