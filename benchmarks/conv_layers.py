"""Per layer of the CNNs in ``benchmarks/models.py`` (ResNet, MobileNetV3, ConvNeXt): each
distinct Conv2d / BatchNorm2d call of one training step (module configuration and input
shape, recorded by forward hooks), forward + backward of torch's module vs the same module
swapped by ``ortcpu_torch.wrap(select="ours")`` (our kernels and the wrap's per-call
path), float32, sides alternating in blocks; ratio = torch / ours (> 1: ours faster).
Where a model step loses, this says which layer shapes do.

    python -m benchmarks.conv_layers [--threads 1] [--blocks 8] [--wall] [model ...]

The default, 1 thread timed with ``time.thread_time()``, is what other processes on a
loaded machine disturb least; ``--wall`` times the wall clock (use it with 2 threads on
an idle machine). Each time is the best block (of ``--blocks``) per side.
"""

from __future__ import annotations

import argparse
import copy
import warnings

import torch

import ortcpu_torch

from . import models as M
from ._util import ForeignLoad, layer_clock

CNNS = ("resnet", "mobilenet_v3", "convnext")
KINDS = ("Conv2d", "BatchNorm2d")


def layer_calls(name: str) -> dict:
    """{(class name, config, input shape, input needs grad): (module, input)} of one
    forward of model ``name``."""
    torch.manual_seed(0)
    model, loss_fn = M.MODELS[name]()
    seen: dict = {}

    def hook(mod, args, out):
        x = args[0]
        key = (type(mod).__name__, mod.extra_repr(), tuple(x.shape), x.requires_grad)
        seen.setdefault(key, (mod, x.detach().clone()))

    hooks = [m.register_forward_hook(hook) for m in model.modules()
             if type(m).__name__ in KINDS]
    loss_fn(model)
    for h in hooks:
        h.remove()
    return seen


def _step(module, x, needs_grad: bool) -> None:
    x = x.clone().requires_grad_(needs_grad)
    y = module(x)
    y.backward(torch.ones_like(y))


def time_layer(module, x, needs_grad: bool, blocks: int, clock) -> tuple[float, float]:
    """(torch ms, ours ms): best block of each side."""
    sides = {"torch": torch.nn.Sequential(copy.deepcopy(module)),
             "ours": torch.nn.Sequential(copy.deepcopy(module))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ortcpu_torch.wrap(sides["ours"], select="ours", fallback="silent")
    for _ in range(3):
        for m in sides.values():
            _step(m, x, needs_grad)
    t0 = clock()
    _step(sides["torch"], x, needs_grad)
    reps = max(3, min(200, int(0.03 / max(clock() - t0, 1e-6))))
    best = {"torch": float("inf"), "ours": float("inf")}
    for b in range(blocks):
        for side in (("torch", "ours") if b % 2 == 0 else ("ours", "torch")):
            t0 = clock()
            for _ in range(reps):
                _step(sides[side], x, needs_grad)
            best[side] = min(best[side], (clock() - t0) / reps * 1e3)
    return best["torch"], best["ours"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--wall", action="store_true", help="wall clock instead of CPU time")
    p.add_argument("models", nargs="*", help=f"a subset of {', '.join(CNNS)}")
    args = p.parse_args(argv)
    names = args.models or list(CNNS)
    bad = [n for n in names if n not in CNNS]
    if bad:
        raise SystemExit(f"unknown model(s) {bad}; choose from {', '.join(CNNS)}")
    clock, header = layer_clock(args.threads, args.wall)
    load = ForeignLoad()
    print(f"{header}, best of {args.blocks} blocks")
    for name in names:
        print(f"\n{name}: {'torch ms':>8} {'ours ms':>8}  ratio  layer")
        tot_t = tot_o = 0.0
        for (kind, cfg, shape, grad), (mod, x) in layer_calls(name).items():
            t, o = time_layer(mod, x, grad, args.blocks, clock)
            tot_t, tot_o = tot_t + t, tot_o + o
            print(f"{'':{len(name) + 1}} {t:8.3f} {o:8.3f} {t / o:5.2f}x  {kind}({cfg[:60]}) "
                  f"on {list(shape)}", flush=True)
        print(f"{'':{len(name) + 1}} {tot_t:8.3f} {tot_o:8.3f} {tot_t / tot_o:5.2f}x  all "
              "layers above (each distinct call once)")
    fl = load.report()
    print(f"\nother processes used {100 * fl['foreign_share']:.0f}% of the machine's CPU "
          "time during the run")


if __name__ == "__main__":
    main()
