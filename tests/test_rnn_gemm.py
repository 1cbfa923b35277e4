"""The RNN kernels' own packed GEMM (native/src/rnn_gemm.inc) through LSTM and GRU: shapes
that cross its blocking (k past one RG_KC = 256 block, m past one RG_MC block of 96 or 48
rows), leave row and column tails in the register tile (batch 1, 13; hidden 5, 7, 70;
input 1 and 3), with and without initial states (dR's h0 term accumulates with beta 1),
against torch's LSTM in float64 (ours float64 to 1e-10, float32 to float32 precision),
float64 gradcheck, and thread counts that must not change a single bit (rows are
independent: the whole-sequence GEMMs split rows, the recurrence splits the batch)."""

from __future__ import annotations

import pytest
import torch

import ortcpu_torch
from ortcpu_torch import ops

from .conftest import assert_close

# (S, B, I, H): 4H = 280 and S*B = 297 cross the k block; S*B > 96 crosses the m block
SHAPES = [(1, 1, 1, 5), (3, 13, 3, 7), (9, 33, 4, 70), (2, 5, 40, 16), (30, 4, 28, 33)]


def _params(S, B, n_in, H, dtype, gen, states):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    x, w, r = rnd(S, B, n_in), rnd(4 * H, n_in, scale=0.4), rnd(4 * H, H, scale=0.4)
    b = rnd(8 * H, scale=0.2)
    h0, c0 = (rnd(B, H), rnd(B, H)) if states else (None, None)
    return x, w, r, b, h0, c0


def _torch_rnn(cls, x, w, r, b):
    """torch.nn.LSTM/GRU (``cls``) in float64 with the same (torch-order) parameters; ``b``
    is the input bias then the recurrent one."""
    m = cls(x.shape[2], r.shape[1]).double()
    half = b.shape[0] // 2
    with torch.no_grad():
        m.weight_ih_l0.copy_(w)
        m.weight_hh_l0.copy_(r)
        m.bias_ih_l0.copy_(b[:half])
        m.bias_hh_l0.copy_(b[half:])
    return m


def _torch_ref(x, w, r, b, h0, c0):
    """torch.nn.LSTM in float64 with the same (torch-order) parameters."""
    m = _torch_rnn(torch.nn.LSTM, x, w, r, b)
    xs = x.detach().double().clone().requires_grad_()
    hx = None if h0 is None else (h0.detach().double()[None].clone().requires_grad_(),
                                 c0.detach().double()[None].clone().requires_grad_())
    y, (hn, cn) = m(xs, hx)
    return m, xs, hx, y, hn[0], cn[0]


def _ours(x, w, r, b, h0, c0):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, r, b)]
    st = [None if t is None else t.detach().clone().requires_grad_() for t in (h0, c0)]
    y, hn, cn = ops.lstm_direction(*leaves, None, st[0], st[1], torch_gates=True)
    return leaves, st, y, hn, cn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}B{}I{}H{}".format(*s))
def test_lstm_fwd_bwd_vs_torch_float64(shape, states, dtype):
    gen = torch.Generator().manual_seed(sum(shape) + states)
    x, w, r, b, h0, c0 = _params(*shape, dtype, gen, states)
    m, xs, hx, y_ref, hn_ref, cn_ref = _torch_ref(x, w, r, b, h0, c0)
    leaves, st, y, hn, cn = _ours(x, w, r, b, h0, c0)
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    gh = torch.randn(hn.shape, generator=gen, dtype=torch.float64)
    gc = torch.randn(cn.shape, generator=gen, dtype=torch.float64)
    (y_ref * gy).sum().add_((hn_ref * gh).sum()).add_((cn_ref * gc).sum()).backward()
    (y * gy.to(dtype)).sum().add_((hn * gh.to(dtype)).sum()).add_(
        (cn * gc.to(dtype)).sum()).backward()
    refs = [xs.grad, m.weight_ih_l0.grad, m.weight_hh_l0.grad,
            torch.cat([m.bias_ih_l0.grad, m.bias_hh_l0.grad])]
    got = [t.grad for t in leaves]
    if states:
        refs += [hx[0].grad[0], hx[1].grad[0]]
        got += [t.grad for t in st]
    # float32: the GEMMs sum in float32 over k up to 4H = 280 and S*B = 297 terms
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else \
        {"rtol": 2e-4, "atol": 1e-4}
    for a, e in zip([y, hn, cn] + got, [y_ref, hn_ref, cn_ref] + refs, strict=True):
        assert a.dtype == dtype
        assert_close(a.double(), e, **tol)


@pytest.mark.parametrize("shape", [(3, 13, 3, 7), (2, 1, 1, 5)],
                         ids=lambda s: "S{}B{}I{}H{}".format(*s))
def test_lstm_gradcheck_tile_tails(shape):
    gen = torch.Generator().manual_seed(1)
    x, w, r, b, h0, c0 = _params(*shape, torch.float64, gen, True)
    ins = [t.requires_grad_() for t in (x, w, r, b, h0, c0)]

    def f(x, w, r, b, h0, c0):
        return ops.lstm_direction(x, w, r, b, None, h0, c0, torch_gates=True)

    assert torch.autograd.gradcheck(f, ins, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(9, 33, 4, 70), (28, 64, 28, 128), (4, 7, 5, 3)],
                         ids=lambda s: "S{}B{}I{}H{}".format(*s))
def test_thread_counts_bitwise_equal(shape):
    gen = torch.Generator().manual_seed(2)
    x, w, r, b, h0, c0 = _params(*shape, torch.float32, gen, True)
    outs = []
    saved = torch.get_num_threads()
    try:
        for n in (1, 2):
            ortcpu_torch.set_num_threads(n)
            leaves, st, y, hn, cn = _ours(x, w, r, b, h0, c0)
            (y.sum() + hn.sum() * 0.5 + cn.sum() * 0.25).backward()
            outs.append([y, hn, cn] + [t.grad for t in leaves + st])
    finally:
        ortcpu_torch.set_num_threads(saved)
    for a, e in zip(*outs, strict=True):
        assert torch.equal(a, e)


def test_inf_and_nan_inputs_stay_in_their_rows():
    """A NaN in one batch row of x reaches only that row's outputs and dX row, and every
    weight gradient (which sums over rows); an inf saturates gates instead of spreading."""
    S, B, n_in, H = 3, 14, 3, 7
    gen = torch.Generator().manual_seed(3)
    x, w, r, b, _, _ = _params(S, B, n_in, H, torch.float32, gen, False)
    x[1, 2, 0] = float("nan")
    x[0, 5, 1] = float("inf")
    leaves, _, y, _, _ = _ours(x, w, r, b, None, None)
    y.sum().backward()
    rows = torch.arange(B) != 2
    assert torch.isnan(y[1:, 2]).all() and torch.isfinite(y[:, rows]).all()
    assert torch.isfinite(leaves[0].grad[:, rows]).all()
    assert torch.isnan(leaves[1].grad).any()


def test_empty_batch_and_sequence():
    gen = torch.Generator().manual_seed(4)
    for S, B in ((0, 3), (2, 0)):
        x, w, r, b, _, _ = _params(S, B, 3, 5, torch.float32, gen, False)
        leaves, _, y, hn, cn = _ours(x, w, r, b, None, None)
        assert y.shape == (S, B, 5)
        (y.sum() + hn.sum() + cn.sum()).backward()
        assert torch.equal(leaves[1].grad, torch.zeros_like(w))
        assert torch.equal(leaves[2].grad, torch.zeros_like(r))


# ---- GRU: the same GEMM (one packed R for linear_before_reset=1, z,r and h apart for 0) ----


def _gru_params(S, B, n_in, H, dtype, gen, states):
    x, w, r, b, h0, _ = _params(S, B, n_in, H, dtype, gen, states)
    return x, w[:3 * H], r[:3 * H], b[:6 * H], h0


def _gru_ours(x, w, r, b, h0, lbr):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, r, b)]
    hs = None if h0 is None else h0.detach().clone().requires_grad_()
    y, hn = ops.gru_direction(*leaves, hs, linear_before_reset=lbr, torch_gates=True)
    (y * torch.linspace(-1, 1, y.shape[-1], dtype=y.dtype)).sum().add_(hn.sum()).backward()
    return [y, hn] + [t.grad for t in leaves] + ([hs.grad] if hs is not None else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}B{}I{}H{}".format(*s))
def test_gru_vs_torch_float64(shape, states, dtype):
    """torch's GRU is linear_before_reset=1 in torch's gate order."""
    gen = torch.Generator().manual_seed(sum(shape) + 7 * states)
    x, w, r, b, h0 = _gru_params(*shape, dtype, gen, states)
    H = r.shape[1]
    m = _torch_rnn(torch.nn.GRU, x, w, r, b)
    xs = x.detach().double().clone().requires_grad_()
    hs = None if h0 is None else h0.detach().double()[None].clone().requires_grad_()
    y, hn = m(xs, hs)
    (y * torch.linspace(-1, 1, H, dtype=torch.float64)).sum().add_(hn.sum()).backward()
    ref = [y, hn[0], xs.grad, m.weight_ih_l0.grad, m.weight_hh_l0.grad,
           torch.cat([m.bias_ih_l0.grad, m.bias_hh_l0.grad])] + \
        ([hs.grad[0]] if hs is not None else [])
    got = _gru_ours(x, w, r, b, h0, 1)
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else \
        {"rtol": 2e-4, "atol": 1e-4}
    for a, e in zip(got, ref, strict=True):
        assert a.dtype == dtype
        assert_close(a.double(), e, **tol)


@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "S{}B{}I{}H{}".format(*s))
def test_gru_lbr0_float32_matches_float64(shape):
    """linear_before_reset=0 (no torch counterpart; float64 is gradchecked in test_rnn.py):
    the float32 run agrees with the float64 run of the same kernels."""
    gen = torch.Generator().manual_seed(5)
    p64 = _gru_params(*shape, torch.float64, gen, True)
    ref = _gru_ours(*p64, 0)
    got = _gru_ours(*[t.float() for t in p64], 0)
    for a, e in zip(got, ref, strict=True):
        assert_close(a.double(), e, rtol=2e-4, atol=1e-4)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_thread_counts_bitwise_equal(lbr):
    gen = torch.Generator().manual_seed(6)
    p = _gru_params(9, 33, 4, 70, torch.float32, gen, True)
    saved = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            ortcpu_torch.set_num_threads(n)
            outs.append(_gru_ours(*p, lbr))
    finally:
        ortcpu_torch.set_num_threads(saved)
    for a, e in zip(*outs, strict=True):
        assert torch.equal(a, e)
