"""mpi4py access and the wire protocol shared by the Send/Recv kernels and the
Python API.

mpi4py is imported on first use, never at import time; without it (or outside
``mpiexec``) the world is one process of rank 0. Everything goes through
``MPI.COMM_WORLD`` (as ONNX Runtime's Send/Recv do).

Wire format of one point-to-point message (a "parcel" of one or more tensors):

1. a header, an ``int64`` array sent on tag ``4*tag + channel`` (channel 0 for
   forward traffic, 2 for gradients sent by autograd's backward)::

       [MAGIC, VERSION, flags, n_tensors, total_bytes,
        (onnx_dtype, ndim, *dims) for each tensor]

   ``flags`` bit 0: the sender's tensor is tracked by autograd.
2. the data, ``total_bytes`` raw bytes (``MPI.BYTE``) on tag ``4*tag + channel + 1``.
   Tensor *i* starts at the next multiple of 256 bytes after tensor *i-1* ends (ORT's
   packing); a single tensor is sent from its own memory, without a copy.

The header lets the receiver allocate the right dtype and shape (or check the
``out=`` tensor it was given) before any data byte lands; the data is never pickled.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from ..kernels._checks import cpu_tensor, int_attr

MAGIC = 0x4F52_5443  # "ORTC"
VERSION = 1
HEADER_SLOTS = 512  # int64 slots reserved for a received header
ALIGN = 256  # bytes, ORT's packing alignment
FLAG_REQUIRES_GRAD = 1
CHANNEL_DATA = 0
CHANNEL_GRAD = 2

INSTALL_HINT = "pip install ortcpu-torch[mpi]"

# ONNX TensorProto data type codes <-> torch dtypes (ORT's element_types attribute).
ONNX_TO_TORCH: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.uint8,
    3: torch.int8,
    4: torch.uint16,
    5: torch.int16,
    6: torch.int32,
    7: torch.int64,
    9: torch.bool,
    10: torch.float16,
    11: torch.float64,
    12: torch.uint32,
    13: torch.uint64,
    14: torch.complex64,
    15: torch.complex128,
    16: torch.bfloat16,
}
for _code, _name in ((17, "float8_e4m3fn"), (18, "float8_e4m3fnuz"), (19, "float8_e5m2"),
                     (20, "float8_e5m2fnuz")):
    if hasattr(torch, _name):
        ONNX_TO_TORCH[_code] = getattr(torch, _name)
TORCH_TO_ONNX: dict[torch.dtype, int] = {v: k for k, v in ONNX_TO_TORCH.items()}

_MPI = None  # the mpi4py.MPI module once loaded, False if unavailable


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def shape_str(shape) -> str:
    shape = tuple(shape)
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def mpi(required: bool = False):
    """The ``mpi4py.MPI`` module, or ``None`` when mpi4py is not installed.

    With ``required=True`` a missing mpi4py raises ImportError naming the extra.
    """
    global _MPI
    if _MPI is None:
        try:
            from mpi4py import MPI
        except ImportError:  # pragma: no cover - depends on the environment
            _MPI = False
        else:
            _MPI = MPI
    if _MPI is False:
        if required:
            raise ImportError(
                "ortcpu_torch.distributed needs mpi4py and an MPI library for "
                f"multi-process communication: {INSTALL_HINT}"
            )
        return None
    return _MPI


def comm():
    """``MPI.COMM_WORLD`` (mpi4py required)."""
    return mpi(required=True).COMM_WORLD


def rank() -> int:
    """This process's rank in MPI_COMM_WORLD; 0 without MPI."""
    m = mpi()
    return 0 if m is None else m.COMM_WORLD.Get_rank()


def world_size() -> int:
    """Number of processes in MPI_COMM_WORLD; 1 without MPI."""
    m = mpi()
    return 1 if m is None else m.COMM_WORLD.Get_size()


def max_tag() -> int:
    m = mpi()
    if m is None:
        return 2**15 // 4 - 1
    ub = m.COMM_WORLD.Get_attr(m.TAG_UB)
    return (ub if ub else 32767) // 4 - 1


def check_peer(op: str, name: str, peer) -> int:
    """Validate a remote rank: an int in range, not our own rank."""
    peer = int_attr(op, name, peer)
    size, me = world_size(), rank()
    if peer == me:
        raise ValueError(f"{op}: {name}={peer} is this process's own rank; point-to-point "
                         "messages must go to another rank")
    if not 0 <= peer < size:
        hint = ""
        if size == 1 and mpi() is None:
            hint = f" (mpi4py is not installed: {INSTALL_HINT})"
        elif size == 1:
            hint = " (launch with mpiexec -n N python -m mpi4py ...)"
        raise ValueError(f"{op}: {name} must be a rank in [0, {size - 1}], got {peer}{hint}")
    mpi(required=True)
    return peer


def check_tag(op: str, tag) -> int:
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise TypeError(f"{op}: tag must be an int, got {type(tag).__name__}")
    hi = max_tag()
    if not 0 <= tag <= hi:
        raise ValueError(f"{op}: tag must be in [0, {hi}], got {tag}")
    return tag


def check_tensor(op: str, name: str, t) -> torch.Tensor:
    t = cpu_tensor(op, name, t)
    if t.dtype not in TORCH_TO_ONNX:
        raise TypeError(f"{op}: {name} has dtype {dtype_name(t.dtype)}, which has no wire "
                        f"encoding; supported: {', '.join(dtype_name(d) for d in TORCH_TO_ONNX)}")
    return t


def as_bytes(t: torch.Tensor):
    """A writable numpy uint8 view of a contiguous tensor's memory (no copy)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        import numpy as np

        return np.empty(0, dtype=np.uint8)
    return flat.view(torch.uint8).numpy()


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(specs) -> tuple[list[int], int]:
    """Byte offsets of each (dtype, shape) in a packed parcel, and the total size."""
    offsets, end = [], 0
    for i, (dt, shape) in enumerate(specs):
        start = 0 if i == 0 else _aligned(end)
        offsets.append(start)
        end = start + math.prod(shape) * dt.itemsize
    return offsets, end


class Parcel:
    """Tensors prepared for sending: a header array and one contiguous byte buffer."""

    def __init__(self, op: str, tensors, requires_grad: bool = False):
        import numpy as np

        specs, parts = [], []
        for i, t in enumerate(tensors):
            name = "tensor" if len(tensors) == 1 else f"Data[{i}]"
            t = check_tensor(op, name, t)
            t = t.detach()
            if not t.is_contiguous():
                t = t.contiguous()  # mpi4py would send a transposed tensor in memory order
            specs.append((t.dtype, tuple(t.shape)))
            parts.append(t)
        offsets, total = layout(specs)
        header = [MAGIC, VERSION, FLAG_REQUIRES_GRAD if requires_grad else 0, len(parts), total]
        for dt, shape in specs:
            header += [TORCH_TO_ONNX[dt], len(shape), *shape]
        if len(header) > HEADER_SLOTS:
            raise ValueError(f"{op}: too many tensors/dimensions for one message "
                             f"(header of {len(header)} > {HEADER_SLOTS} int64 slots)")
        self.header = np.asarray(header, dtype=np.int64)
        if len(parts) == 1:
            self.keep = parts[0]  # sent from its own memory
            self.data = as_bytes(parts[0])
        else:
            self.keep = torch.empty(total, dtype=torch.uint8)
            self.data = self.keep.numpy()
            for off, t in zip(offsets, parts, strict=True):
                nb = t.numel() * t.element_size()
                if nb:
                    self.data[off : off + nb] = as_bytes(t)


def decode_header(op: str, buf, count: int, peer: int, tag: int):
    """(flags, [(dtype, shape)], total_bytes) from a received header, or a clear error."""
    h = [int(v) for v in buf[:count]]
    if count < 5 or h[0] != MAGIC:
        raise RuntimeError(f"{op}: message from rank {peer} (tag {tag}) is not an ortcpu_torch "
                           "tensor header; the sender must use ortcpu_torch.distributed / Send")
    if h[1] != VERSION:
        raise RuntimeError(f"{op}: rank {peer} speaks wire version {h[1]}, we speak {VERSION}")
    flags, n, total = h[2], h[3], h[4]
    specs, i = [], 5
    for _ in range(n):
        code, ndim = h[i], h[i + 1]
        if code not in ONNX_TO_TORCH:
            raise RuntimeError(f"{op}: rank {peer} sent unknown element type {code}")
        specs.append((ONNX_TO_TORCH[code], tuple(h[i + 2 : i + 2 + ndim])))
        i += 2 + ndim
    if layout(specs)[1] != total:
        raise RuntimeError(f"{op}: corrupt header from rank {peer}: sizes do not add up")
    return flags, specs, total


# ---------------------------------------------------------------------------------------
# Requests. Receives on one (source, tag, channel) are completed in posting order, so a
# later irecv's wait() never steals an earlier parcel's data message.

_pending_recvs: dict[tuple, deque] = {}


class Request:
    """A pending isend/irecv. ``wait()`` blocks until done and returns the received
    tensor (irecv) or None (isend); ``test()`` says whether it is done without blocking
    (for an irecv it may complete it)."""

    def __init__(self):
        self._done = False
        self._result = None

    def is_completed(self) -> bool:
        return self._done

    def test(self) -> bool:
        return self._done

    def wait(self, timeout=None):
        return self._result


class SendRequest(Request):
    def __init__(self, parcel: Parcel, reqs):
        super().__init__()
        self._parcel = parcel  # keeps the buffers alive until the sends complete
        self._reqs = reqs

    def test(self) -> bool:
        if not self._done:
            self._done = mpi(required=True).Request.Testall(self._reqs)
            if self._done:
                self._parcel = None
        return self._done

    def wait(self, timeout=None):
        if not self._done:
            mpi(required=True).Request.Waitall(self._reqs)
            self._done, self._parcel = True, None
        return None


def isend_parcel(op: str, parcel: Parcel, dst: int, tag: int, channel: int) -> SendRequest:
    MPI = mpi(required=True)
    c = MPI.COMM_WORLD
    r1 = c.Isend([parcel.header, MPI.INT64_T], dest=dst, tag=4 * tag + channel)
    r2 = c.Isend([parcel.data, MPI.BYTE], dest=dst, tag=4 * tag + channel + 1)
    return SendRequest(parcel, [r1, r2])


class RecvRequest(Request):
    """Posted header receive; the data is received when the request is completed."""

    def __init__(self, op, src, tag, channel, expect, out, finish):
        import numpy as np

        super().__init__()
        MPI = mpi(required=True)
        self._op, self._src, self._tag, self._channel = op, src, tag, channel
        self._expect, self._out, self._finish = expect, out, finish
        self._hbuf = np.empty(HEADER_SLOTS, dtype=np.int64)
        self._status = MPI.Status()
        self._req = MPI.COMM_WORLD.Irecv([self._hbuf, MPI.INT64_T], source=src,
                                         tag=4 * tag + channel)
        self._key = (src, tag, channel)
        _pending_recvs.setdefault(self._key, deque()).append(self)

    def test(self) -> bool:
        if self._done:
            return True
        q = _pending_recvs.get(self._key)
        if q and q[0] is self and self._req.Test(self._status):
            self._complete(header_done=True)
        return self._done

    def wait(self, timeout=None):
        if not self._done:
            q = _pending_recvs[self._key]
            while q and q[0] is not self:  # earlier receives on this channel first
                q[0]._complete()
            self._complete()
        return self._result

    def _complete(self, header_done: bool = False):
        MPI = mpi(required=True)
        q = _pending_recvs[self._key]
        assert q[0] is self
        q.popleft()
        if not q:
            del _pending_recvs[self._key]
        self._done = True
        if not header_done:
            self._req.Wait(self._status)
        count = self._status.Get_count(MPI.INT64_T)
        flags, specs, total = decode_header(self._op, self._hbuf, count, self._src, self._tag)
        error = self._check(specs)
        targets = None
        if error is None:
            targets = [self._out[i] if self._out is not None else None
                       for i in range(len(specs))]
            direct = (len(specs) == 1 and targets[0] is not None
                      and targets[0].is_contiguous())
        else:
            direct = False
        if direct:
            buf_t = targets[0]
            buf = as_bytes(buf_t)
        elif len(specs) == 1 and error is None:
            buf_t = torch.empty(specs[0][1], dtype=specs[0][0])
            buf = as_bytes(buf_t)
        else:
            buf_t = torch.empty(total, dtype=torch.uint8)
            buf = buf_t.numpy()
        # the data message is always consumed, even on a mismatch: the channel stays in sync
        MPI.COMM_WORLD.Recv([buf, MPI.BYTE], source=self._src, tag=4 * self._tag
                            + self._channel + 1)
        if error is not None:
            raise error
        if len(specs) == 1:
            results = [buf_t]
        else:
            offsets, _ = layout(specs)
            results = []
            for (dt, shape), off in zip(specs, offsets, strict=True):
                nb = math.prod(shape) * dt.itemsize
                results.append(buf_t[off : off + nb].view(dt).reshape(shape).clone()
                               if nb else torch.empty(shape, dtype=dt))
        for i, tgt in enumerate(targets):
            if tgt is not None and results[i] is not tgt:
                tgt.copy_(results[i])
                results[i] = tgt
        self._result = self._finish(results, flags)

    def _check(self, specs):
        exp = self._expect
        if exp is None:
            return None
        if len(exp) != len(specs):
            return ValueError(f"{self._op}: expected {len(exp)} tensor(s) from rank {self._src} "
                              f"(tag {self._tag}), the sender sent {len(specs)}")
        for i, ((edt, eshape), (dt, shape)) in enumerate(zip(exp, specs, strict=True)):
            name = "out" if self._out is not None else f"Data[{i}]"
            if edt is not None and edt != dt:
                return TypeError(f"{self._op}: {name} expects dtype {dtype_name(edt)} but rank "
                                 f"{self._src} sent {dtype_name(dt)} (tag {self._tag})")
            if eshape is not None and tuple(eshape) != tuple(shape):
                return ValueError(f"{self._op}: {name} expects shape {shape_str(eshape)} but rank "
                                  f"{self._src} sent shape {shape_str(shape)} (tag {self._tag})")
        return None
