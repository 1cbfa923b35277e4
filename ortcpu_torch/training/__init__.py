"""ONNX Runtime's on-device training API on ortcpu_torch's kernels.

``from ortcpu_torch.training import api, artifacts`` replaces
``from onnxruntime.training import api, artifacts``: artifacts (training, eval and optimizer
ONNX models plus a flatbuffers checkpoint) written by either library train on either.
"""

__all__ = ["api", "artifacts"]
