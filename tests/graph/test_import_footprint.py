"""``import ortcpu_torch`` leaves the graph front end unimported: onnx (with ml_dtypes,
~11 MB of RSS), ONNX's schema registry (~7 MB) and torch.export's tracing modules (~5 MB)
load only when ``ortcpu_torch.ORTModule`` or ``InferenceSession`` is first used. The eager
kernels and ``wrap`` never pay for them (issue 16's RSS target compares against eager)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CODE = """
import sys
import ortcpu_torch
heavy = ("onnx", "ml_dtypes", "ortcpu_torch.graph", "torch.export._trace")
print(sorted(m for m in heavy if m in sys.modules))
ortcpu_torch.ORTModule
print("ortcpu_torch.graph.ortmodule" in sys.modules, "onnx" in sys.modules)
"""


def test_import_leaves_the_graph_front_end_unimported():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = ROOT
    res = subprocess.run([sys.executable, "-c", _CODE], env=env, cwd=ROOT, text=True,
                         capture_output=True, timeout=300, check=True)
    lines = res.stdout.strip().splitlines()
    assert lines[-2] == "[]"
    assert lines[-1] == "True True"
