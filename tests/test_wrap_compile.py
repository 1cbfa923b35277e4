"""Our kernels as torch.library ops (``ortcpu_torch/ops/library.py``) and
``torch.compile(wrap(model))`` running them inside the compiled graph (``wrap/compiled.py``).

- every ``ortcpu::`` op passes ``torch.library.opcheck`` (schema, fake implementation,
  autograd registration, AOT dispatch with dynamic shapes), matches torch forward and
  backward in float32 and passes float64 gradcheck;
- a wrapped model compiles once over a training loop (the wrapper's bookkeeping is not
  guarded state), recompiles on shape changes no more than the plain model does, puts our
  forward and backward ops in the graphs and trains like eager torch (losses, gradients,
  BatchNorm running statistics);
- ``compile_kernels="torch"`` keeps the old behaviour (the compiled graph is torch's),
  ``exclude`` keeps an excluded module's calls on torch under compile too, and ``report()``
  says which calls run as ortcpu:: ops.

Compilation is slow: the default run uses the ``aot_eager`` backend (AOTAutograd with the
ops, no Inductor codegen) and small models; the Inductor runs are marked ``slow``.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch.library import opcheck

import ortcpu_torch
import ortcpu_torch.ops.library  # noqa: F401  (registers the ortcpu:: ops)
from ortcpu_torch import report, wrap

O = torch.ops.ortcpu  # noqa: E741
D = torch.float64


@pytest.fixture(autouse=True)
def _one_thread_fresh_dynamo():
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _r(*shape, dtype=D, grad=True, scale=1.0):
    return (torch.randn(*shape, dtype=dtype) * scale).requires_grad_(grad)


def _stats(c=3, dtype=D):
    return torch.rand(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5


# (name, op, args builder, torch reference taking the same tensors and returning the
# differentiable output)
CASES = [
    ("linear", O.linear, lambda: (_r(3, 5, 4), _r(6, 4), _r(6)),
     lambda x, w, b: F.linear(x, w, b)),
    ("linear_weight_in_out", O.linear, lambda: (_r(3, 5, 4), _r(4, 6), _r(6), False, True),
     lambda x, w, b, p, t: F.linear(x, w.t(), b)),
    ("linear_nobias_1d", O.linear, lambda: (_r(4), _r(6, 4), None),
     lambda x, w, b: F.linear(x, w)),
    ("gelu_erf", O.gelu, lambda: (_r(3, 7), 0), lambda x, a: F.gelu(x)),
    ("gelu_tanh", O.gelu, lambda: (_r(3, 7), 1), lambda x, a: F.gelu(x, approximate="tanh")),
    ("silu", O.act, lambda: (_r(3, 7), "QuickGelu", 1.0), lambda x, k, a: F.silu(x)),
    ("relu", O.act, lambda: (_r(3, 7), "Relu", 0.0), lambda x, k, a: F.relu(x)),
    ("leaky_relu", O.act, lambda: (_r(3, 7), "LeakyRelu", 0.2),
     lambda x, k, a: F.leaky_relu(x, 0.2)),
    ("hardswish", O.hard, lambda: (_r(5, 7, scale=4), "HardSwish", 1 / 6, 0.5),
     lambda x, k, a, b: F.hardswish(x)),
    ("relu6", O.hard, lambda: (_r(5, 7, scale=5), "hardtanh", 0.0, 6.0),
     lambda x, k, a, b: F.relu6(x)),
    ("softmax", O.softmax, lambda: (_r(3, 7), -1, False), lambda x, d, lg: F.softmax(x, d)),
    ("log_softmax_dim1", O.softmax, lambda: (_r(3, 7, 2), 1, True),
     lambda x, d, lg: F.log_softmax(x, d)),
    ("layer_norm", O.layer_norm, lambda: (_r(3, 2, 8), _r(8), _r(8), 1, 1e-5, False),
     lambda x, w, b, n, e, s: F.layer_norm(x, (8,), w, b, e)),
    ("layer_norm_2d_nobias", O.layer_norm,
     lambda: (_r(3, 2, 8), _r(2, 8), None, 2, 1e-5, False),
     lambda x, w, b, n, e, s: F.layer_norm(x, (2, 8), w, None, e)),
    ("rms_norm", O.layer_norm, lambda: (_r(3, 8), _r(8), None, 1, 1e-6, True),
     lambda x, w, b, n, e, s: F.rms_norm(x, (8,), w, e)),
    ("batch_norm_train", O.batch_norm,
     lambda: (_r(4, 3, 5, 5), _r(3), _r(3), *_stats(), True, 1e-5),
     lambda x, w, b, rm, rv, t, e: F.batch_norm(x, None, None, w, b, True, 0.1, e)),
    ("batch_norm_eval", O.batch_norm,
     lambda: (_r(4, 3, 5), _r(3), None, *_stats(), False, 1e-5),
     lambda x, w, b, rm, rv, t, e: F.batch_norm(x, rm, rv, w, None, False, 0.1, e)),
    ("cross_entropy_fused_mean", O.cross_entropy,
     lambda: (_r(6, 5), torch.randint(0, 5, (6,)), None, -100, 1, 0.0, True),
     lambda x, t, w, ig, red, sm, fu: F.cross_entropy(x, t)),
    ("cross_entropy_none_weight_ignore_smooth", O.cross_entropy,
     lambda: (_r(6, 5), torch.tensor([0, 2, 2, 4, 1, 3]), torch.rand(5, dtype=D), 2, 0,
              0.1, False),
     lambda x, t, w, ig, red, sm, fu: F.cross_entropy(x, t, w, ignore_index=2,
                                                      reduction="none", label_smoothing=0.1)),
    ("cross_entropy_sum_spatial", O.cross_entropy,
     lambda: (_r(2, 5, 3), torch.randint(0, 5, (2, 3)), None, -100, 2, 0.0, True),
     lambda x, t, w, ig, red, sm, fu: F.cross_entropy(x, t, reduction="sum")),
    ("conv2d_groups_stride", O.conv,
     lambda: (_r(2, 4, 7, 7), _r(6, 2, 3, 3), _r(6), [2, 1], [1, 0], [1, 1], 2),
     lambda x, w, b, s, p, d, g: F.conv2d(x, w, b, s, p, d, g)),
    ("conv1d_dilated_nobias", O.conv,
     lambda: (_r(2, 3, 9), _r(4, 3, 3), None, [1], [2], [2], 1),
     lambda x, w, b, s, p, d, g: F.conv1d(x, w, None, s, p, d, g)),
    ("max_pool2d_ceil", O.max_pool,
     lambda: (_r(2, 3, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], True),
     lambda x, k, s, p, d, c: F.max_pool2d(x, k, s, p, d, c)),
    ("max_pool2d_2x2_code", O.max_pool,
     lambda: (_r(2, 3, 6, 7), [2, 2], [2, 2], [0, 0], [1, 1], False),
     lambda x, k, s, p, d, c: F.max_pool2d(x, k, s, p, d, c)),
    ("max_pool2d_3x3_stride2_code", O.max_pool,
     lambda: (_r(2, 3, 9, 8), [3, 3], [2, 2], [1, 1], [1, 1], False),
     lambda x, k, s, p, d, c: F.max_pool2d(x, k, s, p, d, c)),
    ("max_pool1d_code", O.max_pool,
     lambda: (_r(2, 3, 11), [3], [2], [1], [1], False),
     lambda x, k, s, p, d, c: F.max_pool1d(x, k, s, p, d, c)),
    ("max_pool2d_dilated_indices", O.max_pool,
     lambda: (_r(2, 3, 9, 9), [3, 3], [1, 1], [1, 1], [2, 2], False),
     lambda x, k, s, p, d, c: F.max_pool2d(x, k, s, p, d, c)),
    ("max_pool3d_indices", O.max_pool,
     lambda: (_r(1, 2, 5, 5, 4), [2, 2, 2], [2, 1, 2], [1, 0, 1], [1, 1, 1], False),
     lambda x, k, s, p, d, c: F.max_pool3d(x, k, s, p, d, c)),
    ("avg_pool2d", O.avg_pool, lambda: (_r(2, 3, 7, 6), [3, 2], [2, 2], [1, 1], False, True),
     lambda x, k, s, p, c, cip: F.avg_pool2d(x, k, s, p, c, cip)),
    ("global_avg_pool", O.global_avg_pool, lambda: (_r(2, 3, 4, 5),),
     lambda x: F.adaptive_avg_pool2d(x, 1)),
    ("attention_causal", O.attention,
     lambda: (_r(2, 3, 5, 4), _r(2, 3, 7, 4), _r(2, 3, 7, 6), None, True, 0.4, 1),
     lambda q, k, v, m, c, s, r: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                scale=s)),
    ("attention_bool_mask_batched", O.attention,
     lambda: (_r(2, 3, 5, 4), _r(2, 3, 7, 4), _r(2, 3, 7, 4),
              torch.rand(2, 1, 5, 7) > 0.3, False, 0.5, 1),
     lambda q, k, v, m, c, s, r: F.scaled_dot_product_attention(q, k, v, m, scale=s)),
    ("attention_float_mask", O.attention,
     lambda: (_r(3, 5, 4), _r(3, 6, 4), _r(3, 6, 4), torch.randn(5, 6, dtype=D), False,
              0.5, 1),
     lambda q, k, v, m, c, s, r: F.scaled_dot_product_attention(q, k, v, m.to(q.dtype),
                                                                scale=s)),
    ("attention_grouped_heads_causal", O.attention,
     lambda: (_r(2, 4, 5, 4), _r(2, 2, 5, 4), _r(2, 2, 5, 4), None, True, 0.5, 2),
     lambda q, k, v, m, c, s, r: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                scale=s, enable_gqa=True)),
]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _f32(args):
    return tuple(a.detach().float().requires_grad_(a.requires_grad)
                 if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)


@pytest.mark.parametrize("name,op,make,ref", CASES, ids=[c[0] for c in CASES])
def test_op_opcheck_values_gradcheck(name, op, make, ref):
    torch.manual_seed(0)
    args = make()
    result = opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result
    # float32 forward and backward vs torch
    a32 = _f32(args)
    r32 = tuple(a.detach().clone().requires_grad_(a.requires_grad)
                if isinstance(a, torch.Tensor) else a for a in a32)
    y, yr = _first(op(*a32)), ref(*r32)
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(yr)
    y.backward(g)
    yr.backward(g)
    for a, b in zip(a32, r32, strict=True):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    # float64 gradcheck (fresh copies: running statistics must not drift between calls)
    diff = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]

    def fn(*ts):
        full = list(args)
        for i, t in zip(diff, ts, strict=True):
            full[i] = t
        full = [a.clone() if isinstance(a, torch.Tensor) and not a.requires_grad else a
                for a in full]
        return _first(op(*full))

    assert torch.autograd.gradcheck(fn, tuple(args[i] for i in diff))


@pytest.mark.parametrize("groups", [1, 8])
def test_conv_op_keeps_channels_last_on_both_sides(groups):
    """``ortcpu::conv`` on a channels-last input (the depthwise one on its channels-last
    kernel) lays Y and dX out channels-last as torch's convolution does, its fake kernel
    and ATen's side alike (opcheck compares the fake's strides with the real ones), with
    torch's values and gradients."""
    from ortcpu_torch.ops import library as L

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 8, 9, 7, dtype=D, generator=g).to(memory_format=torch.channels_last)
    x.requires_grad_()
    w = torch.randn(8, 8 // groups, 3, 3, dtype=D, generator=g, requires_grad=True)
    b = torch.randn(8, dtype=D, generator=g, requires_grad=True)
    args = (x, w, b, [1, 2], [1, 1], [1, 1], groups)
    assert set(opcheck(O.conv, args).values()) == {"SUCCESS"}
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y, yr = O.conv(*args), F.conv2d(xr, wr, br, [1, 2], 1, 1, groups)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    torch.testing.assert_close(y, yr)
    dy = torch.randn(yr.shape, dtype=D, generator=g)
    y.backward(dy)
    yr.backward(dy)
    assert x.grad.is_contiguous(memory_format=torch.channels_last)
    for a, r in ((x, xr), (w, wr), (b, br)):
        torch.testing.assert_close(a.grad, r.grad)
    # ATen's side (``pick`` chooses it where it measures faster): the same layouts
    yt = L._conv_torch(*(t.detach() for t in (x, w, b)), [1, 2], [1, 1], [1, 1], groups)
    assert yt.stride() == y.stride()
    dxt, dwt, _ = L._conv_bwd_torch(dy, x.detach(), w.detach(), [1, 2], [1, 1], [1, 1],
                                    groups, [True, True, True])
    assert dxt.stride() == x.grad.stride() and dwt.is_contiguous()
    _, dw, _ = O.conv_backward(dy, x.detach(), w.detach(), [1, 2], [1, 1], [1, 1], groups,
                               [True, True, True])
    assert dw.is_contiguous()  # as the fake says (the depthwise kernel's is tap-major)


def test_linear_checks_each_weight_layout_apart():
    """``linear`` with an [in, out] weight (``weight_t``, addmm's) and the same shapes
    with an [out, in] one share the eager checks' cache but not its entries: shapes valid
    in one layout are still rejected in the other."""
    x, w = torch.randn(3, 4), torch.randn(4, 6)
    torch.testing.assert_close(O.linear(x, w, None, False, True), x @ w)
    with pytest.raises(ValueError, match="in_features"):
        O.linear(x, w, None)
    x6 = torch.randn(3, 6)
    torch.testing.assert_close(O.linear(x6, w, None), x6 @ w.t())
    with pytest.raises(ValueError, match="in_features"):
        O.linear(x6, w, None, False, True)


def test_batch_norm_update_stats_opcheck_and_semantics():
    rm, rv = torch.zeros(3, dtype=D), torch.ones(3, dtype=D)
    mean, var = torch.rand(3, dtype=D), torch.rand(3, dtype=D)
    assert set(opcheck(O.batch_norm_update_stats, (rm.clone(), rv.clone(), mean, var, 0.1,
                                                   10)).values()) == {"SUCCESS"}
    O.batch_norm_update_stats(rm, rv, mean, var, 0.1, 10)
    torch.testing.assert_close(rm, 0.1 * mean)
    torch.testing.assert_close(rv, 0.9 + 0.1 * var * 10 / 9)


def test_ops_reject_bad_arguments_with_clear_errors():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="kind must be one of"):
        O.act(x, "Tanhh", 0.0)
    with pytest.raises(ValueError, match="input's last dim must be in_features"):
        O.linear(x, torch.randn(5, 3), None)
    with pytest.raises(ValueError, match="target has label 7"):
        O.cross_entropy(x, torch.tensor([0, 7, 1]), None, -100, 1, 0.0, False)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        O.batch_norm(torch.randn(1, 3), None, None, None, None, True, 1e-5)
    with pytest.raises((ValueError, TypeError)):
        O.gelu(torch.randn(3, dtype=torch.float16), 0)


# ---- torch.compile of wrapped models -----------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc1, self.act, self.ln = nn.Linear(d, 4 * d), nn.GELU(), nn.LayerNorm(4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, y):
        h = F.silu(self.fc2(self.ln(self.act(self.fc1(x)))))
        return F.cross_entropy(torch.log_softmax(h, -1), y, label_smoothing=0.1)


class CNN(nn.Module):
    """torchvision-style: conv-BN-ReLU(inplace), MaxPool, a basic block with ``+=``,
    global average pool, Linear."""

    def __init__(self, c=4):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.relu, self.pool = nn.ReLU(inplace=True), nn.MaxPool2d(2)
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.gap, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(c, 5)

    def forward(self, x, y):
        x = self.pool(self.relu(self.bn(self.stem(x))))
        out = self.b1(self.c1(x))
        out += x
        return F.cross_entropy(self.fc(torch.flatten(self.gap(self.relu(out)), 1)), y)


def _batch(kind, n):
    if kind == "mlp":
        return torch.randn(n, 16), torch.randint(0, 16, (n,))
    return torch.randn(n, 3, 8, 8), torch.randint(0, 5, (n,))


class GraphRecorder:
    """An aot_eager-like backend that keeps the forward and backward graphs' op names."""

    def __init__(self):
        self.frames, self.forward, self.backward = 0, set(), set()

    def _keep(self, into):
        def compiler(gm, example_inputs):
            for n in gm.graph.nodes:
                if n.op == "call_function":
                    # a mutating op appears functionalized: auto_functionalized(op, ...)
                    into.add(str(n.args[0] if "auto_functionalized" in str(n.target)
                                 else n.target))
            return make_boxed_func(gm.forward)
        return compiler

    def __call__(self, gm, example_inputs):
        self.frames += 1
        return aot_autograd(fw_compiler=self._keep(self.forward),
                            bw_compiler=self._keep(self.backward))(gm, example_inputs)


def _train_side_by_side(kind, model, steps, backend, **wrap_args):
    torch.manual_seed(0)
    ref = copy.deepcopy(model)
    wrap_args.setdefault("select", "ours")
    wrap(model, fallback="silent", **wrap_args)
    cm = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.05)
    for _ in range(steps):
        x, y = _batch(kind, 6)
        losses = []
        for m, o in ((cm, opt), (ref, opt_r)):
            o.zero_grad()
            loss = m(x, y)
            loss.backward()
            o.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)
    for (n, b), c in zip(model.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6, msg=n)
    return cm, ref


class DepthwiseCL(nn.Module):
    """ConvNeXt-style (Hugging Face's): a depthwise 7x7 on a channels-last view, LayerNorm
    over channels, pointwise Linear, back to NCHW by a permute."""

    def __init__(self, c=16):
        super().__init__()
        self.dw, self.ln = nn.Conv2d(c, c, 7, padding=3, groups=c), nn.LayerNorm(c)
        self.pw, self.head = nn.Linear(c, c), nn.Linear(c, 5)

    def forward(self, x, y):
        h = self.pw(self.ln(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        h = self.dw(h) + h  # a channels-last input to the depthwise conv
        return F.cross_entropy(self.head(h.mean((2, 3))), y)


def test_compiled_channels_last_depthwise_runs_ours_without_layout_copies():
    """The compiled graph's ``ortcpu::conv`` keeps a channels-last input's layout (its
    fake kernel says so, so Inductor plans no copies around it) and trains like torch."""
    torch.manual_seed(0)
    model, rec = DepthwiseCL(), GraphRecorder()
    ref = copy.deepcopy(model)
    wrap(model, fallback="silent", select="ours", compile_kernels="ours")
    cm = torch.compile(model, backend=rec)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.05)
    for _ in range(3):
        x, y = torch.randn(4, 16, 9, 9), torch.randint(0, 5, (4,))
        for m, o in ((cm, opt), (ref, opt_r)):
            o.zero_grad()
            m(x, y).backward()
            o.step()
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    assert rec.frames == 1
    assert "conv" in {t.split(".")[1] for t in rec.forward if t.startswith("ortcpu.")}
    assert "conv_backward" in {t.split(".")[1] for t in rec.backward if t.startswith("ortcpu.")}


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_compiled_wrapped_model_compiles_once_runs_our_ops_trains_like_torch(kind):
    """Issue 14 defect 2: 20 steps, one compilation, our forward and backward ops in the
    graphs, the same losses / parameters / gradients / BatchNorm statistics as torch."""
    rec = GraphRecorder()
    model = MLP() if kind == "mlp" else CNN()
    cm, ref = _train_side_by_side(kind, model, 20, rec, compile_kernels="ours")
    assert rec.frames == 1
    want = {"linear", "cross_entropy"} | ({"gelu", "layer_norm", "softmax", "act"}
                                          if kind == "mlp" else
                                          {"conv", "batch_norm", "batch_norm_update_stats",
                                           "max_pool", "global_avg_pool"})
    fwd = {t.split(".")[1] for t in rec.forward if t.startswith("ortcpu.")}
    bwd = {t.split(".")[1] for t in rec.backward if t.startswith("ortcpu.")}
    assert want <= fwd, fwd
    grads = {w + "_backward" for w in want if w not in ("batch_norm_update_stats",)}
    assert grads <= bwd, bwd
    if kind == "cnn":  # eval: running statistics, no update (one more graph, as torch)
        model.eval()
        ref.eval()
        x, y = _batch(kind, 4)
        torch.testing.assert_close(cm(x, y), ref(x, y), rtol=1e-5, atol=1e-6)
    rep = report(model, file=None)
    assert "ortcpu:: ops in the compiled graph" in rep.text
    assert "F.linear" in rep.compiled["routed"]
    assert {"linear", "cross_entropy"} <= set(rep.compiled["traced_ops"])


def test_shape_changes_recompile_no_more_than_torch():
    counts = []
    for wrapped in (True, False):
        torch._dynamo.reset()
        m = MLP()
        if wrapped:
            wrap(m, fallback="silent", select="ours", compile_kernels="ours")
        cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        cm = torch.compile(m, backend=cnt)
        for n in (4, 6, 8, 4, 10):
            cm(*_batch("mlp", n)).backward()
        counts.append(cnt.frame_count)
    assert counts[0] <= counts[1], counts


def test_compile_kernels_torch_keeps_the_graph_torchs_and_families_select():
    rec = GraphRecorder()
    _train_side_by_side("mlp", MLP(), 3, rec, compile_kernels="torch")
    assert rec.frames == 1
    assert not any(t.startswith("ortcpu.") for t in rec.forward | rec.backward)
    torch._dynamo.reset()
    rec = GraphRecorder()
    m, _ = _train_side_by_side("mlp", MLP(), 3, rec, compile_kernels=["linear"])
    ours = {t.split(".")[1] for t in rec.forward if t.startswith("ortcpu.")}
    assert ours == {"linear"}
    assert "compile_kernels='torch'" in report(
        wrap(MLP(), compile_kernels="torch"), file=None).text
    with pytest.raises(ValueError, match="unknown families"):
        wrap(MLP(), compile_kernels=["gemm"])
    with pytest.raises(ValueError, match="compile_kernels must be"):
        wrap(MLP(), compile_kernels="fastest")


class PickRecorder(GraphRecorder):
    """GraphRecorder that also keeps, per ortcpu:: op, the ``pick`` flags it was traced
    with (a schema argument of the picking ops)."""

    def __init__(self):
        super().__init__()
        self.picks: dict = {}

    def _keep(self, into):
        inner = super()._keep(into)

        def compiler(gm, example_inputs):
            for n in gm.graph.nodes:
                name = str(n.target)
                names = [a.name for a in n.target._schema.arguments] \
                    if n.op == "call_function" and name.startswith("ortcpu.") else []
                if "pick" in names:
                    i = names.index("pick")
                    pick = n.kwargs.get("pick", n.args[i] if len(n.args) > i else False)
                    self.picks.setdefault(name.split(".")[1], set()).add(pick)
            return inner(gm, example_inputs)
        return compiler


def test_default_compile_kernels_auto_routes_conv_pool_and_fast_gemms():
    """"auto": conv and pooling (BatchNorm stays Inductor's, fused with its neighbours);
    the CNN's Linear head too where our GEMM measured clearly faster than torch's in
    this process (compiled.auto_families)."""
    from ortcpu_torch.wrap import compiled

    rec = GraphRecorder()
    _train_side_by_side("cnn", CNN(), 2, rec)
    ours = {t.split(".")[1] for t in rec.forward if t.startswith("ortcpu.")}
    fams = compiled.auto_families()
    extra = {"linear"} if "linear" in fams else set()  # its 6x10 cross entropy: Inductor's
    assert ours == {"conv", "max_pool", "global_avg_pool"} | extra, ours
    assert compiled.auto_families()[:2] == compiled.AUTO
    assert report(wrap(CNN()), file=None).compiled["routed"][:1] == ["F.conv1d"]


class _Logits(torch.nn.Module):
    def __init__(self, d, classes):
        super().__init__()
        self.fc = torch.nn.Linear(d, classes)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(x), y)


@pytest.mark.parametrize("compile_kernels", ["auto", "ours"])
def test_compiled_cross_entropy_is_ours_from_its_size_under_auto(compile_kernels):
    """compile_kernels="auto" (on the AVX-512 build, where cross entropy is in it) routes
    F.cross_entropy to ortcpu:: from CE_MIN_CLASSES classes and CE_MIN_LOGITS logits, and
    leaves smaller ones to Inductor; "ours" routes both. Losses as torch's either way."""
    from ortcpu_torch.wrap import compiled

    if compile_kernels == "auto" and "cross_entropy" not in compiled.auto_families():
        pytest.skip("cross entropy is in compile_kernels='auto' on the AVX-512 build only")
    routed = {}
    for n, c in ((8, 10), (compiled.CE_MIN_LOGITS // compiled.CE_MIN_CLASSES,
                          compiled.CE_MIN_CLASSES)):
        torch.manual_seed(0)
        model, rec = _Logits(16, c), GraphRecorder()
        ref = copy.deepcopy(model)
        wrap(model, fallback="silent", select="ours", compile_kernels=compile_kernels)
        x, y = torch.randn(n, 16), torch.randint(0, c, (n,))
        loss = torch.compile(model, backend=rec)(x, y)
        loss.backward()
        want = ref(x, y)
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.fc.weight.grad, ref.fc.weight.grad, rtol=1e-4,
                                   atol=1e-6)
        routed[c] = "ortcpu.cross_entropy" in {t.rsplit(".", 1)[0] for t in rec.forward}
    assert routed == {10: compile_kernels == "ours", compiled.CE_MIN_CLASSES: True}, routed


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_default_wrap_compiles_once_gemms_and_convs_pick_their_side(kind):
    """select='fastest' (the default) under compile: one compilation over the steps, the
    linear and conv ops traced with pick=True (forward and backward), the side measured
    once per signature at run time (no guard: no recompile), losses/parameters/gradients
    as torch's."""
    L = ortcpu_torch.ops.library
    L.PICKED.clear()
    rec = PickRecorder()
    model = MLP() if kind == "mlp" else CNN()
    fams = ["linear"] + (["conv", "batch_norm", "pool"] if kind == "cnn" else [])
    _train_side_by_side(kind, model, 6, rec, select="fastest", compile_kernels=fams)
    assert rec.frames == 1
    ops = {"linear", "linear_backward"} | ({"conv", "conv_backward"} if kind == "cnn"
                                           else set())
    assert ops <= set(rec.picks), rec.picks
    assert all(rec.picks[o] == {True} for o in ops), rec.picks
    assert {k[0] for k in L.PICKED} == ops, L.PICKED
    assert set(L.PICKED.values()) <= {"ours", "torch"}
    # select='ours': the same ops, always ours (pick=False)
    rec = PickRecorder()
    _train_side_by_side(kind, MLP() if kind == "mlp" else CNN(), 2, rec,
                        compile_kernels=fams)
    assert all(rec.picks[o] == {False} for o in ops), rec.picks


@pytest.mark.parametrize("side", ["ours", "torch"])
def test_picking_ops_give_torchs_values_on_either_side(side, monkeypatch):
    """Whichever side a picking op measured faster, its values and gradients are torch's;
    both sides' outputs are fresh tensors (opcheck: no aliasing)."""
    L = ortcpu_torch.ops.library
    monkeypatch.setattr(L, "_side", lambda key, ours, torch_: side)
    for dt in (torch.float32, D):
        tol = {"rtol": 1e-4, "atol": 1e-4} if dt == torch.float32 else {}
        x, w, b = _r(3, 5, 4, dtype=dt), _r(6, 4, dtype=dt), _r(6, dtype=dt)
        y = O.linear(x, w, b, True)
        ref = F.linear(x, w, b)
        torch.testing.assert_close(y, ref, **tol)
        g = torch.autograd.grad(y.square().sum(), (x, w, b))
        torch.testing.assert_close(g, torch.autograd.grad(ref.square().sum(), (x, w, b)),
                                   **tol)
        opcheck(O.linear, (x, w, b, True))
        opcheck(O.linear, (x.detach(), w, None, True))
        # addmm's [in, out] weight (weight_t): its gradient in that layout
        wt = _r(4, 6, dtype=dt)
        y = O.linear(x, wt, b, True, True)
        g = torch.autograd.grad(y.square().sum(), (x, wt, b))
        assert g[1].is_contiguous()
        ref = F.linear(x, wt.t(), b)
        torch.testing.assert_close(g, torch.autograd.grad(ref.square().sum(), (x, wt, b)),
                                   **tol)
        opcheck(O.linear, (x, wt, b, True, True))
        xc, wc, bc = _r(2, 3, 7, 6, dtype=dt), _r(4, 3, 3, 3, dtype=dt), _r(4, dtype=dt)
        for bias in (bc, None):
            args = (xc, wc, bias, [2, 1], [1, 0], [1, 2], 1)
            y = O.conv(*args, True)
            ref = F.conv2d(xc, wc, bias, (2, 1), (1, 0), (1, 2))
            torch.testing.assert_close(y, ref, **tol)
            ins = (xc, wc) + ((bias,) if bias is not None else ())
            torch.testing.assert_close(torch.autograd.grad(y.square().sum(), ins),
                                       torch.autograd.grad(ref.square().sum(), ins), **tol)
            opcheck(O.conv, (*args, True))
        if dt == D:
            assert torch.autograd.gradcheck(lambda x, w, b: O.linear(x, w, b, True),
                                            (x, w, b))


@pytest.mark.parametrize("side", ["ours", "torch"])
def test_conv_of_a_channels_last_input_keeps_its_fake_layout_under_inductor(side,
                                                                            monkeypatch):
    """A permuted (channels-last strided) input, as ConvNeXt-style code passes: ATen's
    convolution keeps that layout in its outputs, so the fake kernel says channels-last
    and either side returns exactly that (Inductor asserts the strides)."""
    L = ortcpu_torch.ops.library
    monkeypatch.setattr(L, "_side", lambda key, ours, torch_: side)

    class NHWCConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 6, 3, padding=1)

        def forward(self, x):
            return self.conv(x.permute(0, 3, 1, 2)).relu().square().sum()

    torch.manual_seed(0)
    m = NHWCConv()
    ref = copy.deepcopy(m)
    cm = torch.compile(wrap(m, fallback="silent"))
    x = torch.randn(2, 5, 7, 4)
    for _ in range(2):
        for mod in (m, ref):
            mod.zero_grad()
        loss, loss_ref = cm(x), ref(x)
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


class _Conv1DStyle(nn.Module):
    """Hugging Face's ``Conv1D`` (GPT-2's projections): ``x·w + b`` by ``torch.addmm`` with
    the weight stored [in, out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)
        self.bias = nn.Parameter(torch.randn(n_out) * 0.1)

    def forward(self, x, y):
        h = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return F.cross_entropy(h.view(*x.shape[:-1], -1).flatten(0, -2), y)


@pytest.mark.parametrize("select", ["ours", "fastest"])
def test_compiled_addmm_of_a_conv1d_style_module_runs_our_linear(select):
    """torch.addmm with a 1-D bias (GPT-2's Conv1D) is routed as ``linear`` of the
    transposed weight view, trained like torch; other addmm calls (a 2-D input, beta)
    stay ATen's."""
    torch.manual_seed(0)
    model, rec = _Conv1DStyle(12, 7), GraphRecorder()
    ref = copy.deepcopy(model)
    cm = torch.compile(wrap(model, fallback="silent", select=select,
                            compile_kernels=["linear"]), backend=rec)
    x, y = torch.randn(2, 3, 12), torch.randint(0, 7, (6,))
    for m in (cm, ref):
        m(x, y).backward()
    assert "ortcpu.linear.default" not in rec.forward
    assert any(op.startswith("ortcpu.linear") for op in rec.forward), rec.forward
    assert any(op.startswith("ortcpu.linear_backward") for op in rec.backward), rec.backward
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    b2, x2, w2 = torch.randn(6, 7), torch.randn(6, 12), torch.randn(12, 7)
    from ortcpu_torch.wrap import compiled

    assert compiled._addmm(b2, x2, w2) is NotImplemented
    assert compiled._addmm(b2[0], x2, w2, beta=0.5) is NotImplemented


_QUIET = logging.getLogger("ortcpu_torch.tests.graph_break")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _logged_loss(h, y):
    _QUIET.warning("a logging call: Dynamo breaks the graph here")
    return F.cross_entropy(h, y)


class _Breaking(nn.Module):
    """A forward with a graph break in a function it calls (as ``logger.warning_once`` in
    Hugging Face's loss functions makes one in GPT-2's)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 5)

    def forward(self, x, y):
        return _logged_loss(self.fc2(F.gelu(self.fc1(x))), y)


def test_a_graph_break_in_the_roots_forward_keeps_our_ops_in_the_compiled_frames():
    """Dynamo cannot resume the root's forward inside the compile mode after a graph
    break, so it runs that frame uncompiled and compiles the inner frames under the eager
    kernel mode: they route to our ops all the same, and train like torch."""
    torch.manual_seed(0)
    model, rec = _Breaking(), GraphRecorder()
    ref = copy.deepcopy(model)
    cm = torch.compile(wrap(model, fallback="silent", select="ours",
                            compile_kernels=["linear"]), backend=rec)
    for _ in range(2):
        x, y = torch.randn(6, 8), torch.randint(0, 5, (6,))
        for m in (model, ref):
            m.zero_grad()
        loss, loss_ref = cm(x, y), ref(x, y)
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    assert rec.frames >= 2
    assert sum(op.startswith("ortcpu.linear") for op in rec.forward) >= 1, rec.forward


class _CompiledInside(nn.Module):
    """An eagerly run model whose block is compiled on its own (``torch.compile`` of a
    submodule, as users compile blocks): Dynamo traces it under the eager kernel mode."""

    def __init__(self, backend):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))
        self.compiled = torch.compile(self.block, backend=backend)

    def forward(self, x, y):
        return F.cross_entropy(self.compiled(x), y)


def test_a_block_compiled_inside_an_eager_wrapped_model_routes_our_ops():
    torch.manual_seed(0)
    rec = GraphRecorder()
    model = _CompiledInside(rec)
    ref = copy.deepcopy(model.block)
    wrap(model, fallback="silent", select="ours", compile_kernels=["linear"])
    x, y = torch.randn(6, 8), torch.randint(0, 5, (6,))
    loss = model(x, y)
    loss.backward()
    loss_ref = F.cross_entropy(ref(x), y)
    loss_ref.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.block.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    assert sum(op.startswith("ortcpu.linear") for op in rec.forward) >= 1, rec.forward


def test_exclude_keeps_an_excluded_module_on_torch_under_compile():
    rec = GraphRecorder()
    _train_side_by_side("mlp", MLP(), 2, rec, exclude=["ln", "F.cross_entropy"],
                        compile_kernels="ours")
    ours = {t.split(".")[1] for t in rec.forward if t.startswith("ortcpu.")}
    assert "layer_norm" not in ours and "cross_entropy" not in ours
    assert {"linear", "gelu"} <= ours


def test_unsupported_calls_fall_back_to_torch_inside_the_graph():
    """float16-free but unsupported configurations: inplace activations, string padding,
    return_indices: torch's op is traced instead, results unchanged."""

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3, padding="same")

        def forward(self, x):
            h = F.silu(self.conv(x), inplace=False)
            p, _idx = F.max_pool2d(h, 2, return_indices=True)
            return F.relu(p, inplace=True).sum()

    rec = GraphRecorder()
    m = Odd()
    ref = copy.deepcopy(m)
    cm = torch.compile(wrap(m, fallback="silent", select="ours", compile_kernels="ours"),
                       backend=rec)
    x = torch.randn(2, 2, 6, 6)
    torch.testing.assert_close(cm(x), ref(x), rtol=1e-5, atol=1e-6)
    ours = {t.split(".")[1] for t in rec.forward if t.startswith("ortcpu.")}
    assert ours == {"act"}, ours  # silu only; conv 'same', indices, inplace: torch


def test_a_norm_of_a_permuted_input_stays_in_the_compiled_graph_as_torchs():
    """ConvNeXt-style channels-last blocks: a LayerNorm (or RMSNorm) over a permuted view
    is left to Inductor, which reads the permutation in its fused kernel where ours would
    copy the input contiguous first; a contiguous one is ours. Values and gradients match
    torch either way."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_last, self.ln_flat = nn.LayerNorm(6), nn.LayerNorm(6)
            self.rms = nn.RMSNorm(6)

        def forward(self, x):
            h = self.rms(self.ln_last(x.permute(0, 2, 3, 1)))  # channels last: a view
            return self.ln_flat(h.reshape(-1, 6)).square().sum()

    rec = GraphRecorder()
    m = Block()
    ref = copy.deepcopy(m)
    cm = torch.compile(wrap(m, fallback="silent", select="ours", compile_kernels="ours"),
                       backend=rec)
    x = torch.randn(2, 6, 3, 5, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y, yr = cm(x), ref(xr)
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    y.backward()
    yr.backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    # ln_last's input is the permuted view: torch's; rms and ln_flat read contiguous
    # tensors: ours
    assert any(t.startswith("ortcpu.layer_norm.") for t in rec.forward), rec.forward
    assert any("native_layer_norm" in t for t in rec.forward), rec.forward


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_inductor_compiles_once_and_trains_like_torch(kind):
    cnt = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    _train_side_by_side(kind, MLP() if kind == "mlp" else CNN(), 20, cnt,
                        compile_kernels="ours")
    assert cnt.frame_count == 1


def test_auto_families_leaves_the_global_generator_alone():
    """wrap() measures GEMMs for compile_kernels="auto" on a private generator: a wrapped
    run from torch.manual_seed draws the numbers a plain one draws."""
    from ortcpu_torch.wrap import compiled

    torch.manual_seed(3)
    want = torch.rand(4)
    torch.manual_seed(3)
    compiled.auto_families.cache_clear()  # measure again, as the first wrap() does
    fams = compiled.auto_families()
    assert torch.equal(torch.rand(4), want)
    n = len(compiled.AUTO)
    assert fams[:n] == compiled.AUTO and \
        set(fams[n:]) <= {"linear", "attention", *compiled.FUSED_ON_AVX512}


def test_swapped_modules_share_the_originals_dicts_and_see_reassigned_parameters():
    """A swapped module holds its original's own ``_parameters``/``_buffers`` dicts, so
    torch.compile reaches each tensor through one source (no per-call aliasing guard
    function) and a parameter re-assigned after wrapping is what both sides use."""
    from ortcpu_torch.wrap.policy import INFO_ATTR

    torch.manual_seed(0)
    model = CNN()
    ref = copy.deepcopy(model)
    wrap(model, fallback="silent", select="ours")
    for name in ("stem", "bn", "fc"):
        swapped = getattr(model, name)
        original = swapped.__dict__[INFO_ATTR].original
        assert swapped._parameters is original._parameters, name
        assert swapped._buffers is original._buffers, name
    cm = torch.compile(model, backend="aot_eager")
    x, y = _batch("cnn", 4)
    torch.testing.assert_close(cm(x, y), ref(x, y), rtol=1e-5, atol=1e-6)
    for m in (model, ref):
        torch.manual_seed(1)
        m.fc.weight = nn.Parameter(torch.randn(5, 4))
    torch.testing.assert_close(cm(x, y), ref(x, y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model(x, y), ref(x, y), rtol=1e-5, atol=1e-6)
    assert list(model.state_dict()) == list(ref.state_dict())


class _SelfAttention(nn.Module):
    def __init__(self, sdpa_kwargs, d=8, heads=2, kv_heads=2):
        super().__init__()
        self.kw, self.heads, self.kv_heads = sdpa_kwargs, heads, kv_heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d // heads * kv_heads)

    def forward(self, x):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, -1).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, -1).transpose(1, 2)
                for z in self.kv(x).chunk(2, -1))
        a = F.scaled_dot_product_attention(q, k, v, **self.kw)
        return a.transpose(1, 2).reshape(b, t, d).square().mean()


@pytest.mark.parametrize("kind", ["causal", "bool_mask", "float_mask", "gqa", "dropout"])
def test_compiled_sdpa_runs_our_fused_attention_forward_and_backward(kind):
    """F.scaled_dot_product_attention inside a compiled wrapped model: ortcpu::attention
    and attention_backward in the graphs, torch's values and gradients; dropout (not
    fused) stays torch's."""
    torch.manual_seed(0)
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True  # every query attends somewhere
    kw, kv_heads = {"causal": ({"is_causal": True}, 2),
                    "bool_mask": ({"attn_mask": mask}, 2),
                    "float_mask": ({"attn_mask": torch.randn(5, 5), "scale": 0.3}, 2),
                    "gqa": ({"is_causal": True, "enable_gqa": True}, 1),
                    "dropout": ({"dropout_p": 0.5}, 2)}[kind]
    model = _SelfAttention(kw, kv_heads=kv_heads)
    ref = copy.deepcopy(model)
    rec = GraphRecorder()
    cm = torch.compile(wrap(model, fallback="silent", select="ours",
                            compile_kernels=["linear", "attention"]), backend=rec)
    x = torch.randn(3, 5, 8)
    if kind == "dropout":
        cm(x).backward()
        assert not any(t.startswith("ortcpu.attention") for t in rec.forward), rec.forward
        return
    loss, loss_ref = cm(x), ref(x)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    loss_ref.backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)
    assert any(t.startswith("ortcpu.attention.") for t in rec.forward), rec.forward
    assert any(t.startswith("ortcpu.attention_backward.") for t in rec.backward), rec.backward


def test_compiled_graphs_name_the_versioned_overloads():
    """wrap's adapters call ``library.OPS`` (each op's ``OVERLOAD``), so the graph torch's
    compile caches key on names the overload: bumping it when an op changes keeps a stale
    cached compilation from being reused."""
    from ortcpu_torch.ops.library import OVERLOAD

    rec = GraphRecorder()
    _train_side_by_side("mlp", MLP(), 1, rec, compile_kernels="ours")
    ours = [t for t in rec.forward | rec.backward if t.startswith("ortcpu.")]
    assert ours and all(t.endswith("." + OVERLOAD) for t in ours), ours


def test_attributes_set_on_a_swapped_module_reach_the_compiled_forward():
    """torch.compile runs the original's forward without reading the swapped module's
    attributes: ``train()``/``eval()`` and configuration writes reach the original as they
    are made."""
    torch.manual_seed(0)
    model, ref = CNN(), None
    ref = copy.deepcopy(model)
    wrap(model, fallback="silent", select="ours")
    cm = torch.compile(model, backend="aot_eager")
    x, y = _batch("cnn", 4)
    for m in (model, ref):
        m.bn.momentum = 0.5
        m.bn.eps = 1e-2
    torch.testing.assert_close(cm(x, y), ref(x, y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.bn.running_mean, ref.bn.running_mean, rtol=1e-5,
                               atol=1e-6)
    model.eval()
    ref.eval()
    torch.testing.assert_close(cm(x, y), ref(x, y), rtol=1e-5, atol=1e-6)


def test_more_wrapped_models_than_dynamos_recompile_limit_all_compile():
    """Each wrapped root's forward has a code object of its own: Dynamo's recompile limit
    (8 entries per code object) counts per model, not across every wrapped model of the
    process (the ninth used to run uncompiled)."""
    cnt = torch._dynamo.testing.CompileCounter()
    n = torch._dynamo.config.recompile_limit + 2
    for i in range(n):
        cls = type(f"Net{i}", (nn.Module,), {
            "__init__": lambda self, i=i: (nn.Module.__init__(self),
                                           setattr(self, "fc", nn.Linear(8, 8 + i)))[0],
            "forward": lambda self, x: self.fc(x).sum()})
        cm = torch.compile(wrap(cls(), fallback="silent"), backend=cnt)
        cm(torch.randn(4, 8)).backward()
    assert cnt.frame_count == n


def test_compiled_sdpa_leaves_long_sequences_to_torch():
    """Beyond ATTENTION_MAX_SCORES scores per head (our fused attention materialises them;
    torch's flash attention tiles) the compiled graph keeps torch's attention."""
    from ortcpu_torch.wrap.compiled import ATTENTION_MAX_SCORES

    t = int(ATTENTION_MAX_SCORES ** 0.5) + 1
    model = _SelfAttention({"is_causal": True}, d=4, heads=1, kv_heads=1)
    rec = GraphRecorder()
    cm = torch.compile(wrap(model, fallback="silent", select="ours",
                            compile_kernels=["attention"]), backend=rec)
    cm(torch.randn(1, t, 4)).backward()
    assert not any(n.startswith("ortcpu.attention") for n in rec.forward), rec.forward
