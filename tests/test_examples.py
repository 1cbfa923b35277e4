"""The examples behind `make demo`: runs advanced a few steps at a time (the main job
interleaves its sides) train exactly as runs alone, and the main job completes with all
three sides on each model."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _digits_cnn():
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import digits_cnn
    return digits_cnn


def test_interleaved_runs_train_as_runs_alone():
    # dropout draws from torch's global generator: each run must keep its own stream
    cnn = _digits_cnn()
    args = SimpleNamespace(steps=6, batch=16, lr=3e-3, seed=0)
    alone = cnn.run(args, wrap=False, progress=False, dropout=0.5)
    a = cnn.session(args, wrap=False, progress=False, dropout=0.5)
    b = cnn.session(args, wrap=False, progress=False, dropout=0.5)
    while not (a.done and b.done):
        a.advance(4)
        b.advance(1)
    ra, rb = a.result(), b.result()
    assert ra.losses == alone.losses == rb.losses
    assert ra.metrics == alone.metrics and len(ra.step_ms) == 6


def test_main_job_runs_every_side(tmp_path):
    out = subprocess.run(
        [sys.executable, "main_job.py", "--cnn-steps", "4", "--lm-steps", "3", "--block", "2",
         "--threads", "1", "--no-progress", "--log-dir", str(tmp_path)],
        cwd=EXAMPLES, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(("digits_cnn ", "char_tr"))]
    assert [r[0] for r in rows] == ["digits_cnn"] * 3 + ["char_transformer"] * 3, out
    assert all(float(r[-5]) < 1e-3 for r in rows), out  # max |Δ loss| vs plain torch
    assert "FAILED" not in out and "fell back" not in out, out
    assert (tmp_path / "demo.png").exists()
    assert sorted(p.name for p in (tmp_path / "digits_cnn").iterdir()) == \
        ["ortcpu", "ortmodule", "torch"]
