"""Event files: TFRecord framing (uint64 length, masked CRC-32C of the length, data,
masked CRC-32C of the data) computed natively for a whole batch of records, written with
one ``os.write`` per flush so a killed process leaves only whole records behind.

tensorboard's ``RecordWriter`` frames the same bytes but computes CRC-32C in pure Python,
one record per call, from a background thread; this writer is measured faster (see
benchmarks/bench_summary.py) and is checked against tensorboard's reader in the tests.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
import threading
import time

import numpy as np

from .._native import check_status, ffi, lib

_uid = itertools.count()


def frame_records(records: list[bytes]) -> bytes:
    """The framed bytes of ``records`` (one native call)."""
    if not records:
        return b""
    data = b"".join(records)
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    out = bytearray(len(data) + 16 * len(records))
    st = lib.ortcpu_summary_frame_records(
        ffi.from_buffer("uint8_t[]", data), ffi.cast("int64_t *", lengths.ctypes.data),
        len(records), ffi.from_buffer("uint8_t[]", out), len(out))
    check_status(st, "event file framing")
    return bytes(out)


def masked_crc32c(data: bytes) -> int:
    out = ffi.new("uint32_t *")
    check_status(lib.ortcpu_summary_masked_crc32c(ffi.from_buffer("uint8_t[]", data),
                                                  len(data), out), "masked_crc32c")
    return int(out[0])


def read_records(path: str) -> tuple[list[bytes], int]:
    """(records, bytes consumed) of an event file, stopping at the first incomplete or
    corrupt record (its CRCs are checked)."""
    with open(path, "rb") as f:
        buf = f.read()
    out, pos = [], 0
    while pos + 12 <= len(buf):
        (n,) = struct.unpack_from("<Q", buf, pos)
        (hcrc,) = struct.unpack_from("<I", buf, pos + 8)
        if hcrc != masked_crc32c(buf[pos:pos + 8]) or pos + 16 + n > len(buf):
            break
        data = buf[pos + 12:pos + 12 + n]
        (dcrc,) = struct.unpack_from("<I", buf, pos + 12 + n)
        if dcrc != masked_crc32c(data):
            break
        out.append(data)
        pos += 16 + n
    return out, pos


class EventFileWriter:
    """Buffers serialized ``Event`` records and appends them, framed, to one event file:
    when ``max_queue`` records are pending, every ``flush_secs`` (a daemon timer) and on
    ``flush``/``close``. Errors of the timer's flush are raised at the next call."""

    def __init__(self, logdir: str, max_queue: int = 10, flush_secs: float = 120,
                 filename_suffix: str = ""):
        self._logdir = logdir
        try:
            os.makedirs(logdir, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"SummaryWriter: cannot create log_dir {logdir!r}: "
                                   f"{e.strerror}") from None
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_uid)}{filename_suffix}")
        self.path = os.path.join(logdir, name)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise OSError(e.errno, f"SummaryWriter: cannot write to log_dir {logdir!r}: "
                                   f"{e.strerror}") from None
        self._max_queue = max(int(max_queue), 1)
        self._flush_secs = float(flush_secs)
        self._pending: list[bytes] = []
        self._lock = threading.Lock()
        self._closed = False
        self._error: BaseException | None = None
        self._wake = threading.Event()
        self._timer = None
        if self._flush_secs > 0:
            self._timer = threading.Thread(target=self._run_timer, daemon=True,
                                           name="ortcpu-summary-flush")
            self._timer.start()

    def get_logdir(self) -> str:
        return self._logdir

    def _raise_pending_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise OSError(f"SummaryWriter: writing {self.path!r} failed: {e}") from e

    def add_record(self, data: bytes) -> None:
        if self._closed:
            raise RuntimeError(f"SummaryWriter: the event file {self.path!r} is closed")
        if self._error is not None:
            self._raise_pending_error()
        with self._lock:
            self._pending.append(data)
            if len(self._pending) >= self._max_queue:
                self._write_locked()

    def _write_locked(self) -> None:
        if not self._pending:
            return
        buf = frame_records(self._pending)
        self._pending = []
        view = memoryview(buf)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def flush(self) -> None:
        if self._error is not None:
            self._raise_pending_error()
        if self._closed:
            return
        with self._lock:
            self._write_locked()

    def _run_timer(self) -> None:
        while not self._wake.wait(self._flush_secs):
            if self._closed:
                return
            try:
                with self._lock:
                    if not self._closed:
                        self._write_locked()
            except BaseException as e:  # surfaced at the next call, never lost
                self._error = e

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
            try:
                os.fsync(self._fd)
            except OSError as e:  # file systems (and devices) without fsync
                if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
                    raise
        finally:
            with self._lock:
                self._closed = True
                os.close(self._fd)
            self._wake.set()
