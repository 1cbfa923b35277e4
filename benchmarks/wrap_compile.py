"""``torch.compile`` of a wrapped model: it compiles once, with our kernels inside the
compiled graph as ``ortcpu::`` custom ops, and its cost per training step against the
eager wrapped model (the issue's bar: compiled-wrapped not slower than eager wrapped).

Sides, forward+backward(+SGD step) per call, median of alternating rounds, CPU time of
the process (less sensitive than wall time to other processes' load):

- eager torch, eager wrapped (default ``select="fastest"``: the reference of the bar; and
  ``select="ours"``), compiled wrapped as by default (``compile_kernels="auto"``: conv,
  BatchNorm, pooling ours), with every family's kernels ours inside
  (``compile_kernels="ours"``), with the wrapper stepping aside
  (``compile_kernels="torch"``: the old behaviour), compiled torch;
- the recompile count of each compiled side over all its calls;
- the per-call cost of one custom-op call vs calling our kernel directly (tiny GELU),
  and what the custom-op boundary costs inside a compiled graph (the reason GEMMs are
  not in ``compile_kernels="auto"``);
- under ``select="fastest"`` the linear and conv ops inside the graph run ours or ATen's
  per signature, measured on their first call (during the warm-up steps, not timed).

Models: ``mlp`` (Linear-GELU-LayerNorm-Linear-softmax-cross entropy), ``gpt`` (a
GPT-style pre-LN transformer block with a LM-head cross entropy), ``cnn`` (a ResNet-style
basic block: conv-BN-ReLU, MaxPool, global average pool, Linear head)::

    python -m benchmarks.wrap_compile [--model mlp|gpt|cnn|all] [--threads 1] [--reps 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
import ortcpu_torch.ops.library  # noqa: F401  (registers the ortcpu:: ops)
from ortcpu_torch.kernels import activations as KA

from ._util import machine_info, set_threads
from .models import isa


class MLPBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.act, self.ln = nn.Linear(d, 4 * d), nn.GELU(), nn.LayerNorm(4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, y):
        return F.cross_entropy(torch.log_softmax(self.fc2(self.ln(self.act(self.fc1(x)))), -1), y)


class GPTBlock(nn.Module):
    """Pre-LN causal self-attention + GELU MLP, then an LM head and cross entropy."""

    def __init__(self, d, heads=4, vocab=512):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.act, self.fc2 = nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), \
            nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tok, y):
        b, t = tok.shape
        x = self.emb(tok)
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], -1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.fc2(self.act(self.fc1(self.ln2(x))))
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(b * t, -1), y.view(-1))


class CNNBlock(nn.Module):
    """Stem conv-BN-ReLU, MaxPool, a ResNet basic block, global average pool, Linear."""

    def __init__(self, c=32, classes=10):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu, self.pool = nn.ReLU(inplace=True), nn.MaxPool2d(2)
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.gap, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(c, classes)

    def forward(self, x, y):
        x = self.pool(self.relu(self.bn(self.stem(x))))
        h = self.relu(self.b1(self.c1(x)))
        x = self.relu(self.b2(self.c2(h)) + x)
        return F.cross_entropy(self.fc(torch.flatten(self.gap(x), 1)), y)


def make(name: str, batch: int, width: int):
    """(model, inputs) of one benchmark model."""
    if name == "mlp":
        return MLPBlock(width), (torch.randn(batch, width), torch.randint(0, width, (batch,)))
    if name == "gpt":
        t = 64
        return GPTBlock(width), (torch.randint(0, 512, (batch // 8 or 1, t)),
                                 torch.randint(0, 512, (batch // 8 or 1, t)))
    if name == "cnn":
        return CNNBlock(), (torch.randn(batch // 4 or 1, 3, 32, 32),
                            torch.randint(0, 10, (batch // 4 or 1,)))
    raise ValueError(f"unknown model {name!r}")


def _step(m, opt, inputs):
    opt.zero_grad(set_to_none=True)
    loss = m(*inputs)
    loss.backward()
    opt.step()
    return loss


def run_model(name: str, args) -> None:
    torch.manual_seed(0)
    base, inputs = make(name, args.batch, args.width)
    counters, sides = {}, {}
    sides["eager torch"] = copy.deepcopy(base)
    sides["eager wrapped"] = ortcpu_torch.wrap(copy.deepcopy(base), fallback="silent")
    sides["eager wrapped (select='ours')"] = ortcpu_torch.wrap(
        copy.deepcopy(base), fallback="silent", select="ours")
    for label, ck in (("compiled wrapped (default: auto)", "auto"),
                      ("compiled wrapped (ours inside)", "ours"),
                      ("compiled wrapped (torch inside)", "torch")):
        c = counters[label] = torch._dynamo.testing.CompileCounterWithBackend("inductor")
        sides[label] = torch.compile(ortcpu_torch.wrap(copy.deepcopy(base), fallback="silent",
                                                       compile_kernels=ck), backend=c)
    c = counters["compiled torch"] = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    sides["compiled torch"] = torch.compile(copy.deepcopy(base), backend=c)
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in sides.items()}
    t0 = time.perf_counter()
    first = {}
    for k, m in sides.items():
        for _ in range(3):
            first[k] = float(_step(m, opts[k], inputs).detach())
    warm = time.perf_counter() - t0
    times = {k: [] for k in sides}
    per_round = max(args.reps // 4, 1)
    for r in range(4):
        for k in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            m, o = sides[k], opts[k]
            for _ in range(per_round):
                t = time.process_time()
                _step(m, o, inputs)
                times[k].append(time.process_time() - t)
    calls = 3 + 4 * per_round
    print(f"\n[{name}] inputs {[list(t.shape) for t in inputs]}; warm-up incl. compilation "
          f"{warm:.1f} s; loss after 3 steps: " +
          ", ".join(f"{k.split(' (')[0] if k.startswith('eager') else k}={v:.5f}"
                    for k, v in first.items() if k in ("eager wrapped",
                                                      "compiled wrapped (ours inside)")))
    for k, c in counters.items():
        print(f"  {k}: {c.frame_count} frame(s) compiled over {calls} calls")
    ref = statistics.median(times["eager wrapped"])
    for k, v in times.items():
        med = statistics.median(v)
        print(f"  {k:<34} {med * 1e3:8.3f} ms CPU per step   eager wrapped / this: "
              f"{ref / med:5.2f}x")
    for label in ("compiled wrapped (default: auto)", "compiled wrapped (ours inside)"):
        t = statistics.median(times[label])
        met = counters[label].frame_count == 1 and t <= ref * 1.02
        in_graph = sorted({ln.split("torch.ops.ortcpu.")[1].split("(")[0].split(".")[0]
                           for g in counters[label].graphs
                           for ln in g.code.split("\n") if "torch.ops.ortcpu." in ln})
        print(f"  bar for {label} (compiles once, not slower than eager wrapped): "
              f"{'met' if met else 'NOT met'} ({ref / t:.2f}x); ortcpu:: ops in its "
              f"forward graph: {', '.join(in_graph) or 'none'}")


def _below_autograd(x):
    # how a compiled graph's forward/backward calls the op: below the autograd key
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.ortcpu.gelu(x, 0)


def per_call_cost(reps: int = 2000) -> None:
    """One custom-op call (dispatcher + schema + autograd registration) vs our kernel
    called directly and vs the eager ``ops`` autograd.Function, on a tiny GELU."""
    x = torch.randn(8, 8)
    xg = x.clone().requires_grad_()
    g = torch.ones(8, 8)
    cases = {
        "kernel direct (gelu_forward_core)": lambda: KA.gelu_forward_core("gelu", x, None, 0),
        "torch.ops.ortcpu.gelu (autograd key)": lambda: torch.ops.ortcpu.gelu(x, 0),
        "torch.ops.ortcpu.gelu below autograd": lambda: _below_autograd(x),
        "torch.ops.ortcpu.gelu fwd+bwd": lambda: torch.ops.ortcpu.gelu(xg, 0).backward(g),
        "ortcpu_torch.ops.gelu fwd+bwd": lambda: ortcpu_torch.ops.gelu(xg).backward(g),
        "torch F.gelu fwd+bwd": lambda: F.gelu(xg).backward(g),
    }
    res = {k: [] for k in cases}
    for _ in range(5):
        for k, fn in cases.items():
            for _ in range(20):
                fn()
            t = time.process_time()
            for _ in range(reps // 5):
                fn()
            res[k].append((time.process_time() - t) / (reps // 5))
    print("\nper-call cost on 8x8 (eager; under compile the graph calls the op the same way)")
    for k, v in res.items():
        print(f"  {k:<36} {min(v) * 1e6:7.1f} us")
    boundary_cost()


def boundary_cost(reps: int = 50) -> None:
    """What one custom op costs inside a compiled graph: ``F.linear`` fwd+bwd compiled
    (Inductor calls ATen's addmm/mm directly) against ``ortcpu::linear(pick=True)`` with
    its side fixed to torch's (the same ATen calls, inside the custom op), 64x256x256."""
    import ortcpu_torch.ops.library as L

    x, w, b = (torch.randn(*s, requires_grad=True) for s in ((64, 256), (256, 256), (256,)))
    cases = {"compiled F.linear fwd+bwd": torch.compile(lambda: F.linear(x, w, b).sum()),
             "compiled ortcpu::linear (ATen side)": torch.compile(
                 lambda: L.OPS.linear(x, w, b, True).sum())}
    saved, L._side = L._side, lambda key, ours, theirs: "torch"
    try:
        res = {k: [] for k in cases}
        for _ in range(3):
            for fn in cases.values():
                fn().backward()
        for _ in range(6):
            for k, fn in cases.items():
                t = time.process_time()
                for _ in range(reps):
                    fn().backward()
                res[k].append((time.process_time() - t) / reps)
    finally:
        L._side = saved
    print("custom-op boundary inside a compiled graph (64x256x256, fwd+bwd)")
    for k, v in res.items():
        print(f"  {k:<36} {statistics.median(v) * 1e6:7.1f} us")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="all", choices=("mlp", "gpt", "cnn", "all"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    set_threads(args.threads)
    torch._dynamo.config.cache_size_limit = 64  # a recompiling side shows its count
    mi = machine_info()
    print(f"{mi['cpu']} ({isa()}), {args.threads} thread(s), load average {mi['loadavg']}; "
          f"torch {torch.__version__}")
    per_call_cost()
    for name in (("mlp", "gpt", "cnn") if args.model == "all" else (args.model,)):
        run_model(name, args)


if __name__ == "__main__":
    main()
