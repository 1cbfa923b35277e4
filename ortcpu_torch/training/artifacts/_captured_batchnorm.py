"""Training BatchNormalization as ``ortcpu_torch.graph.capture`` writes it, in the standard form.

A captured training graph runs BatchNormalization with ``momentum = 0`` on placeholder
statistics (so its outputs 1 and 2 are the batch mean and variance) and writes torch's
running-statistics update out as arithmetic ending in ``<stat>.updated`` graph outputs. The
artifacts pipeline (like ORT's and torch's TorchScript export) expects the running statistics
as the node's inputs 3 and 4 with the ``momentum`` attribute, so that the eval model normalizes
with them and the training model updates them in place. :func:`adopt_captured_batchnorm`
rewrites the first form into the second and drops the written-out update and its outputs.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from .._onnx_utils import attribute

UPDATED = ".updated"
_INT_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output if o}


def _feeding_batchnorm(graph, producers, value: str, index: int) -> onnx.NodeProto | None:
    """The training BatchNormalization whose output ``index`` ``value`` is computed from."""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if v in seen or v not in producers:
            continue
        seen.add(v)
        n = producers[v]
        if n.op_type == "BatchNormalization" and attribute(n, "training_mode", 0):
            if len(n.output) > index and n.output[index] == v:
                return n
            continue  # the BN's Y (of an earlier layer) is not this statistic
        todo.extend(n.input)
    return None


def _momentum(graph, inits, stat: str) -> float | None:
    """ONNX momentum m of ``stat``'s update ``stat*m + batch*(1-m)``: the scalar constant
    multiplying ``stat``."""
    for n in graph.node:
        if n.op_type == "Mul" and stat in n.input:
            other = n.input[1] if n.input[0] == stat else n.input[0]
            if other in inits and numpy_helper.to_array(inits[other]).size == 1:
                return float(numpy_helper.to_array(inits[other]).reshape(()))
    return None


def _prune_dead_nodes(graph: onnx.GraphProto) -> None:
    needed = {o.name for o in graph.output}
    keep = []
    for n in reversed(graph.node):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(n.input)
    used = needed
    live = list(reversed(keep))
    del graph.node[:]
    graph.node.extend(live)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def adopt_captured_batchnorm(model: onnx.ModelProto) -> list[str]:
    """Rewrite captured training BatchNormalization in place (see the module docstring);
    returns the running statistics adopted. A model without ``<stat>.updated`` outputs is
    left as it is."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    updated = {o.name[: -len(UPDATED)]: o.name for o in g.output
               if o.name.endswith(UPDATED) and o.name[: -len(UPDATED)] in inits}
    if not updated:
        return []
    producers = _producers(g)
    adopted = []
    for stat, out in updated.items():
        for index in (1, 2):
            bn = _feeding_batchnorm(g, producers, out, index)
            if bn is None or len(bn.input) < 5:
                continue
            if index == 1:
                m = _momentum(g, inits, stat)
                if m is None:
                    raise ValueError(f"{out!r}: the running-mean update of {stat!r} is not "
                                     "stat*momentum + batch_mean*(1-momentum)")
                for a in bn.attribute:
                    if a.name == "momentum":
                        a.f = m
                        break
                else:
                    bn.attribute.append(onnx.helper.make_attribute("momentum", m))
            bn.input[index + 2] = stat
            adopted.append(stat)
            break
    if not adopted:
        return []
    # drop the adopted statistics' outputs and integer counters (num_batches_tracked, which
    # only torch's momentum=None mode reads); any other "<x>.updated" output stays
    counters = {s for s in updated if inits[s].data_type in _INT_TYPES}
    dropped = {updated[s] for s in (*adopted, *counters)}
    keep = [o for o in g.output if o.name not in dropped]
    del g.output[:]
    g.output.extend(keep)
    _prune_dead_nodes(g)
    return adopted
