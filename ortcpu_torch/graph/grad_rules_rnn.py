"""Gradient rules of LSTM and GRU: the forward node becomes ORT's LSTMTraining /
GRUTraining (same outputs, plus the cell states and gates the backward reads) and the
gradient is LSTMGrad / GRUGrad."""

from __future__ import annotations

from .grad_rules_base import MS, GradientBuildError, attrs_of, describe, grad_rule, input_at

_RNN_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction",
              "hidden_size", "input_forget", "linear_before_reset")


def _to_training(ctx, node, op_type: str, extra_outputs: dict[int, str]) -> dict:
    """Retype the forward ``node`` to ``op_type`` (com.microsoft) and name the outputs
    the gradient reads; returns the attributes the gradient op takes."""
    if attrs_of(node, ("layout",)).get("layout", 0):
        raise GradientBuildError(f"{describe(node)}: layout=1 (batch first) has no gradient "
                                 "rule; transpose to [seq, batch, ...] around a layout=0 node")
    if input_at(node, 4):
        raise GradientBuildError(f"{describe(node)}: sequence_lens is not supported by "
                                 f"{op_type} (ORT's training op requires it absent)")
    attrs = attrs_of(node, _RNN_ATTRS)
    y = ctx.forward_output(node, 0, f"{node.name or node.op_type}_HAll")
    for index, tag in extra_outputs.items():
        ctx.forward_output(node, index, f"{y}_{tag}")
    node.op_type, node.domain = op_type, MS
    keep = [a for a in node.attribute if a.name in _RNN_ATTRS]
    del node.attribute[:]
    node.attribute.extend(keep)
    return attrs


def _grad_outputs(ctx, node, needs, inputs: list[int]) -> list[str]:
    """Every gradient output named: ORT 1.19.2's LSTMGrad/GRUGrad kernels crash (SIGSEGV)
    when an optional output is left out; the ones nothing needs get ``*_unused`` names."""
    names = []
    for i in inputs:
        wanted = i < len(needs) and needs[i]
        base = input_at(node, i) or f"{node.output[0]}_input{i}"
        names.append(ctx.fresh(f"{base}_grad" if wanted else f"{base}_grad_unused"))
    return names


def _trim(names: list[str]) -> list[str]:
    while names and not names[-1]:
        names.pop()
    return names


@grad_rule("LSTM", inputs=(0, 1, 2, 3, 5, 6), outputs=(0, 1, 2))
def _lstm(ctx, node, dy, needs):
    if input_at(node, 7):
        raise GradientBuildError(f"{describe(node)}: LSTM with peephole weights (input P) "
                                 "has no gradient rule (ORT's LSTMGrad assumes P = 0)")
    attrs = _to_training(ctx, node, "LSTMTraining", {3: "CAll", 4: "iofc"})
    attrs.pop("linear_before_reset", None)
    grad_inputs = [0, 1, 2, 3, 5, 6]  # dX, dW, dR, dB, dH0, dC0
    outs = _grad_outputs(ctx, node, needs, grad_inputs)
    ins = [node.input[0], node.input[1], node.input[2], "", input_at(node, 5),
           input_at(node, 6), node.output[0], node.output[3], node.output[4],
           *(g or "" for g in dy[:3]), *[""] * (3 - len(dy[:3]))]
    ctx.emit("LSTMGrad", _trim(ins), outs, domain=MS, **attrs)
    return _results(ctx, node, needs, outs, grad_inputs)


@grad_rule("GRU", inputs=(0, 1, 2, 3, 5), outputs=(0, 1))
def _gru(ctx, node, dy, needs):
    attrs = _to_training(ctx, node, "GRUTraining", {2: "ZRH"})
    attrs.pop("input_forget", None)
    grad_inputs = [0, 1, 2, 3, 5]  # dX, dW, dR, dB, dH0
    outs = _grad_outputs(ctx, node, needs, grad_inputs)
    ins = [node.input[0], node.input[1], node.input[2], input_at(node, 3), "",
           input_at(node, 5), node.output[0], node.output[2],
           *(g or "" for g in dy[:2]), *[""] * (2 - len(dy[:2]))]
    ctx.emit("GRUGrad", _trim(ins), outs, domain=MS, **attrs)
    return _results(ctx, node, needs, outs, grad_inputs)


def _results(ctx, node, needs, outs, grad_inputs) -> list:
    res = [None] * len(node.input)
    for name, i in zip(outs, grad_inputs, strict=True):
        if i < len(needs) and needs[i]:
            res[i] = ctx.named(name, node.input[i])
    return res
