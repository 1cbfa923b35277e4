"""ONNX Runtime's on-device training checkpoint file (flatbuffers, identifier ``ODTC``).

Written from the published schema (``ort_training_checkpoint.fbs`` and the ``Tensor``
table of ``ort.fbs``), checkpoint format version 2. Field slots, in schema order:

    Checkpoint      version:int32, module_state, optimizer_groups:[OptimizerGroup],
                    property_bag
    ModuleState     requires_grad_params:[Tensor], frozen_params:[Tensor],
                    is_nominal_state:bool, has_external_data:bool
    OptimizerGroup  group_name:string, step:int64, initial_learning_rate:float,
                    optimizer_states:[ParameterOptimizerState]
    ParameterOptimizerState  param_name:string, momentums:[Tensor]
    PropertyBag     ints:[IntProperty], floats:[FloatProperty], strings:[StringProperty]
    *Property       name:string, value
    Tensor          name:string, doc_string:string, dims:[int64], data_type:int32,
                    raw_data:[uint8], string_data:[string], external_data_offset:int64=-1

A nominal checkpoint keeps every tensor's name and type with an empty ``raw_data`` (ORT
1.19.2 refuses a tensor with neither raw data nor an external data offset).

Reading checks every offset against the buffer before following it (the Python
flatbuffers runtime has no verifier), so a truncated or corrupted file is a
:class:`CheckpointError`, never a crash or silently wrong arrays.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass, field

import numpy as np

FILE_IDENTIFIER = b"ODTC"
FORMAT_VERSION = 2

# ort.fbs TensorDataType -> numpy dtype (little-endian raw_data).
_NUMPY_OF_ORT_TYPE = {
    1: np.dtype("<f4"),
    2: np.dtype("u1"),
    3: np.dtype("i1"),
    4: np.dtype("<u2"),
    5: np.dtype("<i2"),
    6: np.dtype("<i4"),
    7: np.dtype("<i8"),
    9: np.dtype("?"),
    10: np.dtype("<f2"),
    11: np.dtype("<f8"),
    12: np.dtype("<u4"),
    13: np.dtype("<u8"),
}
_ORT_TYPE_OF_NUMPY = {dt.newbyteorder("="): code for code, dt in _NUMPY_OF_ORT_TYPE.items()}


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (truncated, wrong format, inconsistent)."""


@dataclass
class TensorEntry:
    """One named tensor of a checkpoint. ``data`` is None in a nominal checkpoint."""

    name: str
    dims: tuple[int, ...]
    dtype: np.dtype
    data: np.ndarray | None


@dataclass
class OptimizerGroupEntry:
    """One optimizer group: its step, initial learning rate and per-parameter momentums."""

    step: int = 0
    initial_learning_rate: float = 0.001
    # param name -> momentum name ("momentum0", ...) -> array
    momentums: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass
class CheckpointContents:
    """Everything a checkpoint file holds, in plain Python/numpy objects."""

    trainable: list[TensorEntry] = field(default_factory=list)
    frozen: list[TensorEntry] = field(default_factory=list)
    is_nominal: bool = False
    optimizer_groups: dict[str, OptimizerGroupEntry] = field(default_factory=dict)
    properties: dict[str, int | float | str] = field(default_factory=dict)


# --------------------------------------------------------------------------- reading


class _Reader:
    """Bounds-checked access to flatbuffers tables in one buffer."""

    def __init__(self, buf: bytes, path: str):
        self.buf = buf
        self.path = path

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {self.path!r} is invalid: {what}")

    def _unpack(self, fmt: str, pos: int, what: str):
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.buf):
            raise self.fail(f"{what} at byte {pos} lies outside the {len(self.buf)}-byte file")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def table(self, pos: int, what: str) -> _Table:
        soffset = self._unpack("<i", pos, what)
        vtable = pos - soffset
        vtable_len = self._unpack("<H", vtable, f"{what} vtable")
        table_len = self._unpack("<H", vtable + 2, f"{what} vtable")
        if vtable_len < 4 or vtable + vtable_len > len(self.buf) or pos + table_len > len(self.buf):
            raise self.fail(f"{what} table at byte {pos} is truncated")
        return _Table(self, pos, vtable, vtable_len, table_len, what)


class _Table:
    def __init__(self, reader, pos, vtable, vtable_len, table_len, what):
        self.r, self.pos, self.vtable = reader, pos, vtable
        self.vtable_len, self.table_len, self.what = vtable_len, table_len, what

    def _field(self, slot: int) -> int:
        """Absolute position of field ``slot``, or 0 when absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vtable_len:
            return 0
        off = self.r._unpack("<H", self.vtable + entry, self.what)
        if off and off + 1 > self.table_len:
            raise self.r.fail(f"{self.what} field {slot} points past its table")
        return self.pos + off if off else 0

    def scalar(self, slot: int, fmt: str, default):
        pos = self._field(slot)
        return self.r._unpack(fmt, pos, f"{self.what} field {slot}") if pos else default

    def _target(self, slot: int) -> int:
        pos = self._field(slot)
        if not pos:
            return 0
        return pos + self.r._unpack("<I", pos, f"{self.what} field {slot}")

    def string(self, slot: int, what: str) -> str | None:
        pos = self._target(slot)
        if not pos:
            return None
        n = self.r._unpack("<I", pos, what)
        if pos + 4 + n + 1 > len(self.r.buf) or self.r.buf[pos + 4 + n] != 0:
            raise self.r.fail(f"{what} (a {n}-byte string) is truncated")
        try:
            return bytes(self.r.buf[pos + 4 : pos + 4 + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.r.fail(f"{what} is not UTF-8") from e

    def table(self, slot: int, what: str) -> _Table | None:
        pos = self._target(slot)
        return self.r.table(pos, what) if pos else None

    def _vector(self, slot: int, elem_size: int, what: str) -> tuple[int, int] | None:
        pos = self._target(slot)
        if not pos:
            return None
        n = self.r._unpack("<I", pos, what)
        if pos + 4 + n * elem_size > len(self.r.buf):
            raise self.r.fail(f"{what} ({n} elements) is truncated")
        return pos + 4, n

    def tables(self, slot: int, what: str) -> list[_Table]:
        vec = self._vector(slot, 4, what)
        if vec is None:
            return []
        start, n = vec
        out = []
        for i in range(n):
            p = start + 4 * i
            out.append(self.r.table(p + self.r._unpack("<I", p, what), f"{what}[{i}]"))
        return out

    def array(self, slot: int, dtype: np.dtype, what: str) -> np.ndarray | None:
        vec = self._vector(slot, dtype.itemsize, what)
        if vec is None:
            return None
        start, n = vec
        return np.frombuffer(self.r.buf, dtype=dtype, count=n, offset=start)


def _read_tensor(t: _Table, what: str, nominal: bool) -> TensorEntry:
    name = t.string(0, f"{what} name")
    if not name:
        raise t.r.fail(f"{what} has no name")
    dims_arr = t.array(2, np.dtype("<i8"), f"tensor {name!r} dims")
    dims = tuple(int(d) for d in dims_arr) if dims_arr is not None else ()
    if any(d < 0 for d in dims):
        raise t.r.fail(f"tensor {name!r} has negative dims {dims}")
    code = t.scalar(3, "<i", 0)
    dtype = _NUMPY_OF_ORT_TYPE.get(code)
    if dtype is None:
        raise t.r.fail(f"tensor {name!r} has data type {code}, which has no numpy equivalent here")
    if t.scalar(6, "<q", -1) >= 0:
        raise t.r.fail(f"tensor {name!r} keeps its data in an external file, which is "
                       "not supported")
    raw = t.array(4, np.dtype("u1"), f"tensor {name!r} raw_data")
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if nominal and (raw is None or raw.size == 0):
        return TensorEntry(name, dims, dtype.newbyteorder("="), None)
    got = 0 if raw is None else raw.size
    if got != nbytes:
        raise t.r.fail(f"tensor {name!r} of shape {list(dims)} needs {nbytes} bytes, has {got}")
    data = np.frombuffer(raw.tobytes(), dtype=dtype).astype(dtype.newbyteorder("="), copy=False)
    return TensorEntry(name, dims, dtype.newbyteorder("="), data.reshape(dims).copy())


def read_checkpoint(path: str | os.PathLike) -> CheckpointContents:
    """Parse the checkpoint file at ``path``; raise :class:`CheckpointError` if it is not one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(
            f"checkpoint {path!r} is a directory; expected an ONNX Runtime checkpoint file "
            "(directories were the pre-1.15 format)"
        )
    with open(path, "rb") as f:
        buf = f.read()
    r = _Reader(buf, path)
    if len(buf) < 8:
        raise r.fail(f"only {len(buf)} bytes, too short for a flatbuffer")
    if len(buf) % 4:  # a finished flatbuffer is padded to its alignment (>= 4)
        raise r.fail(f"{len(buf)} bytes is not a whole flatbuffer (truncated?)")
    if buf[4:8] != FILE_IDENTIFIER:
        raise r.fail(f"file identifier is {bytes(buf[4:8])!r}, expected {FILE_IDENTIFIER!r}")
    root = r.table(r._unpack("<I", 0, "root offset"), "Checkpoint")
    version = root.scalar(0, "<i", 0)
    if version != FORMAT_VERSION:
        raise r.fail(f"format version {version}, only version {FORMAT_VERSION} is supported")

    out = CheckpointContents()
    ms = root.table(1, "ModuleState")
    if ms is not None:
        out.is_nominal = bool(ms.scalar(2, "<B", 0))
        if ms.scalar(3, "<B", 0):
            raise r.fail("it stores its tensors in an external data file, which is not supported")
        for slot, dest, what in ((0, out.trainable, "requires_grad_params"),
                                 (1, out.frozen, "frozen_params")):
            for i, t in enumerate(ms.tables(slot, what)):
                dest.append(_read_tensor(t, f"{what}[{i}]", out.is_nominal))
        names = [e.name for e in out.trainable + out.frozen]
        if len(set(names)) != len(names):
            raise r.fail("a parameter name appears twice")

    for g in root.tables(2, "optimizer_groups"):
        gname = g.string(0, "optimizer group name")
        if gname is None:
            raise r.fail("an optimizer group has no name")
        if gname in out.optimizer_groups:
            raise r.fail(f"optimizer group {gname!r} appears twice")
        group = OptimizerGroupEntry(step=g.scalar(1, "<q", 0),
                                    initial_learning_rate=g.scalar(2, "<f", 0.0))
        for ps in g.tables(3, f"group {gname!r} optimizer_states"):
            pname = ps.string(0, "optimizer state param_name")
            if pname is None:
                raise r.fail(f"an optimizer state of group {gname!r} has no param_name")
            moms = {}
            for i, t in enumerate(ps.tables(1, f"momentums of {pname!r}")):
                e = _read_tensor(t, f"momentum {i} of {pname!r}", False)
                moms[e.name] = e.data
            group.momentums[pname] = moms
        out.optimizer_groups[gname] = group

    bag = root.table(3, "PropertyBag")
    if bag is not None:
        for slot, fmt, kind in ((0, "<q", "int"), (1, "<f", "float"), (2, None, "string")):
            for p in bag.tables(slot, f"{kind} properties"):
                pname = p.string(0, f"{kind} property name")
                if pname is None:
                    raise r.fail(f"a {kind} property has no name")
                if fmt is None:
                    value = p.string(1, f"string property {pname!r}")
                    if value is None:
                        raise r.fail(f"string property {pname!r} has no value")
                else:
                    value = p.scalar(1, fmt, 0)
                out.properties[pname] = value
    return out


# --------------------------------------------------------------------------- writing


def _flatbuffers():
    try:
        import flatbuffers
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("ONNX Runtime checkpoints need the 'flatbuffers' package") from e
    return flatbuffers


def _build_vector_of_offsets(b, offsets):
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _build_tensor(b, name: str, array: np.ndarray | None, dims, dtype) -> int:
    dtype = np.dtype(dtype)
    code = _ORT_TYPE_OF_NUMPY.get(dtype.newbyteorder("="))
    if code is None:
        raise TypeError(f"tensor {name!r}: dtype {dtype} cannot be stored in a checkpoint")
    name_off = b.CreateString(name)
    dims_off = b.CreateNumpyVector(np.asarray(dims, dtype="<i8").reshape(-1))
    if array is None:  # nominal
        raw = np.zeros(0, np.uint8)
    else:
        raw = np.ascontiguousarray(array, dtype=dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
    raw_off = b.CreateNumpyVector(raw)
    b.StartObject(7)
    b.PrependUOffsetTRelativeSlot(0, name_off, 0)
    b.PrependUOffsetTRelativeSlot(2, dims_off, 0)
    b.PrependInt32Slot(3, code, 0)
    b.PrependUOffsetTRelativeSlot(4, raw_off, 0)
    return b.EndObject()


def _build_named_scalar(b, name: str, value, kind: str) -> int:
    name_off = b.CreateString(name)
    value_off = b.CreateString(value) if kind == "string" else None
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(0, name_off, 0)
    if kind == "int":
        b.PrependInt64Slot(1, value, 0)
    elif kind == "float":
        b.PrependFloat32Slot(1, value, 0.0)
    else:
        b.PrependUOffsetTRelativeSlot(1, value_off, 0)
    return b.EndObject()


def encode_checkpoint(c: CheckpointContents) -> bytes:
    """Serialize ``c`` as ONNX Runtime's checkpoint (names sorted, as ORT writes them)."""
    fb = _flatbuffers()
    nbytes = sum(0 if e.data is None else e.data.nbytes for e in c.trainable + c.frozen)
    b = fb.Builder(max(1024, nbytes + 4096))

    def tensors(entries):
        offs = [_build_tensor(b, e.name, None if c.is_nominal else e.data, e.dims, e.dtype)
                for e in sorted(entries, key=lambda e: e.name)]
        return _build_vector_of_offsets(b, offs)

    trainable_vec, frozen_vec = tensors(c.trainable), tensors(c.frozen)
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, trainable_vec, 0)
    b.PrependUOffsetTRelativeSlot(1, frozen_vec, 0)
    b.PrependBoolSlot(2, c.is_nominal, False)
    module_state = b.EndObject()

    groups = []
    for gname in sorted(c.optimizer_groups):
        g = c.optimizer_groups[gname]
        states = []
        for pname in sorted(g.momentums):
            moms = g.momentums[pname]
            mom_offs = [_build_tensor(b, m, moms[m], moms[m].shape, moms[m].dtype)
                        for m in sorted(moms)]
            pname_off = b.CreateString(pname)
            mom_vec = _build_vector_of_offsets(b, mom_offs)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, pname_off, 0)
            b.PrependUOffsetTRelativeSlot(1, mom_vec, 0)
            states.append(b.EndObject())
        gname_off = b.CreateString(gname)
        states_vec = _build_vector_of_offsets(b, states)
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, gname_off, 0)
        b.PrependInt64Slot(1, int(g.step), 0)
        b.PrependFloat32Slot(2, float(g.initial_learning_rate), 0.0)
        b.PrependUOffsetTRelativeSlot(3, states_vec, 0)
        groups.append(b.EndObject())
    groups_vec = _build_vector_of_offsets(b, groups)

    bag = None
    if c.properties:
        by_kind = {"int": [], "float": [], "string": []}
        for pname in sorted(c.properties):
            value = c.properties[pname]
            kind = property_kind(pname, value)
            by_kind[kind].append(_build_named_scalar(b, pname, value, kind))
        vecs = [_build_vector_of_offsets(b, by_kind[k]) for k in ("int", "float", "string")]
        b.StartObject(3)
        for slot, vec in enumerate(vecs):
            b.PrependUOffsetTRelativeSlot(slot, vec, 0)
        bag = b.EndObject()

    b.StartObject(4)
    b.PrependInt32Slot(0, FORMAT_VERSION, 0)
    b.PrependUOffsetTRelativeSlot(1, module_state, 0)
    b.PrependUOffsetTRelativeSlot(2, groups_vec, 0)
    if bag is not None:
        b.PrependUOffsetTRelativeSlot(3, bag, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def property_kind(name: str, value) -> str:
    """'int', 'float' or 'string' for a property value; TypeError for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, np.integer, np.floating)):
        raise TypeError(
            f"property {name!r}: expected an int, float or str value, got {type(value).__name__}"
        )
    if isinstance(value, (int, np.integer)):
        if not -(2**63) <= int(value) < 2**63:
            raise OverflowError(f"property {name!r}: {value} does not fit in int64")
        return "int"
    return "float" if isinstance(value, (float, np.floating)) else "string"


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_checkpoint(c: CheckpointContents, path: str | os.PathLike) -> None:
    """Encode ``c`` and replace ``path`` atomically (temp file in the same folder + os.replace).

    Encoding happens before anything touches the disk, so an error leaves ``path`` as it was;
    a process killed mid-write leaves at most a stray temp file, never a half-written checkpoint.
    """
    path = os.fspath(path)
    data = encode_checkpoint(c)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"checkpoint folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint path {path!r} is a directory")
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
