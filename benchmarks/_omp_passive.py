"""OpenMP's passive wait policy, on request (``--passive`` on the command line), for a
benchmark that runs next to onnxruntime with ``session.intra_op.allow_spinning = 0``.
Import this before torch (libgomp reads the policy when it loads). The default is what a
user gets, OpenMP's spin-then-sleep: on the idle machine it is the faster one (graph
benchmark, resnet50 at 2 threads: 76 ms vs 102 ms passive). On a loaded 2-core machine the
default makes every 2-thread parallel region wait for a worker that has no CPU (the MLP:
24 ms vs 0.9 ms per run), and ``--passive`` gives usable numbers there."""

from __future__ import annotations

import os
import sys

if "--passive" in sys.argv and "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def policy() -> str:
    """The OpenMP wait policy in effect, for the report."""
    return os.environ.get("OMP_WAIT_POLICY", "default (spin, then sleep)")
