"""Graph front end: capture of torch models as ONNX training graphs (``capture``, ``export``)."""

from .capture import CapturedGraph, CaptureError, capture, export

__all__ = ["CaptureError", "CapturedGraph", "capture", "export"]
