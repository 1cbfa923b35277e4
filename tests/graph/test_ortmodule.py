"""ORTModule vs eager torch: outputs, every gradient, BN statistics, AdamW loss curves,
train/eval, shape changes, state dicts, copies, fallback.

Dropout masks come from torch's generator in eager order, so with equal seeds the two runs
see the same masks and can be compared directly. Tolerances (float32): forward 1e-5 rel /
5e-6 abs, gradients 1e-4 rel / 2e-6 abs (measured worst: 5e-7 and 1.4e-7); loss curves
relative 1e-5 per step over 50 AdamW steps.
"""

from __future__ import annotations

import copy
import io
import os
import warnings

import pytest
import torch

import ortcpu_torch
from ortcpu_torch import FallbackError, FallbackWarning, ORTModule

from .capture_models import NAMES, make

SEED = 11
# the loss-curve runs of the bigger models take minutes on a loaded 2-core machine
FULL = os.environ.get("ORTCPU_GRAPH_FULL") == "1"
CURVE_MODELS = NAMES if FULL else ("mlp", "cnn")


def _step(model, args, seed):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(*args)
    out[0].backward()
    return out


def _assert_same_state(ours, ref, *, rtol=1e-4, atol=2e-6):
    for (name, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=name)
    for (name, b), (_, c) in zip(ours.named_buffers(), ref.named_buffers(), strict=True):
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("name", NAMES)
def test_outputs_gradients_and_buffers_match_eager(name):
    model, args = make(name)
    ref = copy.deepcopy(model)
    om = ORTModule(model)
    for step in range(2):  # the second step reuses the cached plan
        out = _step(om, args, SEED + step)
        exp = _step(ref, args, SEED + step)
        for o, e in zip(out, exp, strict=True):
            torch.testing.assert_close(o, e, rtol=1e-5, atol=5e-6)
        _assert_same_state(model, ref)
    assert len(om._cache) == 1
    assert "graph-wide" in om.report()


@pytest.mark.parametrize("name", CURVE_MODELS)
def test_adamw_loss_curve_follows_eager(name):
    """50 AdamW steps (all six models with ORTCPU_GRAPH_FULL=1)."""
    model, args = make(name)
    ref = copy.deepcopy(model)
    om = ORTModule(model)
    opt = torch.optim.AdamW(om.parameters(), lr=3e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    ours, theirs = [], []
    for step in range(50):
        for m, o, curve in ((om, opt, ours), (ref, ref_opt, theirs)):
            o.zero_grad()
            torch.manual_seed(step)
            loss = m(*args)[0]
            loss.backward()
            o.step()
            curve.append(float(loss))
    rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs, strict=True))
    assert rel <= 1e-5, (rel, ours[-1], theirs[-1])
    assert theirs[-1] < theirs[0]


def test_input_gradients_and_no_grad():
    model, args = make("functional")
    ref = copy.deepcopy(model)
    x = args[0].clone().requires_grad_()
    xr = args[0].clone().requires_grad_()
    om = ORTModule(model)
    torch.manual_seed(0)
    om(x, args[1])[0].backward()
    torch.manual_seed(0)
    ref(xr, args[1])[0].backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        torch.manual_seed(1)
        out = om(*args)
        torch.manual_seed(1)
        exp = ref(*args)
    assert out[0].grad_fn is None
    torch.testing.assert_close(out[1], exp[1], rtol=1e-5, atol=5e-6)


def test_train_eval_switch_and_shape_change_recapture():
    model, args = make("cnn")
    ref = copy.deepcopy(model)
    om = ORTModule(model)
    _step(om, args, 0)
    _step(ref, args, 0)
    om.eval()
    ref.eval()
    assert not model.training
    stats = {k: v.clone() for k, v in model.named_buffers()}
    with torch.no_grad():
        torch.testing.assert_close(om(*args)[1], ref(*args)[1], rtol=1e-5, atol=5e-6)
    for k, v in model.named_buffers():  # eval does not touch the running statistics
        assert torch.equal(v, stats[k]), k
    om.train()
    ref.train()
    bigger, _ = make("cnn", batch=6)[1], None
    _step(om, bigger, 1)
    _step(ref, bigger, 1)
    _assert_same_state(model, ref)
    assert len(om._cache) == 3  # train b4, eval b4, train b6


def test_state_dict_deepcopy_and_save():
    model, args = make("cnn")
    om = ORTModule(model)
    _step(om, args, 0)
    assert list(om.state_dict()) == list(model.state_dict())
    twin = ORTModule(make("cnn")[0])
    twin.load_state_dict(om.state_dict())
    for k, v in twin.state_dict().items():
        assert torch.equal(v, om.state_dict()[k]), k
    dup = copy.deepcopy(om)
    buf = io.BytesIO()
    torch.save(om, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    outs = []
    for m in (om, dup, loaded):
        with torch.no_grad():
            m.eval()
            outs.append(m(*args)[1])
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(outs[2], outs[0])
    assert isinstance(next(om.parameters()), torch.nn.Parameter)


def test_save_onnx_writes_forward_and_training_graphs(tmp_path):
    model, args = make("mlp")
    om = ORTModule(model, save_onnx=tmp_path)
    _step(om, args, 0)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["train_0_forward.onnx", "train_0_training.onnx"]


class _Unsupported(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return (torch.cummax(self.fc(x), 1)[0].sum(),)


def test_fallback_warns_once_and_runs_eagerly():
    model = _Unsupported()
    om = ORTModule(model)
    x = torch.randn(4, 3)
    with pytest.warns(FallbackWarning, match="cummax"):
        out = om(x)[0]
    out.backward()
    assert model.fc.weight.grad is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        om(x)
    assert "eager torch" in om.report()


def test_fallback_error_and_bad_arguments():
    with pytest.raises(FallbackError, match="cummax"):
        ORTModule(_Unsupported(), fallback="error")(torch.randn(2, 3))
    with pytest.raises(ValueError, match="fallback"):
        ORTModule(_Unsupported(), fallback="never")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ORTModule(lambda x: x)


def test_top_level_export():
    assert ortcpu_torch.ORTModule is ORTModule


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True,
                                                      activation="gelu")

    def forward(self, x):
        y = self.layer(x)
        return y.pow(2).mean(), y


def test_transformer_encoder_layer_with_dropout_matches_eager():
    """SDPA with attention dropout, and a dropout on a transposed (non-contiguous) tensor:
    the masks follow eager torch's draw order and memory layout."""
    model = _Encoder()
    ref = copy.deepcopy(model)
    om = ORTModule(model, fallback="error")
    x = torch.randn(3, 10, 32)
    out, exp = _step(om, (x,), 4), _step(ref, (x,), 4)
    torch.testing.assert_close(out[1], exp[1], rtol=1e-5, atol=5e-6)
    _assert_same_state(model, ref)
    assert len(next(iter(om._cache.values())).graph.dropout_masks) == 4


def test_padded_max_pools_whose_input_gradient_has_several_contributions():
    """Padded, strided and ceil_mode MaxPools (not the 2x2 rewrite) on one value that also
    feeds a residual: each MaxPoolGrad's output shape comes from value_info and the
    gradients are summed."""
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            h = self.conv(x)
            pooled = F.max_pool2d(h, 3, 1, 1) + h
            return (pooled.square().mean() + F.max_pool2d(h, 3, 2, 1).sum()
                    + F.max_pool2d(torch.relu(h), 3, 2, 1, ceil_mode=True).sum())

    torch.manual_seed(0)
    model, x = Block().double(), torch.randn(2, 3, 9, 9, dtype=torch.float64)
    want = model(x)
    want.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = ORTModule(model, fallback="error")(x)
    got.backward()
    torch.testing.assert_close(got, want)
    for p, g in zip(model.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g)
