"""What a wrapped model's forward adds to each torch call the wrap does not route.

While a wrapped root's forward runs, the wrap may route functionals (``F.gelu``,
``torch.softmax``, ...) to our kernels; every other torch call (``x.add``, a view, a
functional that ``select`` runs on torch) should cost what it costs in plain torch.
This times one forward of a module making ``3 * N`` such calls on 8x8 tensors
(``x.add(x)``, ``torch.relu``, ``.view``), wrapped and not, in the steady state (after
the first forward of the input signature, which counts everything for ``report()``),
for the three steady-state plans of ``ortcpu_torch/wrap/census.py``:

- ``none``: nothing the forward calls runs ours, so no torch function mode at all;
- ``patch``: one functional runs ours (``F.gelu``, select="ours"),
  routed by swapping its ``torch.nn.functional`` attribute during the forward;
- ``lean``: the same functional bound at import time (``from torch.nn.functional import
  gelu``), which no attribute patch catches: a routing-only torch function mode.

and, for reference, the per-call cost with no mode, under an empty
``TorchFunctionMode`` and under the counting ``KernelMode`` (``kernels_enabled()``, what
every forward paid before the census). Extra per call = (wrapped - plain forward time) /
(3 N); the fixed extra per forward (N = 0: the input signature key, the plan) is printed
separately. Clock: the calling thread's CPU time (less sensitive to load than wall
time), 1 thread, sides alternating in blocks, each side's time the minimum over blocks
(load only adds time). Target: <= 0.5 us extra per unrouted call in every plan.

``--models gpt2 bert ...`` (names of ``benchmarks.models``) adds whole models: the
forward of the wrapped model (training mode, autograd on, fixed selection after three
warm-up steps) with the census on and off (``census.ENABLED = False``: every forward
under the counting mode, as before the census), alternating in one process; ratio =
off / on (> 1: the census saves time).

    python -m benchmarks.mode_tax [--calls N] [--blocks B] [--models NAME ...]
"""

from __future__ import annotations

import argparse
import copy
import functools
import time

import torch
import torch.nn.functional as F
from torch.nn.functional import gelu as imported_gelu
from torch.overrides import TorchFunctionMode

import ortcpu_torch

from ._util import cpu_model, isa_line, set_threads

TARGET_US = 0.5
_clock = time.thread_time


class UnroutedCalls(torch.nn.Module):
    """``calls`` rounds of three unrouted torch calls; ``routed``: also one functional
    that runs ours (``"attr"``: ``F.gelu`` looked up at call time, ``"imported"``: bound
    at import time)."""

    def __init__(self, calls: int, routed: str | None = None):
        super().__init__()
        self.calls, self.routed = calls, routed

    def forward(self, x, big):
        y = x
        for _ in range(self.calls):
            y = torch.relu(y.add(x)).view(8, 8)
        if self.routed == "attr":
            big = F.gelu(big)
        elif self.routed == "imported":
            big = imported_gelu(big)
        return y, big


def _per_call(fn, reps: int) -> float:
    t0 = _clock()
    for _ in range(reps):
        fn()
    return (_clock() - t0) / reps


def _alternate(fns: dict, reps: int, blocks: int) -> dict:
    """Seconds per call of each function: minimum over alternating blocks."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(blocks):
        for k, fn in fns.items():
            best[k] = min(best[k], _per_call(fn, reps))
    return best


class _Empty(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def raw_call_costs(blocks: int) -> dict:
    """us per torch call (mean of x.add, torch.relu, view) by what intercepts it."""
    x = torch.randn(8, 8)

    def three():
        torch.relu(x.add(x)).view(8, 8)

    def under(mode_factory):
        def run():
            with mode_factory():
                for _ in range(100):
                    three()
        return run

    def plain():
        for _ in range(100):
            three()

    t = _alternate({"no mode": plain, "empty TorchFunctionMode": under(_Empty),
                    "counting KernelMode (kernels_enabled)":
                        under(lambda: ortcpu_torch.kernels_enabled(fallback="silent",
                                                                   select="fastest"))},
                   20, blocks)
    return {k: v / 300 * 1e6 for k, v in t.items()}


def steady_tax(plan: str, calls: int, blocks: int) -> dict:
    """(extra us per unrouted call, extra us per forward at N=0, the plan the census
    chose) for one plan."""
    routed = {"none": None, "patch": "attr", "lean": "imported"}[plan]
    x, big = torch.randn(8, 8), torch.randn(16, 16)
    out = {}
    for n in (0, calls):
        plain = UnroutedCalls(n, routed)
        # routed: only F.gelu may run ours (always: select="ours"); torch.relu, a
        # routable functional too, stays an unrouted call (not selected)
        wrapped = ortcpu_torch.wrap(copy.deepcopy(plain), fallback="silent",
                                    **({"select": "ours", "include": ["F.gelu"]} if routed
                                       else {"select": "fastest"}))
        with torch.no_grad():
            wrapped(x, big)  # the census forward of this signature
            # the plain side runs the same F.gelu on torch: the difference is the tax plus
            # (ours - torch's) gelu, the same at N = 0 and N = calls, cancelled in the slope
            sides = {"plain": functools.partial(plain, x, big),
                     "wrapped": functools.partial(wrapped, x, big)}
            t = _alternate(sides, max(5, 2000 // (3 * n + 10)), blocks)
        out[n] = (t["wrapped"] - t["plain"]) * 1e6
        rep = ortcpu_torch.report(wrapped, file=None)
        out["plan"] = ",".join(rep.forwards["plans"]) or "-"
        if routed is not None:
            f = {d["name"]: d for d in rep.functionals}["F.gelu"]
            assert f["calls_ours"] >= 1, "F.gelu did not run ours"
    return {"per_call_us": (out[calls] - out[0]) / (3 * calls), "per_forward_us": out[0],
            "plan": out["plan"]}


def model_forward(name: str, rounds: int = 20) -> dict:
    """Best forward ms of a wrapped ``benchmarks.models`` model, census on and off."""
    import warnings

    from ortcpu_torch.wrap import census

    from . import models

    warnings.simplefilter("ignore")
    model, loss_fn = getattr(models, name)()
    opt = torch.optim.AdamW(model.parameters())
    model, opt = ortcpu_torch.optimize(model, opt, fallback="silent")
    for _ in range(3):  # select measures; the census of the signature
        loss_fn(model).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    best = {True: float("inf"), False: float("inf")}
    try:
        for r in range(rounds):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                census.ENABLED = on
                best[on] = min(best[on], _per_call(lambda: loss_fn(model), 3))
    finally:
        census.ENABLED = True
    plans = ",".join(ortcpu_torch.report(model, file=None).forwards["plans"])
    return {"on_ms": best[True] * 1e3, "off_ms": best[False] * 1e3, "plan": plans}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100, help="rounds of 3 calls (default 100)")
    ap.add_argument("--blocks", type=int, default=9, help="alternating blocks (default 9)")
    ap.add_argument("--models", nargs="*", default=[],
                    help="also whole models of benchmarks.models (forward, census on/off)")
    a = ap.parse_args(argv)
    set_threads(1)
    print(f"{cpu_model()}; {isa_line()}")
    print("per torch call on 8x8 tensors (us, thread CPU time, 1 thread):")
    for k, v in raw_call_costs(a.blocks).items():
        print(f"  {k:<40} {v:6.2f}")
    print(f"wrapped forward, steady state, extra over the plain module (target <= "
          f"{TARGET_US} us per unrouted call):")
    for plan in ("none", "patch", "lean"):
        r = steady_tax(plan, a.calls, a.blocks)
        ok = "meets target" if r["per_call_us"] <= TARGET_US else "ABOVE target"
        print(f"  plan {plan:<6} (census chose {r['plan']:<5}) {r['per_call_us']:6.2f} us/call, "
              f"{r['per_forward_us']:6.1f} us/forward fixed  {ok}")
    if a.models:
        print("wrapped model forward (best ms of 3-forward blocks, 1 thread), census on / off:")
    for name in a.models:
        r = model_forward(name)
        print(f"  {name:<13} {r['on_ms']:8.2f} / {r['off_ms']:8.2f} ms  "
              f"{r['off_ms'] / r['on_ms']:.3f}x  (steady state: {r['plan']})")


if __name__ == "__main__":
    main()
