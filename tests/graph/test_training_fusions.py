"""training_fusions.py: every rewrite of the graph ORTModule runs gives the results of the
unfused training graph (float64 and float32), fires where it should, and never reaches the
training graph that ``save_onnx`` writes."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch import ORTModule
from ortcpu_torch.graph import training_fusions

TOL = {torch.float64: {"rtol": 1e-10, "atol": 1e-12}, torch.float32: {"rtol": 2e-5, "atol": 2e-6}}


def _run(model, args, fused: bool, monkeypatch, save_onnx=None):
    """(outputs, {param: grad}, the rewrite descriptions) of two ORTModule steps."""
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(training_fusions, "PASSES", [])
        om = ORTModule(model, fallback="error", save_onnx=save_onnx)
        for _ in range(2):  # the second step runs the cached plans
            om.zero_grad(set_to_none=True)
            out = om(*args)
            (out[0] if isinstance(out, tuple) else out).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    sig = ortcpu_torch.report(om, file=None).graph["signatures"][0]
    return out, grads, sig["training_fusions"]


def check_fused_matches_unfused(make, args, dtype, monkeypatch, tmp_path=None):
    """Fused vs unfused ORTModule on copies of one model; returns the rewrites made."""
    torch.manual_seed(0)
    model = make().to(dtype)
    args = [a.to(dtype) if a.is_floating_point() else a for a in args]
    out_f, g_f, done = _run(copy.deepcopy(model), args, True, monkeypatch, tmp_path)
    out_u, g_u, none = _run(copy.deepcopy(model), args, False, monkeypatch)
    assert none == []
    out_f = out_f if isinstance(out_f, tuple) else (out_f,)
    out_u = out_u if isinstance(out_u, tuple) else (out_u,)
    for a, b in zip(out_f, out_u, strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])
    for name, g in g_u.items():
        assert g is not None, name
        torch.testing.assert_close(g_f[name], g, **TOL[dtype], msg=name)
        assert g_f[name].is_contiguous(), name
    if tmp_path is not None:  # the saved training graph stays standard ONNX + ORT ops
        saved = onnx.load(str(next(tmp_path.glob("*_training.onnx"))))
        assert not any(n.domain == training_fusions.DOMAIN for n in saved.graph.node)
    return done


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 7), nn.Linear(7, 3, bias=False)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(torch.tanh(self.fc1(x))).flatten(0, -2), y)


@pytest.mark.parametrize(("rows", "dtype"), [
    ((2, 4), torch.float64), ((2, 4), torch.float32), ((1, 1), torch.float32),
    ((3, 2, 2), torch.float64), ((5,), torch.float32)],
    ids=["3d-f64", "3d-f32", "3d_one_row-f32", "4d-f64", "2d-f32"])
def test_linear_weight_gradients_without_transposes(dtype, rows, monkeypatch, tmp_path):
    """A Linear on [..., K] is MatMul(X, Transpose(W)): its backward Gemms read W itself and
    write the weight gradient in W's layout (2-D inputs are a Gemm already: no rewrite)."""
    x = torch.randn(*rows, 6)
    y = torch.randint(0, 3, (x[..., 0].numel(),))
    done = check_fused_matches_unfused(MLP, [x, y], dtype, monkeypatch, tmp_path)
    n = 2 if len(rows) > 1 else 0
    assert done.count("Transpose(Gemm(A, B)) -> Gemm(B, A) with the trans flags flipped") == n
    assert done.count("Gemm(Transpose(W)) -> Gemm(W) with the trans flag flipped") == n // 2
