"""TensorBoard summaries inside an ORTModule training graph (``ORTModule(log_dir=...)``).

``add_summary_nodes`` appends, after the gradient nodes of a training graph, com.microsoft
``SummaryScalar`` nodes for the loss and the global gradient norm (``ReduceAllL2`` over
every parameter gradient), one ``SummaryHistogram`` per parameter gradient and a
``SummaryMerge`` of them all into one graph output of serialized ``Summary`` bytes. The
nodes sit in the backward part; ``SummaryLog`` runs that part every ``every`` steps (the
other steps run the backward without the summary nodes) and writes the bytes through
``ortcpu_torch.summary.SummaryWriter``.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from .lowering import MS_DOMAIN

SUMMARY_OUTPUT = "ortmodule_summary"
SUMMARY_OPS = {"SummaryScalar", "SummaryHistogram", "SummaryMerge", "ReduceAllL2"}
_PREFIX = "ortmodule_summary_"


def add_summary_nodes(tg: onnx.ModelProto, loss: str | None,
                      grads: dict[str, str]) -> list[onnx.NodeProto]:
    """Append the summary nodes to ``tg`` (in place) and return them. ``loss``: a float
    scalar output to log as ``loss`` (or None); ``grads``: parameter FQN -> its gradient
    value. Tags: ``loss``, ``grad_norm``, ``gradients/<fqn>``."""
    nodes, parts = [], []
    if loss is not None:
        nodes.append(helper.make_node("SummaryScalar", [loss], [_PREFIX + "loss"],
                                      domain=MS_DOMAIN, tags=["loss"],
                                      name=_PREFIX + "loss"))
        parts.append(_PREFIX + "loss")
    if grads:
        nodes.append(helper.make_node("ReduceAllL2", list(grads.values()),
                                      [_PREFIX + "grad_norm_value"], domain=MS_DOMAIN,
                                      name=_PREFIX + "grad_norm_value"))
        nodes.append(helper.make_node("SummaryScalar", [_PREFIX + "grad_norm_value"],
                                      [_PREFIX + "grad_norm"], domain=MS_DOMAIN,
                                      tags=["grad_norm"], name=_PREFIX + "grad_norm"))
        parts.append(_PREFIX + "grad_norm")
        for k, (fqn, g) in enumerate(grads.items()):
            out = f"{_PREFIX}hist_{k}"
            nodes.append(helper.make_node("SummaryHistogram", [g], [out], domain=MS_DOMAIN,
                                          tag=f"gradients/{fqn}", name=out))
            parts.append(out)
    nodes.append(helper.make_node("SummaryMerge", parts, [SUMMARY_OUTPUT], domain=MS_DOMAIN,
                                  name=SUMMARY_OUTPUT))
    tg.graph.node.extend(nodes)
    tg.graph.output.append(helper.make_tensor_value_info(SUMMARY_OUTPUT, TensorProto.STRING,
                                                         []))
    if not any(o.domain == MS_DOMAIN for o in tg.opset_import):
        tg.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return nodes


def is_summary_node(node: onnx.NodeProto) -> bool:
    return node.name.startswith(_PREFIX) or node.output[0] == SUMMARY_OUTPUT


class SummaryLog:
    """The event-file writer of one ORTModule and its step counter (a step is a backward)."""

    def __init__(self, log_dir: str, every: int):
        from ..summary import SummaryWriter

        self.writer = SummaryWriter(log_dir)
        self.every = every
        self.step = 0

    def due(self) -> bool:
        """Whether the coming backward is a logged step (counts it)."""
        self.step += 1
        return (self.step - 1) % self.every == 0

    def write(self, summary: bytes) -> None:
        self.writer.add_summary(summary, global_step=self.step - 1)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
