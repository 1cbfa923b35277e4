"""The per-call glue of ORTModule and the executor's plan cache: plan keys (defaults left
to their initializer vs fed), one plan per signature across steps, and buffers written back
in place (float statistics and the int64 counter) exactly as eager torch writes them."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import helper as h

from ortcpu_torch import ORTModule
from ortcpu_torch.graph.executor import Executor


def _add_model():
    """y = x + w, with w an initializer that is also a graph input (a default)."""
    f = onnx.TensorProto.FLOAT
    w = onnx.numpy_helper.from_array(np.full((2, 3), 5.0, np.float32), "w")
    g = h.make_graph([h.make_node("Add", ["x", "w"], ["y"])], "g",
                     [h.make_tensor_value_info("x", f, [2, 3]),
                      h.make_tensor_value_info("w", f, [2, 3])],
                     [h.make_tensor_value_info("y", f, [2, 3])], [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_plan_key_tells_a_default_from_a_fed_value_of_the_same_shape():
    ex = Executor(_add_model())
    x = torch.ones(2, 3)
    torch.testing.assert_close(ex.run({"x": x})["y"], torch.full((2, 3), 6.0))
    fed = torch.full((2, 3), -1.0)
    torch.testing.assert_close(ex.run({"x": x, "w": fed})["y"], torch.zeros(2, 3))
    assert len(ex._plans) == 2  # the default folded as a constant in the first plan only
    torch.testing.assert_close(ex.run({"x": x})["y"], torch.full((2, 3), 6.0))
    fed.fill_(2.0)  # a fed value is read at run time, never folded
    torch.testing.assert_close(ex.run({"x": x, "w": fed})["y"], torch.full((2, 3), 3.0))
    assert len(ex._plans) == 2


def test_plan_key_separates_dtypes_and_shapes():
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                     [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    ex = Executor(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), check=False)
    for shape in [(3,), (2, 3), (3,), (1,), (0,)]:
        x = torch.randn(shape)
        torch.testing.assert_close(ex.run({"x": x})["y"], x.relu())
    assert len(ex._plans) == 4


class _BNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4, momentum=0.3)
        self.bn2 = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        z = self.bn(self.conv(x)).relu().mean((2, 3))
        return self.bn2(z).square().sum()


def test_buffers_written_back_in_place_like_eager_over_steps():
    torch.manual_seed(0)
    ref = _BNNet().double()  # float64: the comparison is not blurred by BN's cancellation
    ours_module = copy.deepcopy(ref)
    ours = ORTModule(ours_module, fallback="error")
    before = {n: b for n, b in ours_module.named_buffers()}
    x = torch.randn(5, 2, 6, 6, dtype=torch.float64)
    for _ in range(3):
        for m in (ref, ours):
            m.zero_grad(set_to_none=True)
            m(x).backward()
    for (n, b), (_, r) in zip(ours_module.named_buffers(), ref.named_buffers(), strict=True):
        assert b is before[n], n  # written in place, not rebound
        assert b.dtype == r.dtype, n
        torch.testing.assert_close(b, r, rtol=1e-10, atol=1e-12, msg=n)
    assert int(ours_module.bn.num_batches_tracked) == 3
    # (BN amplifies the rounding of the reductions: float64 gradients agree to ~1e-8)
    for (n, p), (_, r) in zip(ours_module.named_parameters(), ref.named_parameters(),
                              strict=True):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-9, msg=n)
    (entry,) = ours._cache.values()
    assert len(entry.forward._plans) == 1 and len(entry.backward._plans) == 1


def _bn_internal_model(mean, var, dt):
    """BatchNormInternal(x, scale, bias, mean, var), momentum 0, mean / var initializers."""
    t = {torch.float32: onnx.TensorProto.FLOAT, torch.float64: onnx.TensorProto.DOUBLE}[dt]
    inits = [onnx.numpy_helper.from_array(v.numpy(), n) for n, v in (("m", mean), ("v", var))]
    node = h.make_node("BatchNormInternal", ["x", "s", "b", "m", "v"],
                       ["y", "rm", "rv", "sm", "si"], domain="com.microsoft", momentum=0.0,
                       epsilon=1e-5, training_mode=1)
    c = mean.shape[0]
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", t, [4, c, 3, 2]),
                                   h.make_tensor_value_info("s", t, [c]),
                                   h.make_tensor_value_info("b", t, [c])],
                     [h.make_empty_tensor_value_info(o) for o in ("y", "rm", "rv", "sm", "si")],
                     inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17),
                                          h.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
@pytest.mark.parametrize("fill", [-1000.5, float("nan"), float("inf")],
                         ids=["finite", "nan", "inf"])
def test_bn_internal_momentum_0_running_outputs(dt, fill, monkeypatch):
    """Momentum 0 with finite constant running inputs (capture's placeholders): the running
    outputs are the batch statistics themselves (no update ops); a non-finite
    constant still gets ORT's ``0·input + batch`` (NaN)."""
    from ortcpu_torch import kernels
    from ortcpu_torch.kernels import batchnorm

    calls = []
    orig = batchnorm._running
    monkeypatch.setattr(batchnorm, "_running", lambda *a: calls.append(1) or orig(*a))
    c = 3
    mean, var = torch.full((c,), fill, dtype=dt), torch.full((c,), -fill, dtype=dt)
    x = torch.randn(4, c, 3, 2, dtype=dt)
    s, b = torch.rand(c, dtype=dt) + 0.5, torch.randn(c, dtype=dt)
    got = Executor(_bn_internal_model(mean, var, dt), check=False).run({"x": x, "s": s, "b": b})
    assert len(calls) == (0 if fill == -1000.5 else 1)
    want = kernels.BatchNormInternal(x, s, b, mean, var, momentum=0.0, training_mode=1)
    for name, w in zip(("y", "rm", "rv", "sm", "si"), want, strict=True):
        torch.testing.assert_close(got[name], w, rtol=1e-12 if dt == torch.float64 else 1e-6,
                                   atol=1e-12, equal_nan=True, msg=name)
    assert bool(torch.isfinite(got["rm"]).all()) == (fill == -1000.5)
    if fill == -1000.5:
        torch.testing.assert_close(got["rm"], got["sm"], rtol=0, atol=0)


def test_captured_batchnorm_skips_the_running_update_ops(monkeypatch):
    """An ORTModule BatchNorm step runs no ``_running`` ops (the placeholders are finite
    constants with momentum 0) and still tracks torch's running statistics."""
    from ortcpu_torch.kernels import batchnorm

    def fail(*a):
        raise AssertionError("_running called")
    monkeypatch.setattr(batchnorm, "_running", fail)
    test_buffers_written_back_in_place_like_eager_over_steps()
