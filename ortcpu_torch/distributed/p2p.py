"""Point-to-point messages between ranks, autograd-aware for pipeline parallelism.

``send(x, dst)`` on a tensor tracked by autograd returns a zero scalar carrying a
backward edge: backward through it *receives* the gradient of ``x`` from ``dst``.
``recv(src)`` of such a tensor returns a tensor whose backward *sends* the gradient
back to ``src`` (the sender's flag travels in the message header). So a two-stage
pipeline is::

    # rank 0                                # rank 1
    h = stage0(x)                           h = dist.recv(0)
    sig = dist.send(h, 1)                   loss = loss_fn(stage1(h), y)
    sig.backward()                          loss.backward()   # sends dL/dh to rank 0
"""

from __future__ import annotations

import torch

from . import _mpi
from ._mpi import CHANNEL_DATA, CHANNEL_GRAD, Parcel

__all__ = ["send", "recv", "isend", "irecv", "Request"]

Request = _mpi.Request


def _tracked(t: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and t.requires_grad


class _SendFn(torch.autograd.Function):
    """Forward: nothing (the send already happened). Backward: receive dL/dx from dst."""

    @staticmethod
    def forward(ctx, x, dst, tag):
        ctx.dst, ctx.tag = dst, tag
        ctx.meta = (x.dtype, tuple(x.shape))
        return x.new_zeros((), dtype=x.dtype if x.dtype.is_floating_point else torch.float32)

    @staticmethod
    def backward(ctx, _grad_signal):
        dt, shape = ctx.meta
        req = _mpi.RecvRequest("send (backward)", ctx.dst, ctx.tag, CHANNEL_GRAD,
                               [(dt, shape)], None, lambda ts, flags: ts[0])
        return req.wait(), None, None


class _RecvFn(torch.autograd.Function):
    """Forward: return the received tensor. Backward: send dL/dy back to src."""

    @staticmethod
    def forward(ctx, _anchor, value, src, tag):
        ctx.src, ctx.tag = src, tag
        ctx.meta = (value.dtype, tuple(value.shape))
        return value

    @staticmethod
    def backward(ctx, grad):
        dt, shape = ctx.meta
        if grad is None:
            grad = torch.zeros(shape, dtype=dt)
        _mpi.isend_parcel("recv (backward)", Parcel("recv (backward)", [grad]), ctx.src,
                          ctx.tag, CHANNEL_GRAD).wait()
        return None, None, None, None


def _finish_recv(src: int, tag: int, requires_grad):
    def finish(tensors, flags):
        t = tensors[0]
        want = bool(flags & _mpi.FLAG_REQUIRES_GRAD) if requires_grad is None else requires_grad
        if want and torch.is_grad_enabled() and (t.dtype.is_floating_point or t.is_complex()):
            anchor = torch.empty(0, requires_grad=True)
            return _RecvFn.apply(anchor, t, src, tag)
        return t

    return finish


def _check_out(op, out):
    if out is None:
        return None
    _mpi.check_tensor(op, "out", out)
    if out.requires_grad:
        raise ValueError(f"{op}: out must not require grad (it is written in place)")
    return [(out.dtype, tuple(out.shape))]


def isend(tensor: torch.Tensor, dst: int, tag: int = 0) -> Request:
    """Start sending ``tensor`` to rank ``dst``; returns a request to ``wait()`` on.

    The tensor is sent detached and contiguous (a non-contiguous tensor is copied first
    so the receiver gets its logical layout); a contiguous tensor is sent from its own
    memory, so do not modify it before ``wait()``. Not autograd-aware (use ``send``).
    """
    op = "isend"
    _mpi.check_tensor(op, "tensor", tensor)
    tag = _mpi.check_tag(op, tag)
    dst = _mpi.check_peer(op, "dst", dst)
    return _mpi.isend_parcel(op, Parcel(op, [tensor]), dst, tag, CHANNEL_DATA)


def send(tensor: torch.Tensor, dst: int, tag: int = 0):
    """Send ``tensor`` to rank ``dst`` and wait until its buffer may be reused.

    If ``tensor`` is tracked by autograd, returns a zero scalar connected to it:
    calling ``.backward()`` on it (or adding it to a loss) receives the gradient of
    ``tensor`` from ``dst``, which the matching ``recv`` sends in its backward.
    Otherwise returns None.
    """
    op = "send"
    _mpi.check_tensor(op, "tensor", tensor)
    tag = _mpi.check_tag(op, tag)
    dst = _mpi.check_peer(op, "dst", dst)
    tracked = _tracked(tensor)
    _mpi.isend_parcel(op, Parcel(op, [tensor], requires_grad=tracked), dst, tag,
                      CHANNEL_DATA).wait()
    if tracked:
        return _SendFn.apply(tensor, dst, tag)
    return None


def irecv(src: int, tag: int = 0, out: torch.Tensor | None = None,
          requires_grad: bool | None = None) -> Request:
    """Start receiving a tensor from rank ``src``; ``wait()`` returns it.

    The sender's dtype and shape come in a header; with ``out=`` they must match
    ``out`` (TypeError / ValueError otherwise, ``out`` untouched) and the data lands in
    ``out``. ``requires_grad`` (default: as the sender's tensor) makes the result
    autograd-aware: its backward sends the gradient back to ``src``.
    """
    op = "irecv"
    tag = _mpi.check_tag(op, tag)
    src = _mpi.check_peer(op, "src", src)
    expect = _check_out(op, out)
    return _mpi.RecvRequest(op, src, tag, CHANNEL_DATA, expect,
                            None if out is None else [out], _finish_recv(src, tag, requires_grad))


def recv(src: int, tag: int = 0, out: torch.Tensor | None = None,
         requires_grad: bool | None = None) -> torch.Tensor:
    """Receive a tensor from rank ``src`` (blocking); see ``irecv``."""
    op = "recv"
    tag = _mpi.check_tag(op, tag)
    src = _mpi.check_peer(op, "src", src)
    expect = _check_out(op, out)
    return _mpi.RecvRequest(op, src, tag, CHANNEL_DATA, expect,
                            None if out is None else [out],
                            _finish_recv(src, tag, requires_grad)).wait()
