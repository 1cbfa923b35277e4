"""wrap() scopes, report() accounting and torch.compile of a wrapped model.

- ``exclude`` keeps a module and everything inside it (submodules, functionals) on torch;
  ``include`` routes everything inside an included module;
- ``report()`` accounts for every module (class paths, reasons) and every torch function
  the forward called, and with ``timing=True`` the time on each side;
- ``torch.compile(wrap(model))`` compiles once (the wrapper's counters are not guarded
  state) and trains like the eager model.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch import report, unwrap, wrap

# placement and counts are checked: every supported call on ours (see test_wrap_select.py)
wrap = functools.partial(wrap, select="ours")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)


class NewGELUActivation(nn.Module):
    """Hugging Face's tanh-GELU written as a formula (transformers.activations)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x.pow(3))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.act = NewGELUActivation()

    def forward(self, x):
        return F.softmax(self.act(self.bn(self.fc(x))), -1) + F.gelu(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
        self.b = Block()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.b(self.a(x)))


def _functionals(model):
    return {d["name"]: (d["calls_ours"], d["calls_torch"]) for d in
            report(model, file=None).functionals}


def test_exclude_module_class_keeps_its_functionals_on_torch():
    """Issue 14 defect 4: the excluded BatchNorm's F.batch_norm is not routed."""
    m = wrap(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)), exclude=["BatchNorm1d"])
    m(torch.randn(6, 8))
    assert type(m[1]) is nn.BatchNorm1d
    assert "F.batch_norm" not in _functionals(m)
    rep = report(m, file=None)
    bn = next(d for d in rep.torch_functions if d["name"] == "F.batch_norm")
    assert bn["calls"] == 1 and "excluded" in bn["reason"]
    assert bn["modules"] == ["torch.nn.BatchNorm1d"]


def test_exclude_by_name_covers_the_whole_subtree():
    m = Net()
    ref = copy.deepcopy(m)
    wrap(m, exclude=["a"])
    assert type(m.a.fc) is nn.Linear and type(m.a.bn) is nn.BatchNorm1d
    assert isinstance(m.b.fc, ortcpu_torch.nn.Linear)
    x = torch.randn(6, 8)
    torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-6)
    funcs = _functionals(m)
    assert funcs["F.softmax"] == (1, 0) and funcs["F.gelu"] == (1, 0)  # only block b's
    rep = report(m, file=None)
    assert [d["name"] for d in rep.skipped if d["name"].startswith("a")] == ["a"]
    assert "3 submodules" in next(d["reason"] for d in rep.skipped if d["name"] == "a")
    in_a = {d["name"]: d["calls"] for d in rep.torch_functions
            if d["reason"].startswith("inside an excluded")}
    assert in_a["F.softmax"] == 1 and in_a["F.gelu"] == 1 and in_a["F.linear"] == 1


def test_include_routes_everything_inside_an_included_module():
    m = wrap(Net(), include=["b"])
    m(torch.randn(6, 8))
    assert type(m.a.fc) is nn.Linear and isinstance(m.b.fc, ortcpu_torch.nn.Linear)
    assert type(m.head) is nn.Linear
    funcs = _functionals(m)
    assert funcs["F.softmax"] == (1, 0) and funcs["F.gelu"] == (1, 0)
    # a functional named in include is routed wherever it is called
    m = wrap(Net(), include=["F.gelu"])
    m(torch.randn(6, 8))
    assert _functionals(m) == {"F.gelu": (2, 0)} and type(m.a.fc) is nn.Linear


def test_unwrap_removes_scope_hooks():
    m = wrap(Net(), exclude=["a"])
    unwrap(m)
    assert not m.a._forward_pre_hooks and not m.a._forward_hooks
    assert not m._forward_pre_hooks


def test_report_accounts_for_every_module_and_function():
    m = wrap(Net(), fallback="silent")
    m(torch.randn(6, 8)).sum().backward()
    rep = report(m, file=None)
    swapped = {d["name"] for d in rep.modules}
    others = {d["name"] for d in rep.skipped} | {q for names in rep.no_counterpart.values()
                                                  for q in names}
    every = {q or "(root)" for q, _ in m.named_modules()}
    assert swapped | others == every, every - swapped - others
    path = f"{__name__}.NewGELUActivation"
    if path in rep.no_counterpart:  # not detected as a formula module: its ops are listed
        assert rep.no_counterpart[path] == ["a.act", "b.act"]
        tanh = next(d for d in rep.torch_functions if d["name"] == "torch.tanh")
        assert tanh["modules"] == [path] and tanh["calls"] == 2
    assert f"{__name__}.Net" in rep.no_counterpart  # the root, by its class path
    assert "torch functions that ran on torch" in str(rep)


def test_report_class_paths_of_subclasses():
    class LayerNorm2d(nn.LayerNorm):
        """timm's channels-first LayerNorm: a LayerNorm subclass calling F.layer_norm."""

        def forward(self, x):
            x = x.permute(0, 2, 3, 1)
            x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            return x.permute(0, 3, 1, 2)

    m = wrap(nn.Sequential(nn.Conv2d(3, 4, 1), LayerNorm2d(4)))
    m(torch.randn(2, 3, 5, 5))
    rep = report(m, file=None)
    sk = rep.skipped[0]
    assert sk["type"].endswith("test_report_class_paths_of_subclasses.<locals>.LayerNorm2d")
    assert not sk["type"].startswith("torch.nn.") and "routed" in sk["reason"]
    assert _functionals(m)["F.layer_norm"] == (1, 0)  # its functional ran on ours


def test_report_timing_shares():
    m = wrap(Net(), timing=True)
    x = torch.randn(64, 8)
    for _ in range(3):
        m(x).sum().backward()
    rep = report(m, file=None, timing=True)
    t = rep.timing
    assert t["forward"]["ours"] > 0 and t["backward"]["ours"] > 0
    assert t["forward"]["torch"] > 0 and t["backward"]["torch"] > 0
    assert 0 < t["ours_share"] < 1 and "ours" in str(rep) and "%" in str(rep)
    m2 = wrap(Net())
    assert "on from now" in str(report(m2, file=None, timing=True))
    m2(x).sum().backward()
    assert report(m2, file=None, timing=True).timing["forward"]["ours"] > 0


def test_torch_compile_of_wrapped_model_compiles_once_and_trains_like_eager():
    """Issue 14 defect 2: a fallback counter read while tracing was a guard that changed
    every call (a recompilation per call until Dynamo's limit)."""
    m = Net()
    ref = copy.deepcopy(m)
    wrap(m, fallback="silent")
    cnt = torch._dynamo.testing.CompileCounter()
    cm = torch.compile(m, backend=cnt)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(4):
        x = torch.randn(6, 8)
        for mod, o in ((cm, opt), (ref, opt_r)):
            o.zero_grad()
            mod(x).square().mean().backward()
            o.step()
    assert cnt.frame_count == 1
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    m(torch.randn(6, 8))  # eager again: our kernels, counted
    assert report(m, file=None).modules[0]["calls_ours"] == 1
