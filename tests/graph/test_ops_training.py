"""Plan-time training bindings (graph/ops_training.py): same results as the registry
kernels (checked per call), float32 and float64, static and symbolic shapes, and a bad
argument still reported against its node."""

from __future__ import annotations

import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as h

from ortcpu_torch import kernels
from ortcpu_torch.graph import Executor, GraphRunError

ONNX_TYPE = {torch.float32: TP.FLOAT, torch.float64: TP.DOUBLE}


def _run(op_type, inputs, n_out, attrs, static=True, expect_fast=True):
    dt = inputs[0].dtype
    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n_out)]
    node = h.make_node(op_type, names, outs, domain="com.microsoft", **attrs)
    vis = [h.make_tensor_value_info(n, ONNX_TYPE[dt], list(t.shape) if static else
                                    [f"d{n}_{j}" for j in range(t.dim())])
           for n, t in zip(names, inputs, strict=True)]
    graph = h.make_graph([node], "g", vis, [h.make_empty_tensor_value_info(o) for o in outs])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                               h.make_opsetid("com.microsoft", 1)])
    ex = Executor(model, check=False)
    res = ex.run(dict(zip(names, inputs, strict=True)))
    (plan,) = ex._plans.values()
    fn = plan.bound[0].fn
    fast = getattr(getattr(fn, "__code__", None), "co_filename", "").endswith("ops_training.py")
    assert fast == expect_fast, f"plan-time binding used: {fast}"
    return [res[o] for o in outs]


CASES = {
    "BatchNormInternal": (lambda dt: [torch.randn(4, 3, 5, 2, dtype=dt),
                                      torch.rand(3, dtype=dt) + 0.5, torch.randn(3, dtype=dt),
                                      torch.randn(3, dtype=dt), torch.rand(3, dtype=dt) + 1],
                          5, {"epsilon": 2.0**-10, "momentum": 0.75, "training_mode": 1}),
    "BatchNormalizationGrad": (lambda dt: [torch.randn(4, 3, 5, dtype=dt),
                                           torch.randn(4, 3, 5, dtype=dt),
                                           torch.rand(3, dtype=dt) + 0.5,
                                           torch.randn(3, dtype=dt),
                                           torch.rand(3, dtype=dt) + 0.5], 3, {}),
    "ConvGrad": (lambda dt: [torch.randn(2, 4, 3, 4, dtype=dt), torch.randn(2, 2, 6, 8,
                                                                            dtype=dt),
                             torch.randn(4, 1, 3, 3, dtype=dt)], 3,
                 {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2,
                  "kernel_shape": [3, 3], "dilations": [1, 1]}),
}


# symbolic dims in the model: the executor plans per input signature, so the shapes are
# still known when the node is bound
@pytest.mark.parametrize("static", [True, False], ids=["static", "symbolic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op_type", sorted(CASES))
def test_binding_matches_registry_kernel(op_type, dtype, static):
    make, n_out, attrs = CASES[op_type]
    torch.manual_seed(0)
    inputs = make(dtype)
    got = _run(op_type, inputs, n_out, attrs, static)
    exp = kernels.get(op_type)(*inputs, **attrs)
    for g, e in zip(got, exp, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_noncontiguous_feed_and_bad_shape_reported_against_node():
    x = torch.randn(3, 4, 5, 2).transpose(0, 1)  # [4, 3, 5, 2], not contiguous
    c = [torch.rand(3) + 0.5 for _ in range(4)]
    got = _run("BatchNormInternal", [x, *c], 5, {"training_mode": 1})  # static shapes
    exp = kernels.BatchNormInternal(x.contiguous(), *c, training_mode=1)
    torch.testing.assert_close(got[0], exp[0], rtol=0, atol=0)
    # a [C] input of the wrong length: the registry kernel's error, against the node
    with pytest.raises(GraphRunError, match="BatchNormInternal.*scale"):
        # shapes do not fit the fast path: the registry kernel, checked per call
        _run("BatchNormInternal", [x.contiguous(), torch.ones(2), *c[1:]], 5,
             {"training_mode": 1}, expect_fast=False)


def test_maxpool_2x2_training_rewrite_matches_eager_with_ties_and_odd_sizes(tmp_path):
    import copy

    import onnx

    import ortcpu_torch
    from ortcpu_torch import ORTModule

    class Pool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 3, 3)

        def forward(self, x):
            y = torch.nn.functional.max_pool2d(self.conv(x).clamp(-1, 1), 2)  # clamp: ties
            z = torch.nn.functional.max_pool2d(x * 2, 2, padding=1)  # padded: not rewritten
            return y.square().sum() + z.sum(), y

    model = Pool()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 2, 9, 8) * 3  # conv output 7x6: an odd height
    xr = x.clone().requires_grad_()
    x.requires_grad_()
    om = ORTModule(model, fallback="error", save_onnx=tmp_path)
    out, exp = om(x), ref(xr)
    out[0].backward()
    exp[0].backward()
    torch.testing.assert_close(out[1], exp[1])
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(model.conv.weight.grad, ref.conv.weight.grad)
    rep = ortcpu_torch.report(om, file=None)
    assert "MaxPool2x2Train" in rep.text
    assert rep.graph["signatures"][0]["training_fusions"] == [
        "MaxPool 2x2 + MaxPoolGrad -> MaxPool2x2Train + MaxPool2x2TrainGrad"]
    saved = onnx.load(str(next(tmp_path.glob("*_training.onnx"))))
    assert {n.op_type for n in saved.graph.node} >= {"MaxPool", "MaxPoolGrad"}
    assert not any(n.domain == "ortcpu_torch.training" for n in saved.graph.node)


def _auto_conv_grad_fn(inputs, attrs, **kw):
    """``_conv_grad_plan_fn`` bound in conv_infer's "auto" mode with every candidate kept."""
    from ortcpu_torch.graph import conv_infer

    before = conv_infer.get_mode()
    conv_infer.set_mode("auto")
    conv_infer.keep_candidates(True)
    try:
        return _conv_grad_plan_fn(inputs, attrs, **kw)
    finally:
        conv_infer.set_mode(before)
        conv_infer.keep_candidates(False)


def _conv_grad_plan_fn(inputs, attrs, outputs=("dx", "dw", "db")):
    dt = inputs[0].dtype
    names = ["dy", "x", "w"]
    node = h.make_node("ConvGrad", names, list(outputs), domain="com.microsoft", **attrs)
    vis = [h.make_tensor_value_info(n, ONNX_TYPE[dt], list(t.shape))
           for n, t in zip(names, inputs, strict=True)]
    graph = h.make_graph([node], "g", vis, [h.make_empty_tensor_value_info(o)
                                            for o in outputs if o])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                               h.make_opsetid("com.microsoft", 1)])
    ex = Executor(model, check=False)
    ex.run(dict(zip(names, inputs, strict=True)))
    (plan,) = ex._plans.values()
    return plan.bound[0].fn


# (X shape, W shape, attributes): 1-D to 3-D, strides, groups, dilations, asymmetric and
# end-only pads (torch's candidate only where the begin pads give the same grid), a batch
# of one, odd sizes
CONV_GRAD_GEOMETRIES = [
    ((3, 4, 5, 4), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 7, 9), (4, 2, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2}),
    ((1, 3, 6, 5), (5, 3, 2, 3), {"pads": [0, 1, 1, 1], "dilations": [2, 1]}),
    ((2, 3, 9), (4, 3, 3), {"pads": [2, 2], "strides": [3]}),
    ((2, 2, 4, 5, 3), (3, 2, 3, 3, 1), {"pads": [1, 1, 0, 1, 1, 0]}),
    ((4, 1, 8, 8), (5, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", range(len(CONV_GRAD_GEOMETRIES)))
def test_conv_grad_measured_candidates_agree(case, dtype):
    """In "auto" mode ConvGrad is a measured choice between our kernel (as auto lowers it,
    and through zero-padded planes) and torch's convolution backward: every candidate gives
    the registry kernel's dX, dW, dB (float64: to rounding)."""

    xs, ws, attrs = CONV_GRAD_GEOMETRIES[case]
    torch.manual_seed(case)
    x, w = torch.randn(xs, dtype=dtype), torch.randn(ws, dtype=dtype)
    y = kernels.Conv(x, w, **attrs)
    dy = torch.randn(y.shape, dtype=dtype)
    exp = kernels.ConvGrad(dy, x, w, **attrs)
    fn = _auto_conv_grad_fn([dy, x, w], attrs)
    cands = getattr(fn, "candidates", {"training": fn})
    assert "training" in cands
    # case 2: the end pads change the output grid, which torch's symmetric pads cannot
    assert ("torch" in cands) == (case != 2), sorted(cands)
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else \
        {"rtol": 1e-4, "atol": 1e-4}
    for name, run in cands.items():
        got = run(dy, x, w)
        assert len(got) == 3
        for g, e in zip(got, exp, strict=True):
            assert g.is_contiguous()
            torch.testing.assert_close(g, e, **tol, msg=lambda m, n=name: f"{n}: {m}")
    # the outputs the graph reads, only: dW alone
    fn = _auto_conv_grad_fn([dy, x, w], attrs, outputs=("", "dw"))
    for name, run in getattr(fn, "candidates", {"training": fn}).items():
        got = run(dy, x, w)
        assert got[0] is None, name
        torch.testing.assert_close(got[1], exp[1], **tol)


def test_conv_grad_measured_choice_reports_the_side_it_ran_on():
    """A ConvGrad whose measured choice is torch's convolution backward is counted on
    torch in the plan's report (Plan.counts reads ``fn.side()``); ours counts as kernel."""

    xs, ws, attrs = CONV_GRAD_GEOMETRIES[0]
    x, w = torch.randn(xs), torch.randn(ws)
    dy = torch.randn(kernels.Conv(x, w, **attrs).shape)
    fn = _auto_conv_grad_fn([dy, x, w], attrs)
    assert fn.side() == "kernel"  # not run yet: nothing decided
    fn(dy, x, w)
    fn.force("torch")
    assert fn.side() == "torch" and fn.chosen_name() == "torch"
    fn.force("training")
    assert fn.side() == "kernel"
