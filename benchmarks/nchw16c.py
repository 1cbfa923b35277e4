"""Channel-blocked (NCHW16c) against NCHW 1x1 convolutions, as a chain: three
resnet50-style bottleneck blocks of 1x1s (C -> M -> M -> C, ReLU, residual add), run on
``conv1x1_p16`` (NCHW, what the graph executor runs today) and on ``conv1x1_nchw16c``
(the same tile on blocked tensors, whose rows leave as whole zmm rows), alternating chain
by chain; each layer reads the previous one's output, as in a graph. Medians of
``--rounds``, GFLOP/s in brackets. AVX-512 builds only.

This measures the layout, not the executor: what a blocked-layout path between Convs
(onnxruntime's NCHWc) would win on the layers where issue 15's profiles put ours behind.

    python -m benchmarks.nchw16c [--threads 2] [--rounds 10]

Writes ``benchmarks/results/nchw16c.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ortcpu_torch._native import check_status, get_num_threads, lib, ptr
from ortcpu_torch.kernels.gemm import PackedWeight

from ._util import ForeignLoad, isa_line, machine_info, set_threads, write_results

#: (batch, C, M, H=W): resnet50's stages at batch 1 and 8
CHAINS = [(1, 256, 64, 56), (8, 256, 64, 56), (1, 512, 128, 28), (8, 512, 128, 28),
          (1, 1024, 256, 14), (8, 1024, 256, 14)]


def to_blocked(x: torch.Tensor) -> torch.Tensor:
    """NCHW -> [N][C/16][H*W][16]."""
    n, c, h, w = x.shape
    return x.reshape(n, c // 16, 16, h * w).permute(0, 1, 3, 2).contiguous()


def from_blocked(xb: torch.Tensor, h: int, w: int) -> torch.Tensor:
    n, cb, _p, _ = xb.shape
    return xb.permute(0, 1, 3, 2).reshape(n, cb * 16, h, w)


def conv_nchw(x, pw, b, r, relu):
    nb, k, h, w = x.shape
    y = torch.empty(nb, pw.n, h, w)
    check_status(lib.ortcpu_conv1x1_p16(nb, pw.n, k, h * w, ptr(x), ptr(pw.data), ptr(b),
                                        ptr(r), int(relu), ptr(y), 0, get_num_threads()),
                 "conv1x1_p16")
    return y


def conv_blocked(x, pw, b, r, relu):
    nb, kb, p, _ = x.shape
    y = torch.empty(nb, pw.n // 16, p, 16)
    check_status(lib.ortcpu_conv1x1_nchw16c(nb, pw.n, kb * 16, p, ptr(x), ptr(pw.data),
                                            ptr(b), ptr(r), int(relu), ptr(y),
                                            get_num_threads()), "conv1x1_nchw16c")
    return y


def bottlenecks(c: int, m: int, blocks: int = 3, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(blocks):
        ws = [torch.randn(m, c, generator=g) * c ** -0.5,
              torch.randn(m, m, generator=g) * m ** -0.5,
              torch.randn(c, m, generator=g) * m ** -0.5]
        out.append([(PackedWeight.pack(w, True), torch.randn(w.shape[0], generator=g) * 0.1)
                    for w in ws])
    return out


def run_chain(conv, blocks, x):
    for (pa, ba), (pb, bb), (pc, bc) in blocks:
        h = conv(conv(x, pa, ba, None, True), pb, bb, None, True)
        x = conv(h, pc, bc, x, True)
    return x


def measure(batch: int, c: int, m: int, hw: int, rounds: int) -> dict:
    blocks = bottlenecks(c, m)
    x = torch.randn(batch, c, hw, hw)
    xb = to_blocked(x)
    same = torch.allclose(from_blocked(run_chain(conv_blocked, blocks, xb), hw, hw),
                          run_chain(conv_nchw, blocks, x), rtol=1e-4, atol=1e-4)
    times = {"nchw": [], "nchw16c": []}
    sides = [("nchw", conv_nchw, x), ("nchw16c", conv_blocked, xb)]
    for r in range(rounds):
        for name, conv, inp in (sides if r % 2 else sides[::-1]):
            t0 = time.perf_counter()
            run_chain(conv, blocks, inp)
            times[name].append(time.perf_counter() - t0)
    flops = 3 * 2 * batch * hw * hw * (2 * c * m + m * m)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"batch": batch, "C": c, "M": m, "hw": hw, "same_results": same,
            "nchw_ms": med["nchw"] * 1e3, "nchw16c_ms": med["nchw16c"] * 1e3,
            "nchw_gflops": flops / med["nchw"] / 1e9,
            "nchw16c_gflops": flops / med["nchw16c"] / 1e9,
            "ratio": med["nchw"] / med["nchw16c"]}


def markdown(info: dict, rows: list, load: dict) -> str:
    lines = [f"1x1 bottleneck chains (3 blocks of C -> M -> M -> C, ReLU, residual), NCHW "
             f"(`conv1x1_p16`) vs channel-blocked NCHW16c (`conv1x1_nchw16c`), "
             f"{info['threads']} threads, wall time, medians of alternating rounds; other "
             f"processes used {load['foreign_share']:.0%} of the CPU.", "", isa_line(), "",
             "| batch | C -> M | map | NCHW ms (GFLOP/s) | NCHW16c ms (GFLOP/s) | "
             "ratio NCHW / NCHW16c | same results |",
             "|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['C']} -> {r['M']} | {r['hw']}x{r['hw']} | "
                     f"{r['nchw_ms']:.3f} ({r['nchw_gflops']:.0f}) | "
                     f"{r['nchw16c_ms']:.3f} ({r['nchw16c_gflops']:.0f}) | "
                     f"{r['ratio']:.2f}x | {'yes' if r['same_results'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    if not lib.ortcpu_conv_p16_available():
        raise SystemExit("conv1x1_nchw16c is built at x86-64-v4 only (AVX-512)")
    set_threads(args.threads)
    info = machine_info()
    info["threads"] = args.threads
    load = ForeignLoad()
    rows = [measure(*chain, args.rounds) for chain in CHAINS]
    load_stats = load.report()
    text = markdown(info, rows, load_stats)
    print(text)
    write_results("nchw16c", {"info": info, "rows": rows, "load": load_stats}, text)


if __name__ == "__main__":
    main()
