"""The Summary* ops (spec §16) against ONNX Runtime 1.19.2, byte for byte.

Each op outputs a string scalar holding a serialized ``Summary``, which is not valid
UTF-8 in general, so ORT's Python binding cannot return it: its conversion raises a
``UnicodeDecodeError`` whose ``.object`` is exactly the output's bytes. ``ort_bytes``
reads them from there (and encodes the ``str`` back when the output happens to be valid
UTF-8). SummaryMerge's inputs are serialized Summaries that the binding cannot feed
either (bytes become their ``repr``), so it is checked on graphs whose Summary* nodes feed
a SummaryMerge node inside ORT, our registry composing the same calls.

Histograms are compared byte for byte with one thread (ORT sums in order, as our single
chunk does); with several threads the double sums may differ in the last bits, so they are
compared field by field there (sum, sum_squares to 1e-12 relative; everything else exact).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402
from tensorboard.compat.proto import summary_pb2  # noqa: E402

import ortcpu_torch  # noqa: E402
from ortcpu_torch import kernels  # noqa: E402

from .ort_harness import IR_VERSION, MS_DOMAIN, MS_OPSET, OPSET, _session  # noqa: E402

_NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
               np.dtype(bool): TensorProto.BOOL, np.dtype(object): TensorProto.STRING}


def _model(nodes, inputs: dict):
    ins = [helper.make_tensor_value_info(k, _NP_TO_ONNX[v.dtype], list(v.shape))
           for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info("out", TensorProto.STRING, [])]
    graph = helper.make_graph(nodes, "summary_conformance", ins, outs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                helper.make_opsetid(MS_DOMAIN, MS_OPSET)])
    m.ir_version = IR_VERSION
    return m


def ort_bytes(nodes, inputs: dict) -> bytes:
    """Run the graph in ORT and return its string output ``out`` as raw bytes."""
    sess = _session(_model(nodes, inputs).SerializeToString())
    try:
        (out,) = sess.run(["out"], inputs)
    except UnicodeDecodeError as e:  # the binding's str conversion of non-UTF-8 bytes
        assert isinstance(e.object, bytes)
        return e.object
    out = np.asarray(out, dtype=object)
    assert out.shape == ()
    return out.item().encode("utf-8")


def node(op, ins, out="out", **attrs):
    return helper.make_node(op, ins, [out], domain=MS_DOMAIN, **attrs)


# ---- SummaryScalar ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, bool])
@pytest.mark.parametrize("shape", [(1,), (2,), (3, 2), (2, 1, 3), (7,)])
def test_scalar(dtype, shape):
    rng = np.random.default_rng(abs(hash((str(dtype), shape))) % 2**32)
    if dtype is bool:
        x = rng.random(shape) > 0.5
    else:
        x = (rng.standard_normal(shape) * 10).astype(dtype)
        x.reshape(-1)[0] = 1e40 if dtype == np.float64 else x.reshape(-1)[0]  # narrows to inf
    tags = [f"t{i}/x" for i in range(x.size)]
    ref = ort_bytes([node("SummaryScalar", ["x"], tags=tags)], {"x": x})
    ours = kernels.SummaryScalar(torch.from_numpy(np.array(x)), tags=tags)
    assert ours == ref


def test_scalar_nonfinite_and_spec_example():
    x = np.array([1.5, 2.0], np.float32)
    ref = ort_bytes([node("SummaryScalar", ["x"], tags=["a", "b"])], {"x": x})
    assert ref == bytes.fromhex("0a080a0161150000c03f0a080a0162150000" "0040")
    x = np.array([math.nan, math.inf, -math.inf, -0.0], np.float32)
    tags = ["n", "p", "m", "z"]
    ref = ort_bytes([node("SummaryScalar", ["x"], tags=tags)], {"x": x})
    assert kernels.SummaryScalar(torch.from_numpy(x), tags=tags) == ref


# ---- SummaryHistogram -------------------------------------------------------------


def _hist_inputs(n, dtype, rng, special):
    x = rng.standard_normal(n) * rng.choice([1e-6, 1e-3, 1.0, 10.0, 1e6])
    if special and n:
        k = max(1, n // 7)
        pos = rng.choice(n, size=min(k, n), replace=False)
        pool = np.array([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-12, -1e-12, 1e-13,
                         1.1, 1e19, -1e30, 5e-324])
        x[pos] = rng.choice(pool, size=len(pos))
    return x.astype(dtype)


def _compare_histo(ours: bytes, ref: bytes, exact: bool):
    if exact:
        assert ours == ref
        return
    a = summary_pb2.Summary.FromString(ours).value[0]
    b = summary_pb2.Summary.FromString(ref).value[0]
    assert a.tag == b.tag
    ha, hb = a.histo, b.histo
    assert (ha.min, ha.max, ha.num) == (hb.min, hb.max, hb.num)
    assert list(ha.bucket) == list(hb.bucket)
    assert list(ha.bucket_limit) == list(hb.bucket_limit)
    assert ha.sum == pytest.approx(hb.sum, rel=1e-12, abs=1e-300)
    assert ha.sum_squares == pytest.approx(hb.sum_squares, rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 13, 16, 17, 31, 33, 64, 70, 1000, 40000])
@pytest.mark.parametrize("special", [False, True])
def test_histogram(dtype, n, special):
    rng = np.random.default_rng(n * 7 + special + (dtype == np.float64) * 1000)
    x = _hist_inputs(n, dtype, rng, special)
    ref = ort_bytes([node("SummaryHistogram", ["x"], tag="layer/w")], {"x": x})
    for threads in (1, 2):
        ortcpu_torch.set_num_threads(threads)
        ours = kernels.SummaryHistogram(torch.from_numpy(x.copy()), tag="layer/w")
        _compare_histo(ours, ref, exact=threads == 1 or n < 1 << 15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_histogram_shapes_and_spec_example(dtype):
    x = np.array([-2, 0, 0, 1e-13, 1, 1, 1.1, math.nan, math.inf, 5], dtype)
    for shaped in (x, x.reshape(2, 5), x.reshape(5, 1, 2)):
        ref = ort_bytes([node("SummaryHistogram", ["x"], tag="h")], {"x": shaped})
        assert kernels.SummaryHistogram(torch.from_numpy(shaped.copy()), tag="h") == ref


def test_histogram_edges_themselves():
    """Values exactly on every edge and just either side of it (float64)."""
    from ortcpu_torch.kernels.summary import ort_bucket_limits

    lim = ort_bucket_limits()[1:-2]  # finite, below ORT's abort threshold
    lim = lim[np.abs(lim) < 9e19]
    x = np.concatenate([lim, np.nextafter(lim, np.inf), np.nextafter(lim, -np.inf)])
    ref = ort_bytes([node("SummaryHistogram", ["x"], tag="e")], {"x": x})
    ortcpu_torch.set_num_threads(1)
    assert kernels.SummaryHistogram(torch.from_numpy(x), tag="e") == ref
    x32 = x.astype(np.float32)  # rounded: lands on either side of the double edges
    x32 = np.tile(x32, 8)  # >= the table look-up threshold: the float32 fast path
    ref = ort_bytes([node("SummaryHistogram", ["x"], tag="e")], {"x": x32})
    assert kernels.SummaryHistogram(torch.from_numpy(x32), tag="e") == ref


# ---- SummaryText ---------------------------------------------------------------------


@pytest.mark.parametrize("strings", [
    np.array("hello", dtype=object),
    np.array(["a"], dtype=object),
    np.array([["a", "bb"], ["", "ünïcødé ✓"]], dtype=object),
    np.array([["x"] * 3] * 2, dtype=object).reshape(3, 1, 2),
    np.array(["line1\nline2", "# markdown *text*"], dtype=object),
])
def test_text(strings):
    ref = ort_bytes([node("SummaryText", ["x"], tag="notes")], {"x": strings})
    assert kernels.SummaryText(strings, tag="notes") == ref
    assert kernels.SummaryText(strings.tolist() if strings.ndim else strings.item(),
                               tag="notes") == ref


# ---- SummaryMerge --------------------------------------------------------------------


def test_merge_of_all_ops():
    rng = np.random.default_rng(3)
    s = rng.standard_normal(3).astype(np.float32)
    h = _hist_inputs(500, np.float64, rng, True)
    t = np.array(["hi", "there"], dtype=object)
    b = np.array([True], dtype=bool)
    nodes = [node("SummaryScalar", ["s"], "o1", tags=["a", "b", "c"]),
             node("SummaryHistogram", ["h"], "o2", tag="hist"),
             node("SummaryText", ["t"], "o3", tag="text"),
             node("SummaryScalar", ["b"], "o4", tags=["flag"]),
             node("SummaryMerge", ["o1", "o2", "o3", "o4"])]
    ref = ort_bytes(nodes, {"s": s, "h": h, "t": t, "b": b})
    ortcpu_torch.set_num_threads(1)
    ours = kernels.SummaryMerge(
        kernels.SummaryScalar(torch.from_numpy(s), tags=["a", "b", "c"]),
        kernels.SummaryHistogram(torch.from_numpy(h), tag="hist"),
        kernels.SummaryText(t, tag="text"),
        kernels.SummaryScalar(torch.from_numpy(b), tags=["flag"]))
    assert ours == ref
    # one input, and a merge of merges
    one = ort_bytes([nodes[0], node("SummaryMerge", ["o1"])], {"s": s})
    assert kernels.SummaryMerge(kernels.SummaryScalar(torch.from_numpy(s),
                                                      tags=["a", "b", "c"])) == one


def test_merge_empty_tags_may_repeat():
    s = np.array([1.0, 2.0], np.float32)
    nodes = [node("SummaryScalar", ["s"], "o1", tags=["", "x"]),
             node("SummaryScalar", ["s"], "o2", tags=["", "y"]),
             node("SummaryMerge", ["o1", "o2"])]
    ref = ort_bytes(nodes, {"s": s})
    ours = kernels.SummaryMerge(kernels.SummaryScalar(torch.from_numpy(s), tags=["", "x"]),
                                kernels.SummaryScalar(torch.from_numpy(s), tags=["", "y"]))
    assert ours == ref


def test_merge_duplicate_tag_fails_in_both():
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

    s = np.array([1.0], np.float32)
    nodes = [node("SummaryScalar", ["s"], "o1", tags=["dup"]),
             node("SummaryScalar", ["s"], "o2", tags=["dup"]),
             node("SummaryMerge", ["o1", "o2"])]
    with pytest.raises((InvalidArgument, Fail), match="duplicate tag"):
        ort_bytes(nodes, {"s": s})
    a = kernels.SummaryScalar(torch.from_numpy(s), tags=["dup"])
    with pytest.raises(ValueError, match="duplicate tag 'dup'"):
        kernels.SummaryMerge(a, a)


def test_scalar_tag_count_mismatch_fails_in_both():
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

    s = np.array([1.0, 2.0], np.float32)
    with pytest.raises((InvalidArgument, Fail), match="same size"):
        ort_bytes([node("SummaryScalar", ["s"], tags=["a"])], {"s": s})
    with pytest.raises(ValueError, match="same size"):
        kernels.SummaryScalar(torch.from_numpy(s), tags=["a"])
