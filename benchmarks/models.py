"""Training step of real model architectures, plain torch vs ``ortcpu_torch.optimize()``.

GPT-2, BERT, Llama, ViT and ConvNeXt from small Hugging Face transformers configs, and
ResNet/MobileNetV3-style networks written as torchvision writes them
(``tests/models/torchvision_style.py``), random init, synthetic batches, AdamW. Each
model is deep-copied for the two sides (same weights); the torch side runs
``torch.optim.AdamW(fused=True)``, ours is ``optimize(model, AdamW)`` with the default
``select="fastest"`` (its first steps measure, and its in-model check alternates the
selection with all-torch steps after that: both are warm-up here).

Method: the two sides alternate in rounds (torch then ours, ours then torch, ...), each
round a few steps per side; a round's ratio is torch's median step / ours' median step
of that round (the two sides measured minutes apart would see different load), the
model's ratio is the median of its rounds' ratios (> 1: ours faster), and the spread is
their interquartile range: on a quiet machine it is a few hundredths, a wide one says
the run was disturbed. Prints the CPU, its vector ISA, the load other processes put on
the machine, and the targets (issue 14: >= 1.0x on every model; aim >= 1.2x on the
transformer models).

With ``--compile`` the two sides are the eager wrapped model (``optimize()``, the
reference) and ``torch.compile`` of a second wrapped copy (default ``compile_kernels=
"auto"``): ratio = eager wrapped ms / compiled wrapped ms, target >= 1.0x on every model
(issue 14: ``torch.compile(wrap(model))`` compiles once and is not slower than the eager
wrapped model), with the frames Dynamo compiled over the run against those of plain
``torch.compile`` of the model (more would be recompiles of the wrapper's making).

    python -m benchmarks.models [--quick] [--compile] [--threads 2] [--rounds R]
                                [--steps S] [name ...]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

import torch
import torch._dynamo.testing
import torch.nn.functional as F

import ortcpu_torch
from ortcpu_torch.wrap.policy import STATE_ATTR

from ._util import ForeignLoad, machine_info, openmp_runtimes, set_threads, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, SEQ, BATCH = 1000, 64, 8


def isa() -> str:
    """The widest x86 vector extension the CPU reports (our kernels' and torch's paths
    differ between AVX2-only and AVX-512 machines)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")),
                         [])
    except OSError:
        return "unknown"
    if "avx512f" in flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else "no AVX2"


def _tf():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _lm(model):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def _image(model, size=32, classes=10, hf=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, size, size, generator=g)
    y = torch.randint(0, classes, (16,), generator=g)
    if hf:
        return model, lambda m: m(pixel_values=x, labels=y).loss
    return model, lambda m: F.cross_entropy(m(x), y)


def gpt2():
    t = _tf()
    return _lm(t.GPT2LMHeadModel(t.GPT2Config(
        n_layer=2, n_head=4, n_embd=128, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)))


def bert():
    t = _tf()
    return _lm(t.BertForMaskedLM(t.BertConfig(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=512, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)))


def llama():
    t = _tf()
    return _lm(t.LlamaForCausalLM(t.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        bos_token_id=0, eos_token_id=0)))


def vit():
    t = _tf()
    return _image(t.ViTForImageClassification(t.ViTConfig(
        image_size=32, patch_size=4, hidden_size=128, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=512, num_labels=10,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)))


def convnext():
    t = _tf()
    return _image(t.ConvNextForImageClassification(t.ConvNextConfig(
        hidden_sizes=[32, 64], depths=[2, 2], num_stages=2, image_size=32, num_labels=10)))


def _tv():
    sys.path.insert(0, ROOT)
    from tests.models import torchvision_style

    return torchvision_style


def resnet():
    return _image(_tv().ResNetTiny(classes=10, width=16), hf=False)


def mobilenet_v3():
    return _image(_tv().MobileNetV3Tiny(classes=10, width=16), hf=False)


MODELS = {f.__name__: f for f in (gpt2, bert, llama, vit, convnext, resnet, mobilenet_v3)}


def _step(model, opt, loss_fn):
    opt.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    opt.step()


TRANSFORMERS = ("gpt2", "bert", "llama", "vit")
TARGET, AIM = 1.0, 1.2


def round_ratios(times: dict) -> list[float]:
    """Per round: torch's median step time / ours' (``times[side][r]``: that round's steps)."""
    return [statistics.median(t) / statistics.median(o)
            for t, o in zip(times["torch"], times["ours"], strict=True)]


def spread(ratios: list[float]) -> tuple[float, float]:
    """The interquartile range of the round ratios."""
    if len(ratios) < 2:
        return ratios[0], ratios[0]
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return q[0], q[2]


def _optimized(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ortcpu_torch.optimize(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                     fallback="silent")


def _plain_frames(base, loss_fn, steps: int) -> int:
    """Frames Dynamo compiles over ``steps`` steps of plain torch.compile of the model
    (untimed): a recompile of the model's own (Hugging Face's classification losses set
    ``config.problem_type`` on their first call) is not the wrapper's."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cm = torch.compile(model, backend=counter)
    for _ in range(steps):
        _step(cm, opt, loss_fn)
    return counter.frame_count


def run(name: str, rounds: int, steps: int, warmup: int, compiled: bool = False) -> dict:
    """One model's alternating rounds. ``compiled``: the sides are the eager wrapped
    model ("torch" in the row: the reference) and torch.compile of a wrapped copy
    ("ours")."""
    torch.manual_seed(0)
    base, loss_fn = MODELS[name]()
    sides = {"torch": copy.deepcopy(base), "ours": copy.deepcopy(base)}
    counter = None
    if compiled:
        sides["torch"], opt_ref = _optimized(sides["torch"])
        opts = {"torch": opt_ref}
        wrapped, opts["ours"] = _optimized(sides["ours"])
        counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
        sides["ours"] = torch.compile(wrapped, backend=counter)
    else:
        opts = {"torch": torch.optim.AdamW(sides["torch"].parameters(), lr=1e-3,
                                           fused=True)}
        sides["ours"], opts["ours"] = _optimized(sides["ours"])
    first = None
    for side in sides:
        for _ in range(warmup):
            _step(sides[side], opts[side], loss_fn)
            if counter is not None and first is None and side == "ours":
                first = counter.frame_count
    # select's in-model check alternates its arms over the first steps after the choices
    # settle: part of the warm-up, so the rounds time the steady state
    state = getattr(sides["ours"], STATE_ATTR, None)
    for _ in range(64):
        if state is None or state.check is None:
            break
        _step(sides["ours"], opts["ours"], loss_fn)
    times = {"torch": [], "ours": []}
    for r in range(rounds):
        order = ("torch", "ours") if r % 2 == 0 else ("ours", "torch")
        for side in order:
            ts = []
            for _ in range(steps):
                t0 = time.perf_counter()
                _step(sides[side], opts[side], loss_fn)
                ts.append(time.perf_counter() - t0)
            times[side].append(ts)
    ratios = round_ratios(times)
    lo, hi = spread(ratios)
    t_ms = statistics.median(t for ts in times["torch"] for t in ts) * 1e3
    o_ms = statistics.median(t for ts in times["ours"] for t in ts) * 1e3
    rep = ortcpu_torch.report(sides["torch"] if compiled else sides["ours"], file=None)
    check = rep.model_check or {}
    extra = {} if counter is None else {"frames_first_call": first,
                                        "frames": counter.frame_count,
                                        "frames_plain": _plain_frames(base, loss_fn, warmup),
                                        "calls": warmup + rounds * steps}
    return {**extra, "model": name, "torch_ms": round(t_ms, 3), "ours_ms": round(o_ms, 3),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_p25": round(lo, 3), "ratio_p75": round(hi, 3),
            "round_ratios": [round(x, 3) for x in ratios],
            "swapped": len(rep.modules),
            "signatures_on_torch": sum(c["side"] == "torch" for c in rep.choices.values()),
            "signatures": len(rep.choices), "model_check": check.get("outcome")}


def _verdict(row: dict) -> str:
    r = row["ratio"]
    if "frames" in row:  # --compile
        once = row["frames"] <= row["frames_plain"]
        return ("no more frames than plain torch.compile" if once else "RECOMPILED") + \
            (", not slower" if r >= TARGET else ", slower than eager wrapped")
    if r < TARGET:
        return "below target"
    if row["model"] in TRANSFORMERS and r < AIM:
        return "meets target, below aim"
    return "meets target"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    p.add_argument("--compile", action="store_true",
                   help="eager wrapped vs torch.compile of the wrapped model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, help="alternating rounds (default 16, quick 6)")
    p.add_argument("--steps", type=int, help="steps per side and round (default 4, quick 3)")
    p.add_argument("names", nargs="*", help=f"a subset of {', '.join(MODELS)}")
    args = p.parse_args(argv)
    names = args.names or list(MODELS)
    bad = [n for n in names if n not in MODELS]
    if bad:
        raise SystemExit(f"unknown model(s) {bad}; choose from {', '.join(MODELS)}")
    rounds, steps, warmup = (6, 3, 3) if args.quick else (16, 4, 4)
    rounds, steps = args.rounds or rounds, args.steps or steps
    set_threads(args.threads)
    load = ForeignLoad()
    machine = machine_info()
    machine["isa"] = isa()
    print(f"{machine['cpu']} ({machine['isa']}), {machine['cpus']} CPUs, {args.threads} "
          f"threads, torch {machine['torch']}, load average {machine['loadavg']}, OpenMP "
          f"runtimes: {', '.join(os.path.basename(r) for r in openmp_runtimes())}")
    ref, cand = ("eager wrapped", "compiled wrapped") if args.compile else ("torch", "ours")
    target = f"target >= {TARGET}x on every model" + (
        "" if args.compile else f", aim >= {AIM}x on {', '.join(TRANSFORMERS)}")
    print(f"{rounds} rounds x {steps} steps per side (alternating), after {warmup} warm-up "
          f"steps; ratio = median over rounds of {ref} ms / {cand} ms, spread = its "
          f"interquartile range; {target}\n")
    last = "frames" if args.compile else "on torch"
    print(f"{'model':<14} {ref[:9]:>9} {cand[:9]:>9} {'ratio':>7} {'spread':>13}  "
          f"{last:>8}  verdict")
    rows = []
    for n in names:
        row = run(n, rounds, steps, warmup, args.compile)
        row["verdict"] = _verdict(row)
        rows.append(row)
        col = f"{row['frames']:>4}/{row['frames_plain']:<3}" if args.compile else \
            f"{row['signatures_on_torch']:>3}/{row['signatures']:<4}"
        check = "" if args.compile else f" (in-model check: {row['model_check']})"
        print(f"{n:<14} {row['torch_ms']:>9.2f} {row['ours_ms']:>9.2f} {row['ratio']:>6.2f}x"
              f" {row['ratio_p25']:>5.2f}-{row['ratio_p75']:.2f}x  {col}  {row['verdict']}"
              f"{check}", flush=True)
    fl = load.report()
    machine["foreign_load"] = fl
    busy = ": ratios on a loaded machine" if fl["foreign_share"] > 0.1 else ""
    print(f"\nother processes used {100 * fl['foreign_share']:.1f}% of the machine's CPU time "
          f"({fl['foreign_cpu_s']} CPU-s in {fl['wall_s']} s){busy}")
    what = ("`torch.compile` of `ortcpu_torch.optimize(model, AdamW)` (default "
            "`compile_kernels=\"auto\"`) against the eager wrapped model"
            if args.compile else "forward + backward + AdamW")
    md = [f"Training step ({what}), {args.threads} threads, "
          f"{machine['cpu']} ({machine['isa']}), torch {machine['torch']}; ratio = {ref} ms "
          f"/ {cand} ms (> 1: {cand} faster); other processes used "
          f"{100 * fl['foreign_share']:.0f}% of the CPU during the run.", "",
          f"Ratio: median over {rounds} alternating rounds of {steps} steps per side; spread: "
          f"the rounds' interquartile range. {target[0].upper() + target[1:]}.", ""]
    if args.compile:
        md += [f"| model | {ref} ms | {cand} ms | ratio | spread | frames compiled (first "
               "call / whole run / plain torch.compile) | verdict |",
               "|---|---:|---:|---:|---:|---:|---|"]
        md += [f"| {r['model']} | {r['torch_ms']:.2f} | {r['ours_ms']:.2f} | "
               f"{r['ratio']:.2f}x | {r['ratio_p25']:.2f}-{r['ratio_p75']:.2f}x | "
               f"{r['frames_first_call']} / {r['frames']} / {r['frames_plain']} | "
               f"{r['verdict']} |" for r in rows]
    else:
        md += ["| model | torch ms | ours ms | ratio | spread | signatures run on torch | "
               "in-model check | verdict |", "|---|---:|---:|---:|---:|---:|---|---|"]
        md += [f"| {r['model']} | {r['torch_ms']:.2f} | {r['ours_ms']:.2f} | "
               f"{r['ratio']:.2f}x | {r['ratio_p25']:.2f}-{r['ratio_p75']:.2f}x | "
               f"{r['signatures_on_torch']}/{r['signatures']} | {r['model_check'] or '-'} | "
               f"{r['verdict']} |" for r in rows]
    if not args.names and not args.quick:
        write_results("models_compile" if args.compile else "models",
                      {"machine": machine, "threads": args.threads, "rounds": rounds,
                       "steps": steps, "compile": args.compile, "rows": rows},
                      "\n".join(md) + "\n")
    else:
        print("\n" + "\n".join(md))


if __name__ == "__main__":
    main()
