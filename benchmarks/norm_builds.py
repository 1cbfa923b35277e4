"""Two builds of the native library's float32 LayerNorm rows side by side in one process
(for an A/B of a change to the rows), with torch's F.layer_norm forward + backward.

    python -m benchmarks.norm_builds OLD.so NEW.so [--rounds 30] [--reps 20] [shape ...]

OLD.so / NEW.so are extension files of the same level (e.g. a copy of the tree before
the change, built in place: ``.../ortcpu_torch/_native/_ortcpu_avx2.abi3.so``); each is
imported from its own path, so both live in this process. Per shape (``2048x256``
``2048x768`` by default) and round, the two builds' ``ortcpu_layernorm_forward_f32`` and
``_backward_f32`` (scale, bias, dscale, dbias; 1 thread; preallocated outputs) and
torch's forward + autograd backward (1 thread) run in turn, ``--reps`` calls each, timed
in CPU time of this thread (``time.thread_time``: another process on the 2 cores does not
count), old first in even rounds and new first in odd ones. Prints medians over the
rounds (and the fastest round) in microseconds per call, and new / old.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch
import torch.nn.functional as F

import ortcpu_torch._native  # noqa: F401  (loads OpenBLAS globally, which the builds link)

from ._util import layernorm_buffers


def load(path: str):
    """The cffi lib of the extension file ``path`` (imported under its own name from that
    path, not registered in sys.modules)."""
    name = path.rsplit("/", 1)[-1].split(".")[0]
    spec = importlib.util.spec_from_file_location(f"ortcpu_torch._native.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffi, mod.lib


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.norm_builds")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("shapes", nargs="*", default=["2048x256", "2048x768"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    builds = {"old": load(a.old), "new": load(a.new)}
    print(f"isa levels: old {builds['old'][1].ortcpu_isa_level()}, "
          f"new {builds['new'][1].ortcpu_isa_level()}; torch "
          f"{torch.backends.cpu.get_cpu_capability()}; 1 thread, CPU time, median of "
          f"{a.rounds} rounds x {a.reps} calls")
    for shape in a.shapes:
        rows, cols = map(int, shape.split("x"))
        g = torch.Generator().manual_seed(0)
        t = layernorm_buffers(rows, cols, g)
        x, w, b, dy, y, dx = (t[k] for k in ("x", "w", "b", "dy", "y", "dx"))
        mean, inv, ds, db = (t[k] for k in ("mean", "inv", "ds", "db"))
        calls = {}
        for key, (ffi, lb) in builds.items():
            def p(t, ffi=ffi):
                return ffi.cast("void *", t.data_ptr())
            pf = (p(x), p(w), p(b), p(y), p(mean), p(inv), rows, cols, 1e-5, 0, 1)
            pb = (p(dy), p(x), p(w), p(b), p(mean), p(inv), p(dx), p(ds), p(db), rows, cols,
                  0, 1)
            calls[f"{key} fwd"] = lambda lb=lb, pf=pf: lb.ortcpu_layernorm_forward_f32(*pf)
            calls[f"{key} bwd"] = lambda lb=lb, pb=pb: lb.ortcpu_layernorm_backward_f32(*pb)
        xt, wt, bt = (t.clone().requires_grad_() for t in (x, w, b))

        def torch_step(xt=xt, wt=wt, bt=bt, dy=dy, cols=cols):
            out = F.layer_norm(xt, (cols,), wt, bt)
            torch.autograd.grad(out, (xt, wt, bt), dy)
        calls["torch fwd+bwd"] = torch_step
        times = {k: [] for k in calls}
        for f in calls.values():  # warm-up
            for _ in range(3):
                f()
        keys = list(calls)
        for rnd in range(a.rounds):
            # old first in even rounds, new first in odd ones (torch last)
            order = keys if rnd % 2 == 0 else [*keys[2:4], *keys[0:2], *keys[4:]]
            for k in order:
                f = calls[k]
                t0 = time.thread_time()
                for _ in range(a.reps):
                    f()
                times[k].append((time.thread_time() - t0) / a.reps * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        print(f"{shape}: fwd old {med['old fwd']:.1f} new {med['new fwd']:.1f} us "
              f"({med['new fwd'] / med['old fwd']:.2f}x); bwd old {med['old bwd']:.1f} "
              f"new {med['new bwd']:.1f} us ({med['new bwd'] / med['old bwd']:.2f}x); "
              f"fwd+bwd old {med['old fwd'] + med['old bwd']:.1f} new "
              f"{med['new fwd'] + med['new bwd']:.1f}; torch fwd+bwd "
              f"{med['torch fwd+bwd']:.1f} us; fastest rounds: fwd {low['old fwd']:.1f} / "
              f"{low['new fwd']:.1f}, bwd {low['old bwd']:.1f} / {low['new bwd']:.1f}, torch "
              f"{low['torch fwd+bwd']:.1f}")


if __name__ == "__main__":
    main()
