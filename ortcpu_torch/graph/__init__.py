"""The graph front end: run ONNX graphs node by node on ortcpu_torch's kernels.

- ``InferenceSession``: onnxruntime's API (``run``, ``get_inputs``, ``get_outputs``) plus
  ``report()``.
- ``Executor`` / ``run_model``: the internal entry point for the other graph front ends
  (gradient builder, ORTModule, on-device training): torch tensors in and out, no copies,
  in-place training ops write into the fed tensors; one ``Plan`` per input signature.
- ``op_table.supported()``: every (domain, op type, opset range) the executor binds.
"""

from .executor import Executor, FeedError, run_model
from .loading import InvalidModelError, load_model
from .op_table import UnsupportedOpError
from .planner import GraphRunError, Plan
from .session import InferenceSession, NodeArg, SessionOptions

__all__ = ["Executor", "FeedError", "GraphRunError", "InferenceSession", "InvalidModelError",
           "NodeArg", "Plan", "SessionOptions", "UnsupportedOpError", "load_model",
           "run_model"]
