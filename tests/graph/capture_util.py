"""Helpers for the capture tests: run captured graphs in onnxruntime 1.19.2 (forward with
InferenceSession, gradients through ORT's own gradient builder) and compare with torch."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ortcpu_torch.graph import CapturedGraph


def to_numpy(feeds: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in feeds.items()}


def ort_run(model: onnx.ModelProto, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Outputs of ``model`` run by onnxruntime's CPU InferenceSession, by output name."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in to_numpy(feeds).items() if k in names})
    return {o.name: torch.from_numpy(np.asarray(v))
            for o, v in zip(sess.get_outputs(), outs, strict=True)}


def ort_gradients(graph: CapturedGraph, module: torch.nn.Module,
                  feeds: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, {param: grad}) from ORT's generate_artifacts training graph of ``graph``.

    Parameters and buffers become initializers holding the module's values; the first user
    output is the loss.
    """
    import onnxruntime as ort
    from onnxruntime.training import api, artifacts

    ort.set_default_logger_severity(3)
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    state = set(graph.params) | set(graph.buffers)
    keep = [i for i in model.graph.input if i.name not in state]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    for fqn in graph.params:
        model.graph.initializer.append(
            numpy_helper.from_array(module.get_parameter(fqn).detach().numpy(), fqn))
    for fqn in graph.buffers:
        model.graph.initializer.append(
            numpy_helper.from_array(module.get_buffer(fqn).detach().numpy(), fqn))
    # only the loss stays an output (ORT's training graph computes gradients of output 0)
    loss = graph.user_outputs[0]
    outs = [o for o in model.graph.output if o.name == loss]
    del model.graph.output[:]
    model.graph.output.extend(outs)
    trainable = [p for p in graph.params if module.get_parameter(p).requires_grad]
    with tempfile.TemporaryDirectory() as d:
        artifacts.generate_artifacts(model, requires_grad=trainable,
                                     frozen_params=[b for b in graph.buffers] +
                                     [p for p in graph.params if p not in trainable],
                                     artifact_directory=d)
        ckpt = api.CheckpointState.load_checkpoint(os.path.join(d, "checkpoint"))
        mod = api.Module(os.path.join(d, "training_model.onnx"), ckpt)
        mod.train()
        np_feeds = to_numpy(feeds)
        out = mod(*[np_feeds[n] for n in mod.input_names()])
        out = out[0] if isinstance(out, list) else out
        grads = {p: torch.from_numpy(np.array(ckpt.parameters[p].grad)) for p in trainable}
    return float(np.asarray(out)), grads


def torch_gradients(module: torch.nn.Module, args, seed: int) -> tuple[float, dict]:
    """(loss, {param: grad}) of eager torch with the RNG at ``seed`` (same dropout masks)."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = module(*args)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in module.named_parameters()
                         if p.grad is not None}
