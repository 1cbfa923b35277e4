"""Channel-blocked (NCHW16c) against NCHW convolutions, as a chain: three resnet50
bottleneck blocks (1x1 C -> M, 3x3 M -> M, 1x1 M -> C + the block's input, ReLU after
each), run on ``conv1x1_p16`` / ``conv_p16`` (NCHW, the graph executor's AVX-512 "gemm"
candidate) and on ``conv1x1_nchw16c`` / ``conv_nchw16c`` (the same tile on blocked
tensors, whose rows leave as whole zmm rows), the blocked kernels also with
``ORTCPU_CONV16C_NO_FETCH`` (weight rows left to the hardware prefetchers: the graph
executor measures both per geometry), the three sides in rotating order chain by chain;
each layer reads the previous one's output, as in a graph. Medians of ``--rounds``,
GFLOP/s in brackets. AVX-512 builds only.

This measures the layout, not the executor: what the blocked path between Convs
(onnxruntime's NCHWc; the executor's blocked regions, ``graph/blocked_layout.py``) wins on
the layers where issue 15's profiles put ours behind.

    python -m benchmarks.nchw16c [--threads 2] [--rounds 10]

Writes ``benchmarks/results/nchw16c.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ortcpu_torch._native import check_status, ffi, get_num_threads, lib, ptr
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


class Layer:
    """One Conv of a chain: its weight packed for both layouts, bias, geometry."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor, hw: int):
        m, c, k, _ = w.shape
        pad = k // 2
        self.k, self.m, self.b = k, m, b
        self.nchw = PackedWeight.pack(w.reshape(m, -1), True)
        # the blocked reduction runs (channel block, tap, channel in block)
        wb = w.reshape(m, c // 16, 16, k, k).permute(0, 1, 3, 4, 2).reshape(m, -1)
        self.blocked = PackedWeight.pack(wb.contiguous(), True)
        self.geom = ffi.new("int64_t[]", [0, c, hw, hw, m, 1, k, k, hw, hw, 1, 1, pad, pad,
                                          1, 1])


def conv_nchw(x, layer, r=None):
    nb, k, h, w = x.shape
    y = torch.empty(nb, layer.m, h, w)
    if layer.k == 1:
        st = lib.ortcpu_conv1x1_p16(nb, layer.m, k, h * w, ptr(x), ptr(layer.nchw.data),
                                    ptr(layer.b), ptr(r), 1, ptr(y), 0, get_num_threads())
    else:
        layer.geom[0] = nb
        st = lib.ortcpu_conv_p16(ptr(x), ptr(layer.nchw.data), ptr(layer.b), ptr(r), 1,
                                 ptr(y), 0, layer.geom, get_num_threads())
    check_status(st, "conv (NCHW)")
    return y


def conv_blocked(x, layer, r=None, flags=1):
    """The blocked layer with ReLU; ``flags`` as the native entry points take them."""
    nb, kb, p, _ = x.shape
    y = torch.empty(nb, layer.m // 16, p, 16)
    if layer.k == 1:
        st = lib.ortcpu_conv1x1_nchw16c(nb, layer.m, kb * 16, p, ptr(x),
                                        ptr(layer.blocked.data), ptr(layer.b), ptr(r), flags,
                                        ptr(y), 0, get_num_threads())
    else:
        layer.geom[0] = nb
        st = lib.ortcpu_conv_nchw16c(ptr(x), ptr(layer.blocked.data), ptr(layer.b), ptr(r),
                                     flags, ptr(y), 0, layer.geom, get_num_threads())
    check_status(st, "conv (NCHW16c)")
    return y


def conv_blocked_nofetch(x, layer, r=None):
    return conv_blocked(x, layer, r, 1 | lib.ORTCPU_CONV16C_NO_FETCH)


def bottlenecks(c: int, m: int, hw: int, blocks: int = 3, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(blocks):
        shapes = [(m, c, 1), (m, m, 3), (c, m, 1)]
        out.append([Layer(torch.randn(o, i, k, k, generator=g) * (i * k * k) ** -0.5,
                          torch.randn(o, generator=g) * 0.1, hw) for o, i, k in shapes])
    return out


def run_chain(conv, blocks, x):
    for a, b, c in blocks:
        x = conv(conv(conv(x, a), b), c, x)
    return x


def measure(batch: int, c: int, m: int, hw: int, rounds: int) -> dict:
    blocks = bottlenecks(c, m, hw)
    x = torch.randn(batch, c, hw, hw)
    xb = to_blocked(x)
    yb = run_chain(conv_blocked, blocks, xb)
    same = torch.allclose(from_blocked(yb, hw, hw), run_chain(conv_nchw, blocks, x),
                          rtol=1e-4, atol=1e-4) and \
        torch.equal(yb, run_chain(conv_blocked_nofetch, blocks, xb))
    sides = [("nchw", conv_nchw, x), ("nchw16c", conv_blocked, xb),
             ("nchw16c_nofetch", conv_blocked_nofetch, xb)]
    times = {name: [] for name, _, _ in sides}
    for r in range(rounds):  # rotating: no side runs twice in a row across rounds
        for name, conv, inp in sides[r % 3:] + sides[:r % 3]:
            t0 = time.perf_counter()
            run_chain(conv, blocks, inp)
            times[name].append(time.perf_counter() - t0)
    flops = 3 * 2 * batch * hw * hw * (2 * c * m + 9 * m * m)
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"batch": batch, "C": c, "M": m, "hw": hw, "same_results": same,
           "ratio": med["nchw"] / med["nchw16c"],
           "fetch_ratio": med["nchw16c"] / med["nchw16c_nofetch"]}
    for k, v in med.items():
        row[f"{k}_ms"], row[f"{k}_gflops"] = v * 1e3, flops / v / 1e9
    return row


def markdown(info: dict, rows: list, load: dict) -> str:
    lines = [f"Bottleneck chains (3 blocks: 1x1 C -> M, 3x3 M -> M, 1x1 M -> C + input, "
             f"ReLU), NCHW (`conv1x1_p16`, `conv_p16`) vs channel-blocked NCHW16c "
             f"(`conv1x1_nchw16c`, `conv_nchw16c`; fetching weight rows ahead, and with "
             f"`ORTCPU_CONV16C_NO_FETCH`), "
             f"{info['threads']} threads, wall time, medians of rounds in rotating order; "
             f"other processes used {load['foreign_share']:.0%} of the CPU.", "",
             isa_line(), "",
             "| batch | C -> M | map | NCHW ms (GFLOP/s) | NCHW16c ms (GFLOP/s) | "
             "NCHW16c no-fetch ms (GFLOP/s) | ratio NCHW / NCHW16c | ratio fetch ms / "
             "no-fetch ms | same results |",
             "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['C']} -> {r['M']} | {r['hw']}x{r['hw']} | "
                     f"{r['nchw_ms']:.3f} ({r['nchw_gflops']:.0f}) | "
                     f"{r['nchw16c_ms']:.3f} ({r['nchw16c_gflops']:.0f}) | "
                     f"{r['nchw16c_nofetch_ms']:.3f} ({r['nchw16c_nofetch_gflops']:.0f}) | "
                     f"{r['ratio']:.2f}x | {r['fetch_ratio']:.2f}x | "
                     f"{'yes' if r['same_results'] else 'NO'} |")
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
