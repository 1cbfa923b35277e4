"""Steady state of a wrapped root's forward (``ortcpu_torch/wrap/census.py``).

The counting kernel mode runs on the first forward of each root input signature (the
census); later forwards of that signature run by its plan: no torch function mode when
nothing routable ran ours, routers in the functionals' module attributes when something
did, a routing-only mode when a routed call cannot be caught by its attribute. These
tests check that routing, scopes, fallbacks, report(), threads, torch.compile and
pickling behave as under the counting mode on every forward.
"""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F
from torch import nn
from torch.nn.functional import gelu as imported_gelu

import ortcpu_torch
from ortcpu_torch import kernels_enabled, report, wrap
from ortcpu_torch import ops as OPS
from ortcpu_torch.wrap import census
from ortcpu_torch.wrap.policy import FallbackError

ORIGINAL_GELU = F.gelu


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)


@pytest.fixture
def ours_gelu_calls(monkeypatch):
    """The threads whose F.gelu ran ``ortcpu_torch.ops.gelu`` (one entry per call)."""
    calls = []
    real = OPS.gelu

    def counting(*a, **k):
        calls.append(threading.get_ident())
        return real(*a, **k)

    monkeypatch.setattr(OPS, "gelu", counting)
    return calls


class StackDepth(nn.Module):
    """Records the torch function mode stack depth inside its forward."""

    def __init__(self, body):
        super().__init__()
        self.body, self.depths = body, []

    def forward(self, x):
        self.depths.append(torch._C._len_torch_function_stack())
        return self.body(x)


def _plans(model):
    return report(model, file=None).forwards["plans"]


def _assert_restored():
    assert F.gelu is ORIGINAL_GELU
    assert "softmax" not in torch.Tensor.__dict__
    assert "__matmul__" not in torch.Tensor.__dict__
    assert torch._C._len_torch_function_stack() == 0


def test_nothing_routed_to_ours_means_no_torch_function_mode_in_steady_state():
    m = StackDepth(lambda x: torch.tanh(x.add(1)).view(-1))
    wrap(m, fallback="error")
    x = torch.randn(4, 4)
    for _ in range(3):
        torch.testing.assert_close(m(x), torch.tanh(x + 1).view(-1))
    assert m.depths == [1, 0, 0]  # the census, then no mode at all
    rep = report(m, file=None)
    assert rep.forwards == {"counted": 1, "uncounted": 2, "signatures": 1,
                            "plans": {"none": 1}}
    assert "1 counted, 2 uncounted" in rep.text and "no torch function mode" in rep.text
    _assert_restored()


def test_routed_functional_still_runs_ours_in_steady_state_via_its_attribute(
        ours_gelu_calls):
    m = StackDepth(lambda x: F.gelu(x) * 2)
    wrap(m, fallback="error", select="ours")
    x = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    for _ in range(3):
        y = m(x)
        torch.testing.assert_close(y, F.gelu(x) * 2)
        y.sum().backward()
    assert len(ours_gelu_calls) == 3 and m.depths == [1, 0, 0]
    assert _plans(m) == {"patch": 1}
    torch.testing.assert_close(x.grad, 3 * torch.autograd.grad(
        (F.gelu(x) * 2).sum(), x)[0])
    _assert_restored()


@pytest.mark.parametrize("spelling", ["torch.softmax", "Tensor.softmax", "F.softmax"])
def test_each_attribute_spelling_is_patched(spelling, monkeypatch):
    calls = []
    real = OPS.softmax
    monkeypatch.setattr(OPS, "softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    call = {"torch.softmax": lambda x: torch.softmax(x, -1),
            "Tensor.softmax": lambda x: x.softmax(-1),
            "F.softmax": lambda x: F.softmax(x, -1)}[spelling]
    m = wrap(StackDepth(call), fallback="error", select="ours")
    x = torch.randn(3, 5)
    for _ in range(3):
        torch.testing.assert_close(m(x), torch.softmax(x, -1))
    assert len(calls) == 3 and m.depths == [1, 0, 0], (calls, m.depths)
    assert _plans(m) == {"patch": 1}
    _assert_restored()


def test_a_routed_call_no_attribute_patch_sees_keeps_a_routing_mode(ours_gelu_calls):
    m = wrap(StackDepth(imported_gelu), fallback="error", select="ours")
    x = torch.randn(4, 4)
    for _ in range(3):
        torch.testing.assert_close(m(x), F.gelu(x))
    assert len(ours_gelu_calls) == 3 and m.depths == [1, 1, 1]
    assert _plans(m) == {"lean": 1}
    _assert_restored()


def test_the_matmul_operator_is_patched(monkeypatch):
    calls = []
    real = OPS.matmul
    monkeypatch.setattr(OPS, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    m = wrap(StackDepth(lambda x: (x @ x).t() @ x), fallback="error", select="ours")
    x = torch.randn(4, 4, requires_grad=True)
    for _ in range(3):
        y = m(x)
        torch.testing.assert_close(y, (x @ x).t() @ x)
        y.sum().backward()
    assert len(calls) == 6 and m.depths == [1, 0, 0]
    assert _plans(m) == {"patch": 1}
    with pytest.raises(TypeError):
        x @ "not a tensor"
    _assert_restored()


def test_report_content_is_that_of_the_census():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(torch.tanh(self.fc(x)), -1).view(-1)

    def content(model):
        rep = report(model, file=None)
        return ([(d["name"], d["type"], d["ours"]) for d in rep.modules],
                [(d["name"], d["calls_ours"], d["calls_torch"], d["reasons"])
                 for d in rep.functionals],
                [(d["name"], d["calls"], d["reason"], d["modules"])
                 for d in rep.torch_functions], rep.skipped, rep.no_counterpart)

    once, many = wrap(Net(), fallback="error"), wrap(Net(), fallback="error")
    x = torch.randn(4, 8)
    once(x)
    for _ in range(4):
        many(x)
    assert content(once) == content(many)
    tf = {d["name"]: d for d in report(many, file=None).torch_functions}
    assert tf["torch.tanh"]["modules"] == [f"{Net.__module__}.{Net.__qualname__}"]
    # swapped modules count every call
    assert report(many, file=None).modules[0]["calls_ours"] + \
        report(many, file=None).modules[0]["calls_torch"] == 4
    # a new signature is a new census: counted again, and measured by select
    many(torch.randn(5, 8))
    rep = report(many, file=None)
    assert rep.forwards["counted"] == 2 and rep.forwards["signatures"] == 2
    assert sum("f32[5, 8]" in k for k in rep.selection) >= 1


class Block(nn.Module):
    def forward(self, x):
        return F.gelu(x) + 1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        return self.b(self.a(x))


@pytest.mark.parametrize("scope", ["exclude", "include"])
def test_scopes_hold_in_steady_state(scope, ours_gelu_calls):
    m = Net()
    kw = {"exclude": ["a"]} if scope == "exclude" else {"include": ["b"]}
    wrap(m, fallback="error", select="ours", **kw)
    x = torch.randn(3, 4)
    ref = F.gelu(F.gelu(x) + 1) + 1
    for _ in range(4):
        torch.testing.assert_close(m(x), ref)
    assert len(ours_gelu_calls) == 4  # block b's only, every forward
    assert _plans(m) == {"patch": 1}


def test_another_thread_is_not_routed_while_patched(ours_gelu_calls):
    started, release = threading.Event(), threading.Event()

    class Waits(nn.Module):
        def forward(self, x):
            y = F.gelu(x)
            started.set()
            assert release.wait(30)
            return F.gelu(y)

    m = wrap(Waits(), fallback="error", select="ours")
    x = torch.randn(4, 4)
    release.set()
    m(x)  # census
    release.clear()
    started.clear()
    del ours_gelu_calls[:]
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("y", m(x)))
    t.start()
    assert started.wait(30)
    patched = F.gelu is not ORIGINAL_GELU
    z = torch.randn(5)
    other = F.gelu(z)  # this thread, no wrapped forward: torch's, not ours
    release.set()
    t.join(30)
    assert patched and not t.is_alive()
    torch.testing.assert_close(other, ORIGINAL_GELU(z))
    torch.testing.assert_close(out["y"], F.gelu(F.gelu(x)))
    assert ours_gelu_calls == [t.ident, t.ident]  # the wrapped forward's two, not ours
    _assert_restored()


def test_concurrent_steady_forwards_in_two_threads_keep_their_patches(ours_gelu_calls):
    m = wrap(Block(), fallback="error", select="ours")
    x = torch.randn(3, 4)
    m(x)
    errors = []

    def loop():
        try:
            for _ in range(50):
                torch.testing.assert_close(m(x), F.gelu(x) + 1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(ours_gelu_calls) == 101
    _assert_restored()


def test_control_flow_the_census_did_not_see_runs_on_torch():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.use_gelu = False

        def forward(self, x):
            return F.gelu(x) if self.use_gelu else torch.tanh(x)

    m = wrap(Branchy(), fallback="error", select="ours")
    x = torch.randn(4)
    m(x)  # census: nothing routable ran
    assert _plans(m) == {"none": 1}
    m.use_gelu = True
    torch.testing.assert_close(m(x), F.gelu(x))  # correct; on torch


def test_fallback_error_raises_on_every_forward_of_the_signature():
    m = wrap(Block(), fallback="error", select="ours")
    x = torch.randn(4, dtype=torch.float16)
    for _ in range(2):
        with pytest.raises(FallbackError):
            m(x)
        _assert_restored()
    assert report(m, file=None).forwards["signatures"] == 0


def test_fallback_warn_warns_once_and_runs_torch_in_steady_state():
    m = wrap(Block(), fallback="warn", select="ours")
    x = torch.randn(4, dtype=torch.float16)
    with pytest.warns(ortcpu_torch.FallbackWarning):
        m(x)
    torch.testing.assert_close(m(x), F.gelu(x) + 1)
    assert _plans(m) == {"none": 1}


def test_an_exception_in_the_census_decides_nothing_and_restores_everything():
    class Boom(nn.Module):
        def forward(self, x):
            F.gelu(x)
            if x.sum() > -1e9:
                raise RuntimeError("boom")

    m = wrap(Boom(), select="ours")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="boom"):
            m(torch.randn(3))
        _assert_restored()
    assert report(m, file=None).forwards == {"counted": 2, "uncounted": 0,
                                             "signatures": 0, "plans": {}}


def test_root_with_its_own_forward_attribute_uses_the_plans(ours_gelu_calls):
    m = Block()
    m.forward = lambda x: F.gelu(x) * 3  # an instance forward: wrap uses hooks
    wrap(m, fallback="error", select="ours")
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(m(x), F.gelu(x) * 3)
    assert len(ours_gelu_calls) == 3 and _plans(m) == {"patch": 1}
    _assert_restored()


def test_root_with_its_own_forward_attribute_restores_everything_when_it_raises():
    m = Block()

    def boom(x):
        F.gelu(x)
        raise RuntimeError("boom")

    m.forward = boom
    wrap(m, select="ours")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="boom"):
            m(torch.randn(3))
        _assert_restored()
    assert report(m, file=None).forwards["signatures"] == 0


def test_timing_counts_every_forward():
    m = wrap(Block(), fallback="error", select="ours", timing=True)
    for _ in range(3):
        m(torch.randn(3))
    rep = report(m, file=None, timing=True)
    assert rep.forwards["counted"] == 3 and rep.functionals[0]["calls_ours"] == 3


def test_kernels_enabled_still_counts_every_call():
    ctx = kernels_enabled(fallback="error")
    x = torch.randn(4)
    for _ in range(3):
        with ctx:
            F.gelu(x)
    assert report(ctx, file=None).functionals[0]["calls_ours"] == 3


def test_deepcopy_and_pickle_of_a_steady_model_take_a_new_census(ours_gelu_calls):
    m = wrap(nn.Sequential(nn.Linear(4, 4), Block()), fallback="error", select="ours")
    x = torch.randn(2, 4)
    m(x)
    m(x)
    for copied in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        state = copied.__dict__["_ortcpu_wrap_state"]
        assert state.plans == {}
        n = len(ours_gelu_calls)
        for _ in range(2):
            torch.testing.assert_close(copied(x), m(x))
        assert len(ours_gelu_calls) == n + 4  # the copy and the original, both ours
        assert _plans(copied) == {"patch": 1}
    _assert_restored()


def test_compile_after_eager_steady_forwards_compiles_once_with_our_ops():
    m = wrap(nn.Sequential(nn.Linear(8, 8), Block()), fallback="silent", select="ours",
             compile_kernels="ours")
    x = torch.randn(4, 8)
    for _ in range(3):
        m(x)  # census, then patched steady forwards
    _assert_restored()
    torch._dynamo.reset()
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    cm = torch.compile(m, backend=cnt)
    for _ in range(3):
        torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 1
    names = {str(n.target) for g in cnt.graphs for n in g.graph.nodes
             if n.op == "call_function"}
    assert any("ortcpu" in n for n in names), names
    _assert_restored()


def test_signature_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(census, "MAX_PLANS", 3)
    m = wrap(Block(), fallback="error", select="ours")
    for n in range(1, 7):
        m(torch.randn(n))
    assert report(m, file=None).forwards["signatures"] == 3


def test_census_switch_off_counts_every_forward(monkeypatch):
    monkeypatch.setattr(census, "ENABLED", False)
    m = wrap(StackDepth(lambda x: F.gelu(x)), fallback="error", select="ours")
    for _ in range(3):
        m(torch.randn(3))
    assert m.depths == [1, 1, 1]
    rep = report(m, file=None)
    assert rep.forwards["counted"] == 3 and rep.functionals[0]["calls_ours"] == 3


class Lazy(nn.Module):
    def forward(self, x):
        if not hasattr(self, "act"):
            self.act = F.gelu  # read while patched: the router
        return self.act(x)


def test_a_functional_read_during_a_patched_forward_stays_picklable_and_plain():
    m = wrap(Lazy(), fallback="error", select="ours")
    x = torch.randn(3)
    m(x)
    m(x)
    act = m.act
    assert pickle.loads(pickle.dumps(act)) is act
    torch.testing.assert_close(act(x), ORIGINAL_GELU(x))  # outside a forward: torch's
    torch.testing.assert_close(pickle.loads(pickle.dumps(m))(x), F.gelu(x))
    _assert_restored()
