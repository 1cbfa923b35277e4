"""Small-map convolutions (issue 18): the packed path (native/src/conv_pk.inc) against the
small-map im2col path it replaced and torch, at the digits CNN's shapes, in one process.

    python -m benchmarks.conv_small [--threads 1] [--rounds 60] [--steps-rounds 16] [--wall]

1. Each conv layer alone (forward + backward with the gradients the model needs): our
   kernels with the lowering forced (``packed``, ``small_map``) and torch's F.conv2d,
   called in turn call by call (the order reversed every round), min and median per side.
2. The digits training step (``benchmarks.train_step``'s ``digits`` case: the wrapped
   model with ``ortcpu_torch.optimize``, and torch eager) with the conv plans of the
   wrapped model forced to one lowering or the other between rounds of steps, alternating
   with torch's step; median step time. The wrap's ``select="fastest"`` made its choices
   on the first step (under auto), so a conv it gave to torch stays there on both sides.

Default: 1 thread, ``time.thread_time()`` (CPU time: what other processes on a loaded
machine disturb least); ``--wall`` times the wall clock (2 threads on an idle machine).
"""

from __future__ import annotations

import argparse
import statistics as st
import warnings

import torch
import torch.nn.functional as F

from ortcpu_torch.kernels import conv as K

from ._util import ForeignLoad, layer_clock

LAYERS = [  # name, n, c, m, map side (3x3, padding 1)
    ("digits conv1 N64 1->32 8x8", 64, 1, 32, 8),
    ("digits conv2 N64 32->64 4x4", 64, 32, 64, 4),
    ("cnn conv1 N64 1->32 28x28", 64, 1, 32, 28),
]
ALGOS = ("packed", "small_map")
P1 = dict(strides=[1, 1], pads=[1, 1, 1, 1])


def layer(n, c, m, h, rounds, clock):
    """{side: (min us, median us)} of one fwd+bwd per side."""
    x, w, b = torch.randn(n, c, h, h), torch.randn(m, c, 3, 3), torch.randn(m)
    dy = torch.randn(n, m, h, h)
    xr = x.clone().requires_grad_(c > 1)
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()

    def ours(a):
        K.conv_forward("conv", x, w, b, algo=a, **P1)
        K.conv_backward("conv", dy, x, w, need=(c > 1, True, True), algo=a, **P1)

    def torch_side():
        F.conv2d(xr, wr, br, padding=1).backward(dy)

    fs = {a: (lambda a=a: ours(a)) for a in ALGOS}
    fs["torch"] = torch_side
    for f in fs.values():
        f()
        f()
    ts = {k: [] for k in fs}
    for r in range(rounds):
        for k in (list(fs) if r % 2 == 0 else list(fs)[::-1]):
            t0 = clock()
            fs[k]()
            ts[k].append((clock() - t0) * 1e6)
    return {k: (min(v), st.median(v)) for k, v in ts.items()}


def digits_step(rounds, clock, reps=10):
    """{side: median ms per step}: torch, ours with packed convs, ours with small_map."""
    from ortcpu_torch.ops import conv as OC

    from . import train_step as TS

    case = next(c for c in TS.CASES if c.name == "digits")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sides = TS.build(case, sides=("torch", "ours"))
    for _ in range(5):
        for s in sides.values():
            s.step()
    names = ["torch", *ALGOS]
    ts = {k: [] for k in names}
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            if k != "torch":
                for p in OC._PLANS.values():
                    p.geom_c[22] = K.ALGOS[k]
            s = sides["torch" if k == "torch" else "ours"]
            t0 = clock()
            for _ in range(reps):
                s.step()
            ts[k].append((clock() - t0) / reps * 1e3)
    for p in OC._PLANS.values():
        p.geom_c[22] = 0
    return {k: st.median(v) for k, v in ts.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--steps-rounds", type=int, default=16)
    p.add_argument("--wall", action="store_true")
    args = p.parse_args(argv)
    clock, header = layer_clock(args.threads, args.wall)
    load = ForeignLoad()
    print(header)
    print("\nlayer fwd+bwd, us (min / median)      " + "".join(f"{k:>20}" for k in
                                                              (*ALGOS, "torch")))
    for name, n, c, m, h in LAYERS:
        r = layer(n, c, m, h, args.rounds, clock)
        cells = "".join(f"{r[k][0]:>11.0f} / {r[k][1]:<6.0f}" for k in (*ALGOS, "torch"))
        print(f"{name:38s}{cells}  small_map/packed {r['small_map'][0] / r['packed'][0]:.2f}x"
              f" (min)  torch/packed {r['torch'][0] / r['packed'][0]:.2f}x", flush=True)
    d = digits_step(args.steps_rounds, clock)
    print(f"\ndigits step, median ms: torch {d['torch']:.3f}  ours (packed) {d['packed']:.3f}  "
          f"ours (small_map) {d['small_map']:.3f}")
    print(f"  torch/ours: packed {d['torch'] / d['packed']:.3f}x, small_map "
          f"{d['torch'] / d['small_map']:.3f}x; small_map/packed "
          f"{d['small_map'] / d['packed']:.3f}x")
    fl = load.report()
    print(f"\nother processes used {100 * fl['foreign_share']:.0f}% of the machine's CPU "
          "time during the run")


if __name__ == "__main__":
    main()
