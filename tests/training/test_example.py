"""examples/ondevice_training.py runs end to end: artifacts, training, checkpoint reload,
export, and both InferenceSessions agree with the eval model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ondevice_training_example(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ondevice_training.py"), "--steps", "60",
         "--threads", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True).stdout
    accuracies = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]
    assert len(accuracies) == 3, out  # eval model, our session, ORT's session
    assert len(set(accuracies)) == 1 and accuracies[0] > 0.8, out
    losses = [float(v) for v in re.findall(r"loss ([0-9.]+)", out)]
    assert losses[-1] < losses[0], out
    assert "reloaded" in out and (tmp_path / "digits_inference.onnx").exists()
