"""training.api Module / Optimizer / LinearLRScheduler on ORT-generated artifacts, side by
side with onnxruntime-training 1.19.2 running the same artifacts."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from ortcpu_torch.graph import InferenceSession
from ortcpu_torch.training import api

from . import models
from .conftest import LOSS, generate_with_ort, mlp_batch, ort_api

STEPS = 20
REL_TOL = 1e-5


def cnn_batch(rng, n=8):
    return (rng.standard_normal((n, 1, 8, 8)).astype(np.float32),
            rng.integers(0, 10, n).astype(np.int64))


def gru_batch(rng, n=8):
    return (rng.standard_normal((n, 5, 6)).astype(np.float32),
            rng.standard_normal((n, 3)).astype(np.float32))


def _session(lib, art, with_eval=True):
    state = lib.CheckpointState.load_checkpoint(art.checkpoint)
    module = lib.Module(art.train, state, art.eval if with_eval else None)
    return state, module, lib.Optimizer(art.optimizer, module)


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _trajectory(lib, art, batch, steps=STEPS, with_eval=True):
    """Losses of ``steps`` steps at lr 0.01; every other step sees the same batch (so the
    loss must fall), the others fresh ones."""
    state, module, opt = _session(lib, art, with_eval)
    opt.set_learning_rate(0.01)
    rng = np.random.default_rng(0)
    fixed = batch(rng)
    losses = []
    for k in range(steps):
        losses.append(float(_first(module(*(fixed if k % 2 == 0 else batch(rng))))))
        opt.step()
        module.lazy_reset_grad()
    return np.array(losses), state, module


def _rel(a, b):
    return np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30))


def _export_runs_in_both(module, path, x: np.ndarray) -> None:
    """The exported inference model runs in ORT's and our InferenceSession alike."""
    module.export_model_for_inferencing(path, ["output"])
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["input"]
    ref = ort.InferenceSession(os.fspath(path)).run(None, {"input": x})[0]
    got = InferenceSession(os.fspath(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("which", ["mlp", "gru"])
def test_trajectory_matches_ort(which, ort_mlp, ort_gru, tmp_path):
    art, batch = {"mlp": (ort_mlp, mlp_batch), "gru": (ort_gru, gru_batch)}[which]
    theirs, ort_state, ort_module = _trajectory(ort_api, art, batch)
    ours, state, module = _trajectory(api, art, batch)
    assert _rel(ours, theirs) <= REL_TOL, (ours, theirs)
    assert ours[-2] < 0.9 * ours[0]  # it learns (the fixed batch)
    for name, p in ort_state.parameters:
        np.testing.assert_allclose(state.parameters[name].data, p.data, rtol=1e-4, atol=1e-6)
    # same eval outputs on the trained parameters
    module.eval()
    ort_module.eval()
    x = batch(np.random.default_rng(5))
    for a, b in zip(_as_tuple(module(*x)), _as_tuple(ort_module(*x)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    _export_runs_in_both(module, tmp_path / "inference.onnx", x[0])


def _cnn_matches_ort(art, path):
    # ORT cannot load its own eval model here (BatchNormalization with training_mode=0 and
    # three outputs), so ORT runs without it; ours runs it
    theirs, _, _ = _trajectory(ort_api, art, cnn_batch, with_eval=False)
    ours, _, module = _trajectory(api, art, cnn_batch)
    assert _rel(ours, theirs) <= REL_TOL, (ours, theirs)
    assert ours[-2] < 0.9 * ours[0]
    module.eval()
    x = cnn_batch(np.random.default_rng(1))
    assert np.isfinite(module(*x))
    _export_runs_in_both(module, path, x[0])  # ORT runs our export of its eval model


def test_cnn_batchnorm_sgd_trajectory_matches_ort(ort_cnn, tmp_path):
    _cnn_matches_ort(ort_cnn, tmp_path / "inference.onnx")


def test_cnn_maxpool_trajectory_matches_ort(ort_cnn_maxpool, tmp_path):
    _cnn_matches_ort(ort_cnn_maxpool, tmp_path / "inference.onnx")


def test_outputs_and_names_match_ort(ort_mlp):
    _, ort_module, _ = _session(ort_api, ort_mlp)
    _, module, _ = _session(api, ort_mlp)
    for mode in (True, False):
        module.train(mode)
        ort_module.train(mode)
        assert module.input_names() == ort_module.input_names() == ["input", "labels"]
        assert module.output_names() == ort_module.output_names()
        x = mlp_batch(np.random.default_rng(3))
        ours, theirs = module(*x), ort_module(*x)
        assert len(ours) == len(theirs) == 2  # loss, then the additional output
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert module.eval() is module and not module.training
    assert module.train() is module and module.training


def test_gradient_accumulation_matches_ort(ort_mlp):
    ort_state, ort_module, _ = _session(ort_api, ort_mlp)
    state, module, _ = _session(api, ort_mlp)
    # before any step the buffers are zeros (frozen parameters have none)
    assert np.all(state.parameters["fc1.weight"].grad == 0)
    assert state.parameters["fc2.bias"].grad is None
    rng = np.random.default_rng(4)
    a, b = mlp_batch(rng), mlp_batch(rng)
    for m in (module, ort_module):
        m(*a)
    g1 = state.parameters["fc1.weight"].grad
    np.testing.assert_allclose(g1, ort_state.parameters["fc1.weight"].grad, rtol=1e-5,
                               atol=1e-7)
    for m in (module, ort_module):
        m(*b)  # accumulates
    g2 = state.parameters["fc1.weight"].grad
    np.testing.assert_allclose(g2, ort_state.parameters["fc1.weight"].grad, rtol=1e-5,
                               atol=1e-7)
    for m in (module, ort_module):
        m.lazy_reset_grad()
        m(*b)  # overwrites
    gb = state.parameters["fc1.weight"].grad
    np.testing.assert_allclose(gb + g1, g2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, ort_state.parameters["fc1.weight"].grad, rtol=1e-5,
                               atol=1e-7)
    # eval steps leave the gradients alone
    module.eval()
    module(*a)
    np.testing.assert_array_equal(state.parameters["fc1.weight"].grad, gb)


def test_contiguous_parameters_match_ort(ort_mlp):
    _, ort_module, _ = _session(ort_api, ort_mlp)
    state, module, _ = _session(api, ort_mlp)
    for trainable_only in (False, True):
        ours = module.get_contiguous_parameters(trainable_only)
        theirs = ort_module.get_contiguous_parameters(trainable_only).numpy()
        assert ours.numpy().dtype == np.float32
        np.testing.assert_array_equal(ours.numpy(), theirs)
        assert module.get_parameters_size(trainable_only) == \
            ort_module.get_parameters_size(trainable_only) == theirs.size
    assert module.get_parameters_size() == 32 * 20 + 32 + 10 * 32  # default: trainable only
    buf = np.arange(module.get_parameters_size(), dtype=np.float32) / 1000
    frozen_before = state.parameters["fc2.bias"].data
    module.copy_buffer_to_parameters(buf)
    np.testing.assert_array_equal(module.get_contiguous_parameters(True).numpy(), buf)
    np.testing.assert_array_equal(state.parameters["fc2.bias"].data, frozen_before)
    np.testing.assert_array_equal(state.parameters["fc1.weight"].data.ravel(), buf[:640])
    # ORT's OrtValue and torch tensors are accepted as buffers too
    module.copy_buffer_to_parameters(ort_module.get_contiguous_parameters(True))
    module.copy_buffer_to_parameters(torch.from_numpy(buf))
    with pytest.raises(ValueError, match="expected 992 elements, got 3"):
        module.copy_buffer_to_parameters(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="float32"):
        module.copy_buffer_to_parameters(buf.astype(np.float64))
    np.testing.assert_array_equal(module.get_contiguous_parameters(True).numpy(), buf)


def test_nominal_checkpoint_flow(ort_mlp, tmp_path):
    full_state, full, _ = _session(api, ort_mlp)
    state = api.CheckpointState.load_checkpoint(ort_mlp.nominal_checkpoint)
    module = api.Module(ort_mlp.train, state, ort_mlp.eval)
    with pytest.raises(ValueError, match="trainable_only=False"):
        module.copy_buffer_to_parameters(full.get_contiguous_parameters(True))
    module.copy_buffer_to_parameters(full.get_contiguous_parameters(), trainable_only=False)
    assert not state.is_nominal
    for name, p in full_state.parameters:
        np.testing.assert_array_equal(state.parameters[name].data, p.data)
    x = mlp_batch(np.random.default_rng(0))
    np.testing.assert_array_equal(module(*x)[0], full(*x)[0])
    out = os.fspath(tmp_path / "completed")
    api.CheckpointState.save_checkpoint(state, out)
    back = ort_api.CheckpointState.load_checkpoint(out)
    for name, p in full_state.parameters:
        np.testing.assert_array_equal(back.parameters[name].data, p.data)


def test_export_for_inferencing(ort_mlp, tmp_path):
    _, module, opt = _session(api, ort_mlp)
    _, ort_module, ort_opt = _session(ort_api, ort_mlp)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = mlp_batch(rng)
        for m, o in ((module, opt), (ort_module, ort_opt)):
            m(*x)
            o.step()
            m.lazy_reset_grad()
    ours_path, theirs_path = tmp_path / "ours.onnx", tmp_path / "theirs.onnx"
    module.export_model_for_inferencing(ours_path, ["output"])
    ort_module.export_model_for_inferencing(os.fspath(theirs_path), ["output"])
    exported = onnx.load(ours_path)
    onnx.checker.check_model(exported)
    assert [i.name for i in exported.graph.input] == ["input"]  # labels dropped
    assert [o.name for o in exported.graph.output] == ["output"]
    x = rng.standard_normal((7, 20)).astype(np.float32)
    ref = ort.InferenceSession(os.fspath(theirs_path)).run(None, {"input": x})[0]
    ort_runs_ours = ort.InferenceSession(os.fspath(ours_path)).run(None, {"input": x})[0]
    we_run_ours = InferenceSession(os.fspath(ours_path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(ort_runs_ours, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(we_run_ours, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="nope"):
        module.export_model_for_inferencing(tmp_path / "x.onnx", ["nope"])
    state = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    no_eval = api.Module(ort_mlp.train, state)
    with pytest.raises(RuntimeError, match="Eval model was not provided"):
        no_eval.export_model_for_inferencing(tmp_path / "x.onnx", ["output"])
    assert not (tmp_path / "x.onnx").exists()


# ---- optimizer ------------------------------------------------------------------------


def test_learning_rate_get_set(ort_mlp):
    _, _, opt = _session(api, ort_mlp)
    _, _, ort_opt = _session(ort_api, ort_mlp)
    assert opt.get_learning_rate() == ort_opt.get_learning_rate() == np.float32(0.001)
    for o in (opt, ort_opt):
        o.set_learning_rate(0.3)
    assert opt.get_learning_rate() == ort_opt.get_learning_rate()
    with pytest.raises(TypeError, match="learning_rate"):
        opt.set_learning_rate("0.1")


def test_resume_from_checkpoint_matches_ort(ort_mlp, tmp_path):
    """Train 4 steps, save with optimizer state, reload and train 4 more: the same losses on
    both libraries, whichever wrote the checkpoint."""
    rng = np.random.default_rng(0)
    batches = [mlp_batch(rng) for _ in range(8)]

    def run(lib, ckpt_in, ckpt_out, part, lr=None):
        state = lib.CheckpointState.load_checkpoint(ckpt_in)
        module = lib.Module(ort_mlp.train, state, ort_mlp.eval)
        opt = lib.Optimizer(ort_mlp.optimizer, module)
        if lr is not None:
            opt.set_learning_rate(lr)
        losses = []
        for x in part:
            losses.append(float(module(*x)[0]))
            opt.step()
            module.lazy_reset_grad()
        lib.CheckpointState.save_checkpoint(state, os.fspath(ckpt_out), True)
        return losses

    a1 = run(ort_api, ort_mlp.checkpoint, tmp_path / "ort_half", batches[:4], lr=0.01)
    b1 = run(api, ort_mlp.checkpoint, tmp_path / "our_half", batches[:4], lr=0.01)
    np.testing.assert_allclose(b1, a1, rtol=REL_TOL)
    # each continues from the other's checkpoint
    a2 = run(ort_api, tmp_path / "our_half", tmp_path / "ort_end", batches[4:], lr=0.01)
    b2 = run(api, tmp_path / "ort_half", tmp_path / "our_end", batches[4:], lr=0.01)
    np.testing.assert_allclose(b2, a2, rtol=REL_TOL)
    ours = api.CheckpointState.load_checkpoint(tmp_path / "our_end")
    theirs = api.CheckpointState.load_checkpoint(tmp_path / "ort_end")
    for name, p in theirs.parameters:
        np.testing.assert_allclose(ours.parameters[name].data, p.data, rtol=1e-4, atol=1e-6)


def test_optimizer_bad_input(ort_mlp, ort_gru, tmp_path):
    _, module, _ = _session(api, ort_mlp)
    with pytest.raises(TypeError, match="module"):
        api.Optimizer(ort_mlp.optimizer, "not a module")
    with pytest.raises(FileNotFoundError, match="optimizer_uri"):
        api.Optimizer(tmp_path / "missing.onnx", module)
    with pytest.raises(ValueError, match="AdamWOptimizer or SGDOptimizerV2"):
        api.Optimizer(ort_mlp.eval, module)
    # an optimizer state saved for another model does not fit this one
    _, gru_module, gru_opt = _session(api, ort_gru)
    with pytest.raises(ValueError, match="momentum0|does not train"):
        state = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
        state._optimizer_groups = gru_module._state._optimizer_groups
        api.Optimizer(ort_mlp.optimizer, api.Module(ort_mlp.train, state))


# ---- learning-rate schedule -----------------------------------------------------------


def _schedule(lib, art, warmup, total, lr, steps):
    _, module, opt = _session(lib, art)
    sched = lib.LinearLRScheduler(opt, warmup, total, lr)
    rates = [opt.get_learning_rate()]
    x = mlp_batch(np.random.default_rng(0))
    for _ in range(steps):
        module(*x)
        opt.step()
        sched.step()
        module.lazy_reset_grad()
        rates.append(opt.get_learning_rate())
    return np.array(rates)


def test_linear_schedule_is_the_documented_one(ort_mlp):
    ours = _schedule(api, ort_mlp, 3, 10, 0.1, 12)
    k = np.arange(13)
    expected = np.where(k < 3, 0.1 * k / 3, 0.1 * np.maximum(0, (10 - k) / 7))
    np.testing.assert_allclose(ours, expected.astype(np.float32), rtol=1e-6, atol=1e-9)


def test_ort_1_19_2_schedule_is_ours_with_swapped_counts(ort_mlp):
    """ORT 1.19.2 passes warmup and total swapped to its native scheduler: its schedule for
    (warmup=3, total=10) is ours for (warmup=10, total=3)."""
    theirs = _schedule(ort_api, ort_mlp, 3, 10, 0.1, 12)
    ours_swapped = _schedule(api, ort_mlp, 10, 3, 0.1, 12)
    np.testing.assert_array_equal(ours_swapped, theirs)
    k = np.arange(13)
    np.testing.assert_allclose(theirs, np.where(k < 10, 0.1 * k / 10, 0.0).astype(np.float32),
                               rtol=1e-6)


def test_scheduler_bad_input(ort_mlp):
    _, _, opt = _session(api, ort_mlp)
    with pytest.raises(TypeError, match="optimizer"):
        api.LinearLRScheduler("opt", 1, 2, 0.1)
    with pytest.raises(ValueError, match="warmup_step_count"):
        api.LinearLRScheduler(opt, -1, 2, 0.1)
    with pytest.raises(ValueError, match="total_step_count"):
        api.LinearLRScheduler(opt, 1, 2.5, 0.1)
    sched = api.LinearLRScheduler(opt, 0, 0, 0.5)  # no warm-up, nothing to decay over
    sched.step()
    assert opt.get_learning_rate() == 0.0


# ---- bad input ------------------------------------------------------------------------


def test_bad_feeds(ort_mlp):
    state, module, _ = _session(api, ort_mlp)
    before = module.get_contiguous_parameters().numpy().copy()
    x, y = mlp_batch(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"expected 2 input\(s\) \['input', 'labels'\], got 1"):
        module(x)
    with pytest.raises(TypeError, match="'labels'.*numpy array"):
        module(x, [1, 2])
    with pytest.raises(ValueError, match="'input'"):
        module(x.astype(np.float64), y)
    with pytest.raises(ValueError, match="'input'"):
        module(x[:, :5], y)
    with pytest.raises(ValueError, match="'labels'"):
        module(x, y.astype(np.float32))
    np.testing.assert_array_equal(module.get_contiguous_parameters().numpy(), before)
    # non-contiguous and read-only inputs are fine (copied, never written)
    xr = np.asfortranarray(x)
    xr.flags.writeable = False
    np.testing.assert_array_equal(module(xr, y)[0], module(x, y)[0])
    no_eval = api.Module(ort_mlp.train, api.CheckpointState.load_checkpoint(ort_mlp.checkpoint))
    with pytest.raises(RuntimeError, match="eval model"):
        no_eval.eval()(x, y)


def test_checkpoint_not_matching_model(ort_mlp, ort_gru, tmp_path):
    gru_state = api.CheckpointState.load_checkpoint(ort_gru.checkpoint)
    with pytest.raises(ValueError, match="checkpoint"):
        api.Module(ort_mlp.train, gru_state)
    # same names, wrong shape
    other = generate_with_ort(tmp_path / "wide", models.mlp(sizes=(20, 48, 10)),
                              requires_grad=["fc1.weight", "fc1.bias", "fc2.weight"],
                              frozen_params=["fc2.bias"],
                              loss=LOSS.CrossEntropyLoss)
    wide = api.CheckpointState.load_checkpoint(other.checkpoint)
    with pytest.raises(ValueError, match=r"fc1.weight.*\[32, 20\].*\[48, 20\]"):
        api.Module(ort_mlp.train, wide)
    # trainable in the checkpoint, frozen in the model
    state = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    state._params["fc2.bias"].requires_grad = True
    with pytest.raises(ValueError, match="fc2.bias.*trainable.*no gradient buffer"):
        api.Module(ort_mlp.train, state)
    assert all(s.grad is None for s in state._params.values())  # the state is untouched
    nominal = api.CheckpointState.load_checkpoint(ort_mlp.nominal_checkpoint)
    with pytest.raises(ValueError, match="checkpoint"):
        api.Module(ort_gru.train, nominal)
    assert all(s.value is None for s in nominal._params.values())
    with pytest.raises(TypeError, match="state"):
        api.Module(ort_mlp.train, "checkpoint")
    with pytest.raises(ValueError, match="device"):
        api.Module(ort_mlp.train, api.CheckpointState.load_checkpoint(ort_mlp.checkpoint),
                   device="cuda")
    with pytest.raises(FileNotFoundError, match="train_model_uri"):
        api.Module(tmp_path / "none.onnx", api.CheckpointState.load_checkpoint(
            ort_mlp.checkpoint))
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\x01\x02not a model")
    with pytest.raises(ValueError, match="train_model_uri.*not a readable ONNX model"):
        api.Module(bad, api.CheckpointState.load_checkpoint(ort_mlp.checkpoint))


def test_ort_values_as_inputs(ort_mlp):
    _, module, _ = _session(api, ort_mlp)
    x, y = mlp_batch(np.random.default_rng(0))
    as_ort = module(ort.OrtValue.ortvalue_from_numpy(x), ort.OrtValue.ortvalue_from_numpy(y))
    assert all(isinstance(v, ort.OrtValue) for v in as_ort)  # as ORT returns them
    np.testing.assert_array_equal(as_ort[0].numpy(), module(x, y)[0])
    np.testing.assert_array_equal(module(torch.from_numpy(x), torch.from_numpy(y))[0],
                                  as_ort[0].numpy())


def test_ort_optimizer_model_with_ir_14_loads_on_ours(ort_mlp, tmp_path):
    """ORT's generator with onnx 1.23 writes the optimizer model with IR version 14, which
    ORT 1.19.2 refuses; ours runs it as written."""
    model = onnx.load(ort_mlp.optimizer)
    model.ir_version = 14
    path = tmp_path / "optimizer_ir14.onnx"
    onnx.save(model, path)
    state, module, _ = _session(api, ort_mlp)
    opt = api.Optimizer(path, module)
    before = state.parameters["fc1.weight"].data
    module(*mlp_batch(np.random.default_rng(0)))
    opt.step()
    assert not np.array_equal(state.parameters["fc1.weight"].data, before)
    ort_state = ort_api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    ort_module = ort_api.Module(ort_mlp.train, ort_state)
    with pytest.raises(Exception, match="IR version"):
        ort_api.Optimizer(os.fspath(path), ort_module)


@pytest.mark.parametrize("warmup,total", [(0, 10), (5, 5), (7, 3), (1, 1), (4, 100), (0, 0)])
def test_linear_schedule_grid(ort_mlp, warmup, total):
    """The documented formula for every step count k, edge cases included (no warm-up,
    warm-up as long as the run or longer, one step)."""
    _, _, opt = _session(api, ort_mlp)
    sched = api.LinearLRScheduler(opt, warmup, total, 0.25)
    for k in range(0, max(warmup, total) + 3):
        opt._group.step = k
        sched.step()
        if k < warmup:
            want = 0.25 * k / warmup
        else:
            want = 0.25 * max(0.0, (total - k) / max(1, total - warmup))
        assert opt.get_learning_rate() == pytest.approx(want, rel=1e-6, abs=1e-9), k
