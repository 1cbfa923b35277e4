"""ortcpu_torch.wrap / optimize / unwrap / report / kernels_enabled.

Models are compared wrapped vs an unwrapped deep copy of themselves (same initial
weights).

Tolerances (float32): one layer of ours differs from torch by a few ulp (see TOL32 in
conftest); through a few Linear layers and a softmax that stays below ~1e-6 relative, so
outputs and gradients are compared at rtol 1e-5 / atol 1e-6, and 30 AdamW steps of loss
at rtol 1e-4 (measured worst ~1e-6 on these models). float64 at 1e-10.
"""

from __future__ import annotations

import copy
import functools
import io
import math
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch import (
    FallbackError,
    FallbackWarning,
    kernels_enabled,
    optimize,
    report,
    unwrap,
    wrap,
)
from ortcpu_torch.wrap.tables import FUNCTIONALS, MODULES

# These tests check placement and call counts: every supported call runs on ours
# (select="ours"); the default select="fastest" is tested in test_wrap_select.py.
wrap = functools.partial(wrap, select="ours")
optimize = functools.partial(optimize, select="ours")
kernels_enabled = functools.partial(kernels_enabled, select="ours")

ONN, OPS = ortcpu_torch.nn, ortcpu_torch.ops
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}


@pytest.fixture(autouse=True)
def _one_thread():
    """These models are tiny: one thread (ours and torch's) keeps the tests fast and immune
    to a busy machine (OpenMP fork-joins on an oversubscribed 2-core box cost ~ms each).
    conftest restores the thread settings afterwards."""
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)


# ---- models ----------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in=20, hidden=48, classes=7):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act1 = nn.GELU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.LeakyReLU(0.05)
        self.fc3 = nn.Linear(hidden, classes)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.softmax(self.fc3(self.act2(self.fc2(self.act1(self.fc1(x))))))


def mlp_loss(model, x, y):
    return F.nll_loss(torch.log(model(x)), y)


class FunctionalBlock(nn.Module):
    """A pre-norm transformer block and LM head written in functional style, as most
    open-source transformer code is: F.layer_norm, torch.softmax, F.gelu, F.log_softmax."""

    def __init__(self, vocab=50, d=32, heads=4, ff=64):
        super().__init__()
        self.heads = heads
        self.emb = nn.Parameter(torch.randn(vocab, d) * 0.1)
        self.ln1_w, self.ln1_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.ln2_w, self.ln2_b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        B, T = idx.shape
        x = self.emb[idx]
        h = F.layer_norm(x, x.shape[-1:], self.ln1_w, self.ln1_b)
        q, k, v = self.qkv(h).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, -1))
        h = F.layer_norm(x, x.shape[-1:], self.ln2_w, self.ln2_b)
        x = x + self.ff2(F.gelu(self.ff1(h)))
        return F.log_softmax(self.head(x), dim=-1)


def block_loss(model, idx, y):
    return F.nll_loss(model(idx).flatten(0, 1), y.flatten())


def mlp_data(n=16, dtype=torch.float32):
    return torch.randn(n, 20, dtype=dtype), torch.randint(0, 7, (n,))


def block_data(b=3, t=9):
    return torch.randint(0, 50, (b, t)), torch.randint(0, 50, (b, t))


def _pair(model):
    """(reference copy, wrapped original) with identical weights."""
    ref = copy.deepcopy(model)
    return ref, wrap(model)


def _grads(model):
    return {n: p.grad for n, p in model.named_parameters()}


def _check_same(ref, wrapped, loss_fn, data, dtype=torch.float32):
    lr = loss_fn(ref, *data)
    lw = loss_fn(wrapped, *data)
    torch.testing.assert_close(lw, lr, **TOL[dtype])
    lr.backward()
    lw.backward()
    gr, gw = _grads(ref), _grads(wrapped)
    assert gr.keys() == gw.keys()
    for n in gr:
        torch.testing.assert_close(gw[n], gr[n], **TOL[dtype], msg=lambda m, n=n: f"{n}: {m}")


# ---- wrapped vs unwrapped --------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mlp_outputs_and_grads_match(dtype):
    ref, model = _pair(MLP().to(dtype))
    assert type(model.act1) is not nn.GELU and isinstance(model.act1, ONN.GELU)
    assert isinstance(model.act2, ONN.LeakyReLU) and isinstance(model.softmax, ONN.Softmax)
    x, y = mlp_data(dtype=dtype)
    out_r, out_w = ref(x), model(x)
    torch.testing.assert_close(out_w, out_r, **TOL[dtype])
    _check_same(ref, model, mlp_loss, (x, y), dtype)
    rep = report(model, file=None)
    calls = {m["name"]: (m["calls_ours"], m["calls_torch"]) for m in rep.modules}
    assert calls == {"fc1": (2, 0), "act1": (2, 0), "fc2": (2, 0), "act2": (2, 0),
                     "fc3": (2, 0), "softmax": (2, 0)}


def test_functional_block_outputs_and_grads_match():
    ref, model = _pair(FunctionalBlock())
    _check_same(ref, model, block_loss, block_data())
    funcs = {f["name"]: f for f in report(model, file=None).functionals}
    for name in ("F.gelu", "torch.softmax", "F.log_softmax"):
        assert funcs[name]["calls_ours"] == 1 and funcs[name]["calls_torch"] == 0, funcs[name]
    ln = funcs["F.layer_norm"]
    if hasattr(OPS, "layer_norm"):
        assert ln["calls_ours"] == 2
    else:
        assert ln["calls_torch"] == 2 and "missing" in next(iter(ln["reasons"]))


def test_functionals_are_routed_only_during_forward(monkeypatch):
    """The mode is active inside forward only: between calls torch runs untouched."""
    model = wrap(FunctionalBlock())
    model(block_data()[0])
    assert torch._C._len_torch_function_stack() == 0
    calls = []
    monkeypatch.setattr(OPS, "gelu", lambda *a, **k: calls.append(1) or F.gelu(*a, **k))
    F.gelu(torch.randn(4))
    assert calls == []
    model(block_data()[0])
    assert calls == [1]


def test_mode_is_left_when_forward_raises():
    class Bad(nn.Module):
        def forward(self, x):
            F.gelu(x)
            raise RuntimeError("boom")

    m = wrap(Bad())
    with pytest.raises(RuntimeError, match="boom"):
        m(torch.randn(3))
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize("which", ["mlp", "block"])
def test_thirty_training_steps_same_loss_curve(which):
    if which == "mlp":
        model, loss_fn = MLP(), mlp_loss
        data = [mlp_data() for _ in range(30)]
    else:
        model, loss_fn = FunctionalBlock(), block_loss
        data = [block_data() for _ in range(30)]
    ref = copy.deepcopy(model)
    opt_r = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    opt_w = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, opt_w = optimize(model, opt_w)
    curves = {"ref": [], "ours": []}
    for batch in data:
        for key, m, opt in (("ref", ref, opt_r), ("ours", model, opt_w)):
            opt.zero_grad()
            loss = loss_fn(m, *batch)
            loss.backward()
            opt.step()
            curves[key].append(loss.item())
    assert curves["ours"][-1] < curves["ours"][0]  # it trains
    torch.testing.assert_close(torch.tensor(curves["ours"]), torch.tensor(curves["ref"]),
                               rtol=1e-4, atol=1e-5)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        if n == "qkv.bias":
            # the key bias has an exactly-zero gradient (softmax is shift-invariant along
            # the keys): its gradient is rounding noise on both sides, which Adam scales up
            # to lr-sized steps of random sign. Compare the query and value parts only.
            d = p.shape[0] // 3
            p, q = torch.cat([p[:d], p[2 * d:]]), torch.cat([q[:d], q[2 * d:]])
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")


# ---- sharing, state_dict, save/load, deepcopy, unwrap ----------------------------------


class Normed(nn.Module):
    """A module with a buffer, to check buffers are shared too."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP()
        self.register_buffer("scale", torch.tensor(2.0))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.mlp(x * self.scale)


def test_parameters_and_buffers_shared_not_copied():
    model = Normed()
    params = {n: p for n, p in model.named_parameters()}
    buffers = {n: b for n, b in model.named_buffers()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before wrapping
    assert wrap(model) is model
    assert {n: p for n, p in model.named_parameters()} == params  # same objects
    for n, p in model.named_parameters():
        assert p is params[n]
    for n, b in model.named_buffers():
        assert b is buffers[n]
    before = model.mlp.fc1.weight.detach().clone()
    x, y = mlp_data()
    opt.zero_grad()
    mlp_loss(model.mlp, x, y).backward()
    opt.step()
    assert not torch.equal(model.mlp.fc1.weight, before)  # the optimizer moved our weights


def test_state_dict_identical():
    model = Normed()
    sd = model.state_dict()
    wrap(model)
    sd2 = model.state_dict()
    assert list(sd2) == list(sd)
    for k in sd:
        assert sd2[k].data_ptr() == sd[k].data_ptr() and torch.equal(sd2[k], sd[k])
    ref = Normed()
    ref.load_state_dict(sd2)  # loads into a plain torch model and back
    model.load_state_dict(ref.state_dict())


def test_save_load_round_trip():
    model = wrap(MLP())
    model(mlp_data()[0])
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded.act1) is type(model.act1)
    x = mlp_data()[0]
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert report(loaded, file=None).modules[0]["calls_ours"] == 2  # counted, still routed
    # the kept original shares the loaded parameters (no copies appeared on the way)
    assert unwrap(loaded).act1.__class__ is nn.GELU
    state = pickle.loads(pickle.dumps(wrap(MLP())))
    assert isinstance(state.act1, ONN.GELU)


def test_deepcopy_round_trip():
    model = wrap(Normed())
    clone = copy.deepcopy(model)
    assert isinstance(clone.mlp.act1, ONN.GELU)
    for p, q in zip(model.parameters(), clone.parameters(), strict=True):
        assert p is not q and torch.equal(p, q)
    x, y = mlp_data()
    torch.testing.assert_close(clone(x), model(x), rtol=0, atol=0)
    # the clone is independent: training it leaves the original alone
    before = model.mlp.fc1.weight.detach().clone()
    opt = torch.optim.SGD(clone.parameters(), lr=0.5)
    mlp_loss(clone.mlp, x, y).backward()
    opt.step()
    assert torch.equal(model.mlp.fc1.weight, before)
    # and the clone's swapped modules still fall back to *its* originals
    plain = unwrap(clone)
    assert type(plain.mlp.act1) is nn.GELU


def test_unwrap_restores_original_types_and_objects():
    model = MLP()
    originals = {n: m for n, m in model.named_modules()}
    params = list(model.parameters())
    wrap(model)
    model.train(False)
    model.act2.negative_slope = 0.2  # a config change made while wrapped is kept
    assert unwrap(model) is model
    for n, m in model.named_modules():
        assert m is originals[n] and type(m) is type(originals[n])
    assert not model.training and not model.act1.training
    assert model.act2.negative_slope == 0.2
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert not model._forward_pre_hooks and not model._forward_hooks
    with pytest.raises(ValueError, match="not wrapped"):
        report(model)
    wrap(model)  # wrap again after unwrap
    assert isinstance(model.act1, ONN.GELU)


def test_fallback_sees_changes_made_after_wrapping():
    """Parameters re-assigned and config changed on the swapped module are what the torch
    fallback uses."""
    holder = wrap(nn.Sequential(nn.LayerNorm(4)), fallback="silent")
    ln = holder[0]
    ln.weight = nn.Parameter(torch.full((4,), 3.0, dtype=torch.float16))
    ln.bias = nn.Parameter(torch.zeros(4, dtype=torch.float16))
    ln.eps = 1e-2
    x = torch.randn(2, 4, dtype=torch.float16)
    expected = F.layer_norm(x.float(), (4,), ln.weight.float(), ln.bias.float(), 1e-2)
    torch.testing.assert_close(holder(x).float(), expected, rtol=2e-3, atol=2e-3)
    assert report(holder, file=None).modules[0]["calls_torch"] == 1


def test_hooks_on_original_modules_keep_firing():
    model = MLP()
    seen = []
    model.act1.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    wrap(model)
    model(mlp_data()[0])
    assert seen == [torch.Size([16, 48])]


def test_wrap_twice_and_shared_submodule():
    model = MLP()
    model.act3 = model.act1  # the same module under two names
    wrap(model)
    assert model.act3 is model.act1 and isinstance(model.act1, ONN.GELU)
    wrap(model, fallback="silent")  # re-wrapping rewraps with the new policy
    assert report(model, file=None).fallback == "silent"
    assert model.act3 is model.act1


def test_include_exclude():
    model = wrap(MLP(), exclude=["GELU"])
    assert type(model.act1) is nn.GELU and isinstance(model.act2, ONN.LeakyReLU)
    skipped = {d["name"]: d["reason"] for d in report(model, file=None).skipped}
    assert list(skipped) == ["act1"] and skipped["act1"].startswith("excluded")
    model = wrap(MLP(), include=[nn.LeakyReLU])
    assert type(model.act1) is nn.GELU and type(model.softmax) is nn.Softmax
    assert isinstance(model.act2, ONN.LeakyReLU)
    model = wrap(MLP(), exclude=["act*"])
    assert type(model.act1) is nn.GELU and isinstance(model.softmax, ONN.Softmax)
    block = wrap(FunctionalBlock(), exclude=["F.gelu"])
    block(block_data()[0])
    funcs = {f["name"]: f for f in report(block, file=None).functionals}
    assert "F.gelu" not in funcs and funcs["torch.softmax"]["calls_ours"] == 1


def test_subclasses_and_root_are_not_swapped():
    class MyGELU(nn.GELU):
        def forward(self, x):
            return super().forward(x) * 2

    seq = nn.Sequential(nn.Linear(4, 4), MyGELU())
    wrap(seq)
    assert type(seq[1]) is MyGELU
    assert "subclass" in report(seq, file=None).skipped[0]["reason"]
    root = nn.GELU()
    assert wrap(root) is root and type(root) is nn.GELU
    x = torch.randn(5)
    torch.testing.assert_close(root(x), F.gelu(x), rtol=2e-6, atol=2e-6)
    # its forward's F.gelu is routed instead
    assert report(root, file=None).functionals[0]["calls_ours"] == 1


def test_bad_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        wrap(lambda x: x)
    with pytest.raises(ValueError, match="fallback"):
        wrap(MLP(), fallback="loud")
    with pytest.raises(TypeError, match="include"):
        wrap(MLP(), include="GELU")
    with pytest.raises(TypeError, match="exclude"):
        wrap(MLP(), exclude=[3])


# ---- fallback policies -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fallback_warn_once_per_type_and_reason(dtype):
    model = MLP().to(dtype)
    ref = copy.deepcopy(model)
    wrap(model)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(5):
            x = torch.randn(16, 20, dtype=dtype)
            out = model(x)
            torch.testing.assert_close(out, ref(x), rtol=0, atol=0)  # torch's own code
            out.sum().backward()
    msgs = [str(w.message) for w in rec if issubclass(w.category, FallbackWarning)]
    name = str(dtype).replace("torch.", "")
    assert len(msgs) == 4, msgs  # Linear, GELU, LeakyReLU, Softmax: once each over 5 steps
    assert all(f"dtype {name} has no kernel" in m for m in msgs)
    assert {m.split(" falls back")[0].rsplit(" ", 1)[-1] for m in msgs} == \
        {"Linear", "GELU", "LeakyReLU", "Softmax"}
    mods = report(model, file=None).modules
    assert all(m["calls_torch"] == 5 and m["calls_ours"] == 0 for m in mods)
    # the modules' torch fallback runs torch's forward as is: no functional is counted
    assert report(model, file=None).functionals == []
    # a new reason warns again, an old one does not
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        model.to("meta", torch.float32)  # parameters stay the same objects
        model(torch.randn(3, 20, device="meta"))
        model(torch.randn(3, 20, device="meta"))
    msgs = [str(w.message) for w in rec if issubclass(w.category, FallbackWarning)]
    assert len(msgs) == 4 and all("meta tensor" in m for m in msgs)


def test_fallback_error_raises():
    model = wrap(MLP().half(), fallback="error")
    with pytest.raises(FallbackError, match="float16"):
        model(torch.randn(2, 20, dtype=torch.float16))
    with pytest.raises(FallbackError, match="meta"):
        with kernels_enabled(fallback="error"):
            F.gelu(torch.randn(3, device="meta"))


def test_fallback_silent():
    model = MLP().half()
    ref = copy.deepcopy(model)
    wrap(model, fallback="silent")
    x = torch.randn(4, 20, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        out = model(x)
    torch.testing.assert_close(out, ref(x), rtol=0, atol=0)
    assert report(model, file=None).modules[0]["reasons"] == {
        "dtype float16 has no kernel": 1}


def test_fallback_on_argument_combination_our_ops_reject():
    """torch.softmax(x, dim, dtype=float16): ours would cast then have no float16 kernel;
    F.gelu(approximate='tanh') is supported; an op given a torch-only argument with a
    non-default value falls back too."""
    x = torch.randn(4, 6)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with kernels_enabled() as ctx:
            y16 = torch.softmax(x, -1, dtype=torch.float16)
            yt = F.gelu(x, approximate="tanh")
            ys = F.softmax(x, dim=-1, _stacklevel=5)  # implementation detail: ignored
    assert y16.dtype == torch.float16
    torch.testing.assert_close(y16, torch.softmax(x, -1, dtype=torch.float16))
    torch.testing.assert_close(yt, F.gelu(x, approximate="tanh"), rtol=2e-6, atol=5e-7)
    torch.testing.assert_close(ys, F.softmax(x, -1), rtol=2e-6, atol=1e-7)
    funcs = {f["name"]: f for f in report(ctx, file=None).functionals}
    assert funcs["torch.softmax"]["calls_torch"] == 1
    assert "float16" in next(iter(funcs["torch.softmax"]["reasons"]))
    assert funcs["F.gelu"]["calls_ours"] == 1 and funcs["F.softmax"]["calls_ours"] == 1
    msgs = [str(w.message) for w in rec if issubclass(w.category, FallbackWarning)]
    assert len(msgs) == 1 and "torch.softmax" in msgs[0]


def test_fallback_unsupported_keyword(monkeypatch):
    """A torch argument with a non-default value our op does not take -> torch runs it."""

    def gelu_without_approximate(input):
        raise AssertionError("must not be called with approximate='tanh'")

    monkeypatch.setattr(OPS, "gelu", gelu_without_approximate)
    x = torch.randn(5)
    with kernels_enabled(fallback="silent") as ctx:
        y = F.gelu(x, approximate="tanh")
    torch.testing.assert_close(y, F.gelu(x, approximate="tanh"))
    reason = next(iter(report(ctx, file=None).functionals[0]["reasons"]))
    assert "approximate='tanh' is not implemented" in reason


def test_fallback_under_autocast():
    model = wrap(MLP(), fallback="silent")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 20))
    assert "autocast" in next(iter(report(model, file=None).modules[0]["reasons"]))


# ---- report, kernels_enabled, optimize -------------------------------------------------


def test_report_content(capsys):
    model = Normed()
    model.unused = nn.Tanh()  # no counterpart: listed as running on torch
    opt = torch.optim.AdamW(model.parameters())
    model, opt = optimize(model, opt)
    model(mlp_data()[0])
    model.half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(torch.randn(2, 20, dtype=torch.float16))
    rep = report(model)
    text = capsys.readouterr().out
    assert text.strip() == str(rep).strip()
    assert "mlp.act1" in text and "torch.nn.GELU -> ortcpu_torch.nn.GELU  1 / 1" in text
    assert "fell back 1x: dtype float16 has no kernel" in text
    assert rep.no_counterpart["torch.nn.Tanh"] == ["unused"]
    assert "torch.nn.Tanh (unused)" in text
    assert "torch.nn.Linear -> ortcpu_torch.nn.Linear  1 / 1" in text
    assert set(rep.functionals_available) >= {"F.gelu", "torch.softmax", "F.log_softmax",
                                              "F.leaky_relu"}
    assert set(rep.functionals_available) | set(rep.functionals_missing) == \
        {e.name for e in FUNCTIONALS}
    assert rep.optimizer.startswith("torch.optim.AdamW replaced")


def test_kernels_enabled_standalone():
    x = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    ref = x.detach().clone().requires_grad_(True)
    with kernels_enabled() as ctx:
        y = F.log_softmax(F.leaky_relu(F.gelu(x), 0.1), -1) + x.softmax(-1)
    y_ref = F.log_softmax(F.leaky_relu(F.gelu(ref), 0.1), -1) + ref.softmax(-1)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float64])
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, ref.grad, **TOL[torch.float64])
    funcs = {f["name"]: (f["calls_ours"], f["calls_torch"]) for f in
             ctx.report(file=None).functionals}
    assert funcs == {"F.gelu": (1, 0), "F.leaky_relu": (1, 0), "F.log_softmax": (1, 0),
                     "Tensor.softmax": (1, 0)}
    assert y.grad_fn.next_functions[0][0].name().startswith("_Softmax")  # ours recorded
    assert torch._C._len_torch_function_stack() == 0
    F.gelu(x)  # outside: not counted
    assert ctx.report(file=None).functionals[0]["calls_ours"] == 1


def test_optimize_keeps_or_replaces_optimizer():
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x, y = mlp_data()
    mlp_loss(model, x, y).backward()
    opt.step()
    m2, opt2 = optimize(model, opt)
    assert m2 is model and isinstance(model.act1, ONN.GELU)
    assert isinstance(opt2, ortcpu_torch.optim.AdamW)
    assert [p for g in opt2.param_groups for p in g["params"]] == list(model.parameters())
    for p in model.parameters():
        assert torch.equal(opt2.state[p]["exp_avg"], opt.state[p]["exp_avg"])
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert optimize(model, sgd)[1] is not None
    rms = torch.optim.RMSprop(model.parameters())
    assert optimize(model, rms)[1] is rms
    assert "no ortcpu_torch counterpart" in report(model, file=None).optimizer


def test_optimize_training_continues_like_torch():
    model = MLP()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    batches = [mlp_data() for _ in range(20)]
    for i, (x, y) in enumerate(batches):
        if i == 5:
            model, opt = optimize(model, opt)
        for m, o in ((model, opt), (ref, opt_r)):
            o.zero_grad()
            mlp_loss(m, x, y).backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


# ---- every table entry -----------------------------------------------------------------


def _module_cases():
    """(torch module, input) per table entry; inputs in the layout the module expects."""
    r = torch.randn
    return {
        "GELU": (lambda: nn.GELU("tanh"), lambda: r(4, 7)),
        "LeakyReLU": (lambda: nn.LeakyReLU(0.3), lambda: r(4, 7)),
        "SiLU": (lambda: nn.SiLU(), lambda: r(4, 7)),
        "ReLU": (lambda: nn.ReLU(), lambda: r(4, 7)),
        "Hardswish": (lambda: nn.Hardswish(), lambda: r(4, 7) * 4),
        "Hardsigmoid": (lambda: nn.Hardsigmoid(), lambda: r(4, 7) * 4),
        "ReLU6": (lambda: nn.ReLU6(), lambda: r(4, 7) * 4),
        "Hardtanh": (lambda: nn.Hardtanh(-2.0, 1.5), lambda: r(4, 7) * 2),
        "Softmax": (lambda: nn.Softmax(1), lambda: r(4, 7, 3)),
        "LogSoftmax": (lambda: nn.LogSoftmax(-1), lambda: r(4, 7)),
        "LayerNorm": (lambda: nn.LayerNorm(7), lambda: r(4, 5, 7)),
        "RMSNorm": (lambda: nn.RMSNorm(7, eps=1e-6), lambda: r(4, 5, 7)),
        "BatchNorm1d": (lambda: nn.BatchNorm1d(6), lambda: r(8, 6, 5)),
        "BatchNorm2d": (lambda: nn.BatchNorm2d(3), lambda: r(4, 3, 5, 5)),
        "BatchNorm3d": (lambda: nn.BatchNorm3d(2), lambda: r(2, 2, 3, 4, 4)),
        "Dropout": (lambda: nn.Dropout(0.0), lambda: r(4, 7)),
        "Conv1d": (lambda: nn.Conv1d(3, 5, 3, padding=1), lambda: r(2, 3, 11)),
        "Conv2d": (lambda: nn.Conv2d(3, 4, 3, stride=2, bias=False), lambda: r(2, 3, 9, 9)),
        "Conv3d": (lambda: nn.Conv3d(2, 3, 2), lambda: r(1, 2, 5, 5, 5)),
        "MaxPool1d": (lambda: nn.MaxPool1d(2), lambda: r(2, 3, 10)),
        "MaxPool2d": (lambda: nn.MaxPool2d(2), lambda: r(2, 3, 8, 8)),
        "MaxPool3d": (lambda: nn.MaxPool3d(2), lambda: r(1, 2, 4, 4, 4)),
        "AvgPool1d": (lambda: nn.AvgPool1d(2), lambda: r(2, 3, 10)),
        "AvgPool2d": (lambda: nn.AvgPool2d(2), lambda: r(2, 3, 8, 8)),
        "AvgPool3d": (lambda: nn.AvgPool3d(2), lambda: r(1, 2, 4, 4, 4)),
        "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d(1), lambda: r(2, 3, 5, 5)),
        "LSTM": (lambda: nn.LSTM(5, 6, batch_first=True), lambda: r(3, 4, 5)),
        "GRU": (lambda: nn.GRU(5, 6, num_layers=2), lambda: r(4, 3, 5)),
        "Embedding": (lambda: nn.Embedding(20, 6, padding_idx=0),
                      lambda: torch.randint(0, 20, (3, 5))),
        "Linear": (lambda: nn.Linear(7, 5), lambda: r(2, 3, 7)),
    }


def _first_tensor(out):
    return out[0] if isinstance(out, tuple) else out


_TABLE_NAMES = [e.torch_name for e in MODULES if e.torch_name != "CrossEntropyLoss"]


def _check_module_swap(name):
    make, data = _module_cases()[name]
    torch_mod = make()
    holder = nn.Sequential(torch_mod)
    ref = copy.deepcopy(holder)
    sd = holder.state_dict()
    params = list(holder.parameters())
    wrap(holder)
    assert isinstance(holder[0], getattr(ONN, name)), report(holder, file=None).text
    assert all(p is q for p, q in zip(holder.parameters(), params, strict=True))
    assert list(holder.state_dict()) == list(sd)
    x = data()
    xr = x.clone()
    if x.is_floating_point():
        x.requires_grad_(True)
        xr.requires_grad_(True)
    out, out_r = _first_tensor(holder(x)), _first_tensor(ref(xr))
    torch.testing.assert_close(out, out_r, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    out_r.backward(g)
    if x.is_floating_point():
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    for (n, p), q in zip(holder.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=n: f"{n}: {m}")
    for b, c in zip(holder.buffers(), ref.buffers(), strict=True):  # running stats
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6)
    assert report(holder, file=None).modules[0]["calls_ours"] == 1
    clone = copy.deepcopy(holder)
    torch.testing.assert_close(_first_tensor(clone(x)), _first_tensor(holder(x)))
    unwrap(holder)
    assert type(holder[0]) is type(torch_mod)


@pytest.mark.parametrize("name", _TABLE_NAMES)
def test_each_table_module_swaps_and_matches_torch(name):
    _check_module_swap(name)


def test_cross_entropy_module_swap():
    crit = nn.CrossEntropyLoss(label_smoothing=0.1)
    holder = nn.ModuleDict({"loss": crit})
    wrap(holder)
    assert isinstance(holder["loss"], ONN.CrossEntropyLoss)
    x, y = torch.randn(6, 5, requires_grad=True), torch.randint(0, 5, (6,))
    torch.testing.assert_close(holder["loss"](x, y), crit(x, y), rtol=1e-5, atol=1e-6)


_F_CASES = {
    "layer_norm": lambda: (F.layer_norm, (torch.randn(3, 8), (8,), torch.rand(8),
                                          torch.randn(8))),
    "rms_norm": lambda: (F.rms_norm, (torch.randn(3, 8), (8,), torch.rand(8), 1e-6)),
    "dropout": lambda: (F.dropout, (torch.randn(3, 8), 0.3, False)),
    "conv2d": lambda: (F.conv2d, (torch.randn(2, 3, 7, 7), torch.randn(4, 3, 3, 3),
                                  torch.randn(4), 1, 1)),
    "max_pool2d": lambda: (F.max_pool2d, (torch.randn(2, 3, 8, 8), 2)),
    "avg_pool2d": lambda: (F.avg_pool2d, (torch.randn(2, 3, 8, 8), 2)),
    "adaptive_avg_pool2d": lambda: (F.adaptive_avg_pool2d, (torch.randn(2, 3, 5, 5), 1)),
    "embedding": lambda: (F.embedding, (torch.randint(0, 9, (4, 3)), torch.randn(9, 5))),
    "cross_entropy": lambda: (F.cross_entropy, (torch.randn(6, 5), torch.randint(0, 5, (6,)))),
}


@pytest.mark.parametrize("op", sorted(_F_CASES))
def test_functional_routing_of_later_families(op):
    fn, args = _F_CASES[op]()
    with kernels_enabled(fallback="error") as ctx:
        out = fn(*args)
    torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)
    assert report(ctx, file=None).functionals[0]["calls_ours"] == 1


def test_wrapped_standalone_criterion_routes_its_functional(monkeypatch):
    """A loss module outside the model: ``criterion = wrap(nn.CrossEntropyLoss())`` is not
    swapped (it is the root) but the F.cross_entropy its forward calls is routed."""
    calls = []
    real = getattr(OPS, "cross_entropy", None)

    def cross_entropy(**kwargs):
        calls.append(1)
        return real(**kwargs) if real is not None else F.cross_entropy(**kwargs)

    if real is not None:  # take exactly the real op's arguments
        cross_entropy = functools.wraps(real)(cross_entropy)

    monkeypatch.setattr(OPS, "cross_entropy", cross_entropy, raising=False)
    crit = wrap(nn.CrossEntropyLoss(label_smoothing=0.1))
    x, y = torch.randn(6, 5), torch.randint(0, 5, (6,))
    torch.testing.assert_close(crit(x, y), F.cross_entropy(x, y, label_smoothing=0.1),
                               rtol=1e-5, atol=1e-6)
    assert calls == [1]


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.0)
        self.act = nn.GELU()
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        h = self.act(self.bn1(self.conv1(x)))
        h = self.act(h + self.bn2(self.conv2(h)))
        return self.fc(self.drop(self.gap(self.pool(h)).flatten(1)))


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        out, _ = self.lstm(x)
        return F.log_softmax(self.fc(self.norm(out[:, -1])), -1)


@pytest.mark.parametrize("which", ["resnet", "lstm"])
def test_cnn_and_lstm_models_match_and_train(which):
    if which == "resnet":
        model, x = ResNetish(), torch.randn(4, 1, 8, 8)
    else:
        model, x = LSTMClassifier(), torch.randn(4, 6, 8)
    y = torch.randint(0, 10, (4,))
    ref = copy.deepcopy(model)
    wrap(model, fallback="error")

    def loss_fn(m, x, y):
        return F.cross_entropy(m(x), y)

    _check_same(ref, model, loss_fn, (x, y))
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_w = torch.optim.AdamW(model.parameters(), lr=1e-2)
    lr_, lw_ = [], []
    for _ in range(30):
        for m, o, acc in ((ref, opt_r, lr_), (model, opt_w, lw_)):
            o.zero_grad()
            loss = loss_fn(m, x, y)
            loss.backward()
            o.step()
            acc.append(loss.item())
    torch.testing.assert_close(torch.tensor(lw_), torch.tensor(lr_), rtol=1e-3, atol=1e-4)


def test_unsupported_configuration_is_a_fallback():
    # LSTM with projections has no ORT kernel: torch keeps it, and wrap says so once per
    # the fallback policy (warn / error with the model untouched / silent)
    def model():
        return nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 5, proj_size=3))

    with pytest.warns(FallbackWarning, match="proj_size") as rec:
        m = wrap(model())
    assert sum(issubclass(w.category, FallbackWarning) for w in rec) == 1
    assert type(m[1]) is nn.LSTM and type(m[0]) is not nn.Linear
    skipped = report(m, file=None).skipped
    assert [d["name"] for d in skipped] == ["1"] and "proj_size" in skipped[0]["reason"]

    m = model()
    with pytest.raises(FallbackError, match="proj_size"):
        wrap(m, fallback="error")
    assert type(m[0]) is nn.Linear and type(m[1]) is nn.LSTM  # nothing was swapped

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = wrap(model(), fallback="silent")
    assert type(m[1]) is nn.LSTM


def test_optimizer_kept_for_a_setting_is_a_fallback():
    # AdamW(differentiable=True) has no ortcpu_torch counterpart: torch's optimizer stays,
    # warned once; under fallback="error" optimize raises before touching the model. An
    # optimizer type we do not have at all (RMSprop) is only reported.
    def setup():
        m = nn.Sequential(nn.Linear(3, 3), nn.GELU())
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3, differentiable=True)

    m, opt = setup()
    with pytest.warns(FallbackWarning, match="differentiable=True"):
        m2, opt2 = optimize(m, opt)
    assert opt2 is opt and "kept" in report(m2, file=None).optimizer

    m, opt = setup()
    with pytest.raises(FallbackError, match="differentiable=True"):
        optimize(m, opt, fallback="error")
    assert type(m[1]) is nn.GELU  # not wrapped

    m = nn.Sequential(nn.Linear(3, 3))
    rms = torch.optim.RMSprop(m.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, kept = optimize(m, rms)
    assert kept is rms and "no ortcpu_torch counterpart" in report(m, file=None).optimizer


def test_batchnorm_fallback_counts_the_batch_once(monkeypatch):
    """Ours raising inside a swapped BatchNorm's forward (after its num_batches_tracked
    bookkeeping) falls back to torch's forward, which counts the batch: once in all."""
    import ortcpu_torch.nn.norm as nn_norm

    def rejecting_batch_norm(*args, **kwargs):
        raise ValueError("rejected for the test")

    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    model = wrap(copy.deepcopy(ref), fallback="silent", select="ours")
    monkeypatch.setattr(nn_norm.ops, "batch_norm", rejecting_batch_norm)
    x = torch.randn(2, 3, 6, 6)
    for _ in range(3):
        torch.testing.assert_close(model(x), ref(x))
    assert int(model[1].num_batches_tracked) == int(ref[1].num_batches_tracked) == 3
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
