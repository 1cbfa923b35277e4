"""How close the GEMM-bound cases can get: this CPU's float32 FMA peak per core with AVX2
and with AVX-512, against what our OpenBLAS GEMMs and torch's reach.

    python -m benchmarks.gemm_peak [--reps 7]

Our OpenBLAS copy detects the CPU (AVX-512 kernels where it has them) unless
``ORTCPU_OPENBLAS_CORETYPE`` names a core (``env``: follow ``OPENBLAS_CORETYPE``, which this
machine's environment sets to ``Haswell``: AVX2 kernels); torch's MKL GEMMs run AVX2 code
on AMD CPUs, its oneDNN convolutions and LSTM use AVX-512. A training step
whose GEMM flops divided by the 2-core AVX2 peak exceed torch's whole step time cannot
be matched on AVX2 kernels; this script gives the numbers for that argument. The FMA
loop is compiled here with cffi (gcc; 12 independent accumulator chains per width); each
width runs only if the CPU has it (``__builtin_cpu_supports``: an AVX2-only CPU reports
no AVX-512 peak instead of dying with "Illegal instruction").
Writes ``benchmarks/results/gemm_peak.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import cffi
import torch

from ortcpu_torch._native import lib, openblas_core, ptr

from ._util import ForeignLoad, isa_line, machine_info, set_threads, timed, write_results

_FMA_SRC = r"""
#include <immintrin.h>
#define FMA_LOOP(VT, SET1, FMA, LANES)                                           \
    VT a0 = SET1(0.f), a1 = SET1(1.f), a2 = SET1(2.f), a3 = SET1(3.f),           \
       a4 = SET1(4.f), a5 = SET1(5.f), a6 = SET1(6.f), a7 = SET1(7.f),           \
       a8 = SET1(8.f), a9 = SET1(9.f), a10 = SET1(10.f), a11 = SET1(11.f);       \
    VT m = SET1(0.999999f), c = SET1(1e-7f);                                     \
    for (long i = 0; i < iters; i++) {                                           \
        a0 = FMA(a0, m, c); a1 = FMA(a1, m, c); a2 = FMA(a2, m, c);              \
        a3 = FMA(a3, m, c); a4 = FMA(a4, m, c); a5 = FMA(a5, m, c);              \
        a6 = FMA(a6, m, c); a7 = FMA(a7, m, c); a8 = FMA(a8, m, c);              \
        a9 = FMA(a9, m, c); a10 = FMA(a10, m, c); a11 = FMA(a11, m, c);          \
    }                                                                            \
    VT s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;          \
    float out[LANES];                                                            \
    __builtin_memcpy(out, &s, sizeof out);                                       \
    return out[0];
__attribute__((target("avx2,fma"))) float fma_avx2(long iters)
{ FMA_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, 8) }
__attribute__((target("avx512f"))) float fma_avx512(long iters)
{ FMA_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, 16) }
int cpu_has(int width)
{
    __builtin_cpu_init();
    if (width == 512) return __builtin_cpu_supports("avx512f");
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
"""

#: vector width in bits -> (result key, FMA loop, float32 lanes)
_WIDTHS = {256: ("avx2", "fma_avx2", 8), 512: ("avx512", "fma_avx512", 16)}


def _fma_lib():
    b = cffi.FFI()
    b.cdef("float fma_avx2(long iters); float fma_avx512(long iters); int cpu_has(int width);")
    b.set_source("_ortcpu_fma_peak", _FMA_SRC, extra_compile_args=["-O2"])
    tmp = tempfile.mkdtemp(prefix="ortcpu_fma_")
    path = b.compile(tmpdir=tmp, verbose=False)
    import importlib.util
    spec = importlib.util.spec_from_file_location("_ortcpu_fma_peak", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.lib


def _best_rate(fn, flops: float, reps: int) -> float:
    """Highest GFLOP/s of ``reps`` timed calls (peaks: the best run is the machine's)."""
    return flops / min(timed(fn, reps, warmup=1)) / 1e9


def _median_rate(fn, flops: float, reps: int) -> float:
    return flops / statistics.median(timed(fn, reps)) / 1e9


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gemm_peak")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    load = ForeignLoad()
    fma = _fma_lib()
    iters = 50_000_000
    widths = {name: bool(fma.cpu_has(bits)) for bits, (name, _, _) in _WIDTHS.items()}
    peak = {}
    for name, fn, lanes in _WIDTHS.values():
        if widths[name]:  # never execute an instruction the CPU lacks
            loop = getattr(fma, fn)
            peak[name] = _best_rate(lambda loop=loop: loop(iters), iters * 12 * lanes * 2,
                                    args.reps)
    print(f"FMA widths this CPU has: "
          f"{', '.join(n for n, ok in widths.items() if ok) or 'none (no AVX2+FMA)'}")
    # the "of peak" column needs the AVX2 peak; a CPU without AVX2+FMA leaves it empty
    avx2_peak = peak.get("avx2")
    rows = []
    g = torch.Generator().manual_seed(0)
    for m, k, n in ((2048, 256, 1024), (2048, 1024, 256), (32, 256, 1024)):
        a = torch.randn(m, k, generator=g)
        b = torch.randn(k, n, generator=g)
        c = torch.empty(m, n)
        flops = 2.0 * m * n * k
        for threads in (1, 2):
            set_threads(threads)
            pa, pb, pc = (ptr(t) for t in (a, b, c))
            ours = _median_rate(lambda pa=pa, pb=pb, pc=pc, m=m, n=n, k=k, t=threads:
                                lib.ortcpu_gemm_mt_f32(0, 0, m, n, k, 1.0, pa, k, pb, n, 0.0,
                                                       pc, n, t), flops, args.reps * 3)
            theirs = _median_rate(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), flops, args.reps * 3)
            rows.append({"shape": f"{m}x{k}x{n}", "threads": threads, "ours_gflops": round(ours),
                         "torch_mm_gflops": round(theirs),
                         "ours_of_avx2_peak": round(ours / (avx2_peak * threads), 2)
                         if avx2_peak else None})
    fl = load.report()
    coretype = openblas_core()
    result = {"machine": machine_info(), "cpu_fma_widths": widths,
              "fma_peak_gflops_per_core": {k: round(v) for k, v in peak.items()},
              "openblas_coretype": coretype or "auto", "gemm": rows, "load": fl}
    def shown(name):
        return f"{peak[name]:.0f} GFLOP/s" if name in peak else "not on this CPU"

    lines = ["<!-- generated by `python -m benchmarks.gemm_peak`; do not edit by hand -->",
             isa_line(result["machine"]), "",
             f"float32 FMA peak per core: AVX2 {shown('avx2')}, AVX-512 {shown('avx512')} "
             f"(best of {args.reps}). OpenBLAS core type: "
             f"{coretype or 'auto'}. Other processes used {fl['foreign_share']:.0%} of the "
             f"machine's CPU time.", "",
             "| GEMM m x k x n | threads | ours GFLOP/s | torch.mm GFLOP/s | ours / AVX2 peak |",
             "|---|--:|--:|--:|--:|"]
    lines += [f"| {r['shape']} | {r['threads']} | {r['ours_gflops']} | {r['torch_mm_gflops']} | "
              + (f"{r['ours_of_avx2_peak']:.2f}" if r["ours_of_avx2_peak"] is not None else "—")
              + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results("gemm_peak", result, text)


if __name__ == "__main__":
    main()
