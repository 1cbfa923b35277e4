"""ONNX element types <-> torch dtypes, and the ``tensor(float)`` type strings."""

from __future__ import annotations

import torch
from onnx import TensorProto as TP

ONNX_TO_TORCH = {
    TP.FLOAT: torch.float32, TP.DOUBLE: torch.float64, TP.FLOAT16: torch.float16,
    TP.BFLOAT16: torch.bfloat16, TP.INT8: torch.int8, TP.INT16: torch.int16,
    TP.INT32: torch.int32, TP.INT64: torch.int64, TP.UINT8: torch.uint8,
    TP.UINT16: torch.uint16, TP.UINT32: torch.uint32, TP.UINT64: torch.uint64,
    TP.BOOL: torch.bool, TP.COMPLEX64: torch.complex64, TP.COMPLEX128: torch.complex128,
    TP.FLOAT8E4M3FN: torch.float8_e4m3fn, TP.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    TP.FLOAT8E5M2: torch.float8_e5m2, TP.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
}
TORCH_TO_ONNX = {v: k for k, v in ONNX_TO_TORCH.items()}

_TYPE_NAMES = {
    TP.FLOAT: "float", TP.DOUBLE: "double", TP.FLOAT16: "float16", TP.BFLOAT16: "bfloat16",
    TP.INT8: "int8", TP.INT16: "int16", TP.INT32: "int32", TP.INT64: "int64",
    TP.UINT8: "uint8", TP.UINT16: "uint16", TP.UINT32: "uint32", TP.UINT64: "uint64",
    TP.BOOL: "bool", TP.STRING: "string", TP.COMPLEX64: "complex64",
    TP.COMPLEX128: "complex128",
}


def torch_dtype(elem_type: int, what: str = "tensor") -> torch.dtype:
    try:
        return ONNX_TO_TORCH[elem_type]
    except KeyError:
        name = TP.DataType.Name(elem_type) if elem_type in TP.DataType.values() else elem_type
        raise TypeError(f"{what}: ONNX element type {name} has no torch dtype") from None


def type_string(elem_type: int) -> str:
    """onnxruntime's ``NodeArg.type`` spelling: ``tensor(float)``."""
    return f"tensor({_TYPE_NAMES.get(elem_type, str(elem_type))})"


def dtype_name(dt: torch.dtype) -> str:
    e = TORCH_TO_ONNX.get(dt)
    return _TYPE_NAMES.get(e, str(dt).replace("torch.", "")) if e is not None else str(dt)
