"""Summary* kernels (spec §16): byte-exact spec examples, the native bucketing against a
numpy reference (every size class, NaN/inf, values on edges, 1 and 2 threads), and bad
input. The writer is in test_summary_writer.py, ORT itself in
conformance/test_summary_conformance.py."""

from __future__ import annotations

import math
import struct
import sys

import numpy as np
import pytest
import torch
from tensorboard.compat.proto import summary_pb2

import ortcpu_torch
from ortcpu_torch import kernels
from ortcpu_torch.kernels import summary as ks

DBL_MAX = sys.float_info.max


# ---- a minimal protobuf encoder, independent of tensorboard's, for the spec bytes ----


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wire)
    if wire == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def _double(num: int, v: float) -> bytes:
    return b"" if v == 0 else _field(num, 1, struct.pack("<d", v))


def _histo_bytes(tag, mn, mx, num, s, sq, limits, counts) -> bytes:
    h = (_double(1, mn) + _double(2, mx) + _double(3, num) + _double(4, s) + _double(5, sq)
         + _field(6, 2, b"".join(struct.pack("<d", v) for v in limits))
         + _field(7, 2, b"".join(struct.pack("<d", v) for v in counts)))
    value = _field(1, 2, tag.encode()) + _field(5, 2, h)
    return _field(1, 2, value)


# ---- spec examples, byte for byte ----------------------------------------------------


def test_scalar_spec_bytes():
    out = kernels.SummaryScalar(torch.tensor([1.5, 2.0]), tags=["a", "b"])
    assert out == bytes.fromhex("0a080a0161150000c03f0a080a01621500000040")
    assert kernels.SummaryScalar(torch.tensor([1.5, 2.0], dtype=torch.float64),
                                 tags=["a", "b"]) == out


def test_scalar_bool_and_narrowing():
    s = summary_pb2.Summary.FromString(
        kernels.SummaryScalar(torch.tensor([[True], [False]]), tags=["t", "f"]))
    assert [(v.tag, v.simple_value) for v in s.value] == [("t", 1.0), ("f", 0.0)]
    s = summary_pb2.Summary.FromString(
        kernels.SummaryScalar(torch.tensor([0.1, 1e300, math.nan], dtype=torch.float64),
                              tags=["a", "b", "c"]))
    assert s.value[0].simple_value == np.float32(0.1)
    assert s.value[1].simple_value == math.inf and math.isnan(s.value[2].simple_value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_histogram_spec_example_bytes(dtype, threads):
    ortcpu_torch.set_num_threads(threads)
    x = torch.tensor([-2, 0, 0, 1e-13, 1, 1, 1.1, math.nan, math.inf, 5], dtype=dtype)
    limits = [-2.1628190051144287, -1.9661990955585713, -1e-12, 1e-12, 0.917246389039776,
              1.0089710279437536, 1.109868130738129, 4.636194617418625, 5.099814079160488, 0.0]
    counts = [0, 1, 0, 3, 0, 2, 1, 0, 1, 0]
    s, sq = 6.100000023841957, 32.21000005245209  # the spec's (float32 input)
    if dtype == torch.float64:  # in-order double sums, as ORT computes them
        s = sq = 0.0
        for v in [-2, 0, 0, 1e-13, 1, 1, 1.1, 5]:
            s += v
            sq += v * v
    want = _histo_bytes("h", -2.0, 5.0, 8.0, s, sq, limits, counts)
    assert kernels.SummaryHistogram(x, tag="h") == want


def test_histogram_empty_spec_bytes():
    want = _histo_bytes("e", DBL_MAX, -DBL_MAX, 0.0, 0.0, 0.0, [0.0], [0.0])
    assert kernels.SummaryHistogram(torch.empty(0), tag="e") == want
    assert kernels.SummaryHistogram(torch.tensor([math.nan, -math.inf]), tag="e") == want


def test_ort_limits_layout():
    lim = ks.ort_bucket_limits()
    assert len(lim) == 1551 and lim[0] == -DBL_MAX and lim[-2] == DBL_MAX and lim[-1] == 0.0
    assert lim[775] == 1e-12 and lim[774] == -1e-12 and 0.0 not in lim[1:-1]
    assert lim[-3] == 9.920775621859783e19
    tf = ks.tensorflow_bin_edges()
    assert len(tf) == 1549 and tf[774] == 0.0 and np.all(np.diff(tf) > 0)


# ---- native bucketing vs a numpy reference --------------------------------------------


def _ref_ort(x: np.ndarray):
    v = x.astype(np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    edges = ks.ort_bucket_limits()[:-1]
    u = np.searchsorted(edges, v, side="right")
    u = np.minimum(u, len(edges) - 1)
    counts = np.bincount(u, minlength=len(edges) + 1).astype(np.float64)
    return counts, v


def _ref_numpy(x: np.ndarray, edges):
    v = x.astype(np.float64).reshape(-1)
    counts, _ = np.histogram(v[~np.isnan(v)], bins=edges)
    return counts.astype(np.float64), v


def _sample(n, dtype, rng):
    x = rng.standard_normal(n) * rng.choice([1e-9, 1e-3, 1.0, 1e4, 1e15])
    if n:
        k = max(1, n // 5)
        pos = rng.choice(n, size=k, replace=True)
        pool = np.concatenate([
            [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, -5e-324, 1e-45, 3.4e38,
             -3.4e38, 1e300, -1e300],
            ks.ort_bucket_limits()[1:-2][::37], ks.tensorflow_bin_edges()[::41]])
        x[pos] = rng.choice(pool, size=k)
    with np.errstate(over="ignore"):
        return x.astype(dtype)


SIZES = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70, 1 << 14,
         (1 << 15) + 3, 200_003]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_bucketing_matches_reference(dtype, n, threads):
    ortcpu_torch.set_num_threads(threads)
    rng = np.random.default_rng(n + 17 * threads + (dtype == np.float64))
    x = _sample(n, dtype, rng)
    t = torch.from_numpy(x.copy())
    # ORT mode
    counts, (mn, mx, num, s, sq) = ks.histogram_counts(t, ks._ort_edges(), 0)
    ref_counts, v = _ref_ort(x)
    np.testing.assert_array_equal(counts, ref_counts)
    assert num == v.size
    if v.size:
        assert (mn, mx) == (v.min(), v.max())
        # summation order differs from fsum: bound the error by n ulp of sum |v|
        bound = v.size * 2.2e-16 * math.fsum(np.abs(v))
        assert abs(s - math.fsum(v)) <= bound or math.isinf(bound)
        with np.errstate(over="ignore"):
            v2 = v * v
        assert sq == pytest.approx(math.fsum(v2), rel=1e-12) if np.isfinite(v2).all() \
            else math.isinf(sq)
    else:
        assert (mn, mx, s, sq) == (DBL_MAX, -DBL_MAX, 0.0, 0.0)
    # numpy mode (torch's bins="tensorflow")
    counts, (mn, mx, num, s, sq) = ks.histogram_counts(t, ks._tf_edges(), 1)
    ref_counts, v = _ref_numpy(x, ks.tensorflow_bin_edges())
    np.testing.assert_array_equal(counts, ref_counts)
    assert num == n
    if n:
        with np.errstate(invalid="ignore", over="ignore"):
            np.testing.assert_equal([mn, mx], [v.min(), v.max()])
            assert np.isnan(s) == np.isnan(v.sum()) and np.isnan(sq) == np.isnan(v.dot(v))


def test_bucketing_arbitrary_edges_dense_cells():
    """Edges many to a table cell (uniform bins) take the binary-search path."""
    edges = ks.Edges(np.linspace(-1, 1, 5001))
    x = torch.rand(100_000, dtype=torch.float64) * 2.2 - 1.1
    counts, _ = ks.histogram_counts(x, edges, 1)
    ref, _ = np.histogram(x.numpy(), bins=edges.edges)
    np.testing.assert_array_equal(counts, ref)


def test_input_not_modified_and_noncontiguous():
    x = torch.randn(64, 33, dtype=torch.float64)
    before = x.clone()
    a = kernels.SummaryHistogram(x.t(), tag="h")
    assert torch.equal(x, before)
    assert a == kernels.SummaryHistogram(x.t().contiguous(), tag="h")


# ---- merge and text -------------------------------------------------------------------


def test_merge_and_duplicates():
    a = kernels.SummaryScalar(torch.tensor([1.0]), tags=["a"])
    h = kernels.SummaryHistogram(torch.randn(10), tag="h")
    m = summary_pb2.Summary.FromString(kernels.SummaryMerge(a, h))
    assert [v.tag for v in m.value] == ["a", "h"]
    assert kernels.SummaryMerge(np.array(a, dtype=object), [h]) == kernels.SummaryMerge(a, h)
    with pytest.raises(ValueError, match="duplicate tag 'a'"):
        kernels.SummaryMerge(a, h, a)
    e = kernels.SummaryScalar(torch.tensor([1.0, 2.0]), tags=["", ""])
    assert len(summary_pb2.Summary.FromString(kernels.SummaryMerge(e, e)).value) == 4


def test_text_value():
    s = summary_pb2.Summary.FromString(kernels.SummaryText([["a", "b"], ["c", "d"]], tag="t"))
    (v,) = s.value
    assert v.tag == "t" and v.metadata.plugin_data.plugin_name == "text"
    assert v.tensor.dtype == 7 and [d.size for d in v.tensor.tensor_shape.dim] == [2, 2]
    assert list(v.tensor.string_val) == [b"a", b"b", b"c", b"d"]
    assert not summary_pb2.Summary.FromString(
        kernels.SummaryText("x", tag="t")).value[0].tensor.HasField("tensor_shape")


# ---- bad input --------------------------------------------------------------------------


def test_bad_input():
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="same size"):
        kernels.SummaryScalar(x, tags=["a"])
    with pytest.raises(TypeError, match="tags is required"):
        kernels.SummaryScalar(x)
    with pytest.raises(TypeError, match=r"tags\[1\] must be a str"):
        kernels.SummaryScalar(x, tags=["a", 3])
    with pytest.raises(TypeError, match="tags must be a list"):
        kernels.SummaryScalar(x, tags="ab")
    with pytest.raises(TypeError, match="input must be float32 or float64 or bool"):
        kernels.SummaryScalar(torch.tensor([1, 2]), tags=["a", "b"])
    with pytest.raises(TypeError, match="tag is required"):
        kernels.SummaryHistogram(x)
    with pytest.raises(TypeError, match="tag must be a str"):
        kernels.SummaryHistogram(x, tag=5)
    with pytest.raises(TypeError, match="input must be float32 or float64"):
        kernels.SummaryHistogram(torch.tensor([1, 2]), tag="h")
    with pytest.raises(ValueError, match="input 0 is not a serialized Summary"):
        kernels.SummaryMerge(b"\xff\xff\xff")
    with pytest.raises(TypeError, match="input 1 must be a serialized Summary"):
        kernels.SummaryMerge(kernels.SummaryScalar(x, tags=["a", "b"]), 3)
    with pytest.raises(ValueError, match="at least one input"):
        kernels.SummaryMerge()
    with pytest.raises(TypeError, match="element 1 must be a str"):
        kernels.SummaryText(["a", 1], tag="t")
    with pytest.raises(ValueError, match="rectangular"):
        kernels.SummaryText([["a"], ["b", "c"]], tag="t")
    with pytest.raises(TypeError, match="string tensor"):
        kernels.SummaryText(torch.tensor([1.0]), tag="t")


@pytest.mark.parametrize("n", [3, 1 << 15])
def test_histogram_huge_values_go_to_the_dbl_max_bucket(n):
    """ORT 1.19.2 aborts (indexes past its counts) on any value >= 9.92e19; we count such
    values, DBL_MAX included, in the bucket whose limit is DBL_MAX."""
    x = torch.full((n,), 1.0, dtype=torch.float64)
    x[0], x[1] = 1e30, DBL_MAX
    h = summary_pb2.Summary.FromString(kernels.SummaryHistogram(x, tag="h")).value[0].histo
    assert list(h.bucket_limit[-2:]) == [DBL_MAX, 0.0] and list(h.bucket[-2:]) == [2.0, 0.0]
    assert h.max == DBL_MAX and h.num == n
