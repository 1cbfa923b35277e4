"""training.artifacts.generate_artifacts: what it writes loads and trains in onnxruntime-
training 1.19.2 exactly as on ours, matches ORT's generator where ORT works, and handles
the models ORT's generator gets wrong."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch

from ortcpu_torch.graph import export
from ortcpu_torch.training import api, artifacts
from ortcpu_torch.training._checkpoint_file import read_checkpoint

from . import models
from .conftest import LOSS, OPTIM, Artifacts, generate_with_ort, mlp_batch, ort_api

STEPS = 20
REL_TOL = 1e-5


def ours(tmp_path, model, name="art", **kwargs) -> Artifacts:
    folder = tmp_path / name / "nested"  # a folder that does not exist yet
    artifacts.generate_artifacts(model, artifact_directory=folder, **kwargs)
    return Artifacts(folder, kwargs.get("prefix", ""))


def _trajectory(lib, art, batch, steps=STEPS, lr=0.01):
    state = lib.CheckpointState.load_checkpoint(art.checkpoint)
    module = lib.Module(art.train, state, art.eval)
    opt = lib.Optimizer(art.optimizer, module)
    opt.set_learning_rate(lr)
    rng = np.random.default_rng(0)
    fixed = batch(rng)
    losses = []
    for k in range(steps):
        out = module(*(fixed if k % 2 == 0 else batch(rng)))
        losses.append(float(out[0] if isinstance(out, tuple) else out))
        opt.step()
        module.lazy_reset_grad()
    module.eval()
    ev = module(*batch(np.random.default_rng(7)))
    return np.array(losses), state, ev if isinstance(ev, tuple) else (ev,)


def _same_training(art, batch, eval_atol=1e-6):
    theirs, ort_state, ort_eval = _trajectory(ort_api, art, batch)
    mine, state, my_eval = _trajectory(api, art, batch)
    rel = np.max(np.abs(mine - theirs) / np.abs(theirs))
    assert rel <= REL_TOL, (mine, theirs)
    assert mine[-2] < 0.9 * mine[0]
    for a, b in zip(my_eval, ort_eval, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=eval_atol)
    return state, ort_state


def _check_loadable_by_ort_1_19_2(art):
    for path in (art.train, art.eval, art.optimizer):
        m = onnx.load(path)
        assert m.ir_version <= 10, path
        for imp in m.opset_import:
            assert (imp.domain in ("", "ai.onnx") and 13 <= imp.version <= 21) or \
                (imp.domain == "com.microsoft" and imp.version == 1), (path, imp)
        onnx.checker.check_model(m)


def cnn_batch(rng, n=8):
    return (rng.standard_normal((n, 1, 8, 8)).astype(np.float32),
            rng.integers(0, 10, n).astype(np.int64))


def gru_batch(rng, n=8):
    return (rng.standard_normal((n, 5, 6)).astype(np.float32),
            rng.standard_normal((n, 3)).astype(np.float32))


def test_mlp_adamw_trains_the_same_on_ort(tmp_path):
    art = ours(tmp_path, models.mlp(), requires_grad=["fc1.weight", "fc1.bias", "fc2.weight"],
               frozen_params=["fc2.bias"], loss=artifacts.LossType.CrossEntropyLoss,
               optimizer=artifacts.OptimType.AdamW, additional_output_names=["output"],
               nominal_checkpoint=True)
    _check_loadable_by_ort_1_19_2(art)
    state, ort_state = _same_training(art, mlp_batch)
    for name, p in ort_state.parameters:
        np.testing.assert_allclose(state.parameters[name].data, p.data, rtol=1e-4, atol=1e-6)
    assert not state.parameters["fc2.bias"].requires_grad
    nominal = read_checkpoint(art.nominal_checkpoint)
    assert nominal.is_nominal and sorted(e.name for e in nominal.trainable) == \
        ["fc1.bias", "fc1.weight", "fc2.weight"]
    ort_api.CheckpointState.load_checkpoint(art.nominal_checkpoint)


def test_same_trajectory_as_ort_generated_artifacts(tmp_path, ort_mlp):
    """Our generator's loss and AdamW defaults are ORT's: ours-generated on ours follows
    ORT-generated on ORT."""
    art = ours(tmp_path, models.mlp(), requires_grad=["fc1.weight", "fc1.bias", "fc2.weight"],
               frozen_params=["fc2.bias"], loss=artifacts.LossType.CrossEntropyLoss,
               optimizer=artifacts.OptimType.AdamW, additional_output_names=["output"])
    theirs, _, _ = _trajectory(ort_api, ort_mlp, mlp_batch)
    mine, _, _ = _trajectory(api, art, mlp_batch)
    assert np.max(np.abs(mine - theirs) / np.abs(theirs)) <= REL_TOL


def test_gru_mse_trains_the_same_on_ort(tmp_path):
    art = ours(tmp_path, models.gru(), loss=artifacts.LossType.MSELoss,
               optimizer=artifacts.OptimType.AdamW)
    _check_loadable_by_ort_1_19_2(art)
    _same_training(art, gru_batch)


def test_batchnorm_running_stats_are_state(tmp_path):
    m = models.cnn(pool=False)
    params = [p for p in models.parameter_names(m) if "running" not in p]
    art = ours(tmp_path, m, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
               optimizer=artifacts.OptimType.SGD)
    _check_loadable_by_ort_1_19_2(art)
    ck = read_checkpoint(art.checkpoint)
    assert [e.name for e in ck.frozen] == ["bn.running_mean", "bn.running_var"]
    state, ort_state = _same_training(art, cnn_batch)
    for stat in ("bn.running_mean", "bn.running_var"):
        np.testing.assert_allclose(state.parameters[stat].data, ort_state.parameters[stat].data,
                                   rtol=1e-5, atol=1e-7)
    # one step from the initial checkpoint follows torch's rule (unbiased running variance)
    state = api.CheckpointState.load_checkpoint(art.checkpoint)
    module = api.Module(art.train, state, art.eval)
    x, y = cnn_batch(np.random.default_rng(3))
    w, b = (torch.from_numpy(state.parameters[n].data) for n in ("conv.weight", "conv.bias"))
    conv = torch.nn.functional.conv2d(torch.from_numpy(x).double(), w.double(), b.double(),
                                      padding=1)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    torch.nn.functional.batch_norm(conv, rm, rv, training=True, momentum=0.1)
    module(x, y)
    np.testing.assert_allclose(state.parameters["bn.running_mean"].data, rm.numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(state.parameters["bn.running_var"].data, rv.numpy(), rtol=1e-5)
    # eval uses them, and the checkpoint stores them
    out = tmp_path / "after"
    api.CheckpointState.save_checkpoint(state, out)
    back = {e.name: e.data for e in read_checkpoint(out).frozen}
    np.testing.assert_array_equal(back["bn.running_var"], state.parameters["bn.running_var"].data)


def test_ort_generator_batchnorm_eval_model_does_not_load_in_ort(ort_cnn):
    """What ORT's generator writes for BatchNorm: an eval model ORT refuses, statistics
    baked in as constants. Ours loads (checked above) and keeps them as state."""
    state = ort_api.CheckpointState.load_checkpoint(ort_cnn.checkpoint)
    with pytest.raises(Exception, match="should be 1 when Training_mode = False"):
        ort_api.Module(ort_cnn.train, state, ort_cnn.eval)
    assert "bn.running_mean" not in dict(state.parameters)


def test_layernorm_single_output_model(tmp_path):
    m = models.layernorm_mlp()
    with pytest.raises(Exception, match="OutputDefs"):
        generate_with_ort(tmp_path / "ort_ln", m, requires_grad=models.parameter_names(m),
                          loss=LOSS.CrossEntropyLoss, optimizer=OPTIM.AdamW)
    art = ours(tmp_path, m, loss=artifacts.LossType.CrossEntropyLoss,
               optimizer=artifacts.OptimType.AdamW)
    _check_loadable_by_ort_1_19_2(art)
    _same_training(art, lambda r: (r.standard_normal((16, 12)).astype(np.float32),
                                   r.integers(0, 5, 16).astype(np.int64)))


TORCH_LOSSES = {
    "MSELoss": (torch.nn.functional.mse_loss, np.float32),
    "CrossEntropyLoss": (torch.nn.functional.cross_entropy, np.int64),
    "BCEWithLogitsLoss": (torch.nn.functional.binary_cross_entropy_with_logits, np.float32),
    "L1Loss": (torch.nn.functional.l1_loss, np.float32),
}


@pytest.mark.parametrize("loss", list(artifacts.LossType), ids=lambda v: v.name)
def test_losses_and_gradients_match_torch(loss, tmp_path):
    m = models.mlp(sizes=(6, 8, 4))
    art = ours(tmp_path, m, loss=loss)
    fn, target_dtype = TORCH_LOSSES[loss.name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 6)).astype(np.float32)
    if target_dtype == np.int64:
        t = rng.integers(0, 4, 9).astype(np.int64)
    elif loss.name == "BCEWithLogitsLoss":
        t = rng.uniform(0, 1, (9, 4)).astype(np.float32)
    else:
        t = rng.standard_normal((9, 4)).astype(np.float32)
    state = api.CheckpointState.load_checkpoint(art.checkpoint)
    module = api.Module(art.train, state, art.eval)
    value = module(x, t)
    p = {n: torch.from_numpy(state.parameters[n].data).double().requires_grad_()
         for n, _ in state.parameters}
    h = torch.relu(torch.from_numpy(x).double() @ p["fc1.weight"].T + p["fc1.bias"])
    out = h @ p["fc2.weight"].T + p["fc2.bias"]
    ref = fn(out, torch.from_numpy(t) if target_dtype == np.int64 else
             torch.from_numpy(t).double())
    ref.backward()
    np.testing.assert_allclose(value, ref.item(), rtol=1e-5)
    for n, tensor in p.items():
        np.testing.assert_allclose(state.parameters[n].grad, tensor.grad.numpy(), rtol=1e-4,
                                   atol=1e-6)
    module.eval()
    np.testing.assert_allclose(module(x, t), ref.item(), rtol=1e-5)
    # ORT computes the same loss and gradients from our artifacts
    ort_state = ort_api.CheckpointState.load_checkpoint(art.checkpoint)
    ort_module = ort_api.Module(art.train, ort_state, art.eval)
    np.testing.assert_allclose(ort_module(x, t), value, rtol=1e-5)
    for n, _ in state.parameters:
        np.testing.assert_allclose(ort_state.parameters[n].grad, state.parameters[n].grad,
                                   rtol=1e-4, atol=1e-7)


def test_defaults_prefix_and_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    artifacts.generate_artifacts(models.mlp(), loss=artifacts.LossType.MSELoss)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "eval_model.onnx",
                                            "training_model.onnx"]
    ck = read_checkpoint(tmp_path / "checkpoint")
    assert sorted(e.name for e in ck.trainable) == ["fc1.bias", "fc1.weight", "fc2.bias",
                                                    "fc2.weight"]  # requires_grad=None: all
    path = tmp_path / "model.onnx"
    onnx.save(models.mlp(), path)
    artifacts.generate_artifacts(os.fspath(path), frozen_params=["fc1.bias"],
                                 optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=tmp_path / "a" / "b", prefix="p_",
                                 loss=artifacts.LossType.L1Loss)
    assert sorted(os.listdir(tmp_path / "a" / "b")) == [
        "p_checkpoint", "p_eval_model.onnx", "p_optimizer_model.onnx", "p_training_model.onnx"]
    opt = onnx.load(tmp_path / "a" / "b" / "p_optimizer_model.onnx")
    assert [n.op_type for n in opt.graph.node] == ["SGDOptimizerV2"]
    adamw = tmp_path / "c"
    artifacts.generate_artifacts(models.mlp(), loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=adamw)
    node = onnx.load(adamw / "optimizer_model.onnx").graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == pytest.approx({"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6,
                                   "weight_decay": 0.0, "correct_bias": 1, "adam_mode": 1})


def test_loss_none_and_loss_input_names(tmp_path):
    m = ours(tmp_path, models.mlp(), name="custom", loss=artifacts.LossType.MSELoss,
             loss_input_names=["output", "my_target"], optimizer=artifacts.OptimType.SGD)
    state = api.CheckpointState.load_checkpoint(m.checkpoint)
    module = api.Module(m.train, state, m.eval)
    assert module.input_names() == ["input", "my_target"]
    # no loss: the model's first output is differentiated as it is
    base = models.mlp()
    g = base.graph
    g.node.append(onnx.helper.make_node("ReduceSum", ["output"], ["total"], keepdims=0))
    g.output.insert(0, onnx.helper.make_tensor_value_info("total", onnx.TensorProto.FLOAT, []))
    art = ours(tmp_path, base, name="noloss")
    state = api.CheckpointState.load_checkpoint(art.checkpoint)
    module = api.Module(art.train, state, art.eval)
    assert module.output_names() == ["total", "output"]
    total, out = module(mlp_batch(np.random.default_rng(0))[0])
    assert total == pytest.approx(out.sum(), rel=1e-5)
    np.testing.assert_allclose(state.parameters["fc2.bias"].grad, np.full(10, 16.0))


def test_bad_arguments(tmp_path):
    m = models.mlp()
    with pytest.raises(ValueError, match="both in requires_grad and frozen_params"):
        artifacts.generate_artifacts(m, requires_grad=["fc1.weight"], frozen_params=[
            "fc1.weight"], artifact_directory=tmp_path)
    with pytest.raises(ValueError, match=r"requires_grad: \['nope'\] are not initializers"):
        artifacts.generate_artifacts(m, requires_grad=["nope"], artifact_directory=tmp_path)
    with pytest.raises(TypeError, match="loss"):
        artifacts.generate_artifacts(m, loss="MSELoss", artifact_directory=tmp_path)
    with pytest.raises(TypeError, match="optimizer"):
        artifacts.generate_artifacts(m, optimizer=1, artifact_directory=tmp_path)
    with pytest.raises(ValueError, match="ort_format"):
        artifacts.generate_artifacts(m, ort_format=True, artifact_directory=tmp_path)
    with pytest.raises(ValueError, match="'missing' is not a value"):
        artifacts.generate_artifacts(m, loss=artifacts.LossType.MSELoss,
                                     additional_output_names=["missing"],
                                     artifact_directory=tmp_path)
    new = models.mlp()
    new.opset_import[0].version = 22
    with pytest.raises(ValueError, match="opset 22"):
        artifacts.generate_artifacts(new, artifact_directory=tmp_path)
    with pytest.raises(TypeError, match="model"):
        artifacts.generate_artifacts(42, artifact_directory=tmp_path)
    with pytest.raises(FileNotFoundError, match="model"):
        artifacts.generate_artifacts(os.fspath(tmp_path / "none.onnx"))
    assert os.listdir(tmp_path) == []  # nothing written by any of them
    # onnxruntime's own enum members are accepted too
    artifacts.generate_artifacts(m, loss=LOSS.MSELoss, optimizer=OPTIM.SGD,
                                 artifact_directory=tmp_path)
    assert "optimizer_model.onnx" in os.listdir(tmp_path)


class _TorchNet(torch.nn.Module):
    """LayerNorm, BatchNorm1d, GELU and Dropout, as torch exports them in training mode."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
        self.ln, self.bn = torch.nn.LayerNorm(32), torch.nn.BatchNorm1d(32)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.bn(self.ln(self.fc1(x))))
        return self.fc2(self.drop(h))


def test_torch_exported_model(tmp_path):
    """A model captured by ``ortcpu_torch.graph.export(train=True)`` (training BatchNorm with
    its running-statistics update written out to ``<stat>.updated`` outputs)."""
    torch.manual_seed(0)
    net = _TorchNet().train()
    path = tmp_path / "net.onnx"
    graph = export(net, (torch.zeros(8, 16),), path, train=True,
                   dynamic_shapes=({0: torch.export.Dim("batch")},))
    assert "bn.running_mean.updated" in [o.name for o in graph.model.graph.output]
    art = ours(tmp_path, os.fspath(path), requires_grad=[n for n, _ in net.named_parameters()],
               loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
               additional_output_names=graph.user_outputs)
    _check_loadable_by_ort_1_19_2(art)
    # after 20 AdamW steps the two libraries' float32 rounding has drifted the logits by
    # ~2e-5 (the loss trajectories agree to 1e-5 relative)
    state, ort_state = _same_training(art, lambda r: (r.standard_normal((8, 16)).astype(
        np.float32), r.integers(0, 4, 8).astype(np.int64)), eval_atol=1e-4)
    np.testing.assert_allclose(state.parameters["bn.running_var"].data,
                               ort_state.parameters["bn.running_var"].data, rtol=5e-4)


@pytest.mark.parametrize("lib", ["ours", "ort"])
def test_captured_batchnorm_running_stats_follow_torch(tmp_path, lib):
    """Captured training BatchNorm: the checkpoint holds the running statistics, a training
    step updates them as torch's forward does, and the eval model normalizes with them."""
    torch.manual_seed(1)
    net = _TorchNet().train()
    path = tmp_path / "net.onnx"
    graph = export(net, (torch.zeros(6, 16),), path, train=True)
    art = ours(tmp_path, os.fspath(path), requires_grad=[n for n, _ in net.named_parameters()],
               loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.SGD,
               additional_output_names=graph.user_outputs)
    lib_api = api if lib == "ours" else ort_api
    state = lib_api.CheckpointState.load_checkpoint(art.checkpoint)
    module = lib_api.Module(art.train, state, None if lib == "ort" else art.eval)
    x = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    module(x, np.array([0, 1, 2, 3, 0, 1], dtype=np.int64))
    with torch.no_grad():
        net(torch.from_numpy(x))
    for stat in ("bn.running_mean", "bn.running_var"):
        np.testing.assert_allclose(state.parameters[stat].data, net.get_buffer(stat).numpy(),
                                   rtol=1e-5, atol=1e-6)
    if lib == "ours":
        module.eval()
        _, logits = module(x, np.zeros(6, dtype=np.int64))
        with torch.no_grad():
            expected = net.eval()(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
