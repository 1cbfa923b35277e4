"""training_fusions.py: every rewrite of the graph ORTModule runs gives the results of the
unfused training graph (float64 and float32), fires where it should, and never reaches the
training graph that ``save_onnx`` writes."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ortcpu_torch
from ortcpu_torch import ORTModule
from ortcpu_torch.graph import training_fusions

TOL = {torch.float64: {"rtol": 1e-10, "atol": 1e-12}, torch.float32: {"rtol": 2e-5, "atol": 2e-6}}


def _run(model, args, fused: bool, monkeypatch, save_onnx=None):
    """(outputs, {param or input k: grad}, the rewrite descriptions) of two ORTModule
    steps."""
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(training_fusions, "PASSES", [])
        om = ORTModule(model, fallback="error", save_onnx=save_onnx)
        for _ in range(2):  # the second step runs the cached plans
            om.zero_grad(set_to_none=True)
            out = om(*args)
            (out[0] if isinstance(out, tuple) else out).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    grads.update({f"input {k}": a.grad for k, a in enumerate(args) if a.requires_grad})
    sig = ortcpu_torch.report(om, file=None).graph["signatures"][0]
    return out, grads, sig["training_fusions"]


def check_fused_matches_unfused(make, args, dtype, monkeypatch, tmp_path=None):
    """Fused vs unfused ORTModule on copies of one model; returns the rewrites made."""
    torch.manual_seed(0)
    model = make().to(dtype)
    args = [a.to(dtype) if a.is_floating_point() else a for a in args]
    out_f, g_f, done = _run(copy.deepcopy(model), args, True, monkeypatch, tmp_path)
    out_u, g_u, none = _run(copy.deepcopy(model), args, False, monkeypatch)
    assert none == []
    out_f = out_f if isinstance(out_f, tuple) else (out_f,)
    out_u = out_u if isinstance(out_u, tuple) else (out_u,)
    for a, b in zip(out_f, out_u, strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    for name, g in g_u.items():
        assert (g is None) == (g_f[name] is None) == (name in frozen), name
        if g is None:
            continue
        torch.testing.assert_close(g_f[name], g, **TOL[dtype], msg=name)
        assert g_f[name].is_contiguous(), name
    if tmp_path is not None:  # the saved training graph stays standard ONNX + ORT ops
        saved = onnx.load(str(next(tmp_path.glob("*_training.onnx"))))
        assert not any(n.domain == training_fusions.DOMAIN for n in saved.graph.node)
    return done


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 7), nn.Linear(7, 3, bias=False)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(torch.tanh(self.fc1(x))).flatten(0, -2), y)


@pytest.mark.parametrize(("rows", "dtype"), [
    ((2, 4), torch.float64), ((1, 1), torch.float32), ((3, 2, 2), torch.float64),
    ((5,), torch.float32)], ids=["3d-f64", "3d_one_row-f32", "4d-f64", "2d-f32"])
def test_linear_weight_gradients_without_transposes(dtype, rows, monkeypatch, tmp_path):
    """A Linear on [..., K] is MatMul(X, Transpose(W)): its backward Gemms read W itself and
    write the weight gradient in W's layout (2-D inputs are a Gemm already: no rewrite)."""
    x = torch.randn(*rows, 6)
    y = torch.randint(0, 3, (x[..., 0].numel(),))
    done = check_fused_matches_unfused(MLP, [x, y], dtype, monkeypatch, tmp_path)
    n = 2 if len(rows) > 1 else 0
    assert done.count("Transpose(Gemm(A, B)) -> Gemm(B, A) with the trans flags flipped") == n
    assert done.count("Gemm(Transpose(W)) -> Gemm(W) with the trans flag flipped") == n // 2


class Attention(nn.Module):
    """Scores of a causal / padded attention written three ways (``variant``)."""

    def __init__(self, variant: str, t: int = 5, d: int = 8):
        super().__init__()
        self.variant = variant
        self.qk = nn.Linear(d, 2 * d)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        keys = torch.tensor([False] * (t - 2) + [True] * 2)  # padded keys: [S]
        self.register_buffer("mask", {"keys": keys, "keep": ~causal}.get(variant, causal),
                             persistent=False)

    def forward(self, x, v):
        q, k = self.qk(x).chunk(2, dim=-1)
        att = q @ k.transpose(-2, -1)
        if self.variant == "causal":  # minGPT: scale, masked_fill(-inf)
            att = (att * 0.35).masked_fill(self.mask, float("-inf"))
        elif self.variant == "keep":  # where(keep, scores, -inf), the scale on the left
            att = torch.where(self.mask, 0.35 * att, float("-inf"))
        else:  # padded keys, a finite fill, no scale
            att = att.masked_fill(self.mask, -1e4)
        y = torch.softmax(att, dim=-1) @ v
        return y.square().sum(), y


@pytest.mark.parametrize(("variant", "dtype"), [
    ("causal", torch.float64), ("causal", torch.float32), ("keep", torch.float64),
    ("keys", torch.float32)], ids=["causal-f64", "causal-f32", "keep-f64", "keys-f32"])
def test_masked_scaled_softmax(variant, dtype, monkeypatch, tmp_path):
    x = torch.randn(2, 3, 5, 8)
    v = torch.randn(2, 3, 5, 4, requires_grad=True)
    done = check_fused_matches_unfused(lambda: Attention(variant), [x, v], dtype, monkeypatch,
                                       tmp_path)
    assert "[Mul +] Where + Softmax -> MaskedScaledSoftmax" in done
    assert "SoftmaxGrad_13 + Where [+ Mul] -> MaskedScaledSoftmaxGrad" in done


def test_masked_softmax_kernels_against_torch_with_fully_masked_rows_and_bad_mask():
    from onnx import TensorProto as TP
    from onnx import helper as h

    from ortcpu_torch.graph import Executor, GraphRunError

    x = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    mask = torch.rand(4, 6) < 0.4
    mask[1] = True  # a fully masked row: NaN, as torch
    dy = torch.randn_like(x)
    half, ninf = training_fusions._double(0.5), training_fusions._double(float("-inf"))
    nodes = [h.make_node("MaskedScaledSoftmax", ["x", "m"], ["y"],
                         domain=training_fusions.DOMAIN, scale=half, fill=ninf, masked_when=1),
             h.make_node("MaskedScaledSoftmaxGrad", ["dy", "y", "m"], ["dx"],
                         domain=training_fusions.DOMAIN, scale=half, masked_when=1)]
    vis = [h.make_tensor_value_info("x", TP.DOUBLE, list(x.shape)),
           h.make_tensor_value_info("m", TP.BOOL, ["a", "b"]),
           h.make_tensor_value_info("dy", TP.DOUBLE, list(x.shape))]
    graph = h.make_graph(nodes, "g", vis,
                         [h.make_empty_tensor_value_info(o) for o in ("y", "dx")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                               h.make_opsetid(training_fusions.DOMAIN, 1)])
    ex = Executor(model, check=False)
    got = ex.run({"x": x, "m": mask, "dy": dy})
    xr = x.clone().requires_grad_()
    y = torch.softmax((xr * 0.5).masked_fill(mask, float("-inf")), -1)
    y.backward(dy)
    torch.testing.assert_close(got["y"], y.detach(), equal_nan=True)
    assert got["y"][:, :, 1].isnan().all()
    ok = torch.ones(4, dtype=torch.bool).index_fill_(0, torch.tensor(1), False)
    torch.testing.assert_close(got["dx"][:, :, ok], xr.grad[:, :, ok])
    with pytest.raises(GraphRunError, match="MaskedScaledSoftmax: mask must be bool"):
        ex.run({"x": x, "m": torch.ones(3, 6, dtype=torch.bool), "dy": dy})


def _masked_softmax_pair(x, mask, dy, scale, fill):
    from ortcpu_torch.kernels import activations as kact

    m = mask.to(torch.uint8).contiguous()
    y = kact.masked_softmax_core("MaskedScaledSoftmax", x, m, mask.shape[0], scale, fill)
    dx = kact.masked_softmax_grad_core("MaskedScaledSoftmaxGrad", dy, y, m, mask.shape[0],
                                       scale)
    return y, dx


def _reference(x, mask, dy, scale, fill):
    xr = x.clone().requires_grad_()
    y = torch.softmax((xr * scale).masked_fill(mask, fill), -1)
    y.backward(dy)
    return y.detach(), xr.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 7, 16, 37, 128])
def test_masked_softmax_kernels_on_causal_rows(dtype, n):
    """The fused kernels on causal masks against torch, forward and backward: masked
    elements exactly 0, odd widths for SIMD tails; masked holes among kept elements, fully
    masked rows (NaN, as torch), a NaN score (its row NaN) and a NaN dY at a masked
    position (it reaches the row's sum, as in the unfused graph); a finite fill."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, 2, n, n, generator=g, dtype=dtype)
    dy = torch.randn(x.shape, generator=g, dtype=dtype)
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)
    y, dx = _masked_softmax_pair(x, causal, dy, 0.35, float("-inf"))
    ry, rdx = _reference(x, causal, dy, 0.35, float("-inf"))
    tol = TOL[dtype]
    torch.testing.assert_close(y, ry, **tol)
    torch.testing.assert_close(dx, rdx, **tol)
    assert (y[..., causal] == 0).all() and (dx[..., causal] == 0).all()
    if n < 7:
        return
    holes = causal.clone()
    holes[3, 1] = True          # a masked element inside the kept prefix
    holes[4, : n - 1] = True    # only the last element kept
    holes[5] = True             # nothing kept: NaN, as torch
    xs = x.clone()
    xs[0, 0, 2, 1] = float("nan")  # a NaN score in the prefix: that row all NaN
    dys = dy.clone()
    dys[1, 1, 6, n - 1] = float("nan")  # a NaN dY in the (masked) tail reaches the sum
    y, dx = _masked_softmax_pair(xs, holes, dys, 0.5, float("-inf"))
    ry, rdx = _reference(xs, holes, dys, 0.5, float("-inf"))
    torch.testing.assert_close(y, ry, equal_nan=True, **tol)
    assert y[0, 0, 2].isnan().all() and y[:, :, 5].isnan().all()
    keep = ~holes
    ok = torch.ones(n, dtype=torch.bool)
    ok[5] = False  # torch's gradient of a fully masked row is NaN-polluted differently
    torch.testing.assert_close(dx[..., ok, :].masked_select(keep[ok]),
                               rdx[..., ok, :].masked_select(keep[ok]), equal_nan=True, **tol)
    assert dx[1, 1, 6, : 7].isnan().all()
    assert (dx[..., holes] == 0).all()
    # a finite fill (no shortcut: the tail is exp(fill - max), not 0)
    y, dx = _masked_softmax_pair(x, causal, dy, 1.0, -3.0)
    ry, rdx = _reference(x, causal, dy, 1.0, -3.0)
    torch.testing.assert_close(y, ry, **tol)
    torch.testing.assert_close(dx, rdx, **tol)


class Recurrent(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True, **kw)

    def forward(self, x, h0, c0):
        out, (h, c) = self.lstm(x, (h0, c0))
        return out.square().sum() + (h * c).sum(), out


LSTM_DONE = ("LSTMTraining (+ LSTMGrad) with gate-reorder chains -> LSTMTorchGatesTraining "
             "(+ LSTMTorchGatesGrad)")


@pytest.mark.parametrize(("kw", "fused", "dtype"), [
    ({}, 1, torch.float64), ({"bias": False}, 1, torch.float32),
    ({"num_layers": 2, "bidirectional": True}, 4, torch.float64)],
    ids=["bias-f64", "no_bias-f32", "two_layers_bidirectional-f64"])
def test_lstm_in_torch_gate_order(kw, fused, dtype, monkeypatch, tmp_path):
    """Input, state and every parameter gradient equal the reordering graph's (the capture
    writes a reverse direction as a forward LSTM on reversed steps: fused too)."""
    d = 2 if kw.get("bidirectional") else 1
    layers = kw.get("num_layers", 1)
    x = torch.randn(2, 5, 3, requires_grad=True)
    h0 = torch.randn(layers * d, 2, 4, requires_grad=True)
    c0 = torch.randn(layers * d, 2, 4)
    done = check_fused_matches_unfused(lambda: Recurrent(**kw), [x, h0, c0], dtype,
                                       monkeypatch, tmp_path)
    assert done.count(LSTM_DONE) == fused


class GeluMLP(nn.Module):
    def __init__(self, approximate: str, frozen_bias: bool):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 9), nn.Linear(9, 2)
        self.act = nn.GELU(approximate=approximate)
        self.fc1.bias.requires_grad_(not frozen_bias)

    def forward(self, x):
        y = self.fc2(self.act(self.fc1(x)))
        return y.square().mean(), y


@pytest.mark.parametrize(("approximate", "frozen_bias", "dtype"), [
    ("none", False, torch.float64), ("none", False, torch.float32),
    ("tanh", False, torch.float64), ("none", True, torch.float64),
    ("tanh", True, torch.float32)],
    ids=["erf-f64", "erf-f32", "tanh-f64", "erf-frozen_bias-f64", "tanh-frozen_bias-f32"])
def test_bias_gelu(approximate, frozen_bias, dtype, monkeypatch, tmp_path):
    """The bias add folds into the GELU; its gradient comes out of the GELU-gradient pass
    (or, with the bias frozen, BiasGeluGrad_dX without one)."""
    x = torch.randn(3, 4, 6, requires_grad=True)
    done = check_fused_matches_unfused(lambda: GeluMLP(approximate, frozen_bias), [x], dtype,
                                       monkeypatch, tmp_path)
    gelu, grad, fused = (("Gelu", "GeluGrad", "BiasGelu") if approximate == "none" else
                         ("FastGelu", "FastGeluGrad", "FastGelu"))
    assert f"Add + {gelu} -> {fused}" in done
    assert (f"{grad} -> Bias{gelu}Grad_dX" if frozen_bias else
            f"{grad} + ReduceSum -> BiasGeluGradWithBiasGrad") in done


class HeadSplit(nn.Module):
    """minGPT's q/k/v split and head reshape."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.heads, self.qkv = heads, nn.Linear(d, 3 * d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return y.square().sum(), y


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_split_views(dtype, monkeypatch, tmp_path):
    x = torch.randn(2, 5, 8, requires_grad=True)
    done = check_fused_matches_unfused(HeadSplit, [x], dtype, monkeypatch, tmp_path)
    assert "Split (read by Reshapes) -> SplitView" in done


class HeadsAttention(nn.Module):
    """minGPT's attention: qkv split into heads, causal scores, merged heads, projection."""

    def __init__(self, d: int = 12, heads: int = 3):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * 0.3
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        y = self.proj(y)
        return y.square().sum(), y


@pytest.mark.parametrize(("shape", "dtype"), [
    ((2, 5, 12), torch.float64), ((2, 5, 12), torch.float32), ((1, 1, 12), torch.float64),
    ((3, 7, 12), torch.float32)], ids=["f64", "f32", "one_token-f64", "odd-f32"])
def test_attention_products_on_head_views(shape, dtype, monkeypatch, tmp_path):
    """The batched products read the head-split views as 4-D MatMuls (no 3-D reshape
    copies), the merged heads and the qkv gradient's Concat are written by the GEMMs in
    place (MatMulMergeHeads), and the unread view nodes are gone."""
    x = torch.randn(*shape, requires_grad=True)
    done = check_fused_matches_unfused(HeadsAttention, [x], dtype, monkeypatch, tmp_path)
    assert done.count("Reshape 3-D + MatMul + Reshape 4-D -> 4-D MatMul on the views") == 6
    assert "MatMul + merge heads -> MatMulMergeHeads" in done
    assert "3 x (MatMul + merge heads) + Concat -> MatMulMergeHeads" in done
    assert any(d.endswith("unread view nodes dropped") for d in done)


def test_merge_heads_kernel_against_torch_and_bad_input():
    from onnx import TensorProto as TP
    from onnx import helper as h

    from ortcpu_torch.graph import Executor, GraphRunError

    a = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    b = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    c = torch.randn(2, 3, 6, 4, dtype=torch.float64)  # c @ d is [2, 3, 6, 5]: merged transposed
    d = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    node = h.make_node("MatMulMergeHeads", ["a", "b", "c", "d"], ["y"],
                       domain=training_fusions.DOMAIN, transposed=[0, 1])
    vis = [h.make_tensor_value_info(n, TP.DOUBLE, [f"{n}{k}" for k in range(4)])
           for n in "abcd"]
    graph = h.make_graph([node], "g", vis, [h.make_empty_tensor_value_info("y")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                               h.make_opsetid(training_fusions.DOMAIN, 1)])
    ex = Executor(model, check=False)
    got = ex.run({"a": a, "b": b, "c": c, "d": d})["y"]
    want = torch.cat([(a @ b).transpose(1, 2).reshape(2, 5, 18),
                      (c @ d).transpose(-1, -2).transpose(1, 2).reshape(2, 5, 18)], dim=-1)
    torch.testing.assert_close(got, want)
    with pytest.raises(GraphRunError, match="MatMulMergeHeads: every product must be"):
        ex.run({"a": a, "b": b, "c": c, "d": d[:, :, :, :4]})


class GeluPool(nn.Module):
    def __init__(self, approximate: str = "none", shared: bool = False):
        super().__init__()
        self.conv, self.act = nn.Conv2d(2, 3, 3, padding=1), nn.GELU(approximate=approximate)
        self.shared = shared

    def forward(self, x):
        z = self.act(self.conv(x))
        y = F.max_pool2d(z, 2)
        loss = y.square().sum() + (z.sum() if self.shared else 0)
        return loss, y


def _with_gelu_pool_pass(monkeypatch):
    """The opt-in GELU + 2x2 pool pass inserted after the MaxPool 2x2 pass it builds on."""
    passes = list(training_fusions.PASSES)
    passes.insert(passes.index(training_fusions._maxpool_2x2) + 1,
                  training_fusions.OPTIONAL_PASSES["gelu_maxpool_2x2"])
    monkeypatch.setattr(training_fusions, "PASSES", passes)


def test_gelu_maxpool_2x2_is_off_by_default(monkeypatch):
    """Measured slower than Gelu + MaxPool2x2Train (module docstring): not a default pass;
    the pool alone is still rewritten."""
    assert training_fusions.OPTIONAL_PASSES["gelu_maxpool_2x2"] not in training_fusions.PASSES
    x = torch.randn(2, 2, 6, 8, requires_grad=True)
    done = check_fused_matches_unfused(GeluPool, [x], torch.float64, monkeypatch)
    assert "MaxPool 2x2 + MaxPoolGrad -> MaxPool2x2Train + MaxPool2x2TrainGrad" in done
    assert not any("GeluMaxPool2x2Train" in d for d in done)


@pytest.mark.parametrize(("hw", "approximate", "dtype"), [
    ((6, 8), "none", torch.float64), ((6, 8), "none", torch.float32),
    ((7, 5), "tanh", torch.float64), ((2, 3), "none", torch.float32)],
    ids=["even-f64", "even-f32", "odd-tanh-f64", "smallest-f32"])
def test_gelu_maxpool_2x2(hw, approximate, dtype, monkeypatch, tmp_path):
    """GELU feeding only a 2x2 pool runs as one forward (the GELU output never stored) and
    one backward (the slope at the maxima only); odd maps leave the last row / column out
    of every window, their gradient 0."""
    _with_gelu_pool_pass(monkeypatch)
    x = torch.randn(2, 2, *hw, requires_grad=True)
    done = check_fused_matches_unfused(lambda: GeluPool(approximate), [x], dtype,
                                       monkeypatch, tmp_path)
    gelu = "FastGelu" if approximate == "tanh" else "Gelu"
    assert f"MaxPool2x2TrainGrad + {gelu}Grad -> GeluMaxPool2x2TrainGrad; {gelu} + " \
        "MaxPool2x2Train -> GeluMaxPool2x2Train" in done


def test_gelu_maxpool_2x2_wide_map_fuses_the_backward_only(monkeypatch):
    _with_gelu_pool_pass(monkeypatch)
    x = torch.randn(1, 2, 4, 18, requires_grad=True)
    done = check_fused_matches_unfused(GeluPool, [x], torch.float64, monkeypatch)
    assert "MaxPool2x2TrainGrad + GeluGrad -> GeluMaxPool2x2TrainGrad" in done


def test_gelu_read_elsewhere_is_not_fused_with_its_pool(monkeypatch):
    _with_gelu_pool_pass(monkeypatch)
    x = torch.randn(2, 2, 4, 4, requires_grad=True)
    done = check_fused_matches_unfused(lambda: GeluPool(shared=True), [x], torch.float64,
                                       monkeypatch)
    assert not any("GeluMaxPool2x2Train" in d for d in done)


def test_gelu_maxpool_kernels_against_torch_nan_and_bad_input():
    from onnx import TensorProto as TP
    from onnx import helper as h

    from ortcpu_torch.graph import Executor, GraphRunError

    x = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    x[0, 0, 1, 1] = float("nan")
    dy = torch.randn(2, 3, 2, 3, dtype=torch.float64)
    dom = training_fusions.DOMAIN
    nodes = [h.make_node("GeluMaxPool2x2Train", ["x"], ["y", "code"], domain=dom),
             h.make_node("GeluMaxPool2x2TrainGrad", ["dy", "x", "code"], ["dx"], domain=dom)]
    vis = [h.make_tensor_value_info("x", TP.DOUBLE, ["n", "c", "h", "w"]),
           h.make_tensor_value_info("dy", TP.DOUBLE, ["n", "c", "oh", "ow"])]
    graph = h.make_graph(nodes, "g", vis,
                         [h.make_empty_tensor_value_info(o) for o in ("y", "code", "dx")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                               h.make_opsetid(dom, 1)])
    ex = Executor(model, check=False)
    got = ex.run({"x": x, "dy": dy})
    xr = x.clone().requires_grad_()
    y = F.max_pool2d(F.gelu(xr), 2)
    y.backward(dy)
    torch.testing.assert_close(got["y"], y.detach(), equal_nan=True)
    assert got["y"][0, 0, 0, 0].isnan()
    torch.testing.assert_close(got["dx"], xr.grad, equal_nan=True)
    with pytest.raises(GraphRunError, match="GeluMaxPool2x2TrainGrad: dY"):
        ex.run({"x": x, "dy": dy[:, :, :1]})
    with pytest.raises(GraphRunError, match="GeluMaxPool2x2Train: X must be"):
        ex.run({"x": x[:, :, :1], "dy": dy})


def test_bmm_strided_writes_side_by_side_heads_and_rejects_overlapping_outputs():
    from ortcpu_torch.kernels.gemm import bmm_strided

    a, b = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 4, 6)
    buf = torch.full((2, 5, 3 * 6 + 2), 7.0)  # 2 spare columns per row stay untouched
    out = buf[:, :, 1:19].view(2, 5, 3, 6).transpose(1, 2)
    bmm_strided("test", a, b, out=out)
    torch.testing.assert_close(buf[:, :, 1:19], (a @ b).transpose(1, 2).reshape(2, 5, 18))
    assert (buf[:, :, 0] == 7).all() and (buf[:, :, 19] == 7).all()
    overlapping = torch.empty(2, 5, 10).as_strided((2, 3, 5, 6), (50, 2, 10, 1))
    with pytest.raises(RuntimeError, match="overlap"):
        bmm_strided("test", a, b, out=overlapping)


def test_dead_views_keeps_values_read_only_inside_a_subgraph():
    from onnx import TensorProto as TP
    from onnx import helper as h

    from ortcpu_torch.graph import training_fusions_attention as att
    from ortcpu_torch.graph.training_rewrite import Rewrite

    then = h.make_graph([h.make_node("Identity", ["t"], ["y_then"])], "then", [],
                        [h.make_tensor_value_info("y_then", TP.FLOAT, [2])])
    other = h.make_graph([h.make_node("Identity", ["x"], ["y_else"])], "else", [],
                         [h.make_tensor_value_info("y_else", TP.FLOAT, [2])])
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[0]),
             h.make_node("Transpose", ["x"], ["unread"], perm=[0]),
             h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2]),
                                      h.make_tensor_value_info("c", TP.BOOL, [])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    g = Rewrite(model, {})
    att.dead_views(g)
    assert [n.output[0] for n in g.result().graph.node] == ["t", "y"]
