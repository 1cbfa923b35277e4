"""How much this machine's memory bandwidth depends on which physical pages a buffer gets.

    python -m benchmarks.placement [--runs 8] [--cols 768]

Each run is a fresh process that first touches a blob of a different size (0 MB to 4 GB),
then times LayerNorm's memory traffic at torch's elementwise speed (``mul`` reads x and
writes y, ``add`` reads dy and x and writes dx, 8192 x cols float32, 2 threads, outputs
preallocated): the ``floor`` column of ``benchmarks.norm_loss``. The code and sizes are
the same in every run; only where the kernel places the pages differs. On this guest the
times fall into two groups about 2x apart, and which group a run lands in depends on the
pages the kernel hands out (the blob shifts them), so any two processes can see
different memory speeds: compare ours and torch's in the same process, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from ._util import isa_line

_CHILD = """
import statistics, sys, time, torch
torch.set_num_threads(2)
blob_mb, cols = int(sys.argv[1]), int(sys.argv[2])
blob = torch.ones(blob_mb << 18) if blob_mb else None
x, dy = torch.randn(8192, cols), torch.randn(8192, cols)
y, dx = torch.empty_like(x), torch.empty_like(x)
times = []
for _ in range(40):
    t = time.perf_counter()
    torch.mul(x, 2.0, out=y)
    torch.add(dy, x, out=dx)
    times.append(time.perf_counter() - t)
print(statistics.median(times[5:]) * 1e3)
"""


def main(argv=None) -> list[tuple[int, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--cols", type=int, default=768)
    a = ap.parse_args(argv)
    print(isa_line())
    sizes = [0, 256, 1024, 2048, 4096]
    out = []
    for i in range(a.runs):
        blob = sizes[i % len(sizes)]
        t0 = time.perf_counter()
        ms = float(subprocess.run([sys.executable, "-c", _CHILD, str(blob), str(a.cols)],
                                  check=True, capture_output=True, text=True).stdout)
        out.append((blob, ms))
        print(f"run {i}: {blob:5d} MB touched first  floor {ms:6.3f} ms  "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    ms = [m for _, m in out]
    print(f"min {min(ms):.3f}  median {statistics.median(ms):.3f}  max {max(ms):.3f} ms  "
          f"max/min {max(ms) / min(ms):.2f}")
    return out


if __name__ == "__main__":
    main()
