"""training_fusions_rnn.rnn_last_step: ``out[:, -1]`` / ``out[-1]`` of a forward LSTM/GRU
read from HFinal, the gradient entering as dHFinal. Fused vs unfused ORTModule (outputs
and every gradient, float64 and float32), vs eager torch, and the cases that must stay
unfused (the full output read elsewhere, h_n's gradient already present, a reversed
direction, an index that is not the last step)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ortcpu_torch import ORTModule

from .test_training_fusions import check_fused_matches_unfused

DONE = {"LSTM": "LSTMTorchGatesTraining: last step of HAll -> HFinal (gradient as dHFinal)",
        "GRU": "GRUTraining: last step of HAll -> HFinal (gradient as dHFinal)"}


class LastStep(nn.Module):
    def __init__(self, kind="LSTM", batch_first=True, index=-1, also_full=False,
                 use_hn=False, **kw):
        super().__init__()
        self.rnn = getattr(nn, kind)(3, 5, batch_first=batch_first, **kw)
        self.fc = nn.Linear(5 * (2 if kw.get("bidirectional") else 1), 2)
        self.batch_first, self.index = batch_first, index
        self.also_full, self.use_hn = also_full, use_hn

    def forward(self, x):
        out, state = self.rnn(x)
        last = out[:, self.index] if self.batch_first else out[self.index]
        y = self.fc(last)
        loss = y.square().sum()
        if self.also_full:
            loss = loss + out.mean()
        if self.use_hn:
            hn = state[0] if isinstance(state, tuple) else state
            loss = loss + hn.sum() * 0.5
        return loss, y


def _x(batch_first=True):
    x = torch.randn(4, 6, 3) if batch_first else torch.randn(6, 4, 3)
    return x.requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("kind", "batch_first"), [("LSTM", True), ("LSTM", False),
                                                   ("GRU", True)])
def test_last_step_fused(kind, batch_first, dtype, monkeypatch, tmp_path):
    done = check_fused_matches_unfused(lambda: LastStep(kind, batch_first),
                                       [_x(batch_first)], dtype, monkeypatch, tmp_path)
    assert DONE[kind] in done


@pytest.mark.parametrize("case", [
    {"also_full": True}, {"use_hn": True}, {"bidirectional": True}, {"index": 2},
    {"index": -2}, {"num_layers": 2}], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_other_reads_stay_correct(case, monkeypatch):
    """Where the pattern does not hold the graph is left alone; where it still holds (the
    top layer of two) the result is unchanged too."""
    done = check_fused_matches_unfused(lambda: LastStep(**case), [_x()], torch.float64,
                                       monkeypatch)
    fused = any(d.endswith("(gradient as dHFinal)") for d in done)
    assert fused == (case == {"num_layers": 2})


def test_matches_eager_torch():
    torch.manual_seed(0)
    model = LastStep("LSTM")
    ref = LastStep("LSTM")
    ref.load_state_dict(model.state_dict())
    x = _x()
    xo, xr = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    om = ORTModule(model, fallback="error")
    for _ in range(2):
        for m in (om, ref):
            m.zero_grad(set_to_none=True)
        lo, yo = om(xo)
        lr, yr = ref(xr)
        F.mse_loss(yo, torch.zeros_like(yo)).add(lo).backward()
        F.mse_loss(yr, torch.zeros_like(yr)).add(lr).backward()
        torch.testing.assert_close(yo, yr, rtol=2e-5, atol=2e-6)
        torch.testing.assert_close(xo.grad, xr.grad, rtol=2e-5, atol=2e-6)
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(),
                                  strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=2e-5, atol=2e-6, msg=n)
        xo.grad = xr.grad = None
