"""``torch.compile`` of a wrapped model: it compiles once (the wrapper steps aside while
Dynamo traces, so the compiled graph is torch's), and its per-call cost vs the eager
wrapped model and the eager/compiled plain model. Forward+backward of an MLP block
(Linear-GELU-LayerNorm-Linear-softmax) per call, median of alternating rounds.

    python -m benchmarks.wrap_compile [--threads 1] [--batch 64] [--width 256]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch._dynamo.testing
from torch import nn

import ortcpu_torch

from ._util import machine_info, set_threads
from .models import isa


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.act, self.ln = nn.Linear(d, 4 * d), nn.GELU(), nn.LayerNorm(4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return torch.softmax(self.fc2(self.ln(self.act(self.fc1(x)))), -1)


def _call(m, x):
    m(x).sum().backward()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    set_threads(args.threads)
    base = Block(args.width)
    x = torch.randn(args.batch, args.width)
    eager = copy.deepcopy(base)
    wrapped = ortcpu_torch.wrap(copy.deepcopy(base), fallback="silent")
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled_wrapped = torch.compile(ortcpu_torch.wrap(copy.deepcopy(base), fallback="silent"),
                                     backend=counter)
    compiled_plain = torch.compile(copy.deepcopy(base))
    sides = {"eager torch": eager, "eager wrapped": wrapped,
             "compiled wrapped": compiled_wrapped, "compiled torch": compiled_plain}
    t0 = time.perf_counter()
    for m in sides.values():
        for _ in range(3):
            _call(m, x)
    warm = time.perf_counter() - t0
    times = {k: [] for k in sides}
    for r in range(4):
        for k in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            for _ in range(args.reps // 4 + 1):
                t = time.perf_counter()
                _call(sides[k], x)
                times[k].append(time.perf_counter() - t)
    mi = machine_info()
    print(f"{mi['cpu']} ({isa()}), {args.threads} thread(s), load average {mi['loadavg']}; "
          f"warm-up incl. compilation {warm:.1f} s")
    print(f"torch.compile(wrap(model)): {counter.frame_count} frame(s) compiled over "
          f"{3 + 4 * (args.reps // 4 + 1)} calls")
    ref = statistics.median(times["eager wrapped"])
    for k, v in times.items():
        med = statistics.median(v)
        print(f"  {k:<18} {med * 1e6:9.1f} us per fwd+bwd   eager wrapped / this: "
              f"{ref / med:5.2f}x")


if __name__ == "__main__":
    main()
