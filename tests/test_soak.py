"""Soak test (``make soak``; skipped unless pytest gets ``--soak``): 2,000 wrapped
training steps of the digits CNN and of the char transformer (examples/), sampling the
arena's ``memory_stats()`` and the process RSS. After warm-up neither may grow by more
than 5%, and ``empty_cache()`` must hand the cached blocks back to the system.
``ORTCPU_SOAK_STEPS`` shortens the run (warm-up and windows scale with it)."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.nn.functional as F

import ortcpu_torch

pytestmark = pytest.mark.soak

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
STEPS = int(os.environ.get("ORTCPU_SOAK_STEPS", "2000"))
WARMUP, WINDOW, EVERY = STEPS // 5, STEPS // 10, max(1, STEPS // 80)
GROWTH = 1.05


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def arena_bytes() -> int:
    s = ortcpu_torch.memory_stats()
    return s["in_use_bytes"] + s["cached_bytes"]


def _examples():
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import _common
    import char_transformer
    import digits_cnn
    return _common, digits_cnn, char_transformer


def _models():
    C, cnn, gpt = _examples()
    (x, y), _ = C.digits(0, as_images=True)
    data, chars = gpt.corpus(64)
    return {
        "digits_cnn": (lambda: cnn.DigitsCNN(), C.Batches(x, y, 64, 0), F.cross_entropy),
        "char_transformer": (lambda: gpt.CharGPT(len(chars), 64),
                             gpt.Windows(data, 64, 32, 0), gpt.lm_loss),
    }


@pytest.mark.parametrize("name", ["digits_cnn", "char_transformer"])
def test_soak_memory_is_flat_and_returned(name):
    C, _, _ = _examples()
    make, batches, loss_fn = _models()[name]
    torch.manual_seed(0)
    model, opt = C.make_optimizer(make(), 3e-3, wrap=True)
    model.train()
    samples = []  # (step, rss, arena)
    t0 = time.monotonic()
    for step in range(STEPS):
        x, y = batches()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step % EVERY == 0 or step == STEPS - 1:
            assert torch.isfinite(loss), (name, step)
            samples.append((step, rss_bytes(), arena_bytes()))
    elapsed = time.monotonic() - t0
    ref = [s for s in samples if WARMUP <= s[0] < WARMUP + WINDOW]
    later = [s for s in samples if s[0] >= WARMUP + WINDOW]
    ref_rss, ref_arena = max(s[1] for s in ref), max(s[2] for s in ref)
    top_rss, top_arena = max(s[1] for s in later), max(s[2] for s in later)
    report = (f"{name}: {STEPS} steps in {elapsed:.0f} s; RSS {ref_rss / 2**20:.1f} -> max "
              f"{top_rss / 2**20:.1f} MiB, arena {ref_arena / 2**20:.2f} -> max "
              f"{top_arena / 2**20:.2f} MiB")
    print(report)
    assert top_rss <= GROWTH * ref_rss, report
    assert top_arena <= GROWTH * ref_arena, report
    # empty_cache: the cached blocks go back to the system (RSS falls by most of them)
    del model, opt, loss, x, y
    cached = ortcpu_torch.memory_stats()["cached_bytes"]
    before = rss_bytes()
    ortcpu_torch.empty_cache()
    after = rss_bytes()
    assert ortcpu_torch.memory_stats()["cached_bytes"] == 0
    print(f"{name}: empty_cache released {cached / 2**20:.1f} MiB cached; RSS "
          f"{before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
    assert before - after >= 0.5 * cached, (cached, before, after)
