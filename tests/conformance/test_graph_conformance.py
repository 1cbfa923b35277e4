"""Whole graphs vs onnxruntime-training 1.19.2's InferenceSession: torch-exported inference
models (MLP, CNN with BatchNorm in eval, a transformer encoder block, LSTM) and ORT's own
training / eval / optimizer graphs from ``onnxruntime.training.artifacts``, random feeds.

Tolerances: float32 rtol 1e-4 / atol 1e-5 for inference outputs (the kernels sum in a
different order than ORT's MLAS); gradients rtol 1e-4 / atol 1e-5 as well.
The torch models are exported with torch.onnx's TorchScript exporter (``dynamo=False``), used
here only to produce test models.
"""

import io
import warnings

import numpy as np
import onnx
import pytest
import torch

from ortcpu_torch.graph import Executor, InferenceSession

ort = pytest.importorskip("onnxruntime")
artifacts = pytest.importorskip("onnxruntime.training.artifacts")

RTOL, ATOL = 1e-4, 1e-5


def _ort_session(model: onnx.ModelProto):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.ir_version = min(m.ir_version, 9)  # onnx 1.23 writes IR 10+; ORT 1.19.2 reads <= 10
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _export(module, args, names, dynamic=None, training=False):
    f = io.BytesIO()
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, f, input_names=names, output_names=["out"],
                          dynamic_axes=dynamic, opset_version=17, dynamo=False,
                          training=mode, do_constant_folding=not training)
    return onnx.load_from_string(f.getvalue())


def _compare(model, feeds, rtol=RTOL, atol=ATOL):
    ours = InferenceSession(model).run(None, feeds)
    ref = _ort_session(model).run(None, feeds)
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref, strict=True):
        assert o.shape == r.shape and o.dtype == r.dtype
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
    return ours


class MLP(torch.nn.Module):
    def __init__(self, sizes=(20, 32, 32, 5)):
        super().__init__()
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=False):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers[:-1])

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(y.flatten(1))


class RNN(torch.nn.Module):
    def __init__(self, kind="LSTM"):
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(6, 12, batch_first=True)
        self.fc = torch.nn.Linear(12, 4)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


def _randomize_bn(model):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


# ---- torch-exported inference models ---------------------------------------------------


def test_mlp_export():
    torch.manual_seed(0)
    m = MLP().eval()
    model = _export(m, (torch.randn(4, 20),), ["x"], {"x": {0: "N"}})
    for n in (1, 7):
        _compare(model, {"x": np.random.default_rng(n).standard_normal((n, 20), np.float32)})


def test_cnn_batchnorm_eval_export_and_fusion():
    torch.manual_seed(1)
    m = CNN().eval()
    _randomize_bn(m)
    model = _export(m, (torch.randn(2, 3, 8, 8),), ["x"], {"x": {0: "N"}},)
    model = _unfold_bn(model, m)
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 8), np.float32)
    _compare(model, {"x": x})
    s = InferenceSession(model)
    s.run(None, {"x": x})
    assert "Conv+BatchNormalization folded x1" in s.report()


class ResBlock(torch.nn.Module):
    """3x3 Conv + ReLU, a strided 3x3 Conv plus a strided 1x1 shortcut, ReLU: the Conv
    shapes of a ResNet downsampling block."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 40, 3, stride=2, padding=1)
        self.skip = torch.nn.Conv2d(3, 40, 1, stride=2)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.skip(x))


@pytest.mark.parametrize("kernel", ["packed", "channels", "gemm", "training"])
def test_resnet_block_on_each_conv_kernel(kernel):
    """Each inference Conv kernel the measured choice picks among (forced for every Conv;
    one a build lacks falls back to the row tiles) gives ORT's outputs on an odd map."""
    from ortcpu_torch.graph import conv_infer

    torch.manual_seed(2)
    model = _export(ResBlock().eval(), (torch.randn(2, 3, 11, 9),), ["x"], {"x": {0: "N"}})
    before = conv_infer.get_mode()
    conv_infer.set_mode(kernel)
    try:
        for n in (1, 3):
            _compare(model, {"x": np.random.default_rng(n).standard_normal((n, 3, 11, 9),
                                                                             np.float32)})
    finally:
        conv_infer.set_mode(before)


def _unfold_bn(model, module):
    """torch's exporter already folds eval BN into the Conv; put a BatchNormalization node
    back so the executor's own Conv+BN fold is what is tested."""
    if any(n.op_type == "BatchNormalization" for n in model.graph.node):
        return model
    from onnx import helper, numpy_helper

    g = model.graph
    conv = next(n for n in g.node if n.op_type == "Conv")
    inits = {t.name: t for t in g.initializer}
    w = torch.from_numpy(numpy_helper.to_array(inits[conv.input[1]]).copy())
    b = torch.from_numpy(numpy_helper.to_array(inits[conv.input[2]]).copy())
    bn = module.bn
    # undo the exporter's fold with the module's own parameters: W = W' / s, B = ...
    s = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach()
    w0 = w / s.reshape(-1, 1, 1, 1)
    b0 = (b - bn.bias.detach()) / s + bn.running_mean
    inits[conv.input[1]].CopyFrom(numpy_helper.from_array(w0.numpy(), conv.input[1]))
    inits[conv.input[2]].CopyFrom(numpy_helper.from_array(b0.detach().numpy(), conv.input[2]))
    out = conv.output[0]
    conv.output[0] = out + "_prebn"
    names = ["bn_scale", "bn_bias", "bn_mean", "bn_var"]
    vals = [bn.weight, bn.bias, bn.running_mean, bn.running_var]
    for n, v in zip(names, vals, strict=True):
        g.initializer.append(numpy_helper.from_array(v.detach().numpy(), n))
    node = helper.make_node("BatchNormalization", [out + "_prebn", *names], [out],
                            epsilon=bn.eps, name="bn")
    idx = list(g.node).index(conv)
    g.node.insert(idx + 1, node)
    onnx.checker.check_model(model)
    return model


class EncoderBlock(torch.nn.Module):
    """Pre-LN transformer encoder block: multi-head self-attention and a GELU MLP (written
    out, so the TorchScript exporter emits MatMul/Softmax/LayerNormalization/Erf nodes)."""

    def __init__(self, d=32, heads=4, ff=64):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, ff), torch.nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def test_transformer_encoder_block_export():
    torch.manual_seed(2)
    model = _export(EncoderBlock().eval(), (torch.randn(2, 10, 32),), ["x"],
                    {"x": {0: "B", 1: "T"}})
    for shape in ((2, 10, 32), (1, 7, 32)):
        x = np.random.default_rng(2).standard_normal(shape, np.float32)
        _compare(model, {"x": x}, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_rnn_export(kind):
    torch.manual_seed(3)
    m = RNN(kind).eval()
    model = _export(m, (torch.randn(2, 5, 6),), ["x"])
    x = np.random.default_rng(3).standard_normal((2, 5, 6), np.float32)
    _compare(model, {"x": x})


# ---- ORT's own training graphs -----------------------------------------------------------


def _artifacts(module, args, tmp_path, training_export=True):
    model = _export(module.train(), args, ["x"], training=training_export)
    params = [n for n, _ in module.named_parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        artifacts.generate_artifacts(model, requires_grad=params,
                                     loss=artifacts.LossType.CrossEntropyLoss,
                                     optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=str(tmp_path))
    return {k: onnx.load(str(tmp_path / f"{k}_model.onnx"))
            for k in ("training", "eval", "optimizer")}, dict(module.named_parameters())


def _training_feeds(model, params, x, labels, rng):
    feeds = {}
    for vi in model.graph.input:
        n = vi.name
        if n == "x":
            feeds[n] = x
        elif n == "labels":
            feeds[n] = labels
        elif n == "lazy_reset_grad":
            feeds[n] = np.array([False])
        elif n.endswith("_grad.accumulation.buffer"):
            shape = params[n[: -len("_grad.accumulation.buffer")]].shape
            feeds[n] = rng.standard_normal(shape).astype(np.float32)
        elif n in params:
            feeds[n] = params[n].detach().numpy().copy()
        else:
            raise AssertionError(f"unexpected training input {n}")
    return feeds


def _with_buffer_outputs(model):
    """A copy whose InPlaceAccumulatorV2 nodes also output the updated buffer (ORT keeps
    the in-place result internal otherwise)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    types = {vi.name: vi.type for vi in m.graph.input}
    for node in m.graph.node:
        if node.op_type == "InPlaceAccumulatorV2":
            name = node.input[0] + ".updated"
            node.output.append(name)
            vi = m.graph.output.add()
            vi.name = name
            vi.type.CopyFrom(types[node.input[0]])
    return m


def _run_training_graph(models, params, x, labels, module):
    rng = np.random.default_rng(0)
    train = models["training"]
    used = {t for n in train.graph.node for t in (n.op_type,)}
    feeds = _training_feeds(train, params, x, labels, rng)
    full = _with_buffer_outputs(train)
    # ours with torch tensors: the accumulation buffers are updated in place (ORT writes
    # into its numpy feeds as well, so ours get their own copies first)
    tfeeds = {k: torch.from_numpy(v.copy()) for k, v in feeds.items()}
    before = {k: v.clone() for k, v in tfeeds.items()}
    ref = _ort_session(full).run(None, {k: v.copy() for k, v in feeds.items()})
    ex = Executor(full)
    out = ex.run(tfeeds)
    names = [o.name for o in full.graph.output]
    for name, r in zip(names, ref, strict=True):
        np.testing.assert_allclose(out[name].numpy(), r, rtol=RTOL, atol=ATOL, err_msg=name)
    for k, v in tfeeds.items():
        if k.endswith(".accumulation.buffer"):
            np.testing.assert_allclose(v.numpy(), out[k + ".updated"].numpy())
            assert not torch.equal(v, before[k]), f"{k} was not updated in place"
        else:
            assert torch.equal(v, before[k]), f"{k} was modified"
    # eval graph: ORT 1.19.2 refuses its own eval graph when the export kept training-mode
    # BatchNormalization (3 outputs with training_mode=0), so torch in eval mode is the
    # reference here
    ev = models["eval"]
    efeeds = {vi.name: feeds[vi.name] for vi in ev.graph.input}
    (loss,) = InferenceSession(ev).run(None, efeeds)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(module.eval()(torch.from_numpy(x)),
                                                 torch.from_numpy(labels))
    np.testing.assert_allclose(loss, want.numpy(), rtol=RTOL, atol=ATOL)
    return used


def _run_optimizer_graph(models, params):
    opt = onnx.ModelProto()
    opt.CopyFrom(models["optimizer"])
    node = opt.graph.node[0]
    assert node.op_type == "AdamWOptimizer"
    seq_type = next(vi.type for vi in opt.graph.input if vi.name == "params")
    for out in ("w_new", "m1_new", "m2_new"):
        node.output.append(out)
        vi = opt.graph.output.add()
        vi.name = out
        vi.type.CopyFrom(seq_type)
    rng = np.random.default_rng(5)
    ps = [p.detach().numpy().copy() for p in params.values()]
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in opt.graph.input if vi.type.HasField("tensor_type")}
    feeds = {"learning_rate": np.full(dims["learning_rate"], 1e-2, np.float32),
             "step": np.full(dims["step"], 3, np.int64),
             "params": ps,
             "gradients": [rng.standard_normal(p.shape).astype(np.float32) for p in ps],
             "first_order_moments": [rng.standard_normal(p.shape).astype(np.float32) * 0.1
                                     for p in ps],
             "second_order_moments": [rng.random(p.shape).astype(np.float32) for p in ps]}
    tfeeds = {k: [torch.from_numpy(a.copy()) for a in v] if isinstance(v, list)
              else torch.from_numpy(v.copy()) for k, v in feeds.items()}
    ref = _ort_session(opt).run(None, feeds)
    out = Executor(opt).run(tfeeds)
    assert bool(out[opt.graph.output[0].name]) == bool(ref[0])
    for name, r, fed in zip(("w_new", "m1_new", "m2_new"), ref[1:],
                            ("params", "first_order_moments", "second_order_moments"),
                            strict=True):
        for o, rr, t in zip(out[name], r, tfeeds[fed], strict=True):
            np.testing.assert_allclose(o.numpy(), rr, rtol=1e-5, atol=1e-6, err_msg=name)
            assert o.data_ptr() == t.data_ptr()  # written into the fed tensor


def test_ort_artifacts_mlp(tmp_path):
    torch.manual_seed(4)
    m = MLP((20, 16, 5))
    models, params = _artifacts(m, (torch.randn(4, 20),), tmp_path)
    x = np.random.default_rng(4).standard_normal((4, 20), np.float32)
    labels = np.array([0, 3, 4, 1], np.int64)
    ops = _run_training_graph(models, params, x, labels, m)
    assert {"InPlaceAccumulatorV2", "SoftmaxCrossEntropyLossGrad", "ReluGrad"} <= ops
    _run_optimizer_graph(models, params)


def test_ort_artifacts_cnn_batchnorm(tmp_path):
    torch.manual_seed(5)
    m = CNN()
    models, params = _artifacts(m, (torch.randn(2, 3, 8, 8),), tmp_path)
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8), np.float32)
    labels = np.array([1, 9], np.int64)
    ops = _run_training_graph(models, params, x, labels, m)
    assert {"BatchNormInternal", "BatchNormalizationGrad", "ConvGrad", "MaxPoolGrad",
            "InPlaceAccumulatorV2", "SoftmaxCrossEntropyLossGrad"} <= ops
    _run_optimizer_graph(models, params)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_ort_artifacts_rnn(tmp_path, kind):
    torch.manual_seed(6)
    m = RNN(kind)
    models, params = _artifacts(m, (torch.randn(2, 5, 6),), tmp_path)
    x = np.random.default_rng(6).standard_normal((2, 5, 6), np.float32)
    labels = np.array([0, 3], np.int64)
    ops = _run_training_graph(models, params, x, labels, m)
    assert {f"{kind}Training", f"{kind}Grad", "GatherGrad", "ConcatTraining",
            "SplitTraining", "InPlaceAccumulatorV2"} <= ops
    _run_optimizer_graph(models, params)
