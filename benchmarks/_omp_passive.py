"""OpenMP's passive wait policy for a benchmark that runs next to onnxruntime with
``session.intra_op.allow_spinning = 0``: neither library's idle threads spin. Import this
before torch (libgomp reads the policy when it loads); ``--spin`` on the command line keeps
OpenMP's default spin-then-sleep. On the loaded 2-core machine the default made every
2-thread parallel region wait for a worker that had no CPU (the graph benchmark's MLP:
24 ms vs 0.9 ms per run)."""

from __future__ import annotations

import os
import sys

if "--spin" not in sys.argv and "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def policy() -> str:
    """The OpenMP wait policy in effect, for the report."""
    return os.environ.get("OMP_WAIT_POLICY", "default (spin, then sleep)")
