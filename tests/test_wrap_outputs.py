"""Outputs of every ``ortcpu_torch.ops`` function and ``ortcpu_torch.nn`` module are
ordinary tensors: the user may modify them in place exactly where torch allows it
(``relu_()``, ``add_()``, ``+=`` right after the op, as torchvision's ResNet/MobileNet do
with ``ReLU(inplace=True)`` and ``out += identity``), with the same gradients; where torch
refuses (an op that saved its output for backward), ours refuses too.

Each case runs small and "arena-sized" (>= 256 KB outputs come from the native arena).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch import ops

ONN = ortcpu_torch.nn
BIG = 1 << 16  # float32 elements in a 256 KB output: the arena threshold


def _rows(big: bool, cols: int = 64) -> int:
    return BIG // cols + 3 if big else 5


# name -> (ours, torch, inputs(big) -> list of tensors; float ones get requires_grad)
def _cases():
    r = torch.randn
    return {
        "gelu": (ops.gelu, F.gelu, lambda b: [r(_rows(b), 64)]),
        "gelu_tanh": (lambda x: ops.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh"),
                      lambda b: [r(_rows(b), 64)]),
        "bias_gelu": (ops.bias_gelu, lambda x, b: F.gelu(x + b),
                      lambda b: [r(_rows(b), 64), r(64)]),
        "quick_gelu": (ops.quick_gelu, lambda x: x * torch.sigmoid(1.702 * x),
                       lambda b: [r(_rows(b), 64)]),
        "leaky_relu": (lambda x: ops.leaky_relu(x, 0.1), lambda x: F.leaky_relu(x, 0.1),
                       lambda b: [r(_rows(b), 64)]),
        "softmax": (lambda x: ops.softmax(x, -1), lambda x: torch.softmax(x, -1),
                    lambda b: [r(_rows(b), 64)]),
        "log_softmax": (lambda x: ops.log_softmax(x, 1), lambda x: torch.log_softmax(x, 1),
                        lambda b: [r(_rows(b), 64)]),
        "layer_norm": (lambda x, w, bb: ops.layer_norm(x, (64,), w, bb),
                       lambda x, w, bb: F.layer_norm(x, (64,), w, bb),
                       lambda b: [r(_rows(b), 64), r(64), r(64)]),
        "rms_norm": (lambda x, w: ops.rms_norm(x, (64,), w, 1e-6),
                     lambda x, w: F.rms_norm(x, (64,), w, 1e-6),
                     lambda b: [r(_rows(b), 64), r(64)]),
        "batch_norm": (lambda x, w, bb: ops.batch_norm(x, None, None, w, bb, True),
                       lambda x, w, bb: F.batch_norm(x, None, None, w, bb, True),
                       lambda b: [r(_rows(b, 8 * 16), 8, 4, 4), r(8), r(8)]),
        "cross_entropy": (ops.cross_entropy, F.cross_entropy,
                          lambda b: [r(_rows(b), 64), torch.randint(0, 64, (_rows(b),))]),
        "cross_entropy_none": (lambda x, t: ops.cross_entropy(x, t, reduction="none"),
                               lambda x, t: F.cross_entropy(x, t, reduction="none"),
                               lambda b: [r(_rows(b), 64), torch.randint(0, 64, (_rows(b),))]),
        "conv1d": (lambda x, w, bb: ops.conv1d(x, w, bb, padding=1),
                   lambda x, w, bb: F.conv1d(x, w, bb, padding=1),
                   lambda b: [r(_rows(b, 8 * 32) * 2, 3, 32), r(8, 3, 3), r(8)]),
        "conv2d": (lambda x, w, bb: ops.conv2d(x, w, bb, padding=1),
                   lambda x, w, bb: F.conv2d(x, w, bb, padding=1),
                   lambda b: [r(_rows(b, 8 * 64), 3, 8, 8), r(8, 3, 3, 3), r(8)]),
        "conv2d_depthwise": (lambda x, w: ops.conv2d(x, w, None, 1, 1, 1, 8),
                             lambda x, w: F.conv2d(x, w, None, 1, 1, 1, 8),
                             lambda b: [r(_rows(b, 8 * 64), 8, 8, 8), r(8, 1, 3, 3)]),
        "conv3d": (ops.conv3d, F.conv3d,
                   lambda b: [r(_rows(b, 4 * 27), 2, 5, 5, 5), r(4, 2, 3, 3, 3)]),
        "max_pool2d": (lambda x: ops.max_pool2d(x, 2), lambda x: F.max_pool2d(x, 2),
                       lambda b: [r(_rows(b, 4 * 16), 4, 8, 8)]),
        "avg_pool2d": (lambda x: ops.avg_pool2d(x, 2), lambda x: F.avg_pool2d(x, 2),
                       lambda b: [r(_rows(b, 4 * 16), 4, 8, 8)]),
        "max_pool1d": (lambda x: ops.max_pool1d(x, 2), lambda x: F.max_pool1d(x, 2),
                       lambda b: [r(_rows(b, 4 * 16), 4, 32)]),
        "avg_pool3d": (lambda x: ops.avg_pool3d(x, 2), lambda x: F.avg_pool3d(x, 2),
                       lambda b: [r(_rows(b, 4 * 8), 4, 4, 4, 4)]),
        "adaptive_avg_pool2d": (lambda x: ops.adaptive_avg_pool2d(x, 1),
                                lambda x: F.adaptive_avg_pool2d(x, 1),
                                lambda b: [r(_rows(b, 64), 64, 3, 3)]),
        "global_avg_pool": (ops.global_avg_pool, lambda x: x.mean((2, 3), keepdim=True),
                            lambda b: [r(_rows(b, 64), 64, 3, 3)]),
        "global_max_pool": (ops.global_max_pool, lambda x: x.amax((2, 3), keepdim=True),
                            lambda b: [r(_rows(b, 64), 64, 3, 3)]),
        "linear": (ops.linear, F.linear, lambda b: [r(2, _rows(b, 48), 32), r(48, 32)]),
        "linear_2d_bias": (ops.linear, F.linear, lambda b: [r(_rows(b, 48), 32), r(48, 32),
                                                            r(48)]),
        "matmul": (ops.matmul, torch.matmul, lambda b: [r(_rows(b, 48), 32), r(32, 48)]),
        "matmul_batched": (ops.matmul, torch.matmul,
                           lambda b: [r(4, _rows(b, 4 * 48), 32), r(4, 32, 48)]),
        "matmul_kt": (lambda q, k: ops.matmul(q, k.transpose(-2, -1)),
                      lambda q, k: torch.matmul(q, k.transpose(-2, -1)),
                      lambda b: [r(2, _rows(b, 2 * 40), 16), r(2, 40, 16)]),
        "embedding": (ops.embedding, F.embedding,
                      lambda b: [torch.randint(0, 30, (_rows(b),)), r(30, 64)]),
        "dropout_eval": (lambda x: ops.dropout(x, 0.5, False), lambda x: F.dropout(x, 0.5,
                                                                                  False),
                         lambda b: [r(_rows(b), 64)]),
        "fake_quantize": (lambda x: ops.fake_quantize(x, 0.05, 128),
                          lambda x: torch.fake_quantize_per_tensor_affine(x, 0.05, 128, 0,
                                                                          255),
                          lambda b: [r(_rows(b), 64)]),
    }


def _new_cases():
    """Ops added by the wrap's coverage work, present when their kernels are."""
    r = torch.randn
    out = {}
    if hasattr(ops, "silu"):
        out["silu"] = (ops.silu, F.silu, lambda b: [r(_rows(b), 64)])
    if hasattr(ops, "relu"):
        out["relu"] = (ops.relu, F.relu, lambda b: [r(_rows(b), 64)])
    for name in ("hardswish", "hardsigmoid", "relu6", "hardtanh"):
        if hasattr(ops, name):
            out[name] = (getattr(ops, name), getattr(F, name), lambda b: [r(_rows(b), 64) * 4])
    if hasattr(ops, "addmm"):
        out["addmm"] = (ops.addmm, torch.addmm,
                        lambda b: [r(48), r(_rows(b, 48), 32), r(32, 48)])
    if hasattr(ops, "scaled_dot_product_attention"):
        out["sdpa_causal"] = (
            lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda b: [r(4, 4, 64 if b else 8, 64 if b else 16),
                       r(4, 4, 64 if b else 8, 64 if b else 16),
                       r(4, 4, 64 if b else 8, 64 if b else 16)])
    return out


INPLACE = {
    "relu_": lambda y: y.relu_(),
    "add_": lambda y: y.add_(0.5),
    "iadd": lambda y: y.__iadd__(0.5),
}
OUT_OF_PLACE = {
    "relu_": lambda y: y.relu(),
    "add_": lambda y: y.add(0.5),
    "iadd": lambda y: y + 0.5,
}


def _run(fn, inputs, then, dtype=None):
    """(error or None, output after ``then``, gradients of the float inputs)."""
    leaves = [t.detach().clone() for t in inputs]
    if dtype is not None:
        leaves = [t.to(dtype) if t.is_floating_point() else t for t in leaves]
    leaves = [t.requires_grad_(t.is_floating_point()) for t in leaves]
    try:
        y = then(fn(*leaves))
        w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view(y.shape)
        (y * w).sum().backward()
    except RuntimeError as e:
        return str(e), None, None
    return None, y.detach(), [t.grad for t in leaves if t.is_floating_point()]


def _close(ours, theirs, exact):
    """``ours`` (float32) is as close to the float64 result ``exact`` as torch's float32
    result ``theirs`` is: within a few times torch's own error, plus 2e-5 of the largest
    value (a float32 sum over the 16k rows of an arena-sized case, e.g. BiasGelu's dbias,
    accumulated in order rather than pairwise: ~sqrt(16k) ulp)."""
    if exact is None:
        assert ours is None and theirs is None
        return
    exact = exact.to(ours.dtype) if not ours.is_floating_point() else exact.double()
    scale = max(1.0, float(exact.abs().max())) if exact.numel() else 1.0
    err_ours = float((ours.double() - exact).abs().max()) if ours.numel() else 0.0
    err_torch = float((theirs.double() - exact).abs().max()) if theirs.numel() else 0.0
    assert err_ours <= 4 * err_torch + 2e-5 * scale, \
        f"ours is off by {err_ours:.3g}, torch float32 by {err_torch:.3g} (scale {scale:.3g})"


def _check(name, ours, ref, make, big, how):
    """Ours with the in-place op runs wherever torch's does and gives torch's result; where
    torch refuses, ours refuses too or gives the out-of-place result."""
    inputs = make(big)
    if big and not name.startswith("cross_entropy"):
        assert ref(*inputs).numel() * 4 >= 1 << 18, f"{name}: the big case is not arena-sized"
    err_t, y_t, g_t = _run(ref, inputs, INPLACE[how])
    err_o, y_o, g_o = _run(ours, inputs, INPLACE[how])
    err_x, y_x, g_x = _run(ref, inputs, OUT_OF_PLACE[how], torch.float64)
    if err_x is not None:  # no float64 reference: compare with torch's out-of-place float32
        err_x, y_x, g_x = _run(ref, inputs, OUT_OF_PLACE[how])
    if err_t is not None:
        if err_o is not None:
            return
        err_t, y_t, g_t = _run(ref, inputs, OUT_OF_PLACE[how])  # what ours must then give
    assert err_o is None, f"{name}: torch allows {how} on its output, ours raised: {err_o}"
    assert err_x is None, err_x
    _close(y_o, y_t, y_x)
    for a, b, c in zip(g_o, g_t, g_x, strict=True):
        _close(a, b, c)


@pytest.fixture(autouse=True)
def _two_threads():
    torch.set_num_threads(2)
    ortcpu_torch.set_num_threads(2)


@pytest.mark.parametrize("how", sorted(INPLACE))
@pytest.mark.parametrize("big", [False, True], ids=["small", "arena"])
@pytest.mark.parametrize("name", sorted(_cases()) + sorted(_new_cases()))
def test_inplace_on_ops_output_like_torch(name, big, how):
    ours, ref, make = {**_cases(), **_new_cases()}[name]
    _check(name, ours, ref, make, big, how)


def test_dropout_output_in_place_same_gradient():
    x = torch.randn(_rows(True), 64)
    for how in INPLACE.values():
        a = x.clone().requires_grad_(True)
        y, mask = ops.dropout.__globals__["dropout_with_mask"](a, 0.3)
        ref_y = (x * mask.to(x.dtype) / 0.7)
        torch.testing.assert_close(y.detach(), ref_y)
        how(y)
        y.sum().backward()
        b = x.clone().requires_grad_(True)
        how(b * mask.to(x.dtype) / 0.7).sum().backward()
        torch.testing.assert_close(a.grad, b.grad)


# ---- modules: the torchvision patterns ----------------------------------------------


def _module_pairs():
    """(our module, torch module with the same parameters, input(big))."""
    r = torch.randn

    def pair(ours_cls, torch_cls, *args, **kw):
        t = torch_cls(*args, **kw)
        o = ours_cls(*args, **kw)
        o.load_state_dict(t.state_dict())
        return o, t

    return {
        "Linear": (lambda: pair(ONN.Linear, nn.Linear, 32, 48), lambda b: r(_rows(b, 48), 32)),
        "Conv2d": (lambda: pair(ONN.Conv2d, nn.Conv2d, 3, 8, 3, padding=1),
                   lambda b: r(_rows(b, 8 * 64), 3, 8, 8)),
        "BatchNorm2d": (lambda: pair(ONN.BatchNorm2d, nn.BatchNorm2d, 8),
                        lambda b: r(_rows(b, 8 * 64), 8, 8, 8)),
        "LayerNorm": (lambda: pair(ONN.LayerNorm, nn.LayerNorm, 64), lambda b: r(_rows(b), 64)),
        "RMSNorm": (lambda: pair(ONN.RMSNorm, nn.RMSNorm, 64), lambda b: r(_rows(b), 64)),
        "GELU": (lambda: pair(ONN.GELU, nn.GELU), lambda b: r(_rows(b), 64)),
        "LeakyReLU": (lambda: pair(ONN.LeakyReLU, nn.LeakyReLU, 0.2), lambda b: r(_rows(b), 64)),
        "Softmax": (lambda: pair(ONN.Softmax, nn.Softmax, -1), lambda b: r(_rows(b), 64)),
        "LogSoftmax": (lambda: pair(ONN.LogSoftmax, nn.LogSoftmax, -1),
                       lambda b: r(_rows(b), 64)),
        "MaxPool2d": (lambda: pair(ONN.MaxPool2d, nn.MaxPool2d, 2),
                      lambda b: r(_rows(b, 4 * 16), 4, 8, 8)),
        "AvgPool2d": (lambda: pair(ONN.AvgPool2d, nn.AvgPool2d, 2),
                      lambda b: r(_rows(b, 4 * 16), 4, 8, 8)),
        "AdaptiveAvgPool2d": (lambda: pair(ONN.AdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, 1),
                              lambda b: r(_rows(b, 64), 64, 3, 3)),
        "Conv1d": (lambda: pair(ONN.Conv1d, nn.Conv1d, 3, 8, 3, padding=1),
                   lambda b: r(_rows(b, 8 * 32) * 2, 3, 32)),
        "Embedding": (lambda: pair(ONN.Embedding, nn.Embedding, 30, 64),
                      lambda b: torch.randint(0, 30, (_rows(b),))),
        "Dropout_eval": (lambda: tuple(m.eval() for m in pair(ONN.Dropout, nn.Dropout)),
                         lambda b: r(_rows(b), 64)),
    }


def _functional(module):
    """``module`` as a function of (input, *parameters), so ``_check`` compares the
    parameters' gradients too (float64 runs use a float64 copy)."""
    names = [n for n, _ in module.named_parameters()]

    def fn(x, *params):
        m = module if not params or params[0].dtype == torch.float32 else \
            copy.deepcopy(module).double()
        return torch.func.functional_call(m, dict(zip(names, params, strict=True)), (x,))

    return fn, [p.detach() for p in module.parameters()]


@pytest.mark.parametrize("how", sorted(INPLACE))
@pytest.mark.parametrize("big", [False, True], ids=["small", "arena"])
@pytest.mark.parametrize("name", sorted(_module_pairs()))
def test_inplace_on_nn_output_like_torch(name, big, how):
    make, data = _module_pairs()[name]
    ours, ref = make()
    x = data(big)
    f_ours, params = _functional(ours)
    f_ref, _ = _functional(ref)
    _check(name, f_ours, f_ref, lambda b: [x, *params], big, how)


def test_issue_reproducer_linear_hardswish_inplace():
    m = nn.Sequential(nn.Linear(8, 16), nn.Hardswish(inplace=True))
    ref = nn.Sequential(nn.Linear(8, 16), nn.Hardswish(inplace=True))
    ref.load_state_dict(m.state_dict())
    x = torch.randn(4, 8)
    ortcpu_torch.wrap(m, fallback="silent")
    m(x).sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad)


class _BasicBlock(nn.Module):
    """torchvision's BasicBlock pattern: conv-bn-relu(inplace) twice, ``out += identity``."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


@pytest.mark.parametrize("big", [False, True], ids=["small", "arena"])
def test_resnet_block_inplace_patterns_train_like_torch(big):
    c, hw = 8, (32 if big else 6)
    m = _BasicBlock(c)
    ref = copy.deepcopy(m)
    exact = copy.deepcopy(m).double()
    ortcpu_torch.wrap(m, fallback="silent")
    x = torch.randn(4, c, hw, hw)
    for mod, xi in ((m, x), (ref, x), (exact, x.double())):
        mod(xi.clone().requires_grad_(True)).sum().backward()
    for (_n, p), q, e in zip(m.named_parameters(), ref.parameters(), exact.parameters(),
                            strict=True):
        _close(p.grad, q.grad, e.grad)
    for b, c_, e in zip(m.buffers(), ref.buffers(), exact.buffers(), strict=True):
        _close(b, c_, e)
