"""The per-call glue of ORTModule and the executor's plan cache: plan keys (defaults left
to their initializer vs fed), one plan per signature across steps, and buffers written back
in place (float statistics and the int64 counter) exactly as eager torch writes them."""

from __future__ import annotations

import copy

import numpy as np
import onnx
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
