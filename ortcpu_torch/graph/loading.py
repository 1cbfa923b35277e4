"""Model loading: a path, ``bytes`` or an ``onnx.ModelProto`` -> a checked ModelProto.

External data next to a path is loaded. Malformed or truncated input raises
``InvalidModelError`` carrying onnx's own parser/checker message.
"""

from __future__ import annotations

import os

import onnx
import torch
from onnx import numpy_helper

from .dtypes import torch_dtype


class InvalidModelError(ValueError):
    """The model could not be parsed or fails ``onnx.checker``."""


def load_model(model, *, check: bool = True) -> onnx.ModelProto:
    """Parse and check ``model`` (path, bytes or ModelProto)."""
    base_dir = None
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = _parse(bytes(model), "the model bytes")
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file {path!r} does not exist")
        with open(path, "rb") as f:
            proto = _parse(f.read(), repr(path))
        base_dir = os.path.dirname(os.path.abspath(path))
    else:
        raise TypeError(f"model must be a path, bytes or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    if base_dir is not None and _has_external_data(proto):
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, base_dir)
        except (OSError, ValueError, onnx.checker.ValidationError) as e:
            raise InvalidModelError(f"external data of the model could not be read: {e}") \
                from None
    if check:
        try:
            onnx.checker.check_model(_checkable(proto))
        except (onnx.checker.ValidationError, ValueError) as e:
            raise InvalidModelError(f"onnx.checker rejected the model: {e}") from None
    return proto


_ORT_CHECK_DOMAIN = "ortcpu_torch.ort_default_domain"


def _checkable(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or a copy for the checker in which onnxruntime's training ops that it
    registers in the default domain (MaxPoolGrad, AveragePoolGrad, ...; onnx has no
    schema for them) sit in a custom domain, which the checker leaves to the runtime."""
    nonstandard = [n for n in proto.graph.node
                   if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)]
    if not nonstandard:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for n in copy.graph.node:
        if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type):
            n.domain = _ORT_CHECK_DOMAIN
    copy.opset_import.add(domain=_ORT_CHECK_DOMAIN, version=1)
    return copy


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError (its module path differs per backend)
        raise InvalidModelError(f"{what} is not a valid ONNX model (protobuf parse failed: "
                                f"{e})") from None
    if not proto.HasField("graph"):
        raise InvalidModelError(f"{what} is not a valid ONNX model (no graph)")
    return proto


def _has_external_data(proto: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.external_data_helper._get_all_tensors(proto))


def tensor_from_proto(t: onnx.TensorProto) -> torch.Tensor:
    """A TensorProto as a torch tensor (owned, writable)."""
    if t.data_type == onnx.TensorProto.STRING:
        return numpy_helper.to_array(t)  # kept as a numpy object array
    arr = numpy_helper.to_array(t)
    dt = torch_dtype(t.data_type, f"initializer {t.name!r}")
    if arr.dtype.kind == "V" or dt in (torch.bfloat16,) or str(dt).startswith("torch.float8"):
        # onnx returns these as raw/ml_dtypes arrays: reinterpret the bits
        raw = arr.view(f"u{arr.dtype.itemsize}").copy() if arr.dtype.itemsize in (1, 2) else arr
        return torch.from_numpy(raw).view(dt)
    return torch.from_numpy(arr.copy())


def opset_map(proto: onnx.ModelProto) -> dict[str, int]:
    out = {}
    for o in proto.opset_import:
        d = "" if o.domain in ("", "ai.onnx") else o.domain
        out[d] = o.version
    return out
