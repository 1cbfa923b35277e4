"""Communication kernels (spec §15): Send and Recv over MPI_COMM_WORLD via mpi4py.

ORT's signature: ``Send(InputSignal, Remote, *Data, tag=, element_types=)`` ->
``OutputSignal``; ``Recv(InputSignal, Remote, tag=, element_types=)`` ->
``(OutputSignal, *Data)``. The wire format (a header with each tensor's dtype and
shape, then one packed buffer with tensors at 256-byte aligned offsets) is described in
``ortcpu_torch/distributed/_mpi.py``; the header replaces ORT's three shape messages,
so the receiver always knows the layout. Data is sent contiguous and detached, never
pickled. Not runnable in ORT 1.19.2 (built without MPI), so there is no conformance test.
"""

from __future__ import annotations

import torch

from ..distributed import _mpi
from ._registry import register


def _signal(op: str, s) -> None:
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{op}: InputSignal must be a bool scalar tensor, got {type(s).__name__}")
    if s.dtype != torch.bool or s.numel() != 1:
        raise TypeError(f"{op}: InputSignal must be a bool scalar tensor, got "
                        f"{_mpi.dtype_name(s.dtype)} of shape {_mpi.shape_str(s.shape)}")
    if not bool(s.item()):
        raise ValueError(f"{op}: InputSignal must be true (ORT requires it before communicating)")


def _element_types(op: str, element_types, n=None) -> list[torch.dtype]:
    if element_types is None:
        raise TypeError(f"{op}: element_types is a required attribute (one ONNX dtype per tensor)")
    if isinstance(element_types, (int, torch.dtype)):
        element_types = [element_types]
    out = []
    for i, e in enumerate(element_types):
        if isinstance(e, torch.dtype):
            if e not in _mpi.TORCH_TO_ONNX:
                raise TypeError(f"{op}: element_types[{i}] = {e} has no wire encoding")
            out.append(e)
        elif isinstance(e, int) and not isinstance(e, bool) and e in _mpi.ONNX_TO_TORCH:
            out.append(_mpi.ONNX_TO_TORCH[e])
        else:
            raise ValueError(f"{op}: element_types[{i}] must be an ONNX TensorProto dtype code "
                             f"({sorted(_mpi.ONNX_TO_TORCH)}), got {e!r}")
    if n is not None and len(out) != n:
        raise ValueError(f"{op}: element_types has {len(out)} entries for {n} Data tensors")
    return out


def _tag(op: str, tag) -> int:
    if tag is None:
        raise TypeError(f"{op}: tag is a required attribute")
    return _mpi.check_tag(op, tag)


@register
def Send(InputSignal, Remote, *Data, tag=None, element_types=None):
    """Send the Data tensors to rank Remote (MPI point-to-point, blocking until the
    buffers may be reused); returns OutputSignal, a true bool scalar.

    ``element_types`` (ONNX dtype codes, or torch dtypes) must match the Data tensors.
    Sending to one's own rank is an error.
    """
    op = "Send"
    _signal(op, InputSignal)
    tag = _tag(op, tag)
    if not Data:
        raise ValueError(f"{op}: at least one Data tensor is required")
    types = _element_types(op, element_types, len(Data))
    for i, (t, dt) in enumerate(zip(Data, types, strict=True)):
        _mpi.check_tensor(op, f"Data[{i}]", t)
        if t.dtype != dt:
            raise TypeError(f"{op}: Data[{i}] has dtype {_mpi.dtype_name(t.dtype)} but "
                            f"element_types[{i}] says {_mpi.dtype_name(dt)}")
    dst = _mpi.check_peer(op, "Remote", Remote)
    parcel = _mpi.Parcel(op, list(Data))
    _mpi.isend_parcel(op, parcel, dst, tag, _mpi.CHANNEL_DATA).wait()
    return torch.ones((), dtype=torch.bool)


@register
def Recv(InputSignal, Remote, tag=None, element_types=None, output_shapes=None):
    """Receive tensors from rank Remote; returns ``(OutputSignal, *Data)``.

    One output per ``element_types`` entry; the dtypes (and, if given, the
    ``output_shapes=`` keyword — ORT reads static shapes from the graph) must match what
    the sender sent, else TypeError/ValueError (the message is still consumed).
    """
    op = "Recv"
    _signal(op, InputSignal)
    tag = _tag(op, tag)
    types = _element_types(op, element_types)
    if not types:
        raise ValueError(f"{op}: element_types must name at least one tensor")
    if output_shapes is not None:
        if len(output_shapes) != len(types):
            raise ValueError(f"{op}: output_shapes has {len(output_shapes)} entries for "
                             f"{len(types)} element_types")
        shapes = [None if s is None else tuple(int(d) for d in s) for s in output_shapes]
    else:
        shapes = [None] * len(types)
    src = _mpi.check_peer(op, "Remote", Remote)
    req = _mpi.RecvRequest(op, src, tag, _mpi.CHANNEL_DATA, list(zip(types, shapes, strict=True)),
                           None, lambda ts, flags: ts)
    data = req.wait()
    return (torch.ones((), dtype=torch.bool), *data)
