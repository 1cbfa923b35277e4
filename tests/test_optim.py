"""ortcpu_torch.optim against torch.optim: 100-step parity with torch's for-loop
(``foreach=False``) optimizers on several param groups and shapes (empty and size-1
included), schedulers, closures, state-dict round trips both ways, fused clipping,
clip_grad_norm_, fp16/bf16 master weights, bad input and NaN/inf propagation.

Tolerances: float64 1e-12 relative. float32 1e-6 relative to the largest weight of the
tensor: SGD is bit-for-bit torch's (same rounding, op by op); the Adam family differs
only where torch's vectorized float32 sqrt is not correctly rounded (measured: 1 ulp in
~16% of elements; ours is exact), which moves single weights by ~1 ulp per step
(measured max 7e-8 relative after 100 steps).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import ortcpu_torch.optim as O

from .conftest import DTYPES

SHAPES = [(5, 7), (0,), (1,), (33,), (3, 1, 4), (65,)]
STEPS = 100


def _tol(dtype):
    return 1e-6 if dtype == torch.float32 else 1e-12


def _assert_params(ours, theirs, dtype, what=""):
    tol = _tol(dtype)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype
        if b.numel() == 0:
            continue
        scale = b.abs().max().clamp_min(1e-30)
        bad = ~((a - b).abs() <= tol * scale) & ~(a.isnan() & b.isnan())
        assert not bad.any(), (f"{what} param {i}: max diff {(a - b).abs().max().item():.3e} "
                               f"vs scale {scale.item():.3e}")


def _params(dtype, shapes=SHAPES):
    ps = [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]
    return ps, [p.detach().clone().requires_grad_() for p in ps]


def _groups(ps, extra=None):
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": 3e-3, **(extra or {})}]


def _set_grads(a, b, dtype, scale=1.0):
    for p, q in zip(a, b, strict=True):
        g = torch.randn(p.shape, dtype=dtype) * scale
        p.grad = g.clone()
        q.grad = g.clone()


def _run(ours_cls, torch_cls, kw, dtype, steps=STEPS, sched=None, extra=None):
    a, b = _params(dtype)
    o1 = ours_cls(_groups(a, extra), **kw)
    o2 = torch_cls(_groups(b, extra), foreach=False, **kw)
    s1 = sched(o1) if sched else None
    s2 = sched(o2) if sched else None
    for _ in range(steps):
        _set_grads(a, b, dtype)
        o1.step()
        o2.step()
        if sched:
            s1.step()
            s2.step()
    return a, b, o1, o2


ADAM_CONFIGS = [
    dict(lr=1e-2),
    dict(lr=1e-2, weight_decay=0.1, amsgrad=True),
    dict(lr=1e-2, maximize=True, betas=(0.8, 0.99), eps=1e-6),
    dict(lr=torch.tensor(1e-2), weight_decay=0.0),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", ADAM_CONFIGS, ids=lambda k: "-".join(k))
@pytest.mark.parametrize("pair", [(O.AdamW, torch.optim.AdamW), (O.Adam, torch.optim.Adam)],
                         ids=["AdamW", "Adam"])
def test_adam_family_parity(pair, kw, dtype):
    a, b, o1, o2 = _run(*pair, kw, dtype)
    _assert_params(a, b, dtype, f"{pair[0].__name__} {kw}")
    for p, q in zip(a, b, strict=True):
        s1, s2 = o1.state[p], o2.state[q]
        assert set(s1) == set(s2)
        assert s1["step"].dtype == s2["step"].dtype == torch.float32
        assert s1["step"].item() == s2["step"].item() == STEPS


SGD_CONFIGS = [
    dict(lr=1e-2),
    dict(lr=1e-2, momentum=0.9, weight_decay=0.1),
    dict(lr=1e-2, momentum=0.9, nesterov=True, maximize=True),
    dict(lr=1e-2, momentum=0.5, dampening=0.3, weight_decay=1e-3),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", SGD_CONFIGS, ids=lambda k: "-".join(k))
def test_sgd_parity_bitwise(kw, dtype):
    a, b, o1, o2 = _run(O.SGD, torch.optim.SGD, kw, dtype)
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p, q)  # same rounding as torch's for-loop, op by op
        if kw.get("momentum"):
            assert torch.equal(o1.state[p]["momentum_buffer"], o2.state[q]["momentum_buffer"])


@pytest.mark.parametrize("sched", ["cosine", "onecycle"])
@pytest.mark.parametrize("pair", [(O.AdamW, torch.optim.AdamW), (O.SGD, torch.optim.SGD)],
                         ids=["AdamW", "SGD"])
def test_schedulers(pair, sched):
    kw = dict(lr=1e-2) if pair[0] is O.AdamW else dict(lr=1e-2, momentum=0.9)
    if sched == "cosine":
        mk = lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=30)  # noqa: E731
    else:  # also cycles the momentum / beta1 of every group
        mk = lambda o: torch.optim.lr_scheduler.OneCycleLR(  # noqa: E731
            o, max_lr=[0.05, 0.02], total_steps=STEPS)
    a, b, o1, o2 = _run(*pair, kw, torch.float32, sched=mk)
    _assert_params(a, b, torch.float32, sched)
    assert o1.param_groups[0]["lr"] == o2.param_groups[0]["lr"]


def test_closure_and_hooks():
    torch.manual_seed(0)
    model1 = torch.nn.Linear(6, 3)
    model2 = copy.deepcopy(model1)
    x, y = torch.randn(16, 6), torch.randn(16, 3)
    o1 = O.AdamW(model1.parameters(), lr=1e-2)
    o2 = torch.optim.AdamW(model2.parameters(), lr=1e-2, foreach=False)
    calls = []
    o1.register_step_pre_hook(lambda opt, args, kwargs: calls.append("pre"))
    o1.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))

    def closure(model, opt):
        def f():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        return f

    for _ in range(20):
        l1 = o1.step(closure(model1, o1))
        l2 = o2.step(closure(model2, o2))
        assert torch.allclose(l1, l2, rtol=1e-5)
    _assert_params(list(model1.parameters()), list(model2.parameters()), torch.float32)
    assert calls == ["pre", "post"] * 20
    o1.zero_grad()
    assert all(p.grad is None for p in model1.parameters())
    o1.step()  # no gradients: nothing happens, no error


@pytest.mark.parametrize("dtype", DTYPES)
def test_hf_mode_and_no_bias_correction(dtype):
    for correct_bias in (True, False):
        p = torch.randn(40, dtype=dtype, requires_grad=True)
        w, m, v = p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)
        opt = O.AdamW([p], lr=1e-2, weight_decay=0.1, mode="hf", correct_bias=correct_bias)
        b1, b2, eps, lr, wd = 0.9, 0.999, 1e-8, 1e-2, 0.1
        for t in range(1, 11):
            g = torch.randn(40, dtype=dtype)
            p.grad = g.clone()
            opt.step()
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            step = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if correct_bias else lr
            w = w - step * m / (v.sqrt() + eps)
            w = w - lr * wd * w
        tol = 2e-6 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(p.detach(), w, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="correct_bias"):
        O.AdamW([p], correct_bias=False)


@pytest.mark.parametrize("pair,kw", [
    ((O.AdamW, torch.optim.AdamW), dict(lr=1e-2, amsgrad=True, weight_decay=0.05)),
    ((O.Adam, torch.optim.Adam), dict(lr=1e-2)),
    ((O.SGD, torch.optim.SGD), dict(lr=1e-2, momentum=0.9, nesterov=True)),
], ids=["AdamW", "Adam", "SGD"])
def test_state_dict_round_trips(pair, kw):
    ours_cls, torch_cls = pair
    dtype = torch.float32
    a, b = _params(dtype)
    c = [p.detach().clone().requires_grad_() for p in a]
    o1 = ours_cls(_groups(a), **kw)
    o2 = torch_cls(_groups(b), foreach=False, **kw)
    for _ in range(10):
        _set_grads(a, b, dtype)
        o1.step()
        o2.step()
    # torch -> ours: a fresh ours continues from torch's checkpoint on torch's weights
    with torch.no_grad():
        for p, q in zip(c, b, strict=True):
            p.copy_(q)
    o3 = ours_cls(_groups(c), **kw)
    sd_t = o2.state_dict()
    o3.load_state_dict(copy.deepcopy(sd_t))
    sd_o = o1.state_dict()
    assert sd_o["param_groups"][0].keys() >= sd_t["param_groups"][0].keys()
    for k, st in sd_t["state"].items():
        assert set(sd_o["state"][k]) == set(st)
        for name, t in st.items():
            assert sd_o["state"][k][name].dtype == t.dtype
            assert sd_o["state"][k][name].shape == t.shape
    # ours -> torch: a fresh torch optimizer continues from ours
    d = [p.detach().clone().requires_grad_() for p in a]
    o4 = torch_cls(_groups(d), foreach=False, **kw)
    o4.load_state_dict(copy.deepcopy(o1.state_dict()))
    for _ in range(10):
        gs = [torch.randn(p.shape) for p in a]
        for ps in (a, b, c, d):
            for p, g in zip(ps, gs, strict=True):
                p.grad = g.clone()
        for o in (o1, o2, o3, o4):
            o.step()
    _assert_params(c, b, dtype, "torch->ours")
    _assert_params(d, a, dtype, "ours->torch")
    assert o3.param_groups[1]["lr"] == 3e-3 and "max_grad_norm" in o3.param_groups[0]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_grad_norm(norm_type, dtype):
    # torch refuses the inf norm of an empty gradient (no identity); ours takes it as 0
    a, b = _params(dtype, [s for s in SHAPES if math.prod(s)] if math.isinf(norm_type)
                   else SHAPES)
    _set_grads(a, b, dtype, scale=3.0)
    n1 = O.clip_grad_norm_(a, 1.5, norm_type)
    n2 = torch.nn.utils.clip_grad_norm_(b, 1.5, norm_type, foreach=False)
    assert n1.dtype == n2.dtype and n1.shape == n2.shape == ()
    tol = 2e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(n1, n2, rtol=tol, atol=0)
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=tol, atol=tol)
    # below the threshold: untouched
    g0 = [p.grad.clone() for p in a]
    O.clip_grad_norm_(a, 1e9, norm_type)
    assert all(torch.equal(p.grad, g) for p, g in zip(a, g0, strict=True))


def test_clip_grad_norm_nonfinite_and_single_tensor():
    p = torch.randn(5, requires_grad=True)
    p.grad = torch.tensor([1.0, math.inf, 2.0, 0.0, -1.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        O.clip_grad_norm_(p, 1.0, error_if_nonfinite=True)
    q = p.detach().clone().requires_grad_()
    q.grad = p.grad.clone()
    n1 = O.clip_grad_norm_(p, 1.0)
    n2 = torch.nn.utils.clip_grad_norm_(q, 1.0)
    assert math.isinf(n1.item()) and math.isinf(n2.item())
    torch.testing.assert_close(p.grad, q.grad, equal_nan=True)
    assert O.clip_grad_norm_([torch.zeros(2, requires_grad=True)], 1.0).item() == 0.0


@pytest.mark.parametrize("pair,kw", [
    ((O.AdamW, torch.optim.AdamW), dict(lr=1e-2)),
    ((O.SGD, torch.optim.SGD), dict(lr=1e-2, momentum=0.9)),
], ids=["AdamW", "SGD"])
def test_fused_clipping(pair, kw):
    """max_grad_norm= inside step() == torch's clip_grad_norm_ + step, gradients left as
    they were (the coefficient is applied as the update reads them)."""
    ours_cls, torch_cls = pair
    dtype = torch.float32
    a, b = _params(dtype)
    o1 = ours_cls(_groups(a), max_grad_norm=1.0, **kw)
    o2 = torch_cls(_groups(b), foreach=False, **kw)
    for step in range(30):
        _set_grads(a, b, dtype, scale=0.05 if step % 3 == 0 else 2.0)  # clips, or not
        g0 = [p.grad.clone() for p in a]
        o1.step()
        n2 = torch.nn.utils.clip_grad_norm_(b, 1.0, foreach=False)
        o2.step()
        assert all(torch.equal(p.grad, g) for p, g in zip(a, g0, strict=True))
        torch.testing.assert_close(o1.last_grad_norm, n2, rtol=2e-6, atol=0)
    # the norm is accumulated in double (torch: float32 per tensor): coefficients agree
    # to ~1e-7, so the weights to a few 1e-7 of their scale
    for p, q in zip(a, b, strict=True):
        if q.numel():
            assert ((p - q).abs().max() <= 2e-6 * q.abs().max()).item()


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cls", [O.AdamW, O.SGD, O.Adam])
def test_half_params_master_weights(cls, half):
    p = torch.randn(50).to(half).requires_grad_()
    p.grad = torch.randn(50).to(half)
    kw = dict(lr=1e-2, momentum=0.9) if cls is O.SGD else dict(lr=1e-2)
    with pytest.raises(TypeError, match="master_weights=True"):
        cls([p], **kw).step()
    # with master weights: fp32 math on an fp32 copy, compared with torch on fp32 params
    ref = p.detach().float().requires_grad_()
    ref.grad = p.grad.float()
    opt = cls([p], master_weights=True, **kw)
    torch_cls = {O.AdamW: torch.optim.AdamW, O.SGD: torch.optim.SGD, O.Adam: torch.optim.Adam}
    topt = torch_cls[cls]([ref], foreach=False, **kw)
    p0 = p.detach().clone()
    for _ in range(5):
        opt.step()
        topt.step()
    assert not torch.equal(p.detach(), p0)  # never a silent no-op (torch's fused CPU SGD is)
    master = opt.state[p]["master_param"]
    assert master.dtype == torch.float32
    torch.testing.assert_close(master, ref.detach(), rtol=1e-6, atol=1e-6)
    assert torch.equal(p.detach(), master.to(half))


def test_bad_input():
    p = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="learning rate"):
        O.AdamW([p], lr=-1.0)
    with pytest.raises(ValueError, match="epsilon"):
        O.AdamW([p], eps=-1e-8)
    with pytest.raises(ValueError, match="beta parameter at index 0"):
        O.AdamW([p], betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        O.Adam([p], betas=(0.9, -0.1))
    with pytest.raises(ValueError, match="weight_decay"):
        O.AdamW([p], weight_decay=-1)
    with pytest.raises(ValueError, match="momentum"):
        O.SGD([p], lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="Nesterov"):
        O.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="learning rate"):
        O.SGDv2([p], lr=-0.1)
    with pytest.raises(ValueError, match="mode"):
        O.AdamW([p], mode="ort")
    with pytest.raises(ValueError, match="max_grad_norm"):
        O.AdamW([p], max_grad_norm=0.0)
    i = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,))
    p.grad = i
    with pytest.raises(RuntimeError, match="sparse"):
        O.AdamW([p]).step()
    with pytest.raises(RuntimeError, match="sparse"):
        O.AdamW([p], max_grad_norm=1.0).step()  # the fused norm pass refuses it too
    c = torch.randn(3, dtype=torch.complex64, requires_grad=True)
    c.grad = torch.randn(3, dtype=torch.complex64)
    with pytest.raises(TypeError, match="complex64"):
        O.SGD([c], lr=0.1).step()


@pytest.mark.parametrize("pair,kw", [
    ((O.AdamW, torch.optim.AdamW), dict(lr=1e-2, amsgrad=True)),
    ((O.SGD, torch.optim.SGD), dict(lr=1e-2, momentum=0.9)),
], ids=["AdamW", "SGD"])
def test_nan_inf_gradients_propagate_like_torch(pair, kw):
    a, b = _params(torch.float32, [(9,), (4,)])
    o1 = pair[0](a, **kw)
    o2 = pair[1](b, foreach=False, **kw)
    for step in range(4):
        _set_grads(a, b, torch.float32)
        if step == 1:
            for ps in (a, b):
                ps[0].grad[2] = math.nan
                ps[0].grad[5] = math.inf
                ps[1].grad[0] = -math.inf
        o1.step()
        o2.step()
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p.isnan(), q.isnan()) and torch.equal(p.isinf(), q.isinf())
        fin = p.isfinite()
        torch.testing.assert_close(p[fin], q[fin], rtol=1e-6, atol=1e-6)


def test_non_contiguous_and_channels_last_params():
    base = torch.randn(6, 5)
    p = base.t().requires_grad_()  # non-contiguous leaf
    q = base.t().clone().requires_grad_()
    c = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last).requires_grad_()
    d = c.detach().clone().to(memory_format=torch.channels_last).requires_grad_()
    o1 = O.AdamW([p, c], lr=1e-2)
    o2 = torch.optim.AdamW([q, d], lr=1e-2, foreach=False)
    for _ in range(5):
        for x, y in ((p, q), (c, d)):
            g = torch.randn(x.shape)
            x.grad = g.clone()
            y.grad = g.clone()
        o1.step()
        o2.step()
    _assert_params([p, c], [q, d], torch.float32)
    assert c.is_contiguous(memory_format=torch.channels_last)


def test_sgdv2_is_ort_sgd():
    p = torch.randn(10, requires_grad=True)
    w0 = p.detach().clone()
    p.grad = torch.randn(10)
    O.SGDv2([p], lr=0.1).step()
    assert torch.equal(p.detach(), w0.add(p.grad, alpha=-0.1))  # one fused multiply-add


def test_threads_do_not_change_results():
    import ortcpu_torch

    out = []
    for nt in (1, 2):
        ortcpu_torch.set_num_threads(nt)
        torch.manual_seed(3)
        ps = [torch.randn(n, requires_grad=True) for n in (70000, 3, 0, 40001)]
        o = O.AdamW(ps, lr=1e-2, max_grad_norm=10.0)
        for _ in range(3):
            for x in ps:
                x.grad = torch.randn(x.shape)
            o.step()
        out.append([x.detach() for x in ps])
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # only the norm's sum order


def test_step_counters_native_and_fallback():
    p = torch.randn(4, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    o1, o2 = O.AdamW([p], lr=1e-2), torch.optim.AdamW([q], lr=1e-2, foreach=False)
    for _ in range(3):
        g = torch.randn(4)
        p.grad, q.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
    o1.state[p]["step"] = o1.state[p]["step"].double()  # not torch's float32: torch ops path
    g = torch.randn(4)
    p.grad, q.grad = g.clone(), g.clone()
    o1.step()
    o2.step()
    assert o1.state[p]["step"].item() == 4.0
    _assert_params([p], [q], torch.float32)


def test_torch_implementation_flags_accepted():
    p = torch.randn(3, requires_grad=True)
    O.AdamW([p], fused=True, foreach=False)
    O.Adam([p], foreach=True)
    O.SGD([p], lr=0.1, fused=True)
    with pytest.raises(ValueError, match="capturable"):
        O.AdamW([p], capturable=True)
    with pytest.raises(ValueError, match="differentiable"):
        O.SGD([p], lr=0.1, differentiable=True)


@pytest.mark.parametrize("torch_cls,kw,ours_cls", [
    (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True), O.AdamW),
    (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1), O.Adam),
    (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True), O.AdamW),
    (torch.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True), O.SGD),
])
def test_from_torch_continues_training(torch_cls, kw, ours_cls):
    a, b = _params(torch.float32)
    o1 = torch_cls(_groups(a), foreach=False, **kw)
    o2 = torch_cls(_groups(b), foreach=False, **kw)
    for _ in range(5):
        _set_grads(a, b, torch.float32)
        o1.step()
        o2.step()
    ours = O.from_torch(o1)
    assert type(ours) is ours_cls and ours.param_groups[1]["lr"] == 3e-3
    assert O.from_torch(ours) is ours
    for _ in range(10):
        _set_grads(a, b, torch.float32)
        ours.step()
        o2.step()
    _assert_params(a, b, torch.float32, "from_torch")
    with pytest.raises(TypeError, match="no native equivalent"):
        O.from_torch(torch.optim.RMSprop(a))
