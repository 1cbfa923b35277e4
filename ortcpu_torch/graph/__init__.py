"""The graph front end: run ONNX graphs node by node on ortcpu_torch's kernels.

- ``InferenceSession``: onnxruntime's API (``run``, ``get_inputs``, ``get_outputs``) plus
  ``report()``.
- ``Executor`` / ``run_model``: the internal entry point for the other graph front ends
  (gradient builder, ORTModule, on-device training): torch tensors in and out, no copies,
  in-place training ops write into the fed tensors; one ``Plan`` per input signature.
- ``op_table.supported()``: every (domain, op type, opset range) the executor binds.
- ``capture`` / ``export``: a torch model as an ONNX graph with training semantics (or its
  eval graph as standard ONNX).
- ``build_gradient_graph``: an ONNX forward model -> its training graph (forward +
  backward with ONNX Runtime's gradient ops, one ``<input>_grad`` output per trainable
  input).
"""

from .capture import CapturedGraph, CaptureError, capture, export
from .executor import Executor, FeedError, run_model
from .gradient import FORWARD_NODES_KEY, GradientBuildError, build_gradient_graph
from .loading import InvalidModelError, load_model
from .op_table import UnsupportedOpError
from .planner import GraphRunError, Plan
from .session import InferenceSession, NodeArg, SessionOptions

__all__ = ["FORWARD_NODES_KEY", "CaptureError", "CapturedGraph", "Executor", "FeedError",
           "GradientBuildError", "GraphRunError", "InferenceSession", "InvalidModelError",
           "NodeArg", "Plan", "SessionOptions", "UnsupportedOpError", "build_gradient_graph",
           "capture", "export", "load_model", "run_model"]
