"""Inference-time graph rewrites applied when a plan is built (each listed in ``report()``).
"""

from __future__ import annotations


def apply_fusions(nodes, consts, graph, opsets):
    """Rewrite ``nodes`` (a list of NodeProto, topologically ordered); new constants go
    into ``consts``. Returns (nodes, descriptions of what was fused)."""
    return nodes, []
