"""Per-lowering parity: each family of ATen lowerings captured in one module (one capture per
family keeps the run short) and run in onnxruntime 1.19.2's InferenceSession vs torch.

float32, tolerance 1e-5 relative / 1e-5 absolute unless a case says otherwise (measured
worst cases are at the float32 rounding level; transcendental ops differ by a few ulp).
"""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ortcpu_torch.graph import CaptureError, capture

from .capture_util import ort_gradients, ort_run, torch_gradients

pytest.importorskip("onnxruntime")


class Fn(nn.Module):
    """Wraps a function of tensors returning a list of named outputs."""

    def __init__(self, fn, params=None):
        super().__init__()
        self.fn = fn
        for k, v in (params or {}).items():
            if k.startswith("buf_"):
                self.register_buffer(k, v)
            else:
                self.register_parameter(k, nn.Parameter(v))

    def forward(self, *xs):
        return self.fn(self, *xs)


def check_family(fn, args, *, params=None, train=False, rtol=1e-5, atol=1e-5, ops=()):
    """Capture fn, run in ORT, compare every output with torch; returns the graph."""
    model = Fn(fn, params)
    graph = capture(model, args, train=train, standard_only=not train)
    onnx.checker.check_model(graph.model, full_check=True)
    types = {n.op_type for n in graph.model.graph.node}
    for op in ops:
        assert op in types, f"expected an ONNX {op} node, got {sorted(types)}"
    outs = ort_run(graph.model, graph.feeds(model, args))
    with torch.no_grad():
        expected = model(*args)
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    assert len(expected) == len(graph.user_outputs)
    for i, (name, exp) in enumerate(zip(graph.user_outputs, expected, strict=True)):
        got = outs[name]
        assert got.dtype == exp.dtype, f"output {i}: dtype {got.dtype} vs {exp.dtype}"
        assert got.shape == exp.shape, f"output {i}: shape {tuple(got.shape)} vs {exp.shape}"
        torch.testing.assert_close(got, exp, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, i=i: f"output {i}: {m}")
    return graph


def test_elementwise_arithmetic_and_promotion():
    x = torch.randn(3, 4) * 3
    y = torch.rand(3, 4) + 0.5
    i = torch.randint(-7, 8, (3, 4))
    j = torch.randint(1, 5, (4,))

    def fn(m, x, y, i, j):
        return [
            x + y, torch.add(x, y, alpha=2.5), x - y, torch.sub(x, 3, alpha=2), x * 1.5, x / y,
            2 - x, torch.div(x, y, rounding_mode="floor"), torch.div(x, y, rounding_mode="trunc"),
            torch.div(i, j, rounding_mode="floor"), torch.div(i, j, rounding_mode="trunc"),
            i / j, i % j, x % y, torch.fmod(x, y), x ** 3, x ** 2, 2.0 ** x, torch.pow(y, x),
            i + 1.5, i * 2, i + x, (i > 0) + (j > 2), x.to(torch.int64), i.float(),
            torch.maximum(x, y), torch.minimum(x, y), torch.lerp(x, y, 0.3),
            torch.addcmul(x, x, y, value=0.5), torch.addcdiv(x, x, y, value=2.0), -i, i.abs(),
            x.trunc(),
        ]

    check_family(fn, (x, y, i, j), ops=("Mod", "Floor", "Cast"))


def test_elementwise_unary_and_activations():
    x = torch.cat([torch.randn(30) * 4, torch.tensor([0.0, -0.0, 25.0, -25.0, 0.5, 1.5, -2.5])])
    pos = x.abs() + 0.1

    def fn(m, x, pos):
        return [
            x.neg(), x.abs(), x.exp(), pos.log(), pos.sqrt(), pos.rsqrt(), x.sin(), x.cos(),
            x.tanh(), x.sigmoid(), x.relu(), torch.erf(x), pos.reciprocal(), x.floor(),
            x.ceil(), x.round(), x.sign(), pos.log1p(), (x / 10).expm1(), pos.log2(),
            pos.log10(), torch.exp2(x / 4), x.clamp(-1, 2), x.clamp(min=0.5), x.clamp(max=-0.5),
            F.hardtanh(x), F.leaky_relu(x, 0.1), F.elu(x), F.selu(x), F.silu(x),
            F.hardsigmoid(x), F.hardswish(x), F.softplus(x), F.softplus(x, beta=2, threshold=5),
            F.gelu(x), F.gelu(x, approximate="tanh"), F.relu6(x), F.mish(x), F.logsigmoid(x),
            torch.atan(x), torch.asin(x / 30), torch.sinh(x / 5), torch.cosh(x / 5),
        ]

    check_family(fn, (x, pos), rtol=2e-5, atol=2e-6, ops=("Erf", "Tanh"))


def test_comparisons_where_and_masks():
    x = torch.randn(4, 5)
    y = torch.randn(4, 5)
    y[0, 0] = x[0, 0]
    n = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])

    def fn(m, x, y, n):
        b = x > 0
        return [
            x == y, x != y, x < y, x <= y, x > 0.5, x >= y, b & (y > 0), b | (y > 0),
            b ^ (y > 0), ~b, torch.logical_and(b, y > 0), torch.logical_not(b),
            torch.where(b, x, y), torch.where(b, x, 0.0), torch.where(b, 1.0, y),
            x.masked_fill(b, -1.0), x.masked_fill(~b, float("-inf")), n.isnan(), n.isinf(),
            torch.isfinite(n),
        ]

    check_family(fn, (x, y, n), ops=("Where", "Equal"))


def test_views_and_indexing():
    x = torch.randn(2, 3, 4)
    idx = torch.tensor([2, 0, 1, 2])
    rows = torch.tensor([[0, 1], [1, 0]])
    gidx = torch.randint(0, 4, (2, 3, 2))

    def fn(m, x, idx, rows, gidx):
        z = x.clone()
        z[:, 1] = 0.5
        w = x.clone()
        w[1] += 1.0
        return [
            x.view(6, 4), x.reshape(-1), x.permute(2, 0, 1), x.transpose(0, 2), x.t_copy()
            if False else x[0].t(), x.unsqueeze(1), x[:, :1].squeeze(1), x[:1].squeeze(),
            x[0:1].expand(5, 3, 4), x[:, ::2], x[..., 1:-1], x[:, -1], x.narrow(2, 1, 2),
            torch.cat([x, x * 2], dim=1), torch.stack([x, -x], dim=-1),
            *x.split([1, 3], dim=2), *x.chunk(3, dim=1), *x.unbind(0),
            x.index_select(2, idx), x[:, :, idx], x[rows], x[rows, idx[:2]],
            torch.gather(x, 2, gidx), x.flatten(1), z, w,
            x.flip(0, 2), x.repeat(1, 2, 1), torch.tril(x[0]), torch.triu(x[0], 1),
            F.pad(x, (1, 2)), F.pad(x, (0, 0, 1, 1), value=3.0), x.cumsum(1),
        ]

    check_family(fn, (x, idx, rows, gidx), ops=("Gather", "GatherND", "Slice"))


def test_scatter_index_put_and_factories():
    x = torch.randn(5, 3)
    idx = torch.tensor([4, 0, -1])
    src = torch.randn(5, 3)
    sidx = torch.randint(0, 5, (2, 3))

    def fn(m, x, idx, src, sidx):
        return [
            x.index_put((idx,), torch.ones(3)), x.index_put((idx[:2],), src[:2], accumulate=True),
            torch.scatter(x, 0, sidx, src[:2]), torch.scatter(x, 0, sidx, 2.0),
            torch.scatter_add(x, 0, sidx, src[:2]),
            torch.zeros(2, 3), torch.ones(4, dtype=torch.int64), torch.full((2, 2), 7.5),
            torch.arange(6), torch.arange(1, 4, 0.5), torch.zeros_like(x), torch.ones_like(idx),
            torch.full_like(x, -2.0), x.new_zeros(3), x + torch.tensor(2.0),
            torch.topk(x, 2, dim=0).values, torch.topk(x, 2, dim=1, largest=False).indices,
        ]

    check_family(fn, (x, idx, src, sidx), ops=("ScatterND", "ScatterElements"))


def test_reductions_softmax_and_matmul():
    x = torch.randn(3, 4, 5)
    a = torch.randn(4, 6)
    b = torch.randn(6, 3)
    bias = torch.randn(3)
    mask = torch.rand(3, 4) > 0.5

    def fn(m, x, a, b, bias, mask):
        return [
            x.sum(), x.sum(1), x.sum((0, 2), keepdim=True), x.mean(-1), x.mean((0, 1)),
            x.amax(1), x.amin((0, 2)), x.max(1).values, x.max(2).indices, x.min(0).values,
            x.argmax(1), x.argmin(), x.argmax(-1, keepdim=True), x.prod(2), x.var(1),
            x.var(2, correction=0), x.std(0), x.max(), mask.any(1), mask.all(), mask.sum(1),
            F.softmax(x, dim=1), F.log_softmax(x, dim=-1), a @ b, torch.bmm(x, x.transpose(1, 2)),
            torch.addmm(bias, a, b), torch.addmm(bias, a, b, beta=0.5, alpha=2.0), x @ a[:5, :4].t()
            if False else x @ torch.ones(5, 2), torch.einsum("bij,jk->bik", x, torch.ones(5, 2)),
            torch.baddbmm(x, x, torch.ones(3, 5, 5), alpha=0.5),
        ]

    check_family(fn, (x, a, b, bias, mask), rtol=1e-5, atol=2e-5, ops=("ReduceSum", "TopK"))


def test_layers():
    x1 = torch.randn(2, 3, 11)
    x2 = torch.randn(2, 4, 9, 9)
    tok = torch.randint(0, 10, (2, 5))
    q = torch.randn(2, 2, 5, 4)
    amask = torch.rand(5, 5) > 0.3
    amask[:, 0] = True
    p = {
        "w1": torch.randn(6, 3, 3), "w2": torch.randn(8, 2, 3, 3), "wt": torch.randn(4, 3, 2, 2),
        "emb": torch.randn(10, 4), "g": torch.rand(9) + 0.5, "buf_rm": torch.randn(4),
        "buf_rv": torch.rand(4) + 0.5,
    }

    def fn(m, x1, x2, tok, q, amask):
        return [
            F.conv1d(x1, m.w1, stride=2, padding=1), F.conv2d(x2, m.w2, groups=2, dilation=2),
            F.conv2d(x2, m.w2, groups=2, padding="same"), F.conv1d(x1[0], m.w1),
            F.conv_transpose2d(x2, m.wt, stride=2, output_padding=1),
            F.max_pool1d(x1, 3, 2), F.max_pool2d(x2, 2, ceil_mode=True),
            F.max_pool2d(x2, 3, 2, padding=1), F.avg_pool2d(x2, 2, count_include_pad=False),
            F.avg_pool2d(x2, 3, 2, padding=1), F.adaptive_avg_pool2d(x2, 1),
            F.adaptive_avg_pool2d(x2[..., :8, :8], (2, 4)), F.layer_norm(x2, (9,)),
            F.layer_norm(x2, (9, 9)), F.layer_norm(x2, (9,), m.g, None, eps=1e-3),
            F.batch_norm(x2, m.buf_rm, m.buf_rv, training=False), F.embedding(tok, m.emb),
            F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True),
            F.scaled_dot_product_attention(q, q, q * 2, attn_mask=amask),
            F.scaled_dot_product_attention(q, q, q, attn_mask=amask.float() * -2.0, scale=0.3),
            F.nll_loss(F.log_softmax(x1, 1), tok[:, :1].expand(2, 11) % 3),
        ]

    check_family(fn, (x1, x2, tok, q, amask), params=p, rtol=1e-4, atol=2e-5,
                 ops=("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LayerNormalization"))


@pytest.mark.parametrize("case", [
    dict(), dict(weight=True), dict(ignore_index=1), dict(label_smoothing=0.2),
    dict(label_smoothing=0.1, weight=True, ignore_index=0), dict(reduction="sum"),
    dict(reduction="none", label_smoothing=0.3), dict(probs=True), dict(probs=True, weight=True,
                                                                        label_smoothing=0.1),
    dict(kdim=True, weight=True, label_smoothing=0.1), dict(unbatched=True),
])
def test_cross_entropy_variants_forward_and_ort_gradients(case):
    """cross_entropy lowered to SoftmaxCrossEntropyLoss (+ smoothing / probability terms):
    loss and the logits' producer gradients in ORT vs torch."""
    classes = 5
    shape = (6, classes, 3) if case.get("kdim") else (6, classes)
    if case.get("unbatched"):
        shape = (classes,)
    x = torch.randn(*shape[:1], 4) if len(shape) > 1 else torch.randn(4)
    tshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
    target = (torch.rand(shape).softmax(1 if len(shape) > 1 else 0) if case.get("probs")
              else torch.randint(0, classes, tshape))
    if not case.get("probs") and target.dim():
        target.view(-1)[:2] = 1
    kw = dict(reduction=case.get("reduction", "mean"),
              label_smoothing=case.get("label_smoothing", 0.0))
    if "ignore_index" in case:
        kw["ignore_index"] = case["ignore_index"]
    weight = torch.rand(classes) + 0.5 if case.get("weight") else None

    class CE(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, classes * (3 if case.get("kdim") else 1))

        def forward(self, x, target):
            logits = self.proj(x)
            if case.get("kdim"):
                logits = logits.view(x.shape[0], classes, 3)
            loss = F.cross_entropy(logits, target, weight=weight, **kw)
            return loss.sum() if kw["reduction"] == "none" else loss

    model = CE()
    graph = capture(model, (x, target), train=True)
    onnx.checker.check_model(graph.model, full_check=True)
    assert "SoftmaxCrossEntropyLoss" in {n.op_type for n in graph.model.graph.node} or \
        case.get("probs")
    feeds = graph.feeds(model, (x, target))
    out = ort_run(graph.model, feeds)[graph.user_outputs[0]]
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, target), rtol=1e-5, atol=1e-6)
    loss, grads = ort_gradients(graph, model, feeds)
    ref_loss, ref_grads = torch_gradients(copy.deepcopy(model), (x, target), 0)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6, msg=k)


def test_dynamic_batch_sizes_become_shape_ops():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 3)

        def forward(self, x):
            b = x.shape[0]
            h = self.fc(x.view(b, -1))
            return h.view(b, 3, 1).expand(b, 3, 2) + torch.zeros(b, 1, 1)

    model = Net()
    x = torch.randn(4, 3, 4)
    batch = torch.export.Dim("batch", min=2, max=64)
    graph = capture(model, (x,), dynamic_shapes=({0: batch},), standard_only=True)
    types = {n.op_type for n in graph.model.graph.node}
    assert {"Shape", "Gather", "Concat"} <= types
    for n in (2, 5, 9):
        xs = torch.randn(n, 3, 4)
        out = ort_run(graph.model, graph.feeds(model, (xs,)))[graph.user_outputs[0]]
        torch.testing.assert_close(out, model(xs).detach(), rtol=1e-5, atol=1e-6)


def test_unsupported_op_error_names_op_module_and_line():
    class Inner(nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x)  # no ONNX lowering

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x) + 1

    with pytest.raises(CaptureError) as e:
        capture(Outer(), (torch.randn(3),))
    msg = str(e.value)
    assert "aten.special_bessel_j0" in msg
    assert "module 'inner' (Inner)" in msg
    assert "test_capture_ops.py" in msg and "bessel_j0(x)" in msg


def test_data_dependent_control_flow_is_a_capture_error():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(CaptureError, match="torch.export could not capture Branchy"):
        capture(Branchy(), (torch.randn(3),))


def test_bad_arguments():
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        capture(lambda x: x, (torch.randn(2),))
    with pytest.raises(CaptureError, match="scale_grad_by_freq"):
        capture(nn.Embedding(5, 3, scale_grad_by_freq=True), (torch.tensor([0, 1]),))


def test_embedding_padding_idx_reads_a_gradient_free_copy():
    emb = nn.Embedding(5, 3, padding_idx=0)
    train = capture(emb, (torch.tensor([0, 1]),), train=True)
    assert train.detached == {"weight.detached": "weight"}
    graph = capture(emb, (torch.tensor([0, 1]),), train=False)  # eval: one Gather
    assert [n.op_type for n in graph.model.graph.node] == ["Gather"]


def test_group_norm_cumprod_and_boolean_masks_run_in_onnxruntime():
    x = torch.randn(2, 6, 3, 4)
    v = torch.randn(3, 5)

    def fn(m, x, v):
        z = v.clone()
        z[v > 0.5] = -1.0
        return [F.group_norm(x, 3, m.w, m.b, eps=1e-4), F.group_norm(x, 2),
                torch.cumprod(v, 1), torch.cumprod(v, 0), v[v > 0], v[v[:, 0] > 0], z]

    check_family(fn, (x, v), params={"w": torch.rand(6) + 0.5, "b": torch.randn(6)},
                 ops=("InstanceNormalization", "NonZero", "GatherND", "Where"))
