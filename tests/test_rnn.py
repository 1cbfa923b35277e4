"""LSTM / GRU (spec §8): kernels vs torch's modules with copied weights, float64
gradcheck of the autograd functions (peepholes and reverse included), the nn modules'
torch compatibility (constructor, parameter names, return values, states, layers,
bidirectional, batch_first, dropout) and clear errors.

Tolerances (float32 vs torch float32): rtol 1e-4 / atol 2e-5 for outputs and 1e-4 / 5e-5
for gradients. Both sides run the same recurrence with float32 GEMMs summed in different
orders, and errors compound over the steps (measured worst ~4e-6 on these sizes).
float64: 1e-10 (measured ~1e-15).
"""

from __future__ import annotations

import pytest
import torch

from ortcpu_torch import nn as onn
from ortcpu_torch import ops
from ortcpu_torch.kernels import rnn as K

from .conftest import assert_close

F32_OUT = {"rtol": 1e-4, "atol": 2e-5}
F32_GRAD = {"rtol": 1e-4, "atol": 5e-5}
F64 = {"rtol": 1e-10, "atol": 1e-10}


def _tol(dtype, grad=False):
    if dtype == torch.float64:
        return F64
    return F32_GRAD if grad else F32_OUT


def _pair(kind, dtype, **kw):
    tm = getattr(torch.nn, kind)(**kw).to(dtype)
    om = getattr(onn, kind)(**kw).to(dtype)
    om.load_state_dict(tm.state_dict())
    return tm, om


def _run(m, x, hx):
    out = m(x, hx) if hx is not None else m(x)
    return out


def _flat(kind, out):
    y, st = out
    return [y] + (list(st) if kind == "LSTM" else [st])


CONFIGS = [
    dict(num_layers=1),
    dict(num_layers=2),
    dict(num_layers=1, bidirectional=True),
    dict(num_layers=2, bidirectional=True, batch_first=True),
    dict(num_layers=1, bias=False),
    dict(num_layers=2, batch_first=True, bias=False),
]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("with_state", [False, True])
def test_module_vs_torch(kind, dtype, cfg, with_state):
    n_in, H, S, B = 5, 7, 6, 3
    tm, om = _pair(kind, dtype, input_size=n_in, hidden_size=H, **cfg)
    D = 2 if cfg.get("bidirectional") else 1
    L = cfg["num_layers"]
    shape = (B, S, n_in) if cfg.get("batch_first") else (S, B, n_in)
    x = torch.randn(shape, dtype=dtype)
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    hx_t = hx_o = None
    leaves_t, leaves_o = [xt], [xo]
    if with_state:
        h0 = torch.randn(L * D, B, H, dtype=dtype)
        c0 = torch.randn(L * D, B, H, dtype=dtype)
        if kind == "LSTM":
            hx_t = (h0.clone().requires_grad_(), c0.clone().requires_grad_())
            hx_o = (h0.clone().requires_grad_(), c0.clone().requires_grad_())
            leaves_t += list(hx_t)
            leaves_o += list(hx_o)
        else:
            hx_t, hx_o = h0.clone().requires_grad_(), h0.clone().requires_grad_()
            leaves_t.append(hx_t)
            leaves_o.append(hx_o)
    out_t = _flat(kind, _run(tm, xt, hx_t))
    out_o = _flat(kind, _run(om, xo, hx_o))
    for a, b in zip(out_o, out_t, strict=True):
        assert_close(a, b, **_tol(dtype), msg=f"{kind} output")
    gs = [torch.randn_like(o) for o in out_t]
    torch.autograd.backward(out_t, gs)
    torch.autograd.backward(out_o, gs)
    for a, b in zip(leaves_o, leaves_t, strict=True):
        assert_close(a.grad, b.grad, **_tol(dtype, True), msg=f"{kind} input/state grad")
    for (n, pt), (n2, po) in zip(tm.named_parameters(), om.named_parameters(), strict=True):
        assert n == n2
        assert_close(po.grad, pt.grad, **_tol(dtype, True), msg=f"{kind} grad of {n}")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_unbatched_and_only_final_state_used(kind):
    tm, om = _pair(kind, torch.float64, input_size=4, hidden_size=3, num_layers=2)
    x = torch.randn(5, 4, dtype=torch.float64)
    yt, st = tm(x)
    yo, so = om(x)
    assert_close(yo, yt, **F64)
    # gradient through h_n only (output unused)
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ht = tm(xt)[1]
    ho = om(xo)[1]
    (ht[0] if kind == "LSTM" else ht).sum().backward()
    (ho[0] if kind == "LSTM" else ho).sum().backward()
    assert_close(xo.grad, xt.grad, **F64)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_state_dict_names_and_init(kind):
    tm = getattr(torch.nn, kind)(3, 4, num_layers=2, bidirectional=True)
    om = getattr(onn, kind)(3, 4, num_layers=2, bidirectional=True)
    assert list(tm.state_dict()) == list(om.state_dict())
    for (_, a), (_, b) in zip(tm.state_dict().items(), om.state_dict().items(), strict=True):
        assert a.shape == b.shape
    bound = 1 / 4 ** 0.5
    assert all(float(p.detach().abs().max()) <= bound for p in om.parameters())
    tm.load_state_dict(om.state_dict())


def test_dropout_between_layers():
    om = onn.LSTM(4, 5, num_layers=3, dropout=0.5)
    x = torch.randn(6, 2, 4)
    om.train()
    torch.manual_seed(0)
    y1 = om(x)[0]
    torch.manual_seed(1)
    y2 = om(x)[0]
    assert not torch.equal(y1, y2)  # dropout active in training
    om.eval()
    assert torch.equal(om(x)[0], om(x)[0])
    tm = torch.nn.LSTM(4, 5, num_layers=3, dropout=0.5).eval()
    tm.load_state_dict(om.state_dict())
    assert_close(om(x)[0], tm(x)[0], **F32_OUT)


@pytest.mark.parametrize("torch_gates", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("peep", [False, True])
def test_lstm_gradcheck(reverse, peep, torch_gates):
    S, B, n_in, H = 3, 2, 3, 2
    d = torch.float64

    def mk(*shape):
        return (torch.randn(*shape, dtype=d) * 0.6).requires_grad_()

    args = [mk(S, B, n_in), mk(4 * H, n_in), mk(4 * H, H), mk(8 * H), mk(3 * H) if peep else None,
            mk(B, H), mk(B, H)]

    def f(x, w, r, b, p, h0, c0):
        return ops.lstm_direction(x, w, r, b, p, h0, c0, reverse=reverse,
                                  torch_gates=torch_gates)

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("torch_gates", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_gradcheck(reverse, lbr, torch_gates):
    S, B, n_in, H = 3, 2, 3, 2
    d = torch.float64

    def mk(*shape):
        return (torch.randn(*shape, dtype=d) * 0.6).requires_grad_()

    args = [mk(S, B, n_in), mk(3 * H, n_in), mk(3 * H, H), mk(6 * H), mk(B, H)]

    def f(x, w, r, b, h0):
        return ops.gru_direction(x, w, r, b, h0, linear_before_reset=lbr, reverse=reverse,
                                 torch_gates=torch_gates)

    assert torch.autograd.gradcheck(f, args)


def _blocks(t, order, H):
    return torch.cat([t[k * H:(k + 1) * H] for k in order])


@pytest.mark.parametrize("kind", ["LSTM", "GRU0", "GRU1"])
def test_torch_gate_order_is_a_permutation_of_orts(kind):
    """torch_gates=True on torch-ordered parameters == ORT order on the same parameters
    permuted: outputs and every gradient (peepholes included)."""
    torch.manual_seed(3)
    S, B, n_in, H = 5, 3, 4, 6
    d = torch.float64
    gates = 4 if kind == "LSTM" else 3
    # where each ORT block sits in torch's order
    order = (0, 3, 1, 2) if kind == "LSTM" else (1, 0, 2)
    bias_order = order + tuple(gates + k for k in order)
    x = torch.randn(S, B, n_in, dtype=d)
    w = torch.randn(gates * H, n_in, dtype=d)
    r = torch.randn(gates * H, H, dtype=d)
    b = torch.randn(2 * gates * H, dtype=d)
    extra = [torch.randn(3 * H, dtype=d)] if kind == "LSTM" else []
    states = [torch.randn(B, H, dtype=d) for _ in range(2 if kind == "LSTM" else 1)]
    ort = [_blocks(w, order, H), _blocks(r, order, H), _blocks(b, bias_order, H)]

    def run(params, torch_gates):
        leaves = [t.clone().requires_grad_() for t in [x, *params, *extra, *states]]
        if kind == "LSTM":
            out = ops.lstm_direction(*leaves, reverse=True, torch_gates=torch_gates)
        else:
            out = ops.gru_direction(*leaves, linear_before_reset=int(kind[-1]),
                                    torch_gates=torch_gates)
        sum((o * (i + 1)).sum() for i, o in enumerate(out)).backward()
        return list(out), [t.grad for t in leaves]

    out_t, grads_t = run([w, r, b], True)
    out_o, grads_o = run(ort, False)
    for a, e in zip(out_t, out_o, strict=True):
        assert_close(a, e, **F64)
    # the ORT-order gradients of w, r, b back in torch's order (inverse permutation)
    inv = tuple(sorted(range(gates), key=order.__getitem__))
    inv_b = inv + tuple(gates + k for k in inv)
    grads_o[1:4] = [_blocks(grads_o[1], inv, H), _blocks(grads_o[2], inv, H),
                    _blocks(grads_o[3], inv_b, H)]
    for a, e in zip(grads_t, grads_o, strict=True):
        assert_close(a, e, **F64)


def test_gradcheck_without_optional_inputs():
    d = torch.float64
    x = torch.randn(4, 3, 2, dtype=d, requires_grad=True)
    w = torch.randn(8, 2, dtype=d, requires_grad=True)
    r = torch.randn(8, 2, dtype=d, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, r: ops.lstm_direction(x, w, r), [x, w, r])
    w3 = torch.randn(6, 2, dtype=d, requires_grad=True)
    r3 = torch.randn(6, 2, dtype=d, requires_grad=True)
    for lbr in (0, 1):
        assert torch.autograd.gradcheck(
            lambda x, w, r, lbr=lbr: ops.gru_direction(x, w, r, linear_before_reset=lbr),
            [x, w3, r3])


@pytest.mark.parametrize("B", [1, 3, 9, 33])
def test_batch_slices_and_threads(B):
    """The time loop splits the batch over threads: every split gives the same result."""
    import ortcpu_torch

    S, n_in, H = 4, 5, 6
    x, w, r = torch.randn(S, B, n_in), torch.randn(4 * H, n_in) * .4, torch.randn(4 * H, H) * .4
    ortcpu_torch.set_num_threads(1)
    ref = K.lstm_forward(x, w, r)
    ortcpu_torch.set_num_threads(2)
    got = K.lstm_forward(x, w, r)
    for a, b in zip(got, ref, strict=True):
        assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_lstm_grad_registry_with_peepholes_matches_autograd():
    """LSTMGrad(P=...) goes beyond ORT: exact through the peepholes."""
    S, B, n_in, H = 3, 2, 3, 4
    d = torch.float64
    X = torch.randn(S, B, n_in, dtype=d)
    W, R = torch.randn(1, 4 * H, n_in, dtype=d) * .5, torch.randn(1, 4 * H, H, dtype=d) * .5
    P = torch.randn(1, 3 * H, dtype=d)
    hall, hf, cf, call, iofc = K.LSTMTraining(X, W, R, None, None, None, None, P,
                                               hidden_size=H)
    dh = torch.randn_like(hall)
    grads = K.LSTMGrad(X, W, R, None, None, None, hall, call, iofc, dh, hidden_size=H, P=P)
    leaves = [t.clone().requires_grad_() for t in (X, W[0], R[0], P[0])]
    y = ops.lstm_direction(leaves[0], leaves[1], leaves[2], None, leaves[3])[0]
    (y * dh[:, 0]).sum().backward()
    assert_close(grads[0], leaves[0].grad, **F64)
    assert_close(grads[1][0], leaves[1].grad, **F64)
    assert_close(grads[2][0], leaves[2].grad, **F64)
    assert_close(grads[6][0], leaves[3].grad, **F64)
    assert torch.equal(grads[3][0, :4 * H], grads[3][0, 4 * H:])


@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_registry_directions(direction):
    S, B, n_in, H = 4, 2, 3, 5
    D = 2 if direction == "bidirectional" else 1
    X = torch.randn(S, B, n_in, dtype=torch.float64)
    W = torch.randn(D, 3 * H, n_in, dtype=torch.float64)
    R = torch.randn(D, 3 * H, H, dtype=torch.float64)
    Bb = torch.randn(D, 6 * H, dtype=torch.float64)
    hall, hfin, zrh = K.GRUTraining(X, W, R, Bb, hidden_size=H, direction=direction,
                                    linear_before_reset=1)
    assert hall.shape == (S, D, B, H) and zrh.shape == (S, D, B, 3 * H)
    rev = D - 1  # the reverse direction: index 0 alone, index 1 when bidirectional
    assert torch.equal(hfin[rev], hall[0, rev])
    dX, dW, dR, dB, dH0 = K.GRUGrad(X, W, R, Bb, None, None, hall, zrh, torch.ones_like(hall),
                                    hidden_size=H, direction=direction, linear_before_reset=1)
    assert dX.shape == X.shape and dW.shape == W.shape and dB.shape == Bb.shape


def test_zero_length_sequence():
    m = onn.GRU(3, 4)
    y, h = m(torch.zeros(0, 2, 3))
    assert y.shape == (0, 2, 4) and torch.equal(h, torch.zeros(1, 2, 4))


# ---- errors ------------------------------------------------------------------------------


def test_errors():
    with pytest.raises(ValueError, match="proj_size"):
        onn.LSTM(3, 4, proj_size=2)
    m = onn.LSTM(3, 4)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 3), [5, 3])
    with pytest.raises(TypeError, match="PackedSequence"):
        m(packed)
    with pytest.raises(ValueError, match="input.size"):
        m(torch.randn(5, 2, 4))
    with pytest.raises(ValueError, match="h_0"):
        m(torch.randn(5, 2, 3), (torch.randn(2, 2, 4), torch.randn(1, 2, 4)))
    X = torch.randn(3, 2, 4)
    W, R = torch.randn(1, 12, 4), torch.randn(1, 12, 3)
    with pytest.raises(ValueError, match="sequence lengths"):
        K.GRUTraining(X, W, R, None, torch.tensor([3, 3], dtype=torch.int32), hidden_size=4)
    with pytest.raises(ValueError, match="clip"):
        K.GRUTraining(X, W[:, :9], R[:, :9], hidden_size=3, clip=1.0)
    with pytest.raises(ValueError, match="W must have shape"):
        K.LSTMTraining(X, W, R, hidden_size=4)
    with pytest.raises(TypeError, match="dtype"):
        K.LSTMTraining(X, W.double(), R, hidden_size=3)
    with pytest.raises(ValueError, match="activations"):
        K.LSTMTraining(X, W, R, hidden_size=3, activations=["Relu", "Tanh", "Tanh"])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("H", [1, 17, 70])
def test_odd_hidden_sizes(kind, H):
    """Hidden sizes that leave SIMD tails in the fused gate passes."""
    tm, om = _pair(kind, torch.float32, input_size=3, hidden_size=H)
    x = torch.randn(4, 5, 3)
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yt, yo = tm(xt)[0], om(xo)[0]
    assert_close(yo, yt, **F32_OUT)
    g = torch.randn_like(yt)
    yt.backward(g)
    yo.backward(g)
    assert_close(xo.grad, xt.grad, **F32_GRAD)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_nan_stays_in_its_batch_row(kind):
    om = getattr(onn, kind)(3, 4)
    x = torch.randn(5, 3, 3)
    x[1, 0, 0] = float("nan")
    y = om(x)[0]
    assert torch.isnan(y[1:, 0]).all() and not torch.isnan(y[0]).any()
    assert not torch.isnan(y[:, 1:]).any()


def test_noncontiguous_registry_inputs():
    S, B, n_in, H = 3, 2, 4, 3
    X = torch.randn(B, S, n_in).transpose(0, 1)          # non-contiguous
    W = torch.randn(1, n_in, 4 * H).transpose(1, 2)
    R = torch.randn(1, H, 4 * H).transpose(1, 2)
    got = K.LSTMTraining(X, W, R, hidden_size=H)
    ref = K.LSTMTraining(X.contiguous(), W.contiguous(), R.contiguous(), hidden_size=H)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)
