"""``ortcpu_torch.ops`` (autograd functions) and ``ortcpu_torch.nn`` (modules) for the
activation family, against torch.nn.functional / torch.nn: forward, backward, float64
gradcheck, in-place LeakyReLU, dtype= for softmax, errors, and module drop-in behaviour
(constructor, repr, state_dict, pickling, nn.Sequential training step).
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import ortcpu_torch
from ortcpu_torch import nn as onn
from ortcpu_torch import ops

from .conftest import DTYPES, assert_close, assert_unchanged, snapshot, tol

# name -> (ours(x, b), torch(x, b), op name in the tolerance table, backward op name)
FUNCS = {
    "gelu": (lambda x, b: ops.gelu(x), lambda x, b: F.gelu(x), "Gelu", "GeluGrad"),
    "gelu(tanh)": (lambda x, b: ops.gelu(x, approximate="tanh"),
                   lambda x, b: F.gelu(x, approximate="tanh"), "FastGelu", "FastGeluGrad"),
    "bias_gelu": (lambda x, b: ops.bias_gelu(x, b), lambda x, b: F.gelu(x + b), "BiasGelu",
                  "BiasGeluGrad_dX"),
    "bias_gelu(tanh)": (lambda x, b: ops.bias_gelu(x, b, approximate="tanh"),
                        lambda x, b: F.gelu(x + b, approximate="tanh"), "FastGelu",
                        "BiasFastGeluGrad_dX"),
    "quick_gelu": (lambda x, b: ops.quick_gelu(x), lambda x, b: x * torch.sigmoid(1.702 * x),
                   "QuickGelu", "QuickGeluGrad"),
    "quick_gelu(alpha=-0.6)": (lambda x, b: ops.quick_gelu(x, alpha=-0.6),
                               lambda x, b: x * torch.sigmoid(-0.6 * x), "QuickGelu",
                               "QuickGeluGrad"),
    "leaky_relu": (lambda x, b: ops.leaky_relu(x), lambda x, b: F.leaky_relu(x), "LeakyRelu",
                   "LeakyReluGrad"),
    "leaky_relu(0.2)": (lambda x, b: ops.leaky_relu(x, 0.2), lambda x, b: F.leaky_relu(x, 0.2),
                        "LeakyRelu", "LeakyReluGrad"),
    # a negative slope: the autograd function differentiates with X (torch's rule)
    "leaky_relu(-0.5)": (lambda x, b: ops.leaky_relu(x, -0.5),
                         lambda x, b: F.leaky_relu(x, -0.5), "LeakyRelu", "LeakyReluGrad"),
    "softmax(-1)": (lambda x, b: ops.softmax(x, -1), lambda x, b: torch.softmax(x, -1),
                    "Softmax", "SoftmaxGrad_13"),
    "softmax(0)": (lambda x, b: ops.softmax(x, 0), lambda x, b: torch.softmax(x, 0), "Softmax",
                   "SoftmaxGrad_13"),
    "log_softmax(-1)": (lambda x, b: ops.log_softmax(x, -1),
                        lambda x, b: torch.log_softmax(x, -1), "LogSoftmax",
                        "LogSoftmaxGrad_13"),
    "log_softmax(1)": (lambda x, b: ops.log_softmax(x, 1), lambda x, b: torch.log_softmax(x, 1),
                       "LogSoftmax", "LogSoftmaxGrad_13"),
}


def _inputs(dtype, gen, shape=(4, 6, 10)):
    x = (torch.randn(*shape, generator=gen, dtype=torch.float64) * 2.5).to(dtype)
    b = torch.randn(shape[-1], generator=gen, dtype=torch.float64).to(dtype)
    dy = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    return x, b, dy


def _run(f, x, b, dy):
    x = x.detach().clone().requires_grad_(True)
    b = b.detach().clone().requires_grad_(True)
    y = f(x, b)
    y.backward(dy)
    return y.detach(), x.grad, b.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(FUNCS))
def test_forward_and_backward_vs_torch(name, dtype, gen):
    ours, ref, fwd_op, bwd_op = FUNCS[name]
    x, b, dy = _inputs(dtype, gen)
    before = snapshot(x, b, dy)
    y, dx, db = _run(ours, x, b, dy)
    ry, rdx, rdb = _run(ref, x, b, dy)
    assert y.dtype == dtype
    assert_close(y, ry, **tol(fwd_op, dtype), msg=f"{name} forward")
    assert_close(dx, rdx, **tol(bwd_op, dtype), msg=f"{name} d(input)")
    if rdb is not None:
        # d(bias) is a sum of dX over 240 rows: float32 summation-order differences
        t = tol(bwd_op, dtype)
        if dtype == torch.float32:
            t = {"rtol": 1e-5, "atol": 1e-5}
        assert_close(db, rdb, **t, msg=f"{name} d(bias)")
    else:
        assert db is None
    assert_unchanged(before, [x, b, dy])


@pytest.mark.parametrize("name", list(FUNCS))
def test_gradcheck_float64(name, gen):
    ours = FUNCS[name][0]
    x, b, _ = _inputs(torch.float64, gen, shape=(3, 5))
    if "leaky" in name:
        x = torch.where(x.abs() < 0.05, x + 0.2, x)  # away from the kink
    x.requires_grad_(True)
    b.requires_grad_("bias" in name)
    assert torch.autograd.gradcheck(ours, (x, b))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_gradient_flags(approximate, gen):
    """Only the inputs that require grad get one; the bias gradient sums over every
    leading axis."""
    x, b, dy = _inputs(torch.float64, gen, shape=(2, 3, 4, 5))
    ref_x, ref_b = x.clone().requires_grad_(), b.clone().requires_grad_()
    F.gelu(ref_x + ref_b, approximate=approximate).backward(dy)
    for need_x, need_b in [(True, False), (False, True), (True, True)]:
        xx, bb = x.clone().requires_grad_(need_x), b.clone().requires_grad_(need_b)
        ops.bias_gelu(xx, bb, approximate=approximate).backward(dy)
        assert (xx.grad is not None) == need_x and (bb.grad is not None) == need_b
        if need_x:
            assert_close(xx.grad, ref_x.grad, rtol=1e-12, atol=1e-12)
        if need_b:
            assert_close(bb.grad, ref_b.grad, rtol=1e-12, atol=1e-12)


def test_bias_gelu_bias_grad_across_thread_chunks(gen):
    """dbias is reduced from per-chunk partial sums: many rows, several threads."""
    x = torch.randn(3000, 37, generator=gen, dtype=torch.float64)
    b = torch.randn(37, generator=gen, dtype=torch.float64)
    dy = torch.randn(3000, 37, generator=gen, dtype=torch.float64)
    grads = []
    for threads in (1, 2, 3):
        ortcpu_torch.set_num_threads(threads)
        bb = b.clone().requires_grad_()
        ops.bias_gelu(x, bb).backward(dy)
        grads.append(bb.grad)
    ref = b.clone().requires_grad_()
    F.gelu(x + ref).backward(dy)
    for g in grads:
        assert_close(g, ref.grad, rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("name", ["gelu", "bias_gelu", "quick_gelu", "leaky_relu(0.2)",
                                  "softmax(-1)", "log_softmax(1)"])
def test_double_backward_raises_clearly(name, gen):
    """The gradient kernels are differentiable once. Under create_graph=True the gradient
    must not silently act as a constant (a gradient penalty would lose its contribution):
    differentiating it raises, whether or not the incoming gradient requires grad."""
    ours = FUNCS[name][0]
    x, b, dy = _inputs(torch.float64, gen, shape=(3, 5))
    x.requires_grad_(True)
    for grad_out in (dy, dy.clone().requires_grad_(True)):
        y = ours(x, b)
        (g,) = torch.autograd.grad(y, x, grad_out, create_graph=True)
        assert g.requires_grad
        with pytest.raises(RuntimeError, match="double backward is not supported"):
            (y.sum() + g.pow(2).sum()).backward()
    # first-order results are unaffected by create_graph
    (g1,) = torch.autograd.grad(ours(x, b), x, dy, create_graph=True)
    (g2,) = torch.autograd.grad(ours(x, b), x, dy)
    assert torch.equal(g1.detach(), g2)


@pytest.mark.parametrize("name", list(FUNCS))
def test_noncontiguous_input_and_grad(name, gen):
    """A transposed input and a non-contiguous incoming gradient."""
    ours, ref, fwd_op, bwd_op = FUNCS[name]
    x, b, _ = _inputs(torch.float32, gen, shape=(10, 10))
    xt = x.t()  # shape (10, 10), column-major
    dy = torch.randn(20, 10, generator=gen)[::2]
    assert not xt.is_contiguous() and not dy.is_contiguous()
    y, dx, db = _run(ours, xt, b, dy)
    ry, rdx, rdb = _run(ref, xt.contiguous(), b, dy.contiguous())
    assert_close(y, ry, **tol(fwd_op, torch.float32), msg=name)
    assert_close(dx, rdx, **tol(bwd_op, torch.float32), msg=name)


@pytest.mark.parametrize("name", list(FUNCS))
def test_zero_dim_and_empty(name):
    ours, ref = FUNCS[name][:2]
    for shape in [(), (0,), (0, 4), (3, 0)]:
        if "bias" in name and shape == ():
            continue
        if name.endswith("(1)") and len(shape) < 2:
            continue
        x = torch.zeros(shape, dtype=torch.float64).requires_grad_()
        b = torch.zeros(shape[-1] if shape else 1, dtype=torch.float64).requires_grad_()
        y = ours(x, b)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape
        assert_close(y.detach(), ref(x, b).detach(), rtol=1e-12, atol=1e-12, msg=name)


def test_no_grad_mode(gen):
    x, b, _ = _inputs(torch.float32, gen)
    x.requires_grad_()
    with torch.no_grad():
        for name, (ours, *_rest) in FUNCS.items():
            y = ours(x, b)
            assert not y.requires_grad and y.grad_fn is None, name


# ---- leaky_relu in place ---------------------------------------------------------------------


def test_leaky_relu_inplace_writes_input_and_backpropagates(gen):
    lin = torch.nn.Linear(6, 6).double()
    x = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    h = lin(x)
    out = ops.leaky_relu(h, 0.1, inplace=True)
    assert out is h
    assert_close(h, F.leaky_relu(lin(x), 0.1), rtol=0, atol=0)
    out.pow(2).sum().backward()
    got = lin.weight.grad.clone()
    lin.zero_grad()
    F.leaky_relu(lin(x), 0.1, inplace=True).pow(2).sum().backward()
    assert_close(got, lin.weight.grad, rtol=1e-12, atol=1e-12)


def test_leaky_relu_inplace_on_leaf_requiring_grad_raises_untouched():
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        ops.leaky_relu(x, 0.1, inplace=True)
    assert torch.equal(x.detach(), before)


def test_leaky_relu_inplace_negative_slope():
    """Like torch: fine without autograd; backward raises (the input X was overwritten and
    a negative slope makes Y's sign differ from X's)."""
    x = torch.tensor([-2.0, 3.0])
    assert ops.leaky_relu(x, -0.5, inplace=True).tolist() == [1.0, 3.0]
    lin = torch.nn.Linear(2, 2)
    h = lin(torch.ones(1, 2))
    y = ops.leaky_relu(h, -0.5, inplace=True)
    with pytest.raises(RuntimeError, match="negative_slope"):
        y.sum().backward()


def test_leaky_relu_inplace_noncontiguous_view(gen):
    base = torch.randn(6, 8, generator=gen)
    expected = base.clone()
    expected[:, ::2] = F.leaky_relu(expected[:, ::2], 0.3)
    view = base[:, ::2]
    assert ops.leaky_relu(view, 0.3, inplace=True) is view
    assert torch.equal(base, expected)


# ---- softmax dtype= ------------------------------------------------------------------------


@pytest.mark.parametrize("fn, ref", [(ops.softmax, torch.softmax),
                                     (ops.log_softmax, torch.log_softmax)])
def test_softmax_dtype_argument(fn, ref, gen):
    x = torch.randn(3, 7, generator=gen).requires_grad_()
    y = fn(x, 1, dtype=torch.float64)
    r = ref(x, 1, dtype=torch.float64)
    assert y.dtype == torch.float64
    assert_close(y, r, rtol=1e-12, atol=1e-12)
    dy = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    (g,) = torch.autograd.grad(y, x, dy)
    (rg,) = torch.autograd.grad(r, x, dy)
    assert g.dtype == torch.float32
    assert_close(g, rg, rtol=1e-6, atol=1e-7)
    # integer input with a float dtype works like torch's
    i = torch.arange(6).reshape(2, 3)
    assert_close(fn(i, 1, dtype=torch.float32), ref(i, 1, dtype=torch.float32), rtol=1e-6,
                 atol=1e-7)


@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_softmax_random_shapes_and_dims_hypothesis(shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = torch.randn(*shape, dtype=torch.float64) * 3
    assert_close(ops.softmax(x, dim), torch.softmax(x, dim), rtol=1e-12, atol=1e-12)
    assert_close(ops.log_softmax(x, dim), torch.log_softmax(x, dim), rtol=1e-12, atol=1e-12)


# ---- errors ----------------------------------------------------------------------------------


def test_ops_bad_inputs_name_the_argument(gen):
    x = torch.randn(3, 4, generator=gen)
    b = torch.randn(4, generator=gen)
    before = snapshot(x, b)
    cases = [
        (lambda: ops.gelu(x.long()), TypeError, r"^gelu: input must be float32 or float64"),
        (lambda: ops.gelu(x.half()), TypeError, r"^gelu: input must be float32 or float64"),
        (lambda: ops.gelu(x > 0), TypeError, r"^gelu: input must be float32 or float64"),
        (lambda: ops.gelu(x.tolist()), TypeError, r"^gelu: input must be a torch.Tensor"),
        (lambda: ops.gelu(torch.ones(2, device="meta")), TypeError,
         r"^gelu: input must be a CPU tensor"),
        (lambda: ops.gelu(x, approximate="fast"), ValueError,
         r"^gelu: approximate must be 'none' or 'tanh', got 'fast'"),
        (lambda: ops.bias_gelu(x, b[:3]), ValueError,
         r"^bias_gelu: bias must be 1-D with input.shape\[-1\]=4 elements, got shape \(3,\)"),
        (lambda: ops.bias_gelu(x, b.double()), TypeError,
         r"^bias_gelu: bias must have the dtype of input"),
        (lambda: ops.bias_gelu(x, b.long()), TypeError, r"^bias_gelu: bias must be float32"),
        (lambda: ops.bias_gelu(x, b, approximate=None), ValueError,
         r"^bias_gelu: approximate must be"),
        (lambda: ops.quick_gelu(x, alpha="1"), TypeError, r"^quick_gelu: alpha must be a float"),
        (lambda: ops.leaky_relu(x, negative_slope=None), TypeError,
         r"^leaky_relu: negative_slope must be a float"),
        (lambda: ops.leaky_relu(x.long()), TypeError, r"input must be float32 or float64"),
        (lambda: ops.softmax(x, 2), ValueError, r"^softmax: axis must be in \[-2, 1\]"),
        (lambda: ops.log_softmax(x, -3), ValueError, r"^log_softmax: axis must be in \[-2, 1\]"),
        (lambda: ops.softmax(x, None), TypeError, r"^softmax: axis must be an int"),
        (lambda: ops.softmax(x.long(), 0), TypeError, r"^softmax: input must be float32"),
    ]
    for fn, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            fn()
    assert_unchanged(before, [x, b])


# ---- nn modules --------------------------------------------------------------------------------


@pytest.mark.parametrize("ours, theirs", [
    (lambda: onn.GELU(), lambda: torch.nn.GELU()),
    (lambda: onn.GELU("tanh"), lambda: torch.nn.GELU("tanh")),
    (lambda: onn.GELU(approximate="tanh"), lambda: torch.nn.GELU(approximate="tanh")),
    (lambda: onn.LeakyReLU(), lambda: torch.nn.LeakyReLU()),
    (lambda: onn.LeakyReLU(0.2), lambda: torch.nn.LeakyReLU(0.2)),
    (lambda: onn.LeakyReLU(negative_slope=0.2, inplace=True),
     lambda: torch.nn.LeakyReLU(negative_slope=0.2, inplace=True)),
    (lambda: onn.Softmax(), lambda: torch.nn.Softmax()),
    (lambda: onn.Softmax(1), lambda: torch.nn.Softmax(1)),
    (lambda: onn.Softmax(dim=-1), lambda: torch.nn.Softmax(dim=-1)),
    (lambda: onn.LogSoftmax(), lambda: torch.nn.LogSoftmax()),
    (lambda: onn.LogSoftmax(dim=0), lambda: torch.nn.LogSoftmax(dim=0)),
])
def test_module_matches_torch_module(ours, theirs, gen):
    m, t = ours(), theirs()
    assert isinstance(m, torch.nn.Module)
    assert repr(m) == repr(t)
    assert m.state_dict() == t.state_dict() == {}
    assert list(m.parameters()) == [] and list(m.buffers()) == []
    for attr in ("approximate", "negative_slope", "inplace", "dim"):
        assert getattr(m, attr, "absent") == getattr(t, attr, "absent"), attr
    for shape in [(5,), (4, 6), (2, 3, 4), (2, 3, 4, 5)]:
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's implicit-dim softmax warning
            try:
                r = t(x.clone())
            except IndexError:
                # a dim out of range for this rank: torch raises IndexError, ours the
                # registry's ValueError naming the axis
                with pytest.raises(ValueError, match="axis must be in"):
                    m(x.clone())
                continue
            y = m(x.clone())
        assert_close(y, r, rtol=1e-12, atol=1e-12, msg=f"{m!r} {shape}")


def test_softmax_legacy_dim_choice_every_rank():
    """dim=None picks torch's legacy dim: 0 for 0-, 1- and 3-D input, else 1."""
    for ndim in range(5):
        x = torch.randn([3] * ndim, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = torch.nn.Softmax()(x)
            want_log = torch.nn.LogSoftmax()(x)
        assert_close(onn.Softmax()(x), want, rtol=1e-12, atol=1e-12, msg=f"ndim {ndim}")
        assert_close(onn.LogSoftmax()(x), want_log, rtol=1e-12, atol=1e-12)


def test_gelu_module_rejects_bad_approximate():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'fast'"):
        onn.GELU("fast")


def test_leaky_relu_module_inplace_modifies_input():
    x = torch.tensor([-1.0, 2.0])
    y = onn.LeakyReLU(0.5, inplace=True)(x)
    assert y is x and x.tolist() == [-0.5, 2.0]
    x2 = torch.tensor([-1.0, 2.0])
    onn.LeakyReLU(0.5)(x2)
    assert x2.tolist() == [-1.0, 2.0]


@pytest.mark.parametrize("module", [onn.GELU("tanh"), onn.LeakyReLU(0.3, True), onn.Softmax(1),
                                    onn.LogSoftmax(-1)])
def test_module_pickle_and_deepcopy(module):
    x = torch.randn(3, 4, dtype=torch.float64)
    for clone in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
        assert type(clone) is type(module) and repr(clone) == repr(module)
        assert_close(clone(x.clone()), module(x.clone()), rtol=0, atol=0)


def test_softmax_module_unpickles_old_state_without_dim():
    """torch.nn.Softmax.__setstate__ fills a missing ``dim`` with None; so does ours."""
    m = onn.Softmax(1)
    state = m.__dict__.copy()
    del state["dim"]
    fresh = onn.Softmax.__new__(onn.Softmax)
    fresh.__setstate__(state)
    assert fresh.dim is None


def _mlp(mods, dtype):
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 16), mods.GELU(), torch.nn.Linear(16, 16),
        mods.GELU(approximate="tanh"), torch.nn.Linear(16, 16),
        mods.LeakyReLU(0.05, inplace=True), torch.nn.Linear(16, 5), mods.LogSoftmax(dim=1),
    ).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sequential_training_steps_match_torch(dtype, gen):
    ours, theirs = _mlp(onn, dtype), _mlp(torch.nn, dtype)
    theirs.load_state_dict(ours.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(32, 12, generator=gen, dtype=dtype)
    target = torch.randint(0, 5, (32,), generator=gen)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.1)
    t = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-11,
                                                                        "atol": 1e-12}
    for _ in range(3):
        for opt in (opt_o, opt_t):
            opt.zero_grad()
        lo = F.nll_loss(ours(x), target)
        lt = F.nll_loss(theirs(x), target)
        lo.backward()
        lt.backward()
        assert_close(lo.detach(), lt.detach(), **t)
        for (n, po), pt in zip(ours.named_parameters(), theirs.parameters(), strict=True):
            assert_close(po.grad, pt.grad, **t, msg=n)
        opt_o.step()
        opt_t.step()
