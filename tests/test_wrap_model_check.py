"""select's in-model check (ortcpu_torch/wrap/model_check.py): once the choices settle and
some are ours, training steps alternate between the selection and every call on torch;
the selection stays only if its median step is faster, else everything goes to torch for
good. The clock is replaced so that each arm's step time is what the test says."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch.wrap import model_check as MC
from ortcpu_torch.wrap import select as S
from ortcpu_torch.wrap.policy import INFO_ATTR


class _Net(nn.Module):
    """Swapped modules and a routed functional (F.gelu)."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm, self.out = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.norm(F.gelu(self.fc(x))))


def _model():
    torch.manual_seed(0)
    return _Net()


@pytest.fixture
def ours_measured_faster(monkeypatch):
    """Every measured signature comes out ours (as a large model's would)."""
    monkeypatch.setattr(S, "measure", lambda *a, **k: {"side": "ours", "ours_ms": 1.0,
                                                       "torch_ms": 2.0})


def _steps_clock(monkeypatch, cost: dict):
    """A clock that advances by the step cost of the arm in place at each tick."""
    now = [0.0]
    state_ref = {}

    def clock():
        st = state_ref.get("state")
        if st is not None:
            now[0] += cost["torch" if st.torch_arm else "selected"]
        return now[0]

    monkeypatch.setattr(MC, "_clock", clock)
    return state_ref


def _train(model, steps, x):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        (model(x) ** 2).mean().backward()  # a loss that converges (no blow-up to amplify
        opt.step()                         # the two sides' float32 rounding)


def _state(model):
    from ortcpu_torch.wrap.policy import STATE_ATTR

    return getattr(model, STATE_ATTR)


@pytest.mark.parametrize(("selected", "torch_side", "outcome"),
                         [(1.0, 2.0, "kept the selection"), (2.0, 1.0, "all torch"),
                          (1.0, 1.0, "all torch")])  # a tie goes to torch
def test_check_keeps_the_selection_only_where_it_is_faster(monkeypatch, ours_measured_faster,
                                                           selected, torch_side, outcome):
    model = ortcpu_torch.wrap(_model())
    ref = _steps_clock(monkeypatch, {"selected": selected, "torch": torch_side})
    ref["state"] = state = _state(model)
    x = torch.randn(5, 8)
    _train(model, MC.SETTLE + 2 * MC.PAIRS + 3, x)
    rep = ortcpu_torch.report(model, file=None)
    assert rep.model_check["outcome"] == outcome
    assert rep.model_check["steps_per_arm"] == MC.PAIRS
    assert state.check is None and "in-model check" in rep.text
    sides = set(rep.selection.values())
    assert sides == ({"ours"} if outcome == "kept the selection" else {"torch"})
    # later calls run on the kept side only
    before = {d["name"]: d["calls_ours"] for d in rep.modules}
    _train(model, 2, x)
    after = {d["name"]: d["calls_ours"] for d in ortcpu_torch.report(model, file=None).modules}
    grew = any(after[n] > before[n] for n in before)
    assert grew == (outcome == "kept the selection")
    if outcome == "all torch":
        # torch's modules are back (the same parameters); the report keeps the record
        assert not any(INFO_ATTR in m.__dict__ for m in model.modules())
        assert all(type(m).__module__.startswith("torch.nn") for m in model.children())
        assert len(rep.modules) == 3
        # a new signature of the functional goes to torch, unmeasured
        _train(model, 1, torch.randn(3, 8))
        rep = ortcpu_torch.report(model, file=None)
        new = [c for c in rep.choices.values() if c.get("model_check")]
        assert new and all(c["side"] == "torch" for c in new)


def test_arms_compute_the_same_training(monkeypatch, ours_measured_faster):
    """Both arms are real training steps: the wrapped model trains like the plain one."""
    plain = _model()
    model = ortcpu_torch.wrap(copy.deepcopy(plain))
    ref = _steps_clock(monkeypatch, {"selected": 1.0, "torch": 2.0})
    ref["state"] = _state(model)
    x = torch.randn(6, 8)
    _train(model, MC.SETTLE + 2 * MC.PAIRS + 2, x)
    _train(plain, MC.SETTLE + 2 * MC.PAIRS + 2, x)
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_new_signature_during_the_alternation_restarts_it(monkeypatch, ours_measured_faster):
    model = ortcpu_torch.wrap(_model())
    ref = _steps_clock(monkeypatch, {"selected": 1.0, "torch": 2.0})
    ref["state"] = state = _state(model)
    _train(model, MC.SETTLE + 3, torch.randn(5, 8))
    assert state.check.arm is not None
    # another batch size: new signatures, seen at the next forward's start
    _train(model, 2, torch.randn(7, 8))
    assert state.check.arm is None and not state.torch_arm
    _train(model, MC.SETTLE + 2 * MC.PAIRS + 2, torch.randn(7, 8))
    assert state.model_check["outcome"] == "kept the selection"


def test_no_check_for_explicit_selections_or_when_nothing_is_ours(monkeypatch):
    for select in ("ours", {"x": "torch"}):
        assert _state(ortcpu_torch.wrap(_model(), select=select)).check is None
    monkeypatch.setattr(S, "measure", lambda *a, **k: {"side": "torch", "ours_ms": 2.0,
                                                       "torch_ms": 1.0})
    model = ortcpu_torch.wrap(_model())
    _train(model, MC.SETTLE + 2, torch.randn(5, 8))
    assert _state(model).model_check["outcome"] == "nothing ran ours"


def test_a_copy_taken_mid_alternation_runs_the_selection(monkeypatch, ours_measured_faster):
    model = ortcpu_torch.wrap(_model())
    ref = _steps_clock(monkeypatch, {"selected": 1.0, "torch": 2.0})
    ref["state"] = _state(model)
    _train(model, MC.SETTLE + 2, torch.randn(5, 8))
    assert _state(model).torch_arm
    twin = copy.deepcopy(model)
    st = _state(twin)
    assert st.check is None and not st.torch_arm
    twin(torch.randn(5, 8)).sum().backward()
    assert all(c["side"] == "ours" for c in st.choices.values())


def test_all_torch_leaves_a_hooked_module_in_place(monkeypatch, ours_measured_faster):
    """A hook the user put on a swapped module keeps firing: that module is not swapped
    back (it runs torch's side through the wrapper)."""
    model = ortcpu_torch.wrap(_model())
    seen = []
    model.norm.register_forward_hook(lambda m, i, o: seen.append(1))
    ref = _steps_clock(monkeypatch, {"selected": 2.0, "torch": 1.0})
    ref["state"] = _state(model)
    _train(model, MC.SETTLE + 2 * MC.PAIRS + 2, torch.randn(5, 8))
    assert _state(model).model_check["outcome"] == "all torch"
    assert INFO_ATTR in model.norm.__dict__ and INFO_ATTR not in model.fc.__dict__
    n = len(seen)
    _train(model, 1, torch.randn(5, 8))
    assert len(seen) == n + 1
