"""The optimizer model: one AdamWOptimizer / SGDOptimizerV2 node over the trainable
parameters, with the graph inputs ONNX Runtime's ``Optimizer`` feeds by name."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ._graph_edit import MS_DOMAIN

IR_VERSION = 8  # ORT 1.19.2 loads IR <= 10; 8 is what its own training models carry

# ORT's defaults (onnxblock.optim.AdamW)
ADAMW_DEFAULTS = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6, "weight_decay": 0.0,
                  "correct_bias": 1, "adam_mode": 1}


def optimizer_model(kind: str, elem_type: int, opset: int) -> onnx.ModelProto:
    """``kind`` is "AdamW" or "SGD"; ``elem_type`` the parameters' ONNX element type."""
    seq = helper.make_tensor_sequence_value_info
    inputs = [helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("step", TensorProto.INT64, [1]),
              seq("params", elem_type, None), seq("gradients", elem_type, None),
              seq("first_order_moments", elem_type, None)]
    flag = "update_completed"
    if kind == "AdamW":
        inputs.append(seq("second_order_moments", elem_type, None))
        node = helper.make_node(
            "AdamWOptimizer", ["learning_rate", "step", "params", "gradients",
                               "first_order_moments", "second_order_moments"], [flag],
            name="AdamWOptimizer", domain=MS_DOMAIN, **ADAMW_DEFAULTS)
    elif kind == "SGD":
        node = helper.make_node("SGDOptimizerV2", ["learning_rate", "params", "gradients"],
                                [flag], name="SGDOptimizerV2", domain=MS_DOMAIN)
    else:
        raise ValueError(f"optimizer: unknown optimizer {kind!r}")
    graph = helper.make_graph([node], "optimizer", inputs,
                              [helper.make_tensor_value_info(flag, TensorProto.BOOL, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="ortcpu_torch")
    model.ir_version = IR_VERSION
    return model
