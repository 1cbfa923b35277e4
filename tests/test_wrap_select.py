"""``wrap(model, select=...)``: with the default ``"fastest"`` the first call of each
input signature times ours and torch's forward+backward on copies and keeps the faster;
the measurement changes nothing (running statistics, gradients, hooks, RNG), every
choice is reported with its timings, and ``select=report(model).selection`` replays it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ortcpu_torch
from ortcpu_torch import report, wrap
from ortcpu_torch.wrap.select import MARGIN, decide


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)


def _net():
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.GELU(), nn.Linear(32, 4))


def test_choices_are_measured_once_per_signature_and_reported():
    m = wrap(_net())
    for n in (8, 8, 300):
        m(torch.randn(n, 16)).sum().backward()
    rep = report(m, file=None)
    # 4 modules x 2 batch sizes
    assert len(rep.choices) == 8, rep.text
    for key, c in rep.choices.items():
        assert c["side"] == decide(c["ours_ms"] / 1e3, c["torch_ms"] / 1e3), key  # ms -> s
    assert set(rep.selection.values()) <= {"ours", "torch"}
    assert "signatures chosen" in rep.text
    calls = {d["name"]: d["calls_ours"] + d["calls_torch"] for d in rep.modules}
    assert calls == {"0": 3, "1": 3, "2": 3, "3": 3}
    for d in rep.modules:  # a call run on torch by choice is not a fallback
        for msg in d["reasons"]:
            assert "measured faster" in msg


def test_measurement_changes_nothing_in_the_model():
    m = _net()
    ref = copy.deepcopy(m)
    seen = []
    m[0].register_forward_hook(lambda mod, i, o: seen.append(1))
    wrap(m, fallback="silent")
    x = torch.randn(8, 16)
    rng = torch.get_rng_state()
    y = m(x)
    assert torch.equal(torch.get_rng_state(), rng)
    y.sum().backward()
    ref(x).sum().backward()
    assert seen == [1]  # the hook fired for the real call only
    for (n, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=n)
    for b, c in zip(m.buffers(), ref.buffers(), strict=True):  # one BN update, not seven
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6)


def test_selection_replays_without_measuring():
    m = wrap(_net())
    m(torch.randn(8, 16)).sum().backward()
    sel = report(m, file=None).selection
    forced = {k: "torch" for k in sel}
    m2 = wrap(_net(), select=forced)
    m2(torch.randn(8, 16)).sum().backward()
    rep = report(m2, file=None)
    assert rep.selection == forced
    assert all(c["ours_ms"] is None for c in rep.choices.values())
    assert all(d["calls_ours"] == 0 and d["calls_torch"] == 1 for d in rep.modules)
    m3 = wrap(_net(), select={k: "ours" for k in sel})
    m3(torch.randn(8, 16))
    assert all(d["calls_ours"] == 1 for d in report(m3, file=None).modules)


def test_functionals_are_selected_too():
    x = torch.randn(4, 8)
    with ortcpu_torch.kernels_enabled(select="fastest") as ctx:
        torch.softmax(x, -1)
        torch.softmax(x, -1)
    rep = report(ctx, file=None)
    assert len(rep.choices) == 1 and next(iter(rep.choices)).startswith("torch.softmax(")
    f = rep.functionals[0]
    assert f["calls_ours"] + f["calls_torch"] == 2


def test_kernels_enabled_defaults_to_ours():
    with ortcpu_torch.kernels_enabled() as ctx:
        torch.softmax(torch.randn(2, 3), -1)
    rep = report(ctx, file=None)
    assert rep.choices == {} and rep.functionals[0]["calls_ours"] == 1


def test_bad_select():
    with pytest.raises(ValueError, match="select must be one of"):
        wrap(_net(), select="slowest")
    with pytest.raises(ValueError, match="'ours' or 'torch'"):
        wrap(_net(), select={"x": "gpu"})


def test_decision_rule_ties_go_to_torch():
    from ortcpu_torch.wrap.select import MIN_GAIN_S

    assert decide(1.0, 1.0) == "torch"
    # a gain below the noise of a tiny call is a tie too
    assert decide(0.5 * MIN_GAIN_S, 1.4 * MIN_GAIN_S) == "torch"
    assert decide(0.5 * MIN_GAIN_S, 1.6 * MIN_GAIN_S) == "ours"
    assert decide(1.0 - MARGIN, 1.0) == "ours"
    assert decide(1.0 - MARGIN / 2, 1.0) == "torch"
    assert decide(2.0, 1.0) == "torch"
    assert decide(0.1, 1.0) == "ours"


def test_measurement_is_cpu_time_and_near_ties_are_measured_again(monkeypatch):
    import time as _time

    from ortcpu_torch.wrap import select as S

    # the calling thread's CPU time: what other processes run on the machine is not counted
    assert S._clock is _time.thread_time
    # a fake clock, one tick per read: a run takes 2 ticks (forward, backward), one that
    # reads the clock twice more 4
    ticks = iter(range(10**6))
    monkeypatch.setattr(S, "_clock", lambda: next(ticks))
    calls = {"ours": 0, "torch": 0}

    def side(name, extra_ticks):
        def run(x):
            calls[name] += 1
            for _ in range(extra_ticks):
                next(ticks)
            return x * 2
        return run

    x = torch.randn(8, requires_grad=True)
    # the same cost on both sides: a tie, measured in twice the blocks, goes to torch
    c = S.measure(side("ours", 0), side("torch", 0), (x,), {})
    assert c["side"] == "torch" and c["ours_ms"] == c["torch_ms"], c
    assert calls == {"ours": 1 + 2 * S._BLOCKS * S._MIN_REPS,
                     "torch": 1 + 2 * S._BLOCKS * S._MIN_REPS}
    # a clear difference is decided after the first blocks
    calls.update(ours=0, torch=0)
    c = S.measure(side("ours", 0), side("torch", 2), (x,), {})
    assert c["side"] == "ours" and c["ours_ms"] * 2 == c["torch_ms"], c
    assert calls["ours"] == 1 + S._BLOCKS * S._MIN_REPS


class _DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop = nn.Linear(64, 256), nn.Dropout(0.3)
        self.drop2 = nn.Dropout(0.3)

    def forward(self, x):
        h = self.drop2(self.drop(self.fc(x)))
        h = torch.nn.functional.dropout(h, 0.2, self.training)
        q = h.view(4, 2, -1, 32)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
        return a.sum() + h.sum()


def test_random_ops_are_not_timed_and_keep_torchs_random_stream():
    """select='fastest' leaves every random op on torch, untimed: the wrapped model draws
    exactly plain torch's random numbers, so torch.manual_seed gives plain torch's run."""
    torch.manual_seed(0)
    plain = _DropNet()
    wrapped = wrap(copy.deepcopy(plain), fallback="silent")
    x = torch.randn(64, 64)
    for _ in range(3):
        torch.manual_seed(7)
        want = plain(x)
        after_plain = torch.get_rng_state()
        torch.manual_seed(7)
        got = wrapped(x)
        torch.testing.assert_close(got, want)
        assert torch.equal(torch.get_rng_state(), after_plain)
    rep = report(wrapped, file=None)
    random = {k for k, c in rep.choices.items() if c.get("random")}
    assert random, rep.text
    for k in random:
        assert rep.choices[k]["side"] == "torch" and rep.choices[k]["ours_ms"] is None
    assert any("Dropout" in k for k in random) and any("dropout" in k for k in random)
    assert any("scaled_dot_product_attention" in k for k in random)
    assert "random op" in rep.text
    drops = [d for d in rep.modules if d["name"] in ("drop", "drop2")]
    assert len(drops) == 2
    for d in drops:  # both modules say why, the second one from the wrap-wide choice
        assert d["calls_ours"] == 0
        assert any("random op" in msg for msg in d["reasons"]), d


def test_dropout_that_draws_nothing_is_timed_as_usual():
    m = wrap(nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.0)), fallback="silent")
    m(torch.randn(4, 8)).sum().backward()
    m.eval()
    wrapped_eval = wrap(nn.Sequential(nn.Dropout(0.5)).eval())
    wrapped_eval(torch.randn(4, 8))
    for model in (m, wrapped_eval):
        rep = report(model, file=None)
        assert rep.choices and not any(c.get("random") for c in rep.choices.values()), rep.text


def test_random_ops_run_ours_under_select_ours():
    m = wrap(nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5)), select="ours")
    m(torch.randn(4, 8)).sum().backward()
    rep = report(m, file=None)
    assert [d["calls_ours"] for d in rep.modules] == [1, 1]
    assert not rep.choices


def test_a_call_ours_does_not_take_falls_back_instead_of_raising_while_measured():
    """An argument ours does not implement (``out=``, as Inductor's generated code passes
    to ``torch.addmm`` inside a compiled frame run under the wrap) is found while the new
    signature is measured: the call runs torch's, and the reason names the argument, not
    the tensor's values (a repr per call would make every reason a new one)."""

    class AddmmOut(nn.Module):
        def forward(self, b, x, w):
            out = torch.empty(x.shape[0], w.shape[1])
            torch.addmm(b, x, w, out=out)
            return out

    b, x, w = torch.randn(5), torch.randn(3, 4), torch.randn(4, 5)
    m = wrap(AddmmOut(), fallback="silent")
    for _ in range(2):
        torch.testing.assert_close(m(b, x, w), torch.addmm(b, x, w))
    rep = report(m, file=None)
    assert "out= given" in rep.text, rep.text
    assert "tensor([" not in rep.text
