"""The per-call fast paths of issue 18 keep every check: argument checks cached per
signature run again for a new signature (including a tensor resized in place), labels are
still range-checked with a clear message, and a swapped module that ``select`` runs on
torch leaves the kernel mode as it found it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ortcpu_torch
from ortcpu_torch import ops
from ortcpu_torch.kernels._checks import SignatureCache, checked_signature


def test_checked_signature_tells_apart_what_the_checks_read():
    a = torch.randn(3, 4)
    assert checked_signature(a, None, 1) == checked_signature(torch.randn(3, 4), None, 1)
    assert checked_signature(a) != checked_signature(a.double())
    assert checked_signature(a) != checked_signature(a.view(4, 3))
    assert checked_signature(a) != checked_signature(a.to_sparse())
    assert checked_signature(1) != checked_signature(True) != checked_signature(1.0)
    assert checked_signature([1, 2]) is None  # not summarised: checked on every call
    cache = SignatureCache(limit=2)
    for k in ("a", "b", "c"):
        cache.add(checked_signature(k))
    assert checked_signature("c") in cache and None not in cache


def test_linear_checks_a_new_signature_after_a_cached_one():
    x, w, b = torch.randn(5, 4), torch.randn(3, 4), torch.randn(3)
    torch.testing.assert_close(ops.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    with pytest.raises(TypeError, match="linear: weight must be float32 or float64"):
        ops.linear(x, w.to(torch.int64), b)
    with pytest.raises(ValueError, match="linear: bias must have shape"):
        ops.linear(x, w, torch.randn(4))
    x.resize_(5, 6)  # in place: same object, new shape
    with pytest.raises(ValueError, match="linear: input's last dim must be in_features=4"):
        ops.linear(x, w, b)
    with pytest.raises(TypeError, match="linear: input must be a torch.Tensor"):
        ops.linear([[1.0] * 4], w, b)


def test_linear_non_contiguous_inputs_after_a_cached_contiguous_call():
    x, w = torch.randn(6, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    ops.linear(x, w)
    xt = torch.randn(4, 6, dtype=torch.float64).t()  # same signature, other strides
    wt = torch.randn(4, 3, dtype=torch.float64).t()
    torch.testing.assert_close(ops.linear(xt, wt), xt @ wt.t())


def test_gelu_checks_a_new_signature_after_a_cached_one():
    x = torch.randn(4, 8)
    ops.gelu(x)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        ops.gelu(x, approximate="fast")
    with pytest.raises(TypeError, match="gelu: input must be float32 or float64"):
        ops.gelu(torch.ones(4, 8, dtype=torch.int32))
    ops.bias_gelu(x, torch.randn(8))
    with pytest.raises(ValueError, match="bias must be 1-D with input.shape"):
        ops.bias_gelu(x, torch.randn(7))


def test_gelu_backward_of_a_non_contiguous_gradient():
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(8, 4, dtype=torch.float64).t()
    ops.gelu(x).backward(g)
    x2 = x.detach().clone().requires_grad_()
    torch.nn.functional.gelu(x2).backward(g)
    torch.testing.assert_close(x.grad, x2.grad)


def test_cross_entropy_labels_out_of_range_with_a_cached_signature():
    x = torch.randn(6, 5, requires_grad=True)
    good = torch.tensor([0, 1, 2, 3, 4, 0])
    ops.cross_entropy(x, good).backward()
    bad = torch.tensor([0, 1, 7, 3, 4, 0])  # same signature, one label out of range
    with pytest.raises(ValueError, match=r"target has label 7 at index \(2,\), out of range"):
        ops.cross_entropy(x, bad)
    ignored = torch.tensor([0, -100, 2, 3, 4, 0])  # ignore_index stays allowed
    torch.testing.assert_close(ops.cross_entropy(x, ignored),
                               torch.nn.functional.cross_entropy(x, ignored))
    with pytest.raises(ValueError, match="reduction must be"):
        ops.cross_entropy(x, good, reduction="avg")
    with pytest.raises(TypeError, match="target must be int64 or int32"):
        ops.cross_entropy(x, good.to(torch.int16))


def test_cross_entropy_cached_path_int32_and_unbatched():
    for target in (torch.tensor([1, 3], dtype=torch.int32), torch.tensor(2)):
        x = torch.randn(*target.shape, 4, dtype=torch.float64, requires_grad=True)
        for _ in range(2):  # the second call takes the cached path
            x.grad = None
            ops.cross_entropy(x, target).backward()
            x2 = x.detach().clone().requires_grad_()
            torch.nn.functional.cross_entropy(x2, target.long()).backward()
            torch.testing.assert_close(x.grad, x2.grad)


def test_module_chosen_torch_runs_without_the_kernel_mode_and_restores_it():
    base = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    model = copy.deepcopy(base)
    ortcpu_torch.wrap(model, fallback="error")
    x = torch.randn(4, 8)
    model(x)
    sig = {k: "torch" for k in ortcpu_torch.report(model, file=None).selection}
    ortcpu_torch.wrap(model, fallback="error", select=sig)
    depth = torch._C._len_torch_function_stack()
    out = model(x)
    torch.testing.assert_close(out, base(x))
    assert torch._C._len_torch_function_stack() == depth
    rep = ortcpu_torch.report(model, file=None)
    assert all(d["calls_torch"] == 1 and d["calls_ours"] == 0 for d in rep.modules)
    # the torch functions inside a module run by torch are that module's, not counted again
    assert not any(d["name"] in ("F.linear", "F.gelu") for d in rep.torch_functions)


def test_kernel_mode_is_restored_when_a_torch_chosen_module_raises():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    ortcpu_torch.wrap(model, fallback="error")
    model(torch.randn(4, 8))
    sig = {k: "torch" for k in ortcpu_torch.report(model, file=None).selection}
    ortcpu_torch.wrap(model, fallback="error", select=sig)
    depth = torch._C._len_torch_function_stack()
    model[1].weight.data = torch.randn(2, 5)  # breaks torch's forward, not the checks
    with pytest.raises(RuntimeError):
        model(torch.randn(4, 8))
    assert torch._C._len_torch_function_stack() == depth
    model[1].weight.data = torch.randn(2, 8)
    model(torch.randn(4, 8)).sum().backward()


def test_views_and_metadata_reads_are_counted_without_their_module():
    """The kernel mode counts views and metadata reads on a fast path (no lookup of the
    calling module); computing torch functions keep the module that called them."""

    class Net(nn.Module):
        def forward(self, x):
            return torch.tanh(x.view(2, 6).transpose(0, 1)).reshape(12) * x.shape[0]

    m = ortcpu_torch.wrap(Net(), fallback="silent")
    for _ in range(3):
        m(torch.randn(12))
    rep = ortcpu_torch.report(m, file=None)
    funcs = {d["name"]: d for d in rep.torch_functions}
    # counted on the census forward of the signature (the later two run uncounted)
    assert rep.forwards["counted"] == 1 and rep.forwards["uncounted"] == 2
    for name in ("Tensor.view", "Tensor.transpose", "Tensor.reshape", "Tensor.shape.__get__"):
        d = funcs[name]
        assert d["metadata"] and d["calls"] == 1 and d["modules"], d
    assert funcs["torch.tanh"]["modules"] == [f"{Net.__module__}.{Net.__qualname__}"]
    assert not funcs["torch.tanh"]["metadata"] and funcs["torch.tanh"]["calls"] == 1
    assert "views and metadata reads on torch (no arithmetic)" in rep.text


@pytest.mark.parametrize("op", ["linear", "gelu"])
def test_backward_takes_the_upstream_gradient_autograd_casts(op):
    """The backward of linear/gelu does not re-check dy: autograd hands it in the output's
    dtype and shape, even when the caller passes a float64 gradient for a float32 output."""
    x, w = torch.randn(4, 3, 5), torch.randn(2, 5)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ws = [w.clone().requires_grad_(), w.clone().requires_grad_()]
    fs = (ops.linear, torch.nn.functional.linear) if op == "linear" else \
        (lambda a, _w: ops.gelu(a), lambda a, _w: torch.nn.functional.gelu(a))
    g = None
    for f, xi, wi in zip(fs, xs, ws, strict=True):
        y = f(xi, wi)
        g = torch.randn(y.shape, dtype=torch.float64) if g is None else g
        y.backward(g)
    assert xs[0].grad.dtype == torch.float32
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-5, atol=1e-6)
    if op == "linear":
        torch.testing.assert_close(ws[0].grad, ws[1].grad, rtol=1e-5, atol=1e-5)


class _Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("side", ["ours", "torch"])
def test_a_decided_signature_still_falls_back_for_a_subclass_or_autocast(side):
    """A swapped module's call of a signature ``select`` decided before takes the short
    path, which still sends a tensor subclass (same shape and dtype as the decided call)
    and CPU autocast to torch as counted fallbacks, on either chosen side."""
    base = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    model = copy.deepcopy(base)
    x = torch.randn(4, 8)
    ortcpu_torch.wrap(model, fallback="silent")
    model(x)
    sig = {k: side for k in ortcpu_torch.report(model, file=None).selection}
    ortcpu_torch.wrap(model, fallback="silent", select=sig)
    for _ in range(2):
        torch.testing.assert_close(model(x), base(x), rtol=1e-5, atol=1e-6)
    depth = torch._C._len_torch_function_stack()
    out = model(x.as_subclass(_Sub))
    torch.testing.assert_close(out.as_subclass(torch.Tensor), base(x), rtol=1e-5, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert torch._C._len_torch_function_stack() == depth
    lin = next(d for d in ortcpu_torch.report(model, file=None).modules if d["name"] == "0")
    reasons = " | ".join(lin["reasons"])
    assert "tensor subclass _Sub" in reasons and "CPU autocast is active" in reasons, reasons
    assert lin["calls_ours" if side == "ours" else "calls_torch"] >= 2
    assert lin["calls_ours"] + lin["calls_torch"] == 4


def test_a_decided_signature_on_ours_falls_back_when_ours_rejects_the_call():
    """On the short path, ours raising a TypeError/ValueError for a call is a fallback to
    torch's forward with ours' message, as on the general path."""
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    ortcpu_torch.wrap(model, fallback="silent", select="ours")
    x = torch.randn(4, 8)
    model(x)
    model[1].approximate = "tanh"
    model(x)  # ours takes tanh too: still ours
    model[0].weight.data = model[0].weight.data.double()  # ours rejects: mixed dtypes
    with pytest.raises(RuntimeError):
        model(x)  # torch's forward rejects it too, after the counted fallback
    lin = next(d for d in ortcpu_torch.report(model, file=None).modules if d["name"] == "0")
    assert lin["calls_ours"] == 2 and lin["calls_torch"] == 1
    assert any("weight must have the dtype of input" in r for r in lin["reasons"]), lin


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale: float = 1.0):
        return torch.nn.functional.gelu(self.lin(x)) * scale


def test_root_forward_attribute_survives_pickle_deepcopy_and_unwrap():
    """The wrapped root runs its forward inside the kernel mode through an instance
    ``forward`` attribute (no root hooks): the signature stays the class forward's,
    copies and pickles keep routing, unwrap removes it."""
    import inspect
    import io

    model = ortcpu_torch.wrap(_Net(), fallback="error", select="ours")
    assert list(inspect.signature(model.forward).parameters) == ["x", "scale"]
    assert not model._forward_pre_hooks and not model._forward_hooks
    x = torch.randn(2, 4)
    y = model(x, scale=2.0)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for m in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        assert m.forward.module is m  # the copy's forward runs the copy
        torch.testing.assert_close(m(x, scale=2.0), y)
        funcs = {d["name"]: d for d in ortcpu_torch.report(m, file=None).functionals}
        assert funcs["F.gelu"]["calls_ours"] >= 1  # routed in the copy too
    depth = torch._C._len_torch_function_stack()
    with pytest.raises(TypeError):
        model(x, bogus=1)  # leaves the kernel mode on the way out
    assert torch._C._len_torch_function_stack() == depth
    ortcpu_torch.unwrap(model)
    assert "forward" not in model.__dict__
    torch.testing.assert_close(model(x, scale=2.0), y)


def test_dropped_wrapped_model_is_freed_without_the_cyclic_collector():
    """The root's forward attribute holds the root weakly: no reference cycle, so a
    wrapped model's memory goes when its last reference does, as an unwrapped one's."""
    import gc
    import weakref

    model = ortcpu_torch.wrap(_Net(), fallback="error", select="ours")
    model(torch.randn(2, 4), scale=2.0).sum().backward()
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()


def test_root_with_a_forward_attribute_of_its_own_is_wrapped_with_hooks():
    model = _Net()
    inner = model.forward
    model.forward = lambda x: inner(x, scale=3.0)  # as some libraries patch forward
    ortcpu_torch.wrap(model, fallback="error", select="ours")
    x = torch.randn(2, 4)
    model(x)
    funcs = {d["name"]: d for d in ortcpu_torch.report(model, file=None).functionals}
    assert funcs["F.gelu"]["calls_ours"] == 1
    ortcpu_torch.unwrap(model)
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert model.forward is not inner  # the user's attribute is kept
