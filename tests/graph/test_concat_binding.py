"""The executor's static Concat binding (shapes known at plan time): every axis, negative
axis, an empty input, int64/bool data and a non-contiguous torch feed, vs numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

from ortcpu_torch.graph import InferenceSession


def _model(shapes, axis, elem):
    ins = [helper.make_tensor_value_info(f"x{i}", elem, s) for i, s in enumerate(shapes)]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    g = helper.make_graph([helper.make_node("Concat", [f"x{i}" for i in range(len(shapes))],
                                            ["y"], axis=axis)], "g", ins,
                          [helper.make_tensor_value_info("y", elem, out)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("elem,np_t", [(TP.FLOAT, np.float32), (TP.DOUBLE, np.float64),
                                       (TP.INT64, np.int64), (TP.BOOL, np.bool_)])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_static_concat_matches_numpy(elem, np_t, axis):
    rng = np.random.default_rng(0)
    base = [2, 3, 4]
    shapes = []
    for n in (1, 0, 5):
        s = list(base)
        s[axis] = n
        shapes.append(s)
    feeds = {f"x{i}": (rng.standard_normal(s) * 10).astype(np_t) for i, s in enumerate(shapes)}
    got = InferenceSession(_model(shapes, axis, elem)).run(None, feeds)[0]
    np.testing.assert_array_equal(got, np.concatenate(list(feeds.values()), axis=axis))


def test_static_concat_noncontiguous_torch_feed():
    m = _model([[3, 4], [3, 2]], 1, TP.FLOAT)
    a = torch.randn(4, 3).t()
    b = torch.randn(3, 2)
    got = InferenceSession(m).run(None, {"x0": a, "x1": b})[0]
    torch.testing.assert_close(got, torch.cat([a, b], 1))
