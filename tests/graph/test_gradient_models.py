"""Whole-model tests of the gradient builder: an MLP, a CNN with BatchNorm/pooling/dropout,
a GPT-style block, LSTM and GRU classifiers (written as the capture writes them) and
torch-exported models at opsets 13-17. Each training graph is full-checked, run in
onnxruntime-training 1.19.2 and on our executor, and every gradient compared with torch
autograd; the MLP and the CNN also against ORT's own gradient builder (generate_artifacts)."""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper as h

from .gradient_harness import (
    F32,
    I64,
    assert_close,
    build,
    make_model,
    rand,
    run_ort,
    run_ours,
    torch_reference,
)

N = h.make_node


def _compare(model, fn, feeds, init, params, atol=2e-5, rtol=1e-4, ours=True, **kw):
    training = build(model, params, **kw)
    want = torch_reference(fn, {**feeds, **init}, params)
    keys = ["loss"] + [f"{p}_grad" for p in params]
    got = run_ort(training, feeds)
    assert_close(got, want, atol, rtol, keys=keys)
    if ours:
        mine = run_ours(training, feeds)
        assert_close(mine, want, atol, rtol, keys=keys)
    return training, got


# ---- MLP -------------------------------------------------------------------------------------


def _mlp(n_in=12, hidden=16, classes=5, log_prob=False):
    init = {"fc1.weight": rand(hidden, n_in, scale=0.3), "fc1.bias": rand(hidden, scale=0.1),
            "fc2.weight": rand(hidden, hidden, scale=0.3), "fc2.bias": rand(hidden, scale=0.1),
            "fc3.weight": rand(classes, hidden, scale=0.3), "fc3.bias": rand(classes, scale=0.1)}
    nodes = [N("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h1"], transB=1),
             N("Relu", ["h1"], ["a1"]),
             N("MatMul", ["a1", "fc2.weight"], ["h2m"]), N("Add", ["h2m", "fc2.bias"], ["h2"]),
             N("Tanh", ["h2"], ["a2"]),
             N("Gemm", ["a2", "fc3.weight", "fc3.bias"], ["logits"], transB=1),
             # ORT's builder needs the log_prob output; ours adds it when missing
             N("SoftmaxCrossEntropyLoss", ["logits", "y"],
               ["loss", "log_prob"] if log_prob else ["loss"])]
    model = make_model(nodes, [("x", F32, ["batch", n_in]), ("y", I64, ["batch"])],
                       [("loss", F32, []), ("logits", F32, ["batch", classes])], init)

    def fn(x, y, **p):
        a1 = torch.relu(F.linear(x, p["fc1.weight"], p["fc1.bias"]))
        a2 = torch.tanh(a1 @ p["fc2.weight"] + p["fc2.bias"])
        return F.cross_entropy(F.linear(a2, p["fc3.weight"], p["fc3.bias"]), y)

    return model, fn, init


def test_mlp_matches_torch_and_ort_generate_artifacts(tmp_path):
    feeds = {"x": rand(8, 12), "y": np.random.randint(0, 5, 8).astype(np.int64)}
    for log_prob in (False, True):
        model, fn, init = _mlp(log_prob=log_prob)
        params = list(init)
        training, got = _compare(model, fn, feeds, init, params)
    _compare_with_ort_artifacts(model, training, feeds, init, params, tmp_path)


def _compare_with_ort_artifacts(model, training, feeds, init, params, tmp_path, atol=1e-6):
    """ORT's generate_artifacts training model (params as inputs, gradients through
    InPlaceAccumulatorV2, which ORT runs in place on the fed buffers) on the same feeds
    gives the same gradients as ours."""
    from onnxruntime.training import artifacts

    artifacts.generate_artifacts(model, requires_grad=params, artifact_directory=str(tmp_path))
    theirs = onnx.load(str(tmp_path / "training_model.onnx"))
    names = {i.name for i in theirs.graph.input}
    ort_feeds = dict(feeds)
    for p in params:
        ort_feeds[p] = init[p]
        ort_feeds[f"{p}_grad.accumulation.buffer"] = np.zeros_like(init[p])
    ort_feeds["lazy_reset_grad"] = np.asarray([True])
    ort_feeds = {k: v for k, v in ort_feeds.items() if k in names}
    ref = run_ort(theirs, ort_feeds)
    mine = run_ort(training, feeds)
    np.testing.assert_allclose(mine["loss"], ref["loss"], rtol=1e-6)
    for p in params:
        np.testing.assert_allclose(mine[f"{p}_grad"], ort_feeds[f"{p}_grad.accumulation.buffer"],
                                   atol=atol, rtol=1e-5, err_msg=p)
        assert np.abs(mine[f"{p}_grad"]).max() > 0


def test_mlp_input_gradient_and_seed_inputs():
    """ORTModule's form: gradient w.r.t. the input too, the upstream gradients of two
    outputs fed as graph inputs, params as graph inputs."""
    model, fn, init = _mlp()
    params = ["x", "fc1.weight", "fc3.bias"]
    training = build(model, params, ["loss", "logits"], seed_inputs=True, params_as_inputs=True)
    names = [i.name for i in training.graph.input]
    assert {"loss_grad", "logits_grad", "fc1.weight", "fc3.bias"} <= set(names)
    assert {t.name for t in training.graph.initializer} == set(init) - {"fc1.weight",
                                                                      "fc3.bias"}
    x, y = rand(4, 12), np.random.randint(0, 5, 4).astype(np.int64)
    g_loss, g_logits = np.asarray(0.7, np.float32), rand(4, 5)
    feeds = {"x": x, "y": y, "loss_grad": g_loss, "logits_grad": g_logits,
             "fc1.weight": init["fc1.weight"], "fc3.bias": init["fc3.bias"]}
    got = run_ort(training, feeds)
    mine = run_ours(training, feeds)

    ts = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in params)
          for k, v in {**init, "x": x}.items()}
    a1 = torch.relu(F.linear(ts["x"], ts["fc1.weight"], ts["fc1.bias"]))
    a2 = torch.tanh(a1 @ ts["fc2.weight"] + ts["fc2.bias"])
    logits = F.linear(a2, ts["fc3.weight"], ts["fc3.bias"])
    loss = F.cross_entropy(logits, torch.from_numpy(y))
    grads = torch.autograd.grad([loss, logits], [ts[p] for p in params],
                                [torch.tensor(0.7, dtype=torch.float64),
                                 torch.from_numpy(g_logits).double()])
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_allclose(got[f"{p}_grad"], g.numpy(), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(mine[f"{p}_grad"], g.numpy(), atol=1e-5, rtol=1e-4)


# ---- CNN -------------------------------------------------------------------------------------


def _cnn(pool="MaxPool", dropout=True):
    init = {"conv1.weight": rand(6, 3, 3, 3, scale=0.3), "conv1.bias": rand(6, scale=0.1),
            "bn1.weight": np.abs(rand(6)) + 0.5, "bn1.bias": rand(6, scale=0.1),
            "bn1.running_mean": np.zeros(6, np.float32),
            "bn1.running_var": np.ones(6, np.float32),
            "conv2.weight": rand(8, 6, 3, 3, scale=0.3),
            "fc.weight": rand(4, 8 * 2 * 2, scale=0.2), "fc.bias": rand(4, scale=0.1),
            "class_weight": np.asarray([1.0, 2.0, 0.5, 1.5], np.float32),
            "ratio": np.asarray(0.25, np.float32), "train": np.asarray(True)}
    pool_node = (N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2])
                 if pool == "MaxPool" else
                 N("AveragePool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]))
    nodes = [N("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], pads=[1, 1, 1, 1]),
             N("BatchNormalization", ["c1", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                      "bn1.running_var"],
               ["b1", "bn1.running_mean.updated", "bn1.running_var.updated"],
               training_mode=1, momentum=0.9),
             N("Relu", ["b1"], ["r1"]), pool_node,
             N("Conv", ["p1", "conv2.weight"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             N("AveragePool", ["c2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             N("Flatten", ["p2"], ["f"], axis=1)]
    if dropout:
        nodes.append(N("Dropout", ["f", "ratio", "train"], ["d", "mask"]))
    nodes += [N("Gemm", ["d" if dropout else "f", "fc.weight", "fc.bias"], ["logits"], transB=1),
              N("SoftmaxCrossEntropyLoss", ["logits", "y", "class_weight"],
                ["loss", "log_prob"], ignore_index=3)]
    outs = [("loss", F32, []), ("bn1.running_mean.updated", F32, [6]),
            ("bn1.running_var.updated", F32, [6])]
    if dropout:
        outs.append(("mask", 9, [4, 32]))
    model = make_model(nodes, [("x", F32, [4, 3, 16, 16]), ("y", I64, [4])], outs, init)
    return model, init


def _cnn_torch(pool, mask=None):
    def fn(x, y, **p):
        c1 = F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=1)
        b1 = F.batch_norm(c1, None, None, p["bn1.weight"], p["bn1.bias"], training=True)
        r1 = torch.relu(b1)
        p1 = F.max_pool2d(r1, 2) if pool == "MaxPool" else F.avg_pool2d(r1, 2)
        c2 = F.conv2d(p1, p["conv2.weight"], padding=1, stride=2)
        f = F.avg_pool2d(c2, 2).flatten(1)
        if mask is not None:
            f = f * torch.from_numpy(mask) / 0.75
        logits = F.linear(f, p["fc.weight"], p["fc.bias"])
        return F.cross_entropy(logits, y, weight=p["class_weight"], ignore_index=3)
    return fn


@pytest.mark.parametrize("pool", ["MaxPool", "AveragePool"])
def test_cnn_batchnorm_pool_dropout(pool):
    model, init = _cnn(pool)
    params = [k for k in init if k not in ("bn1.running_mean", "bn1.running_var",
                                           "class_weight", "ratio", "train")]
    training = build(model, params)
    ops = {n.op_type for n in training.graph.node}
    assert {"BatchNormInternal", "BatchNormalizationGrad", "ConvGrad", "DropoutGrad",
            f"{pool}Grad", "SoftmaxCrossEntropyLossGrad"} <= ops
    assert "BatchNormalization" not in ops
    feeds = {"x": rand(4, 3, 16, 16), "y": np.asarray([0, 1, 3, 2], np.int64)}
    got = run_ort(training, feeds)
    want = torch_reference(_cnn_torch(pool, got["mask"]), {**feeds, **init}, params)
    assert_close(got, want, 3e-5, 1e-4, keys=["loss"] + [f"{p}_grad" for p in params])
    x64 = feeds["x"].astype(np.float64)
    mean = F.conv2d(torch.from_numpy(x64), torch.from_numpy(init["conv1.weight"]).double(),
                    torch.from_numpy(init["conv1.bias"]).double(), padding=1).mean((0, 2, 3))
    np.testing.assert_allclose(got["bn1.running_mean.updated"], 0.1 * mean.numpy(), atol=1e-6)


def test_cnn_on_our_executor_matches_ort():
    """Without dropout (the two runtimes draw different masks)."""
    model, init = _cnn("MaxPool", dropout=False)
    params = ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight",
              "fc.weight", "fc.bias"]
    training = build(model, params)
    feeds = {"x": rand(4, 3, 16, 16), "y": np.asarray([0, 1, 3, 2], np.int64)}
    got = run_ort(training, feeds)
    mine = run_ours(training, feeds)
    keys = ["loss", "bn1.running_mean.updated", "bn1.running_var.updated"] + [
        f"{p}_grad" for p in params]
    assert_close(mine, got, 3e-5, 1e-4, keys=keys)


def test_cnn_matches_ort_generate_artifacts(tmp_path):
    """ORT's builder on the same model (no dropout: masks differ between sessions)."""
    model, init = _cnn("MaxPool", dropout=False)
    params = ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight",
              "fc.weight", "fc.bias"]
    training = build(model, params)
    feeds = {"x": rand(4, 3, 16, 16), "y": np.asarray([0, 1, 3, 2], np.int64)}
    _compare_with_ort_artifacts(model, training, feeds, init, params, tmp_path, atol=2e-6)


# ---- GPT-style block -------------------------------------------------------------------------


def _gpt(vocab=11, d=8, heads=2, seq=5, tanh_gelu=False):
    init = {"wte": rand(vocab, d, scale=0.5), "wpe": rand(seq, d, scale=0.5),
            "ln1.weight": np.abs(rand(d)) + 0.5, "ln1.bias": rand(d, scale=0.1),
            "attn.qkv": rand(d, 3 * d, scale=0.3), "attn.qkv_bias": rand(3 * d, scale=0.1),
            "attn.proj": rand(d, d, scale=0.3),
            "ln2.weight": np.abs(rand(d)) + 0.5, "ln2.bias": rand(d, scale=0.1),
            "mlp.fc": rand(d, 4 * d, scale=0.3), "mlp.fc_bias": rand(4 * d, scale=0.1),
            "mlp.proj": rand(4 * d, d, scale=0.3),
            "lm_head": rand(d, vocab, scale=0.3),
            "pos": np.arange(seq, dtype=np.int64),
            "heads_shape": np.asarray([0, seq, heads, d // heads], np.int64),
            "merge_shape": np.asarray([0, seq, d], np.int64),
            "flat_logits": np.asarray([-1, vocab], np.int64),
            "flat_labels": np.asarray([-1], np.int64),
            "scale": np.asarray(1.0 / math.sqrt(d // heads), np.float32),
            "mask": np.triu(np.full((seq, seq), -1e4, np.float32), 1),
            "qkv_split": np.asarray([d, d, d], np.int64)}
    gelu = (N("FastGelu", ["m1", "mlp.fc_bias"], ["g"], domain="com.microsoft") if tanh_gelu
            else N("BiasGelu", ["m1", "mlp.fc_bias"], ["g"], domain="com.microsoft"))
    nodes = [
        N("Gather", ["wte", "tokens"], ["tok"]), N("Gather", ["wpe", "pos"], ["pe"]),
        N("Add", ["tok", "pe"], ["x0"]),
        N("LayerNormalization", ["x0", "ln1.weight", "ln1.bias"], ["n1"]),
        N("MatMul", ["n1", "attn.qkv"], ["qkv0"]), N("Add", ["qkv0", "attn.qkv_bias"], ["qkv"]),
        N("Split", ["qkv", "qkv_split"], ["q0", "k0", "v0"], axis=-1),
        N("Reshape", ["q0", "heads_shape"], ["q1"]),
        N("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        N("Reshape", ["k0", "heads_shape"], ["k1"]),
        N("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        N("Reshape", ["v0", "heads_shape"], ["v1"]),
        N("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        N("MatMul", ["q", "kt"], ["s0"]), N("Mul", ["s0", "scale"], ["s1"]),
        N("Add", ["s1", "mask"], ["s2"]), N("Softmax", ["s2"], ["att"], axis=-1),
        N("MatMul", ["att", "v"], ["o0"]), N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        N("Reshape", ["o1", "merge_shape"], ["o2"]), N("MatMul", ["o2", "attn.proj"], ["o3"]),
        N("Add", ["x0", "o3"], ["x1"]),
        N("LayerNormalization", ["x1", "ln2.weight", "ln2.bias"], ["n2", "n2_mean", "n2_inv"]),
        N("MatMul", ["n2", "mlp.fc"], ["m1"]), gelu,
        N("MatMul", ["g", "mlp.proj"], ["m2"]), N("Add", ["x1", "m2"], ["x2"]),
        N("MatMul", ["x2", "lm_head"], ["logits"]),
        N("Reshape", ["logits", "flat_logits"], ["lf"]),
        N("Reshape", ["labels", "flat_labels"], ["yf"]),
        N("SoftmaxCrossEntropyLoss", ["lf", "yf"], ["loss"]),
    ]
    model = make_model(nodes, [("tokens", I64, ["B", seq]), ("labels", I64, ["B", seq])],
                       [("loss", F32, [])], init)

    def fn(tokens, labels, **p):
        x0 = p["wte"][tokens] + p["wpe"][torch.arange(seq)]
        n1 = F.layer_norm(x0, (d,), p["ln1.weight"], p["ln1.bias"])
        q, k, v = (n1 @ p["attn.qkv"] + p["attn.qkv_bias"]).split(d, -1)

        def heads_of(t):
            return t.reshape(t.shape[0], seq, heads, d // heads).transpose(1, 2)

        s = heads_of(q) @ heads_of(k).transpose(-1, -2) / math.sqrt(d // heads)
        att = torch.softmax(s + torch.from_numpy(init["mask"]).double(), -1)
        o = (att @ heads_of(v)).transpose(1, 2).reshape(-1, seq, d)
        x1 = x0 + o @ p["attn.proj"]
        n2 = F.layer_norm(x1, (d,), p["ln2.weight"], p["ln2.bias"])
        g = F.gelu(n2 @ p["mlp.fc"] + p["mlp.fc_bias"],
                   approximate="tanh" if tanh_gelu else "none")
        x2 = x1 + g @ p["mlp.proj"]
        return F.cross_entropy((x2 @ p["lm_head"]).reshape(-1, vocab), labels.reshape(-1))

    return model, fn, init


@pytest.mark.parametrize("tanh_gelu", [False, True])
def test_gpt_block(tanh_gelu):
    model, fn, init = _gpt(tanh_gelu=tanh_gelu)
    params = [k for k, v in init.items() if v.dtype == np.float32 and k not in ("scale", "mask")]
    feeds = {"tokens": np.random.randint(0, 11, (3, 5)).astype(np.int64),
             "labels": np.random.randint(0, 11, (3, 5)).astype(np.int64)}
    training, _ = _compare(model, fn, feeds, init, params)
    ops = {n.op_type for n in training.graph.node}
    assert {"GatherGrad", "LayerNormalizationGrad", "SoftmaxGrad_13",
            "BiasFastGeluGrad_dX" if tanh_gelu else "BiasGeluGrad_dX"} <= ops


# ---- recurrent classifiers ------------------------------------------------------------------


def _rnn_classifier(kind, seq=6, vocab=9, emb=5, hidden=7, classes=3):
    gates = 4 if kind == "LSTM" else 3
    init = {"emb": rand(vocab, emb, scale=0.5), "rnn.W": rand(1, gates * hidden, emb, scale=0.4),
            "rnn.R": rand(1, gates * hidden, hidden, scale=0.4),
            "rnn.B": rand(1, 2 * gates * hidden, scale=0.2),
            "fc.weight": rand(classes, hidden, scale=0.4), "fc.bias": rand(classes, scale=0.1),
            "axis0": np.asarray([0], np.int64)}
    rnn_outs = ["", "yh"] if kind == "GRU" else ["", "yh", ""]
    attrs = {"hidden_size": hidden}
    if kind == "GRU":
        attrs["linear_before_reset"] = 1
    nodes = [N("Gather", ["emb", "tokens"], ["e"]), N("Transpose", ["e"], ["et"], perm=[1, 0, 2]),
             N(kind, ["et", "rnn.W", "rnn.R", "rnn.B"], rnn_outs, **attrs),
             N("Squeeze", ["yh", "axis0"], ["last"]),
             N("Gemm", ["last", "fc.weight", "fc.bias"], ["logits"], transB=1),
             N("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"])]
    model = make_model(nodes, [("tokens", I64, [4, seq]), ("labels", I64, [4])],
                       [("loss", F32, [])], init)
    from .test_gradient_ops import _onnx_gru, _onnx_lstm

    def fn(tokens, labels, **p):
        x = p["emb"][tokens].transpose(0, 1)
        zeros = torch.zeros(1, x.shape[1], hidden, dtype=x.dtype)
        if kind == "LSTM":
            _, hn, _ = _onnx_lstm(x, p["rnn.W"], p["rnn.R"], p["rnn.B"], zeros, zeros)
        else:
            _, hn = _onnx_gru(x, p["rnn.W"], p["rnn.R"], p["rnn.B"], zeros, 1)
        return F.cross_entropy(F.linear(hn[0], p["fc.weight"], p["fc.bias"]), labels)

    return model, fn, init


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("subset", ["all", "W", "emb", "B"])
def test_rnn_classifier(kind, subset):
    """Partial sets too: ORT's LSTMGrad/GRUGrad crash when an output is left out, so the
    builder names all of them."""
    model, fn, init = _rnn_classifier(kind)
    params = {"all": [k for k in init if k != "axis0"], "W": ["rnn.W", "fc.bias"],
              "emb": ["emb"], "B": ["rnn.B"]}[subset]
    feeds = {"tokens": np.random.randint(0, 9, (4, 6)).astype(np.int64),
             "labels": np.asarray([0, 2, 1, 1], np.int64)}
    training, _ = _compare(model, fn, feeds, init, params)
    ops = {n.op_type for n in training.graph.node}
    assert {f"{kind}Training", f"{kind}Grad"} <= ops and kind not in ops


# ---- torch-exported models ---------------------------------------------------------------------


class _TorchNet(torch.nn.Module):
    def __init__(self, bn: bool):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 10)
        self.norm = torch.nn.BatchNorm1d(10) if bn else torch.nn.LayerNorm(10)
        self.fc2 = torch.nn.Linear(10, 4)

    def forward(self, x, y):
        h = F.gelu(self.norm(self.fc1(x)))
        return F.cross_entropy(self.fc2(h), y)


def _export(net, args, opset, training):
    f = io.BytesIO()
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(net, args, f, dynamo=False, opset_version=opset, training=mode,
                          do_constant_folding=False, input_names=["x", "y"],
                          output_names=["loss"])
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("opset", [13, 14, 17])
@pytest.mark.parametrize("bn", [False, True])
def test_torch_exported_model(opset, bn):
    """The legacy exporter's graphs (decomposed LayerNorm below opset 17, Erf GELU,
    training BatchNormalization, SoftmaxCrossEntropyLoss; parameters as FQN
    initializers) train like the torch module."""
    torch.manual_seed(0)
    net = _TorchNet(bn).train()
    x, y = torch.randn(8, 6), torch.randint(0, 4, (8,))
    model = _export(net, (x, y), opset, training=bn)
    params = [n for n, _ in net.named_parameters()]
    init_names = {t.name for t in model.graph.initializer}
    assert set(params) <= init_names
    training = build(model, params)
    got = run_ort(training, {"x": x.numpy(), "y": y.numpy()})
    mine = run_ours(training, {"x": x.numpy(), "y": y.numpy()})
    net.zero_grad()
    loss = net(x, y)
    loss.backward()
    for name, p in net.named_parameters():
        np.testing.assert_allclose(got[f"{name}_grad"], p.grad.numpy(), atol=1e-5, rtol=1e-4,
                                   err_msg=name)
        np.testing.assert_allclose(mine[f"{name}_grad"], p.grad.numpy(), atol=1e-5, rtol=1e-4,
                                   err_msg=name)
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_rnn_classifier_matches_ort_generate_artifacts(kind, tmp_path):
    model, _, init = _rnn_classifier(kind)
    params = [k for k in init if k != "axis0"]
    feeds = {"tokens": np.random.randint(0, 9, (4, 6)).astype(np.int64),
             "labels": np.asarray([0, 2, 1, 1], np.int64)}
    for n in model.graph.node:  # ORT's builder needs SCE's log_prob and the RNN's Y
        if n.op_type == "SoftmaxCrossEntropyLoss":
            n.output.append("log_prob")
        if n.op_type == kind:  # and all its inputs spelled out (h0, c0 as zeros)
            n.output[0] = "rnn_y"
            states = ["h0"] if kind == "GRU" else ["h0", "c0"]
            n.input.extend(["", *states])
    for name in ("h0", "c0"):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            np.zeros((1, 4, 7), np.float32), name))
    training = build(model, params)
    _compare_with_ort_artifacts(model, training, feeds, init, params, tmp_path, atol=1e-6)


def test_gpt_block_matches_ort_generate_artifacts(tmp_path):
    """With both LayerNormalizations giving Mean/InvStdDev (ORT's builder fails on the
    one-output form, ORT issue #19427) and SCE's log_prob."""
    model, _, init = _gpt()
    for n in model.graph.node:
        if n.op_type == "LayerNormalization" and len(n.output) == 1:
            n.output.extend([f"{n.output[0]}_mean", f"{n.output[0]}_inv"])
        if n.op_type == "SoftmaxCrossEntropyLoss":
            n.output.append("log_prob")
    params = [k for k, v in init.items() if v.dtype == np.float32 and k not in ("scale", "mask")]
    feeds = {"tokens": np.random.randint(0, 11, (3, 5)).astype(np.int64),
             "labels": np.random.randint(0, 11, (3, 5)).astype(np.int64)}
    training = build(model, params)
    _compare_with_ort_artifacts(model, training, feeds, init, params, tmp_path, atol=2e-6)


def test_training_graphs_under_ort_default_optimizations():
    """ORT's optimizer (ORT_ENABLE_ALL, its default) rewrites our training graphs without
    changing the results (on-device training runs them that way)."""
    cases = []
    model, _, init = _mlp()
    cases.append((model, list(init), {"x": rand(8, 12),
                                      "y": np.random.randint(0, 5, 8).astype(np.int64)}))
    model, init = _cnn("MaxPool", dropout=False)
    cases.append((model, ["conv1.weight", "bn1.weight", "bn1.bias", "fc.weight"],
                  {"x": rand(4, 3, 16, 16), "y": np.asarray([0, 1, 3, 2], np.int64)}))
    model, _, init = _gpt(tanh_gelu=True)
    cases.append((model, ["wte", "ln1.weight", "mlp.fc", "mlp.fc_bias", "attn.qkv"],
                  {"tokens": np.random.randint(0, 11, (3, 5)).astype(np.int64),
                   "labels": np.random.randint(0, 11, (3, 5)).astype(np.int64)}))
    for kind in ("LSTM", "GRU"):
        model, _, init = _rnn_classifier(kind)
        cases.append((model, ["rnn.W", "emb"],
                      {"tokens": np.random.randint(0, 9, (4, 6)).astype(np.int64),
                       "labels": np.asarray([0, 2, 1, 1], np.int64)}))
    for model, params, feeds in cases:
        training = build(model, params)
        plain = run_ort(training, feeds)
        optimized = run_ort(training, feeds, optimize=True)
        for k in plain:
            np.testing.assert_allclose(optimized[k], plain[k], atol=2e-6, rtol=1e-5, err_msg=k)
