"""Lowerings that used to be a CaptureError (fallback to eager): group_norm, cumprod,
boolean-mask indexing (read and write), LSTM with proj_size. Each captured by ORTModule
(fallback="error") and compared with eager torch: outputs, input gradients and every
parameter gradient, float32 and float64."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ortcpu_torch import ORTModule

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}


class GroupNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.gn = nn.GroupNorm(3, 6)
        self.gn_plain = nn.GroupNorm(2, 6, affine=False)

    def forward(self, x):
        return self.gn_plain(self.gn(self.conv(x))).square().mean(), self.gn(self.conv(x))


class CumprodNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.5, 1.5, 7))

    def forward(self, x):
        y = x * self.w
        return torch.cumprod(y, dim=-1).sum(), torch.cumprod(y, 0), torch.cumprod(y[:, :1], 1)


class MaskNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        h = self.fc(x)
        picked = h[h > 0.1]                     # read: data-dependent length
        rows = h[x[:, 0] > 0]                   # a mask over the leading dim only
        z = h.clone()
        z[h < -0.2] = 0.25                      # write a value
        z[x > 1.0] += 1.0                       # accumulate
        return picked.square().sum() + rows.sum() + z.square().sum(), picked, z


class ProjLSTM(nn.Module):
    def __init__(self, bidirectional=False, layers=1, batch_first=True):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, num_layers=layers, proj_size=3, batch_first=batch_first,
                            bidirectional=bidirectional)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return out.square().sum() + h.sum() + c.sum(), out, h, c


CASES = {
    "group_norm": (GroupNormNet, lambda g, dt: (torch.randn(2, 3, 4, 5, generator=g,
                                                            dtype=dt),)),
    "cumprod": (CumprodNet, lambda g, dt: (torch.cat([torch.randn(3, 6, generator=g,
                                                                  dtype=dt),
                                                      torch.zeros(3, 1, dtype=dt)], 1)
                                           [:, torch.tensor([0, 1, 6, 2, 3, 4, 5])],)),
    "bool_mask": (MaskNet, lambda g, dt: (torch.randn(6, 5, generator=g, dtype=dt),)),
    "lstm_proj": (ProjLSTM, lambda g, dt: (torch.randn(2, 5, 4, generator=g, dtype=dt),)),
    "lstm_proj_bidir_2layers": (lambda: ProjLSTM(True, 2, False),
                                lambda g, dt: (torch.randn(5, 2, 4, generator=g, dtype=dt),)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_with_gradients(name, dtype):
    make_model, make_args = CASES[name]
    torch.manual_seed(0)
    model = make_model().to(dtype)
    ref = copy.deepcopy(model)
    args = [a.requires_grad_() for a in make_args(torch.Generator().manual_seed(3), dtype)]
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    om = ORTModule(model, fallback="error")
    for _ in range(2):  # the second call runs the cached plan
        for a in (*args, *ref_args):
            a.grad = None
        om.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out = om(*args)
        exp = ref(*ref_args)
        for o, e in zip(out, exp, strict=True):
            torch.testing.assert_close(o, e, **TOL[dtype])
        out[0].backward()
        exp[0].backward()
        for a, r in zip(args, ref_args, strict=True):
            torch.testing.assert_close(a.grad, r.grad, **TOL[dtype])
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(),
                                  strict=True):
            torch.testing.assert_close(p.grad, q.grad, **TOL[dtype], msg=n)
    ops = {n.op_type for n in next(iter(om._cache.values())).graph.model.graph.node}
    expected_op = {"group_norm": "InstanceNormalization", "cumprod": "Pad",
                   "bool_mask": "NonZero", "lstm_proj": "Sigmoid",
                   "lstm_proj_bidir_2layers": "Sigmoid"}[name]
    assert expected_op in ops
