"""Our ops keep memory formats as torch's do: a channels_last (or any dense permuted)
input gives an output, and passes back an input gradient, laid out as torch's op would
lay them out, with torch's values. The next torch op picks its kernel by that layout
(an NCHW output of ours in front of torch's depthwise convolutions made a wrapped
ConvNeXt step slower than plain torch's), so a wrap must not change it.

Elementwise ops run on the input's memory in its own order (no copy); convolution,
batch norm and pooling compute channels-first and convert.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ortcpu_torch import ops

CL, CL3 = torch.channels_last, torch.channels_last_3d


def _cases():
    r = torch.randn
    w2, wd, w3 = r(16, 8, 3, 3), r(8, 1, 3, 3), r(6, 8, 3, 3, 3)
    scale, shift = torch.rand(8) + 0.5, r(8)
    bn = lambda f: lambda x: f(x, torch.zeros(8), torch.ones(8), scale, shift, True)  # noqa: E731
    return {
        "conv2d": (lambda f: lambda x: f(x, w2, None, 1, 1), F.conv2d, ops.conv2d, (5, 8, 7, 9)),
        "conv2d_s2": (lambda f: lambda x: f(x, w2, None, 2, 0), F.conv2d, ops.conv2d,
                      (3, 8, 8, 8)),
        "depthwise": (lambda f: lambda x: f(x, wd, None, 1, 1, 1, 8), F.conv2d, ops.conv2d,
                      (4, 8, 6, 5)),
        "conv3d": (lambda f: lambda x: f(x, w3, None, 1, 1), F.conv3d, ops.conv3d,
                   (2, 8, 4, 5, 3)),
        "batch_norm": (bn, F.batch_norm, ops.batch_norm, (4, 8, 5, 7)),
        "max_pool2d": (lambda f: lambda x: f(x, 3, 2, 1), F.max_pool2d, ops.max_pool2d,
                       (3, 8, 9, 7)),
        "max_pool2d_2x2": (lambda f: lambda x: f(x, 2), F.max_pool2d, ops.max_pool2d,
                           (3, 8, 8, 6)),
        "avg_pool2d": (lambda f: lambda x: f(x, 3, 2, 1), F.avg_pool2d, ops.avg_pool2d,
                       (3, 8, 9, 7)),
        "max_pool3d": (lambda f: lambda x: f(x, 2), F.max_pool3d, ops.max_pool3d,
                       (2, 8, 4, 4, 6)),
        "adaptive_avg_pool2d": (lambda f: lambda x: f(x, 1), F.adaptive_avg_pool2d,
                                ops.adaptive_avg_pool2d, (3, 8, 5, 7)),
        "gelu": (lambda f: f, F.gelu, ops.gelu, (3, 8, 5, 7)),
        "gelu_tanh": (lambda f: lambda x: f(x, approximate="tanh"), F.gelu, ops.gelu,
                      (3, 8, 5, 7)),
        "relu": (lambda f: f, F.relu, ops.relu, (3, 8, 5, 7)),
        "silu": (lambda f: f, F.silu, ops.silu, (3, 8, 5, 7)),
        "leaky_relu": (lambda f: lambda x: f(x, 0.2), F.leaky_relu, ops.leaky_relu,
                       (3, 8, 5, 7)),
        "hardswish": (lambda f: f, F.hardswish, ops.hardswish, (3, 8, 5, 7)),
        "hardsigmoid": (lambda f: f, F.hardsigmoid, ops.hardsigmoid, (3, 8, 5, 7)),
        "relu6": (lambda f: f, F.relu6, ops.relu6, (3, 8, 5, 7)),
        "hardtanh": (lambda f: f, F.hardtanh, ops.hardtanh, (3, 8, 5, 7)),
    }


CASES = _cases()


def _layout(t: torch.Tensor) -> tuple:
    """The strides that matter: those of dims longer than 1 (the others do not move
    through memory)."""
    return tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)


def _input(shape, kind: str) -> torch.Tensor:
    x = torch.randn(shape, dtype=torch.float64) * 3
    if kind == "channels_last":
        x = x.contiguous(memory_format=CL if len(shape) == 4 else CL3)
    elif kind == "permuted":  # dense, but in no named memory format
        x = x.permute(3, 1, 0, 2).contiguous().permute(2, 1, 3, 0) if len(shape) == 4 \
            else x.transpose(0, 2).contiguous().transpose(0, 2)
    elif kind == "sliced":  # not dense: a copy runs, torch's layout rules still hold
        x = torch.randn(*shape[:-1], shape[-1] * 2, dtype=torch.float64)[..., ::2]
    assert x.shape == shape
    return x.float()


def _run(fn, x0: torch.Tensor, dy: torch.Tensor):
    """fn's output and the gradient it passes to x's producer (not a leaf's ``.grad``:
    autograd lays those out like the leaf)."""
    leaf = x0.detach().clone().requires_grad_()
    x = leaf * 1  # a non-leaf in x0's layout
    seen = {}
    x.register_hook(lambda g: seen.setdefault("dx", g))
    y = fn(x)
    y.backward(dy)
    return y, seen["dx"]


# a dense order that is no named memory format: elementwise ops keep it (torch's spatial
# ops treat it as NCHW, as ours do)
ELEMENTWISE = ("gelu", "relu", "silu", "hardswish", "leaky_relu")
LAYOUT_CASES = [(n, k) for n in sorted(CASES) for k in ("channels_last", "sliced")] + \
    [(n, "permuted") for n in ELEMENTWISE]


@pytest.mark.parametrize(("name", "kind"), LAYOUT_CASES)
def test_layout_and_values_match_torch(name, kind):
    call, theirs, ours, shape = CASES[name]
    torch.manual_seed(0)
    x0 = _input(shape, kind)
    dy = _dy_for(call(theirs), x0)
    y_ref, dx_ref = _run(call(theirs), x0, dy)
    y, dx = _run(call(ours), x0, dy)
    assert _layout(y) == _layout(y_ref), f"output strides {y.stride()} vs {y_ref.stride()}"
    assert _layout(dx) == _layout(dx_ref), f"dx strides {dx.stride()} vs {dx_ref.stride()}"
    _close(y, y_ref)
    _close(dx, dx_ref)


def _close(a, b, msg=None):
    """float32 agreement, to the rounding of the largest magnitude (a convolution's sums
    of 72 products round differently in another order)."""
    scale = float(b.detach().abs().max()) if b.numel() else 1.0
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(scale, 1.0), msg=msg)


def _dy_for(fn, x0):
    """A random output gradient in the layout torch's output has (what the next op's
    backward hands back)."""
    with torch.no_grad():
        y = fn(x0.clone())
    g = torch.Generator().manual_seed(1)
    return torch.empty_like(y).copy_(torch.randn(y.shape, generator=g))


def test_gradient_in_another_layout_than_the_output():
    """A contiguous gradient for a channels_last output (the next op's backward chose
    another layout) still gives torch's values."""
    x0 = _input((3, 8, 5, 7), "channels_last")
    dy = torch.randn(3, 8, 5, 7)
    for name in ("gelu", "relu", "hardswish", "conv2d", "batch_norm", "max_pool2d"):
        call, theirs, ours, _ = CASES[name]
        if name in ("conv2d", "max_pool2d"):
            with torch.no_grad():
                dy = torch.randn(call(theirs)(x0).shape)
        _, dx_ref = _run(call(theirs), x0, dy)
        _, dx = _run(call(ours), x0, dy)
        _close(dx, dx_ref, msg=name)
        dy = torch.randn(3, 8, 5, 7)


@pytest.mark.parametrize("name", ["gelu", "relu", "hardswish", "conv2d", "batch_norm"])
def test_channels_last_output_is_an_ordinary_tensor(name):
    """In place on the permuted-layout output is allowed as on torch's, same gradient."""
    call, theirs, ours, shape = CASES[name]
    x0 = _input(shape, "channels_last")
    grads = []
    for f in (theirs, ours):
        leaf = x0.detach().clone().requires_grad_()
        y = call(f)(leaf * 1)
        y = y + 0 if name in ("relu",) else y  # relu saved its output: as torch, not in place
        y.add_(1).relu_()
        y.sum().backward()
        grads.append(leaf.grad)
    _close(grads[1], grads[0])


@pytest.mark.parametrize("inplace_op", ["relu", "leaky_relu", "hardswish", "relu6"])
def test_inplace_activation_on_channels_last(inplace_op):
    """The in-place forms write into the channels_last input in its own layout and pass
    back torch's gradient."""
    x0 = _input((3, 8, 5, 7), "channels_last")
    outs = []
    for lib in (F, ops):
        leaf = x0.detach().clone().requires_grad_()
        x = leaf * 1
        y = getattr(lib, inplace_op)(x, inplace=True)
        assert y is x and y.stride() == x0.stride()
        (y * torch.arange(y.numel()).view(y.shape)).sum().backward()
        outs.append((y.detach(), leaf.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0])
    torch.testing.assert_close(outs[1][1], outs[0][1])


@pytest.mark.parametrize("inplace", [False, True])
def test_dropout_on_channels_last_keeps_layout_and_its_mask(inplace):
    """Dropout draws its mask in the input's memory order; output, gradient and the mask
    agree position by position."""
    from ortcpu_torch.ops.dropout import dropout_with_mask

    x0 = _input((4, 8, 6, 5), "channels_last").abs() + 0.5
    leaf = x0.detach().clone().requires_grad_()
    x = leaf * 1
    y, mask = dropout_with_mask(x, 0.4, True, inplace)
    assert _layout(y) == _layout(x0)
    kept = mask.bool()
    assert kept.shape == x0.shape and 0 < kept.sum() < kept.numel()
    torch.testing.assert_close(y.detach(), torch.where(kept, x0 / 0.6, 0.0))
    y.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.where(kept, 1 / 0.6, 0.0).float())


def test_empty_and_size_one_channels_last():
    for shape in ((0, 8, 5, 7), (3, 8, 1, 1), (1, 1, 4, 4)):
        x0 = torch.randn(shape).contiguous(memory_format=CL)
        for name in ("gelu", "relu", "batch_norm", "conv2d"):
            call, theirs, ours, _ = CASES[name]
            if shape[0] == 0 and name == "batch_norm":
                continue  # torch refuses an empty batch in training too
            if shape[1] != 8 and name in ("batch_norm", "conv2d"):
                continue
            ref = call(theirs)(x0)
            y = call(ours)(x0)
            assert _layout(y) == _layout(ref), (name, shape)
            _close(y, ref)
