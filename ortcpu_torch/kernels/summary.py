"""TensorBoard summary kernels (spec §16): SummaryScalar, SummaryHistogram, SummaryMerge,
SummaryText. Each returns the serialized ``tensorboard.Summary`` protobuf as ``bytes``.

Statistics and bucketing run natively (multithreaded, one pass); the protobuf encoding uses
tensorboard's compiled protos (``tensorboard.compat.proto``).
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import torch

from .._native import ffi, lib
from ._checks import check_status, float_input, get_num_threads
from ._registry import register

DBL_MAX = sys.float_info.max


def _pb():
    from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    return summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2


# ---- bucket edges ---------------------------------------------------------------


def _geometric() -> list[float]:
    """1e-12, 1e-12*1.1, ... (repeated double multiplication) while < 1e20: 774 values."""
    out, v = [], 1e-12
    while v < 1e20:
        out.append(v)
        v *= 1.1
    return out


@functools.lru_cache(maxsize=1)
def ort_bucket_limits() -> np.ndarray:
    """ORT's 1551 bucket limits: [-DBL_MAX, -v773..-v0, v0..v773, DBL_MAX, 0.0] (spec §16.2:
    no 0 edge in the middle, a stray trailing 0.0)."""
    pos = _geometric()
    lim = [-DBL_MAX] + [-v for v in reversed(pos)] + pos + [DBL_MAX, 0.0]
    return np.array(lim, dtype=np.float64)


@functools.lru_cache(maxsize=1)
def tensorflow_bin_edges() -> np.ndarray:
    """The bin edges of torch.utils.tensorboard's default ``bins="tensorflow"``:
    [-v773..-v0, 0, v0..v773] (1549 edges, 1548 bins)."""
    pos = _geometric()
    return np.array([-v for v in reversed(pos)] + [0.0] + pos, dtype=np.float64)


class Edges:
    """Sorted edges plus their native look-up table (built once, reused)."""

    def __init__(self, edges: np.ndarray):
        self.edges = np.ascontiguousarray(edges, dtype=np.float64)
        self.lut = np.empty(lib.ORTCPU_SUMMARY_LUT_SIZE, dtype=np.int32)
        self.cell_edge = np.empty(lib.ORTCPU_SUMMARY_CELLS, dtype=np.float32)
        st = lib.ortcpu_summary_edges_lut(self._eptr(), len(self.edges),
                                          ffi.cast("int32_t *", self.lut.ctypes.data),
                                          ffi.cast("float *", self.cell_edge.ctypes.data))
        check_status(st, "summary edges")

    def _eptr(self):
        return ffi.cast("double *", self.edges.ctypes.data)


@functools.lru_cache(maxsize=1)
def _ort_edges() -> Edges:
    return Edges(ort_bucket_limits()[:-1])  # the sorted prefix; the stray 0.0 is bucket 1550


@functools.lru_cache(maxsize=1)
def _tf_edges() -> Edges:
    return Edges(tensorflow_bin_edges())


_LUT_MIN_N = 1 << 14  # below this a binary search beats touching the table


def histogram_counts(x: torch.Tensor, edges: Edges, mode: int) -> tuple[np.ndarray, list]:
    """Native one-pass statistics and bucket counts of a contiguous float32/float64 CPU
    tensor (see ortcpu.h, ``ortcpu_summary_histogram``). Returns (counts, stats)."""
    n = x.numel()
    ne = len(edges.edges)
    nb = ne + 1 if mode == lib.ORTCPU_HIST_ORT else ne - 1
    counts = np.empty(nb, dtype=np.float64)
    stats = ffi.new("double[5]")
    fn = (lib.ortcpu_summary_histogram_f32 if x.dtype == torch.float32
          else lib.ortcpu_summary_histogram_f64)
    ctype = "float *" if x.dtype == torch.float32 else "double *"
    if n >= _LUT_MIN_N:
        lut = ffi.cast("int32_t *", edges.lut.ctypes.data)
        up = ffi.cast("float *", edges.cell_edge.ctypes.data)
    else:
        lut = up = ffi.NULL
    st = fn(ffi.cast(ctype, x.data_ptr()), n, edges._eptr(), ne, lut, up, mode,
            ffi.cast("double *", counts.ctypes.data), stats, get_num_threads())
    check_status(st, "summary histogram")
    return counts, list(stats)


def ort_histogram_proto(x: torch.Tensor):
    """``HistogramProto`` with ORT's statistics, bucket scheme and run-merging."""
    summary_pb2 = _pb()[0]
    counts, (mn, mx, num, s, sq) = histogram_counts(x, _ort_edges(), lib.ORTCPU_HIST_ORT)
    limits = ort_bucket_limits()
    # emit bucket i unless it and the previous bucket are both empty (then the previous
    # emitted bucket's limit is extended to bucket i's limit)
    nz = counts != 0
    keep = np.ones(len(counts), dtype=bool)
    keep[1:] = nz[1:] | nz[:-1]
    idx = np.flatnonzero(keep)
    ends = np.append(idx[1:] - 1, len(counts) - 1)
    return summary_pb2.HistogramProto(
        min=mn, max=mx, num=num, sum=s, sum_squares=sq,
        bucket_limit=limits[ends].tolist(), bucket=counts[idx].tolist())


def _tag(op: str, name: str, tag) -> str:
    if tag is None:
        raise TypeError(f"{op}: attribute {name} is required")
    if not isinstance(tag, str):
        raise TypeError(f"{op}: {name} must be a str, got {type(tag).__name__}")
    return tag


# ---- kernels ----------------------------------------------------------------------


@register
def SummaryScalar(input, *, tags=None) -> bytes:
    """Serialized Summary with one ``simple_value`` per element of ``input`` (float, double
    or bool), tagged ``tags[i]``; values are narrowed to float32 (bool -> 1.0/0.0)."""
    op = "SummaryScalar"
    x = float_input(op, "input", input, dtypes=(torch.float32, torch.float64, torch.bool))
    if tags is None:
        raise TypeError(f"{op}: attribute tags is required")
    if isinstance(tags, str) or not isinstance(tags, (list, tuple)):
        raise TypeError(f"{op}: tags must be a list of str, got {type(tags).__name__}")
    for i, t in enumerate(tags):
        if not isinstance(t, str):
            raise TypeError(f"{op}: tags[{i}] must be a str, got {type(t).__name__}")
    if len(tags) != x.numel():
        raise ValueError(f"{op}: tags and input must have the same size: {len(tags)} tags, "
                         f"{x.numel()} input elements")
    summary_pb2 = _pb()[0]
    vals = x.reshape(-1).to(torch.float64).tolist()
    s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v)
                                   for t, v in zip(tags, vals, strict=True)])
    return s.SerializeToString()


@register
def SummaryHistogram(input, *, tag=None) -> bytes:
    """Serialized Summary with one histogram of ``input`` (float or double): min, max, num,
    sum, sum_squares over the finite values (NaN/inf skipped) and ORT's bucket scheme
    (spec §16.2: TensorFlow's 1.1-ratio edges, no 0 edge, trailing 0.0 limit)."""
    op = "SummaryHistogram"
    x = float_input(op, "input", input)
    tag = _tag(op, "tag", tag)
    summary_pb2 = _pb()[0]
    h = ort_histogram_proto(x)
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, histo=h)]
                               ).SerializeToString()


def _summary_bytes(op: str, i: int, v) -> bytes:
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise ValueError(f"{op}: input {i} must be a string scalar, got shape {v.shape}")
        v = v.reshape(-1)[0]
    elif isinstance(v, (list, tuple)):
        if len(v) != 1:
            raise ValueError(f"{op}: input {i} must be a string scalar, got {len(v)} items")
        v = v[0]
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{op}: input {i} must be a serialized Summary (bytes), "
                    f"got {type(v).__name__}")


@register
def SummaryMerge(*input) -> bytes:
    """Serialized Summary holding every value of the input Summaries, in input order; a
    non-empty tag that occurs twice is an error (empty tags may repeat)."""
    op = "SummaryMerge"
    if not input:
        raise ValueError(f"{op}: needs at least one input")
    from google.protobuf.message import DecodeError

    summary_pb2 = _pb()[0]
    blobs = [_summary_bytes(op, i, v) for i, v in enumerate(input)]
    out = summary_pb2.Summary()
    seen: dict[str, int] = {}
    for i, b in enumerate(blobs):
        try:
            s = summary_pb2.Summary.FromString(b)
        except DecodeError as e:
            raise ValueError(f"{op}: input {i} is not a serialized Summary ({e})") from None
        for v in s.value:
            if v.tag:
                if v.tag in seen:
                    raise ValueError(f"{op}: inputs contain duplicate tag {v.tag!r} "
                                     f"(inputs {seen[v.tag]} and {i})")
                seen[v.tag] = i
        out.value.extend(s.value)
    return out.SerializeToString()


def _strings(op: str, x) -> tuple[list[str | bytes], list[int]]:
    """(row-major strings, shape) of a string tensor: str, nested lists or a numpy array."""
    if isinstance(x, (str, bytes)):
        return [x], []
    if isinstance(x, np.ndarray):
        if x.dtype != object and x.dtype.kind not in "US":
            raise TypeError(f"{op}: input must be a string tensor, got dtype {x.dtype}")
        flat = x.reshape(-1).tolist()
        shape = list(x.shape)
    elif isinstance(x, (list, tuple)):
        arr = np.empty(0, dtype=object)
        try:
            arr = np.array(x, dtype=object)
        except ValueError:
            raise ValueError(f"{op}: input must be a rectangular nested list of str") from None
        if arr.size and any(isinstance(e, (list, tuple)) for e in arr.reshape(-1)):
            raise ValueError(f"{op}: input must be a rectangular nested list of str")
        flat, shape = arr.reshape(-1).tolist(), list(arr.shape)
    else:
        raise TypeError(f"{op}: input must be a string tensor (str, nested list of str or a "
                        f"numpy array), got {type(x).__name__}")
    for j, s in enumerate(flat):
        if not isinstance(s, (str, bytes)):
            raise TypeError(f"{op}: input element {j} must be a str, got {type(s).__name__}")
    return flat, shape


@register
def SummaryText(input, *, tag=None) -> bytes:
    """Serialized Summary with one text value: a DT_STRING tensor of ``input``'s shape and
    strings (row-major), with plugin ``"text"``."""
    op = "SummaryText"
    tag = _tag(op, "tag", tag)
    flat, shape = _strings(op, input)
    summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2 = _pb()
    return summary_pb2.Summary(value=[text_value(tag, flat, shape)]).SerializeToString()


def text_value(tag: str, flat: list, shape: list[int]):
    """A ``Summary.Value`` for the text plugin (as SummaryText builds it)."""
    summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2 = _pb()
    t = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING,
        string_val=[s.encode("utf-8") if isinstance(s, str) else s for s in flat])
    if shape:  # a 0-d tensor has no tensor_shape field at all (as ORT writes it)
        t.tensor_shape.dim.extend(tensor_shape_pb2.TensorShapeProto.Dim(size=d)
                                  for d in shape)
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    return summary_pb2.Summary.Value(tag=tag, tensor=t, metadata=meta)
