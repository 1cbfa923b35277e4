"""Small ONNX forward models (built with onnx.helper) for the on-device training tests.

Each builder returns an ``onnx.ModelProto`` whose initializers are the parameters, in the
shape ``torch.onnx.export`` gives such models (Gemm with transB=1, BatchNormalization in
training mode with its running-statistics outputs, ONNX GRU). Opset 17, IR version 8.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _init(rng, name, shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    bound = scale if scale is not None else 1.0 / np.sqrt(fan_in)
    return numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), name)


def _model(nodes, inputs, outputs, inits, name):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                          producer_name="ortcpu_torch-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def mlp(sizes=(20, 32, 10), seed=0) -> onnx.ModelProto:
    """Linear-ReLU-...-Linear; input "input" [batch, sizes[0]], output "output"."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "input"
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
        w, bias = f"fc{i + 1}.weight", f"fc{i + 1}.bias"
        inits += [_init(rng, w, (b, a)), _init(rng, bias, (b,), 1.0 / np.sqrt(a))]
        y = "output" if i == len(sizes) - 2 else f"fc{i + 1}_out"
        nodes.append(helper.make_node("Gemm", [x, w, bias], [y], transB=1))
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [y], [f"relu{i + 1}"]))
            y = f"relu{i + 1}"
        x = y
    return _model(nodes,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sizes[0]])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                                 ["batch", sizes[-1]])],
                  inits, "mlp")


def cnn(channels=4, classes=10, hw=8, seed=0, pool=True) -> onnx.ModelProto:
    """Conv3x3 - BatchNorm (training mode) - ReLU - MaxPool2 (if ``pool``) - Flatten - Linear."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = [_init(rng, "conv.weight", (c, 1, 3, 3)), _init(rng, "conv.bias", (c,), 1 / 3),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "bn.weight"),
             numpy_helper.from_array(rng.uniform(-0.2, 0.2, c).astype(np.float32), "bn.bias"),
             numpy_helper.from_array(np.zeros(c, np.float32), "bn.running_mean"),
             numpy_helper.from_array(np.ones(c, np.float32), "bn.running_var"),
             _init(rng, "fc.weight", (classes, c * (hw // 2 if pool else hw) ** 2)),
             _init(rng, "fc.bias", (classes,), 0.1)]
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["conv_out"],
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization",
                         ["conv_out", "bn.weight", "bn.bias", "bn.running_mean",
                          "bn.running_var"],
                         ["bn_out", "bn.running_mean_out", "bn.running_var_out"],
                         epsilon=1e-5, momentum=0.9, training_mode=1),
        helper.make_node("Relu", ["bn_out"], ["relu_out"]),
        helper.make_node("MaxPool", ["relu_out"], ["pool_out"], kernel_shape=[2, 2],
                         strides=[2, 2]) if pool else
        helper.make_node("Identity", ["relu_out"], ["pool_out"]),
        helper.make_node("Flatten", ["pool_out"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["output"], transB=1),
    ]
    return _model(nodes,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                 ["batch", 1, hw, hw])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                                 ["batch", classes])],
                  inits, "cnn")


def gru(features=6, hidden=8, outputs=3, seed=0) -> onnx.ModelProto:
    """Batch-first input [batch, seq, features] -> GRU -> last hidden state -> Linear."""
    rng = np.random.default_rng(seed)
    h = hidden
    inits = [_init(rng, "gru.W", (1, 3 * h, features), 1 / np.sqrt(h)),
             _init(rng, "gru.R", (1, 3 * h, h), 1 / np.sqrt(h)),
             _init(rng, "gru.B", (1, 6 * h), 1 / np.sqrt(h)),
             _init(rng, "fc.weight", (outputs, h)), _init(rng, "fc.bias", (outputs,), 0.1),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([h], np.int64), "hidden")]
    # an explicit zero initial state, as torch exports it (ORT's GRU gradient needs it)
    nodes = [
        helper.make_node("Shape", ["input"], ["in_shape"]),
        helper.make_node("Gather", ["in_shape", "axes0"], ["batch"], axis=0),
        helper.make_node("Concat", ["one", "batch", "hidden"], ["h0_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["h0_shape"], ["h0"],
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
        helper.make_node("Transpose", ["input"], ["seq_first"], perm=[1, 0, 2]),
        helper.make_node("GRU", ["seq_first", "gru.W", "gru.R", "gru.B", "", "h0"],
                         ["all_hidden", "h_last"],
                         hidden_size=h, linear_before_reset=1),
        helper.make_node("Squeeze", ["h_last", "axes0"], ["h"]),
        helper.make_node("Gemm", ["h", "fc.weight", "fc.bias"], ["output"], transB=1),
    ]
    return _model(nodes,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                 ["batch", "seq", features])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                                 ["batch", outputs])],
                  inits, "gru")


def parameter_names(model: onnx.ModelProto) -> list[str]:
    """Float initializers: the parameters."""
    return [t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT]


def layernorm_mlp(features=12, hidden=16, classes=5, seed=0) -> onnx.ModelProto:
    """Linear - LayerNormalization (one output, as torch exports it) - ReLU - Linear."""
    rng = np.random.default_rng(seed)
    inits = [_init(rng, "fc1.weight", (hidden, features)), _init(rng, "fc1.bias", (hidden,)),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, hidden).astype(np.float32),
                                     "ln.weight"),
             numpy_helper.from_array(rng.uniform(-0.1, 0.1, hidden).astype(np.float32),
                                     "ln.bias"),
             _init(rng, "fc2.weight", (classes, hidden)), _init(rng, "fc2.bias", (classes,))]
    nodes = [
        helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        helper.make_node("LayerNormalization", ["h", "ln.weight", "ln.bias"], ["hn"],
                         axis=-1, epsilon=1e-5),
        helper.make_node("Relu", ["hn"], ["hr"]),
        helper.make_node("Gemm", ["hr", "fc2.weight", "fc2.bias"], ["output"], transB=1),
    ]
    return _model(nodes,
                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", features])],
                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", classes])],
                  inits, "layernorm_mlp")
