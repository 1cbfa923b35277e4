"""CheckpointState and the ODTC checkpoint file, against onnxruntime-training 1.19.2."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from ortcpu_torch.training import api
from ortcpu_torch.training._checkpoint_file import (
    CheckpointContents,
    TensorEntry,
    encode_checkpoint,
    read_checkpoint,
)

from .conftest import mlp_batch, ort_api


def _params(state) -> dict[str, tuple[bool, np.ndarray]]:
    return {name: (p.requires_grad, p.data) for name, p in state.parameters}


def _same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name][0] == b[name][0], name
        assert a[name][1].dtype == b[name][1].dtype and a[name][1].shape == b[name][1].shape
        assert a[name][1].tobytes() == b[name][1].tobytes(), name  # bit-identical


def _ort_trained_state(art, tmp_path, steps=3, with_props=True):
    """An ORT state after a few AdamW steps (non-zero momentums), saved with its optimizer."""
    st = ort_api.CheckpointState.load_checkpoint(art.checkpoint)
    mod = ort_api.Module(art.train, st, art.eval)
    opt = ort_api.Optimizer(art.optimizer, mod)
    rng = np.random.default_rng(1)
    for _ in range(steps):
        mod(*mlp_batch(rng))
        opt.step()
        mod.lazy_reset_grad()
    if with_props:
        st.properties["epoch"] = 7
        st.properties["best_score"] = 0.8125
        st.properties["run"] = "digits-α"
    path = os.fspath(tmp_path / "ort_ckpt")
    ort_api.CheckpointState.save_checkpoint(st, path, True)
    return st, path


def test_ort_written_checkpoint_loads_bit_identical(ort_mlp, tmp_path):
    ort_state, path = _ort_trained_state(ort_mlp, tmp_path)
    ours = api.CheckpointState.load_checkpoint(path)
    _same_params(_params(ours), _params(ort_state))
    assert dict(ours.properties) == {"epoch": 7, "best_score": 0.8125, "run": "digits-α"}
    # optimizer state: step, initial lr, both momentums of every trainable parameter
    raw = read_checkpoint(path)
    group = raw.optimizer_groups["group0"]
    assert group.step == 3
    assert group.initial_learning_rate == np.float32(0.001)
    assert sorted(group.momentums) == ["fc1.bias", "fc1.weight", "fc2.weight"]
    for moms in group.momentums.values():
        assert sorted(moms) == ["momentum0", "momentum1"]
        assert all(np.any(m != 0) for m in moms.values())


def test_ours_loads_in_ort_bit_identical(ort_mlp, tmp_path):
    _, path = _ort_trained_state(ort_mlp, tmp_path)
    ours = api.CheckpointState.load_checkpoint(path)
    ours.properties["extra"] = 12
    out = os.fspath(tmp_path / "ours_ckpt")
    api.CheckpointState.save_checkpoint(ours, out, include_optimizer_state=True)
    back = ort_api.CheckpointState.load_checkpoint(out)
    _same_params(_params(back), _params(ours))
    assert dict(back.properties) == {"epoch": 7, "best_score": 0.8125, "run": "digits-α",
                                     "extra": 12}
    a, b = read_checkpoint(path), read_checkpoint(out)
    for name, g in a.optimizer_groups.items():
        h = b.optimizer_groups[name]
        assert (g.step, g.initial_learning_rate) == (h.step, h.initial_learning_rate)
        for p, moms in g.momentums.items():
            for m, arr in moms.items():
                assert arr.tobytes() == h.momentums[p][m].tobytes()
    # and ORT resumes training from it: the optimizer state is ORT-readable
    mod = ort_api.Module(ort_mlp.train, back, ort_mlp.eval)
    opt = ort_api.Optimizer(ort_mlp.optimizer, mod)
    mod(*mlp_batch(np.random.default_rng(2)))
    opt.step()
    ort_api.CheckpointState.save_checkpoint(back, out, True)
    assert read_checkpoint(out).optimizer_groups["group0"].step == 4


def test_rewriting_ort_file_keeps_every_value(ort_mlp, tmp_path):
    """Re-encoding ORT's own file keeps every name, value and byte of tensor data."""
    _, path = _ort_trained_state(ort_mlp, tmp_path)
    c = read_checkpoint(path)
    mine = encode_checkpoint(c)
    with open(path, "rb") as f:
        theirs = f.read()
    assert read_checkpoint_bytes(mine, tmp_path) == read_checkpoint_bytes(theirs, tmp_path)


def read_checkpoint_bytes(data: bytes, tmp_path) -> CheckpointContents:
    p = tmp_path / "tmp_roundtrip"
    p.write_bytes(data)
    c = read_checkpoint(p)
    for e in c.trainable + c.frozen:
        e.data = e.data.tobytes()
    for g in c.optimizer_groups.values():
        g.momentums = {k: {m: a.tobytes() for m, a in v.items()} for k, v in g.momentums.items()}
    return c


def test_without_optimizer_state(ort_mlp, tmp_path):
    _, path = _ort_trained_state(ort_mlp, tmp_path, with_props=False)
    ours = api.CheckpointState.load_checkpoint(path)
    out = tmp_path / "no_opt"
    api.CheckpointState.save_checkpoint(ours, out)
    assert read_checkpoint(out).optimizer_groups == {}
    ort_api.CheckpointState.load_checkpoint(os.fspath(out))


def test_parameter_access(ort_mlp):
    st = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    ref = ort_api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    assert [n for n, _ in st.parameters] == [n for n, _ in ref.parameters]  # name order
    assert len(st.parameters) == 4 and "fc1.weight" in st.parameters
    assert "nope" not in st.parameters
    p = st.parameters["fc1.bias"]
    assert p.name == "fc1.bias" and p.requires_grad and p.grad is None
    assert not st.parameters["fc2.bias"].requires_grad
    assert "fc1.bias" in repr(p)
    # .data is a copy; assignment copies in
    d = p.data
    d[:] = 5
    assert not np.all(st.parameters["fc1.bias"].data == 5)
    new = np.arange(32, dtype=np.float32)
    p.data = new
    np.testing.assert_array_equal(st.parameters["fc1.bias"].data, new)
    st.parameters["fc1.bias"] = new * 2
    np.testing.assert_array_equal(st.parameters["fc1.bias"].data, new * 2)
    with pytest.raises(KeyError, match="nope"):
        st.parameters["nope"]


def test_parameter_assignment_errors(ort_mlp):
    st = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    p = st.parameters["fc1.bias"]
    before = p.data
    with pytest.raises(ValueError, match=r"fc1.bias.*shape \[32\].*\[3\]"):
        p.data = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match="fc1.bias.*float32.*float64"):
        p.data = np.zeros(32, np.float64)
    with pytest.raises(TypeError, match="fc1.bias.*numpy array"):
        p.data = [0.0] * 32
    with pytest.raises(KeyError, match="nope"):
        st.parameters["nope"] = np.zeros(3, np.float32)
    np.testing.assert_array_equal(p.data, before)


def test_properties(tmp_path, ort_mlp):
    st = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    st.properties["i"] = 2**40
    st.properties["f"] = 0.1
    st.properties["s"] = ""
    st.properties["b"] = True  # ORT stores a bool as an int
    assert st.properties["f"] == float(np.float32(0.1))  # float32, as ORT keeps it
    assert st.properties["b"] == 1 and isinstance(st.properties["b"], int)
    assert len(st.properties) == 4 and "i" in st.properties
    st.properties["i"] = "now a string"
    assert st.properties["i"] == "now a string"
    for bad in ([1], None, {"a": 1}, np.zeros(2)):
        with pytest.raises(TypeError, match="property 'bad'"):
            st.properties["bad"] = bad
    with pytest.raises(OverflowError, match="int64"):
        st.properties["big"] = 2**63
    with pytest.raises(KeyError, match="missing"):
        st.properties["missing"]
    out = os.fspath(tmp_path / "props")
    api.CheckpointState.save_checkpoint(st, out)
    back = ort_api.CheckpointState.load_checkpoint(out)
    assert dict(back.properties) == dict(st.properties)


def test_nominal_checkpoint(ort_mlp, tmp_path):
    st = api.CheckpointState.load_checkpoint(ort_mlp.nominal_checkpoint)
    assert st.is_nominal and len(st.parameters) == 4
    with pytest.raises(RuntimeError, match="nominal"):
        st.parameters["fc1.weight"]
    with pytest.raises(RuntimeError, match="nominal"):
        st.parameters["fc1.weight"] = np.zeros((32, 20), np.float32)
    out = os.fspath(tmp_path / "nominal_again")
    api.CheckpointState.save_checkpoint(st, out)
    c = read_checkpoint(out)
    assert c.is_nominal and all(e.data is None for e in c.trainable + c.frozen)
    ort_api.CheckpointState.load_checkpoint(out)  # ORT reads ours


# ---- bad files --------------------------------------------------------------------


def _good_bytes(ort_mlp) -> bytes:
    with open(ort_mlp.checkpoint, "rb") as f:
        return f.read()


@pytest.mark.parametrize("cut", [0, 3, 7, 8, 40, 0.5, -1])
def test_truncated_file(ort_mlp, tmp_path, cut):
    data = _good_bytes(ort_mlp)
    n = int(len(data) * cut) if isinstance(cut, float) else (len(data) + cut if cut < 0 else cut)
    p = tmp_path / "cut"
    p.write_bytes(data[:n])
    with pytest.raises(api.CheckpointError, match="invalid"):
        api.CheckpointState.load_checkpoint(p)


def test_every_truncation_is_a_clear_error(ort_mlp, tmp_path):
    data = _good_bytes(ort_mlp)
    p = tmp_path / "cut"
    for n in range(0, len(data), 7):
        p.write_bytes(data[:n])
        with pytest.raises(api.CheckpointError):
            api.CheckpointState.load_checkpoint(p)


def test_corrupted_bytes_never_crash(ort_mlp, tmp_path):
    data = bytearray(_good_bytes(ort_mlp))
    rng = np.random.default_rng(0)
    p = tmp_path / "flip"
    for _ in range(300):
        bad = bytearray(data)
        for i in rng.integers(0, len(bad), 3):
            bad[i] = int(rng.integers(0, 256))
        p.write_bytes(bytes(bad))
        try:
            api.CheckpointState.load_checkpoint(p)
        except api.CheckpointError:
            pass


def test_wrong_identifier_and_version(ort_mlp, tmp_path):
    data = bytearray(_good_bytes(ort_mlp))
    data[4:8] = b"ORTM"
    p = tmp_path / "ident"
    p.write_bytes(bytes(data))
    with pytest.raises(api.CheckpointError, match="identifier.*ORTM.*ODTC"):
        api.CheckpointState.load_checkpoint(p)
    p.write_bytes(b"\x00" * 64)
    with pytest.raises(api.CheckpointError, match="identifier"):
        api.CheckpointState.load_checkpoint(p)
    c = read_checkpoint(ort_mlp.checkpoint)
    data = bytearray(encode_checkpoint(c))
    # the version is the first scalar we write; find it through the root table
    root = struct.unpack_from("<I", data, 0)[0]
    vtable = root - struct.unpack_from("<i", data, root)[0]
    version_at = root + struct.unpack_from("<H", data, vtable + 4)[0]
    struct.pack_into("<i", data, version_at, 1)
    p.write_bytes(bytes(data))
    with pytest.raises(api.CheckpointError, match="version 1"):
        api.CheckpointState.load_checkpoint(p)


def test_missing_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        api.CheckpointState.load_checkpoint(tmp_path / "nothing")
    with pytest.raises(api.CheckpointError, match="directory"):
        api.CheckpointState.load_checkpoint(tmp_path)


# ---- atomic save ------------------------------------------------------------------


def test_save_is_atomic(ort_mlp, tmp_path, monkeypatch):
    st = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    out = tmp_path / "ckpt"
    api.CheckpointState.save_checkpoint(st, out)
    good = out.read_bytes()

    # a write that dies half way leaves the old checkpoint and no temp file
    real_fdopen = os.fdopen

    class Dies:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError("disk full")

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: Dies(real_fdopen(fd, mode)))
    st.parameters["fc1.bias"] = np.zeros(32, np.float32)
    with pytest.raises(OSError, match="disk full"):
        api.CheckpointState.save_checkpoint(st, out)
    monkeypatch.undo()
    assert out.read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


def test_unsaveable_state_writes_nothing(ort_mlp, tmp_path):
    st = api.CheckpointState.load_checkpoint(ort_mlp.checkpoint)
    out = tmp_path / "ckpt"
    api.CheckpointState.save_checkpoint(st, out)
    good = out.read_bytes()
    st._properties["bad"] = object()  # bypassing the checks: encoding must fail first
    with pytest.raises(TypeError, match="property 'bad'"):
        api.CheckpointState.save_checkpoint(st, out)
    assert out.read_bytes() == good and os.listdir(tmp_path) == ["ckpt"]
    del st._properties["bad"]
    with pytest.raises(FileNotFoundError, match="folder"):
        api.CheckpointState.save_checkpoint(st, tmp_path / "no" / "such" / "ckpt")
    with pytest.raises(TypeError, match="CheckpointState"):
        api.CheckpointState.save_checkpoint("not a state", out)


def test_other_dtypes_roundtrip(tmp_path):
    """Every numeric dtype ORT's Tensor table can hold survives a write and read."""
    rng = np.random.default_rng(0)
    entries = []
    for i, dt in enumerate([np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16,
                            np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.bool_]):
        a = (rng.standard_normal((2, 3)) * 50).astype(dt)
        entries.append(TensorEntry(f"t{i}", a.shape, a.dtype, a))
    entries.append(TensorEntry("empty", (0, 4), np.dtype(np.float32),
                               np.zeros((0, 4), np.float32)))
    entries.append(TensorEntry("scalar", (), np.dtype(np.float32), np.array(3.5, np.float32)))
    c = CheckpointContents(trainable=entries[:1], frozen=entries[1:])
    p = tmp_path / "dtypes"
    p.write_bytes(encode_checkpoint(c))
    back = read_checkpoint(p)
    got = {e.name: e.data for e in back.trainable + back.frozen}
    for e in entries:
        assert got[e.name].dtype == e.data.dtype and got[e.name].shape == e.data.shape
        assert got[e.name].tobytes() == e.data.tobytes()


def test_external_data_is_refused(tmp_path):
    """ORT's format can point tensors at a side file (ModuleState.has_external_data,
    Tensor.external_data_offset); such a checkpoint is refused by name, not misread."""
    import flatbuffers

    b = flatbuffers.Builder(256)
    name = b.CreateString("w")
    dims = b.CreateNumpyVector(np.array([2], np.int64))
    b.StartObject(7)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(2, dims, 0)
    b.PrependInt32Slot(3, 1, 0)
    b.PrependInt64Slot(6, 0, -1)  # external_data_offset = 0
    tensor = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(tensor)
    vec = b.EndVector()
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, vec, 0)
    module_state = b.EndObject()
    b.StartObject(4)
    b.PrependInt32Slot(0, 2, 0)
    b.PrependUOffsetTRelativeSlot(1, module_state, 0)
    b.Finish(b.EndObject(), file_identifier=b"ODTC")
    p = tmp_path / "external"
    p.write_bytes(bytes(b.Output()))
    with pytest.raises(api.CheckpointError, match="'w'.*external file"):
        api.CheckpointState.load_checkpoint(p)


def test_random_contents_roundtrip(tmp_path):
    """Names with any unicode, empty and long strings, extreme numbers: what is written
    is what is read, by us and by ORT."""
    rng = np.random.default_rng(0)
    alphabet = list("abcXYZ._-/0129 ") + ["é", "ß", "漢", "🙂", "\u200b"]
    p = tmp_path / "random"
    for trial in range(5):
        def name(k):
            return f"{k}:" + "".join(rng.choice(alphabet, int(rng.integers(0, 40))))
        entries = [TensorEntry(name(i), a.shape, a.dtype, a) for i, a in enumerate(
            rng.standard_normal(tuple(int(d) for d in rng.integers(1, 5, int(rng.integers(
                0, 4))))).astype(np.float32) for _ in range(4))]
        props = {name(100 + i): v for i, v in enumerate(
            [int(rng.integers(-2**62, 2**62)), float(np.float32(rng.standard_normal())),
             "".join(rng.choice(alphabet, 300)), "", -(2**63), 2**63 - 1])}
        c = CheckpointContents(trainable=entries[:2], frozen=entries[2:], properties=props)
        p.write_bytes(encode_checkpoint(c))
        back = read_checkpoint(p)
        assert back.properties == props, trial
        got = {e.name: e.data for e in back.trainable + back.frozen}
        for e in entries:
            assert got[e.name].tobytes() == e.data.tobytes() and got[e.name].shape == e.dims
        theirs = ort_api.CheckpointState.load_checkpoint(os.fspath(p))
        assert dict(theirs.properties) == props
        for n, prm in theirs.parameters:
            assert prm.data.tobytes() == got[n].tobytes()
