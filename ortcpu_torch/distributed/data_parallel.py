"""Data parallelism: one model replica per rank, gradients averaged by allreduce.

``DataParallel(model)`` broadcasts rank 0's parameters and buffers at construction.
Gradients are packed into flat buckets of about ``bucket_mb`` MiB (parameters in
reverse registration order, which is roughly the order backward produces them). A
gradient hook copies each gradient into its bucket as soon as it is accumulated; when a
bucket is full a non-blocking MPI allreduce of it starts (buckets are launched in
bucket order on every rank, so the collectives match), and the later hooks drive
MPI's progress engine while backward continues (or, with ``overlap="thread"``, a
communication thread runs it). When ``backward()`` returns, every
``.grad`` holds the gradient averaged over ranks, as with ``torch.nn.parallel.
DistributedDataParallel``. float16/bfloat16 gradients are reduced in float32.

Every parameter that requires a gradient must get one in every backward on every rank,
unless ``find_unused_parameters=True`` (as in torch's DDP): then a rank without one
contributes zeros (or its existing ``.grad``, e.g. from ``no_sync`` accumulation). Each
bucket carries per-parameter flags through the same allreduce, so a missing gradient is
a ``RuntimeError`` on every rank at the end of that backward, never a hang: the wrapped
model's outputs get a gradient hook, so even a rank whose backward reaches no parameter
at all still takes part in the reduction.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import torch

from . import _mpi

__all__ = ["DataParallel"]


class _Bucket:
    """Flat gradients of ``params`` followed by two flags per parameter, summed by the
    same allreduce: ``used`` (this rank contributes a gradient: a parameter no rank has
    one for keeps ``.grad = None``) and ``produced`` (this backward produced it here: the
    ranks that did not are found without an extra collective)."""

    def __init__(self, params, dtype):
        self.params = params
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        k = len(params)
        self.flat = torch.zeros(n + 2 * k, dtype=dtype)
        self.grads = self.flat[:n]
        self.used = self.flat[n : n + k]
        self.produced = self.flat[n + k :]
        self.arr = self.flat.numpy()
        self.ready = 0
        self.filled = [False] * len(params)
        self.request = None  # Iallreduce request ("poll") or threading.Event ("thread")
        self.error = None

    def slot(self, i):
        p = self.params[i]
        return self.flat[self.offsets[i] : self.offsets[i] + p.numel()].view(p.shape)


class DataParallel(torch.nn.Module):
    """Wrap ``module`` for data-parallel training over MPI (all ranks construct it).

    Args:
        module: the model; rank 0's parameters and buffers are copied to every rank.
        bucket_mb: gradient bucket size in MiB (one allreduce per bucket).
        overlap: how a bucket's allreduce overlaps the rest of backward.
            ``"poll"`` (or True, the default): a non-blocking ``Iallreduce`` starts as
            soon as a bucket is full, and every later gradient hook drives MPI's
            progress engine (MPICH progresses only inside MPI calls). ``"thread"``: a
            communication thread runs each full bucket's blocking allreduce while
            backward continues (mpi4py releases the GIL inside MPI calls); on a 2-core
            machine with 2 ranks it competes with the compute thread and measured no
            faster than False. False: every bucket is reduced after backward has
            produced all gradients.
        broadcast_buffers: also copy rank 0's buffers (e.g. BatchNorm running stats)
            at construction.
        find_unused_parameters: allow a backward to produce no gradient for some
            parameters on some ranks (unused layers, a branch taken on one rank only):
            such a rank contributes zeros (or its existing ``.grad``), and a parameter no
            rank has a gradient for keeps ``.grad = None``. False (the default, as in
            torch's DDP): a missing gradient is a RuntimeError on every rank, naming the
            parameters.

    With one process it is a transparent wrapper (no hooks, no communication).
    ``state_dict`` keys carry a ``module.`` prefix, as torch's DDP does.
    """

    def __init__(self, module: torch.nn.Module, bucket_mb: float = 25, overlap: bool = True,
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"DataParallel: module must be a torch.nn.Module, got "
                            f"{type(module).__name__}")
        if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) \
                or not bucket_mb > 0:
            raise ValueError(
                f"DataParallel: bucket_mb must be a positive number, got {bucket_mb!r}")
        if not isinstance(find_unused_parameters, bool):
            raise TypeError(f"DataParallel: find_unused_parameters must be a bool, got "
                            f"{find_unused_parameters!r}")
        self.module = module
        self.bucket_mb = bucket_mb
        self.find_unused_parameters = find_unused_parameters
        if overlap is True:
            overlap = "poll"
        if overlap not in (False, "thread", "poll"):
            raise ValueError(f"DataParallel: overlap must be True, False, 'thread' or 'poll', "
                             f"got {overlap!r}")
        self.overlap = overlap
        self._thread = None
        self._world = _mpi.world_size()
        self._buckets: list[_Bucket] = []
        self._hooks = []
        self._sync = True
        self._queued = False
        self._next = 0
        # exposed communication: seconds spent after backward waiting for allreduces
        self.stats = {"backward_calls": 0, "wait_s": 0.0}
        if self._world == 1:
            return
        MPI = _mpi.mpi(required=True)
        self._comm = MPI.COMM_WORLD.Dup()  # our own context: never matches user collectives
        self._broadcast_state(broadcast_buffers)
        self._build_buckets()
        if self.overlap == "thread":
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._comm_loop, args=(self._queue,),
                                            name="ortcpu-dp-allreduce", daemon=True)
            self._thread.start()

    # -- construction ------------------------------------------------------------------
    @torch.no_grad()
    def _broadcast_state(self, buffers: bool):
        MPI = _mpi.mpi(required=True)
        tensors = list(self.module.parameters())
        if buffers:
            tensors += list(self.module.buffers())
        # agree on what is being broadcast, so a structural mismatch is an error, not a hang
        sig = hash(tuple((_mpi.TORCH_TO_ONNX.get(t.dtype, -1), tuple(t.shape))
                         for t in tensors)) & 0x7FFFFFFF
        sigs = self._comm.allgather(sig)
        if len(set(sigs)) != 1:
            raise ValueError("DataParallel: the model's parameters/buffers differ between ranks "
                             f"(structure signatures {sigs}); every rank must wrap the same model")
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for dt in sorted(by_dtype, key=str):
            group = by_dtype[dt]
            flat = torch.cat([t.detach().reshape(-1) for t in group]) if group else None
            if flat is None or flat.numel() == 0:
                continue
            self._comm.Bcast([_mpi.as_bytes(flat), MPI.BYTE], root=0)
            off = 0
            for t in group:
                n = t.numel()
                t.copy_(flat[off : off + n].view(t.shape))
                off += n

    def _build_buckets(self):
        cap = int(self.bucket_mb * 2**20)
        params = [p for p in self.module.parameters() if p.requires_grad]
        seen, uniq = set(), []
        for p in params:  # shared parameters are reduced once
            if id(p) not in seen:
                seen.add(id(p))
                uniq.append(p)
        current: dict[torch.dtype, list] = {}
        sizes: dict[torch.dtype, int] = {}
        order: list[tuple[torch.dtype, list]] = []
        for p in reversed(uniq):
            bdt = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
            if not (bdt.is_floating_point or bdt.is_complex):
                raise TypeError(f"DataParallel: parameter of dtype {_mpi.dtype_name(p.dtype)} "
                                "cannot have a gradient to average")
            nbytes = p.numel() * bdt.itemsize
            if bdt in current and sizes[bdt] + nbytes > cap and current[bdt]:
                order.append((bdt, current.pop(bdt)))
            if bdt not in current:
                current[bdt], sizes[bdt] = [], 0
            current[bdt].append(p)
            sizes[bdt] += nbytes
        order.extend(current.items())
        names = {}
        for name, p in self.module.named_parameters():
            names.setdefault(id(p), name)
        self._names = names
        self._where = {}
        for bi, (bdt, ps) in enumerate(order):
            b = _Bucket(ps, bdt)
            self._buckets.append(b)
            for i, p in enumerate(ps):
                self._where[id(p)] = (bi, i)
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    # -- backward ----------------------------------------------------------------------
    def _queue_finish(self):
        """Reduce at the end of the running backward (once per backward)."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _output_hook(self, grad):
        # the backward reached the model's output: this rank takes part in the reduction
        # even if no parameter gets a gradient here
        if self._sync:
            self._queue_finish()

    def _make_hook(self, p):
        key = id(p)

        def hook(param):
            if not self._sync:
                return
            self._queue_finish()
            bi, i = self._where[key]
            b = self._buckets[bi]
            if not b.filled[i]:
                b.slot(i).copy_(param.grad)
                b.used[i] = 1
                b.produced[i] = 1
                b.filled[i] = True
                b.ready += 1
            if self.overlap:
                self._launch_ready()
                if self.overlap == "poll":
                    self._progress()

        return hook

    def _comm_loop(self, q):
        MPI = _mpi.mpi(required=True)
        while True:
            b = q.get()
            if b is None:
                return
            try:
                self._comm.Allreduce(MPI.IN_PLACE, b.arr, op=MPI.SUM)
            except BaseException as e:  # reported on the main thread by _finish
                b.error = e
            b.request.set()

    def _launch(self, b: _Bucket):
        MPI = _mpi.mpi(required=True)
        if self.overlap == "thread":
            b.request = threading.Event()
            self._queue.put(b)
        elif self.overlap == "poll":
            b.request = self._comm.Iallreduce(MPI.IN_PLACE, b.arr, op=MPI.SUM)
        else:
            self._comm.Allreduce(MPI.IN_PLACE, b.arr, op=MPI.SUM)

    def _launch_ready(self):
        while self._next < len(self._buckets):
            b = self._buckets[self._next]
            if b.ready < len(b.params):
                break
            self._launch(b)
            self._next += 1

    def _progress(self):
        MPI = _mpi.mpi()
        reqs = [b.request for b in self._buckets[: self._next] if b.request is not None]
        if reqs:
            MPI.Request.Testall(reqs)

    @torch.no_grad()
    def _finish(self):
        MPI = _mpi.mpi(required=True)
        self._queued = False
        # a parameter that got no gradient in this backward contributes its current .grad
        # (accumulated under no_sync, or reduced before) or, without one, zeros and flag 0;
        # its "produced" flag stays 0, so a missing gradient is seen on every rank below
        for b in self._buckets:
            for i, p in enumerate(b.params):
                if not b.filled[i]:
                    if p.grad is None:
                        b.slot(i).zero_()
                        b.used[i] = 0
                    else:
                        b.slot(i).copy_(p.grad)
                        b.used[i] = 1
                    b.produced[i] = 0
                    b.filled[i] = True
                    b.ready += 1
        t0 = time.perf_counter()
        self._launch_ready()
        if self.overlap == "thread":
            for b in self._buckets:
                b.request.wait()
            errors = [b.error for b in self._buckets if b.error is not None]
            if errors:
                raise RuntimeError("DataParallel: gradient allreduce failed") from errors[0]
        else:
            reqs = [b.request for b in self._buckets if b.request is not None]
            if reqs:
                MPI.Request.Waitall(reqs)
        self.stats["wait_s"] += time.perf_counter() - t0
        self.stats["backward_calls"] += 1
        if not self.find_unused_parameters:
            missing = [(self._names.get(id(p), "?"), int(cnt))
                       for b in self._buckets
                       for p, cnt in zip(b.params, b.produced.real.tolist(), strict=True)
                       if cnt < self._world]
            if missing:
                self._reset_buckets()
                shown = ", ".join(f"{n!r} ({c} of {self._world} ranks)" for n, c in missing[:8])
                more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
                raise RuntimeError(
                    f"DataParallel: this backward produced no gradient for some parameters "
                    f"on some ranks; gradient on: {shown}{more}. Every parameter that "
                    f"requires grad must get one on every rank, or pass "
                    f"find_unused_parameters=True (as torch's DistributedDataParallel); "
                    f"the gradients were not averaged")
        for b in self._buckets:
            b.grads.div_(self._world)
            used = b.used.tolist()
            for i, p in enumerate(b.params):
                if not used[i]:  # no rank has a gradient for it: .grad stays None
                    continue
                avg = b.slot(i)
                if p.grad is None:
                    p.grad = avg.to(p.dtype).clone()
                else:
                    p.grad.copy_(avg)
        self._reset_buckets()

    def _reset_buckets(self):
        for b in self._buckets:
            b.ready, b.filled, b.request, b.error = 0, [False] * len(b.params), None, None
        self._next = 0

    # -- module API --------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if self._world > 1 and self._sync and torch.is_grad_enabled():
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(self._output_hook)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, backward accumulates local gradients without communication (for
        gradient accumulation); the next backward outside reduces the accumulated sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def close(self) -> None:
        """Stop the communication thread and remove the gradient hooks."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        for h in self._hooks:
            h.remove()
        self._hooks = []

    @property
    def world_size(self) -> int:
        return self._world


def _tensors(obj):
    """The tensors in a module's output (nested tuples, lists and dicts)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
