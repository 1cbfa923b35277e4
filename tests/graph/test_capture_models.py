"""Captured training and eval graphs of whole models vs eager torch, run in onnxruntime 1.19.2.

Forward: ORT's InferenceSession on the captured training graph, with the dropout masks drawn
from torch's generator under the same seed as the eager run (so the masks are the same).
Gradients: ORT's own gradient builder (``generate_artifacts``) on the captured graph.
Tolerances: float32, measured worst cases here were <= 5e-7 (forward) and <= 4e-7 (grads);
the bounds below are ~10x that, scaled by magnitude.
"""

from __future__ import annotations

import copy

import onnx
import pytest
import torch

from ortcpu_torch.graph import capture, export

from .capture_models import NAMES, make
from .capture_util import ort_gradients, ort_run, torch_gradients

pytest.importorskip("onnxruntime")

SEED = 7


@pytest.fixture(scope="module")
def captured():
    cache = {}

    def get(name):
        if name not in cache:
            model, args = make(name)
            cache[name] = (model, args, capture(model, args, train=True))
        return cache[name]

    return get


def _torch_forward(model, args):
    ref = copy.deepcopy(model).train()
    torch.manual_seed(SEED)
    with torch.no_grad():
        out = ref(*args)
    return ref, out


@pytest.mark.parametrize("name", NAMES)
def test_training_graph_forward_and_buffers_match_torch(captured, name):
    model, args, graph = captured(name)
    onnx.checker.check_model(graph.model, full_check=True)
    torch.manual_seed(SEED)
    outs = ort_run(graph.model, graph.feeds(model, args))
    ref, expected = _torch_forward(model, args)
    for out_name, exp in zip(graph.user_outputs, expected, strict=True):
        torch.testing.assert_close(outs[out_name], exp, rtol=1e-5, atol=5e-6)
    for fqn, out_name in graph.buffer_updates.items():
        torch.testing.assert_close(outs[out_name], ref.get_buffer(fqn), rtol=1e-5, atol=1e-6)
    assert set(graph.buffer_updates) == {n for n, b in model.named_buffers()
                                         if "running" in n or "num_batches" in n}


@pytest.mark.parametrize("name", NAMES)
def test_ort_gradient_builder_accepts_graph_and_gradients_match_torch(captured, name):
    model, args, graph = captured(name)
    torch.manual_seed(SEED)
    feeds = graph.feeds(model, args)
    loss, grads = ort_gradients(graph, model, feeds)
    ref_loss, ref_grads = torch_gradients(copy.deepcopy(model).train(), args, SEED)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    assert set(grads) == set(ref_grads)
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-4, atol=2e-6, msg=k)


def test_training_graph_contract(captured):
    """The ops that carry ORT's training semantics are there, with their extra outputs."""
    _, _, gpt = captured("gpt")
    ops = {n.op_type: n for n in gpt.model.graph.node}
    assert len(ops["LayerNormalization"].output) == 3  # Y, Mean, InvStdDev
    assert ops["Gelu"].domain == "com.microsoft"
    assert len(ops["SoftmaxCrossEntropyLoss"].output) == 2  # loss, log_prob
    names = [i.name for i in gpt.model.graph.input]
    assert names[:2] == ["idx", "targets"]
    assert "blocks.0.qkv.weight" in names and "tok.weight" in names
    assert [m.name for m in gpt.dropout_masks] == [f"dropout_mask_{k}" for k in range(6)]
    _, _, cnn = captured("cnn")
    bn = [n for n in cnn.model.graph.node if n.op_type == "BatchNormalization"]
    assert all(len(n.output) == 3 for n in bn)
    outputs = [o.name for o in cnn.model.graph.output]
    assert outputs[:2] == cnn.user_outputs
    assert sorted(outputs[2:]) == sorted(f"bn{i}.{b}.updated" for i in (1, 2) for b in (
        "running_mean", "running_var", "num_batches_tracked"))
    _, _, lstm = captured("lstm")
    assert [n.op_type for n in lstm.model.graph.node].count("LSTM") == 4  # 2 layers x 2 dirs
    assert {n.op_type for n in lstm.model.graph.node if n.op_type == "Gelu"} == set()


def test_batchnorm_running_stats_follow_torch_over_steps():
    """torch's unbiased running variance and num_batches_tracked, three steps fed forward."""
    bn = torch.nn.BatchNorm1d(5, momentum=0.3)
    x = torch.randn(6, 5) * 3 + 1
    graph = capture(bn, (x,), train=True)
    ref = copy.deepcopy(bn).train()
    state = {fqn: bn.get_buffer(fqn).clone() for fqn in graph.buffers}
    for step in range(3):
        xs = x + step
        feeds = {"input": xs, "weight": bn.weight.detach(), "bias": bn.bias.detach(), **state}
        outs = ort_run(graph.model, feeds)
        with torch.no_grad():
            y = ref(xs)
        torch.testing.assert_close(outs[graph.user_outputs[0]], y, rtol=1e-5, atol=1e-5)
        state = {fqn: outs[name] for fqn, name in graph.buffer_updates.items()}
        for fqn, value in state.items():
            torch.testing.assert_close(value, ref.get_buffer(fqn), rtol=1e-6, atol=1e-6)
    assert int(state["num_batches_tracked"]) == 3


@pytest.mark.parametrize("name", NAMES)
def test_eval_export_is_standard_onnx_and_matches_torch(tmp_path, name):
    model, args = make(name)
    path = tmp_path / f"{name}.onnx"
    graph = export(model, args, path)
    assert model.training  # the module's mode is restored
    saved = onnx.load(str(path))
    onnx.checker.check_model(saved, full_check=True)
    assert {n.domain for n in saved.graph.node} <= {""}
    assert [o.domain for o in saved.opset_import] == [""]
    assert not graph.dropout_masks and not graph.buffer_updates
    assert {i.name for i in saved.graph.input} == set(graph.user_inputs)
    outs = ort_run(saved, dict(zip(graph.user_inputs, graph.flatten_inputs(args), strict=True)))
    with torch.no_grad():
        expected = copy.deepcopy(model).eval()(*args)
    for out_name, exp in zip(graph.user_outputs, expected, strict=True):
        torch.testing.assert_close(outs[out_name], exp, rtol=1e-5, atol=5e-6)


def test_gelu_tanh_is_fastgelu_in_training_and_standard_in_export(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(approximate="tanh"))
    x = torch.randn(3, 4)
    train = capture(m, (x,), train=True)
    assert [n.op_type for n in train.model.graph.node if n.domain] == ["FastGelu"]
    graph = export(m, (x,), tmp_path / "g.onnx")
    out = ort_run(graph.model, {"input": x})[graph.user_outputs[0]]
    torch.testing.assert_close(out, m(x).detach(), rtol=1e-5, atol=1e-6)
