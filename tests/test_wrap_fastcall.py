"""The per-call shortcuts of a wrapped model (issue 18) behave as the paths they shorten:
``RootForward``'s inline root key and thread-local handling (census.py) and a swapped
module's own ``__call__`` (swap.py ``_wrapped_call``: straight to ``forward`` when nothing
needs ``Module.__call__``'s hook machinery)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ortcpu_torch
from ortcpu_torch import report, wrap
from ortcpu_torch.wrap import census, swap
from ortcpu_torch.wrap.policy import STATE_ATTR


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.loss = nn.CrossEntropyLoss()

    def forward(self, logits, target, *rest, **kw):
        return self.loss(logits, target)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(16, 5, requires_grad=True), torch.randint(0, 5, (16,))


@pytest.mark.parametrize("extra", [(), (3,), ("a", None), ([torch.ones(2)],)])
@pytest.mark.parametrize("kw", [{}, {"flag": True}])
def test_root_forward_keys_its_plans_as_root_key(extra, kw):
    model = wrap(Loss(), fallback="error")
    x, t = _inputs()
    model(x, t, *extra, **kw)
    state = model.__dict__[STATE_ATTR]
    assert list(state.plans) == [census.root_key(model, (x, t, *extra), kw)]
    model(x, t, *extra, **kw)  # steady: the same plan found again, nothing new
    assert len(state.plans) == 1 and state.forwards == [1, 1]


def test_steady_root_restores_the_thread_state_also_when_it_raises():
    model = wrap(Loss(), fallback="error")
    x, t = _inputs()
    model(x, t)
    tl = census.per_thread
    assert tl.root is None and tl.active is None
    with pytest.raises((IndexError, RuntimeError)):
        model(x, torch.full((16,), 7))  # target out of range, same signature
    assert tl.root is None and tl.active is None
    # nested inside another state's active routers: both restored
    marker = object()
    tl.active = marker
    try:
        model(x, t)
        assert tl.active is marker and tl.root is None
    finally:
        tl.active = None


def _swapped_and_torch(fallback="error"):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    return base, wrap(copy.deepcopy(base), fallback=fallback)


def _step(model, x):
    for p in model.parameters():
        p.grad = None
    out = model(x)
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_swapped_call_is_torch_module_call_when_no_hook():
    base, model = _swapped_and_torch()
    assert type(model[0]).__call__ is swap._wrapped_call
    x = torch.randn(4, 8)
    for _ in range(3):  # census, then steady
        o1, g1 = _step(base, x)
        o2, g2 = _step(model, x)
        torch.testing.assert_close(o2, o1)
        for a, b in zip(g2, g1, strict=True):
            torch.testing.assert_close(a, b)
    assert report(model, file=None).modules[0]["calls_ours"] + \
        report(model, file=None).modules[0]["calls_torch"] == 3


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "global_forward",
                                  "global_forward_pre", "backward"])
def test_swapped_call_fires_hooks(kind):
    _base, model = _swapped_and_torch()
    x = torch.randn(4, 8, requires_grad=True)
    model(x)
    model(x)  # steady
    seen = []
    lin = model[0]
    if kind == "forward":
        h = lin.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    elif kind == "forward_pre":
        h = lin.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape))
    elif kind == "global_forward":
        h = nn.modules.module.register_module_forward_hook(
            lambda m, a, o: seen.append(type(m).__name__))
    elif kind == "global_forward_pre":
        h = nn.modules.module.register_module_forward_pre_hook(
            lambda m, a: seen.append(type(m).__name__))
    else:
        h = lin.register_full_backward_hook(lambda m, gi, go: seen.append(go[0].shape))
    try:
        model(x).sum().backward()
    finally:
        h.remove()
    assert seen
    if kind.startswith("global"):
        assert "WrappedLinear" in seen and "WrappedGELU" in seen
    seen.clear()
    model(x).sum().backward()  # removed: the short path again, no hook
    assert not seen


def test_swapped_call_under_jit_trace_and_fx_patching():
    base, model = _swapped_and_torch("silent")  # tracing: torch runs (a fallback)
    x = torch.randn(4, 8)
    model(x)
    traced = torch.jit.trace(model, (x,), check_trace=False)
    torch.testing.assert_close(traced(x), base(x))
    # a patched Module.__call__ (FX's tracer does this) is what a swapped module calls
    calls = []
    real = nn.Module.__call__

    def patched(self, *a, **k):
        calls.append(type(self).__name__)
        return real(self, *a, **k)

    nn.Module.__call__ = patched
    try:
        model[0](x)
    finally:
        nn.Module.__call__ = real
    assert calls == ["WrappedLinear"]


def test_swapped_module_compiled_by_module_compile_takes_its_compiled_call():
    _base, model = _swapped_and_torch()
    lin = model[0]
    lin.compile(backend="eager")
    assert lin._compiled_call_impl is not None
    x = torch.randn(4, 8)
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
