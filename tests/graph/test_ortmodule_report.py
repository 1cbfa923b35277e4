"""``ortcpu_torch.report(model)`` on an ORTModule: what ran graph-wide, on which side, what
was fused, what fell back (the wrap package's Report, with ``graph`` filled in)."""

from __future__ import annotations

import io
import warnings

import torch

import ortcpu_torch
from ortcpu_torch import FallbackWarning, ORTModule

from .capture_models import make


def test_report_lists_kernel_and_torch_ops_per_plan():
    model, args = make("cnn")
    om = ORTModule(model)
    assert "not run yet" in ortcpu_torch.report(om, file=None).text
    om(*args)[0].backward()
    buf = io.StringIO()
    rep = ortcpu_torch.report(om, file=buf)
    assert buf.getvalue().strip() == rep.text == om.report()
    assert rep.graph["fallback"] is None and not rep.torch_side
    (sig,) = rep.graph["signatures"]
    fwd, bwd = sig["plans"]["forward"], sig["plans"]["backward"]
    assert fwd["ops"]["Conv"] == {"kernel": 2, "torch": 0}
    assert bwd["ops"]["com.microsoft.ConvGrad"] == {"kernel": 2, "torch": 0}
    assert sig["parameters_with_grad"] == len(list(model.parameters()))
    assert "graph-wide" in rep.text and "on our kernels: " in rep.text
    assert "com.microsoft.BatchNormalizationGrad x2" in rep.text


def test_report_of_a_fallback_names_the_reason():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    om = ORTModule(DataDependent())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        om(torch.randn(3))
    rep = ortcpu_torch.report(om, file=None)
    assert rep.graph["fallback"] and "fell back" in rep.text
    assert any(s["type"].endswith("DataDependent") for s in rep.skipped)
    assert any(t.endswith("DataDependent") for t in rep.torch_side)
