"""ONNX Runtime's on-device training API (``onnxruntime.training.api``, 1.19.2) on
ortcpu_torch's kernels: the same classes, arguments and file formats, so code written for
ORT runs after changing its import::

    from ortcpu_torch.training import api

    state = api.CheckpointState.load_checkpoint("artifacts/checkpoint")
    module = api.Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
    optimizer = api.Optimizer("artifacts/optimizer_model.onnx", module)
    loss = module(inputs, labels)
    optimizer.step()
    module.lazy_reset_grad()
"""

from .._checkpoint_file import CheckpointError
from .checkpoint_state import CheckpointState, Parameter, Parameters, Properties
from .lr_scheduler import LinearLRScheduler
from .module import Module
from .optimizer import Optimizer

__all__ = ["CheckpointError", "CheckpointState", "LinearLRScheduler", "Module", "Optimizer",
           "Parameter", "Parameters", "Properties"]
