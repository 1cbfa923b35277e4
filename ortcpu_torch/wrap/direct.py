"""torch's forward of a swapped module as a direct call of its ATen function, for the
calls ``select`` gave to torch.

A swapped module that runs torch's side would otherwise call the original module's
``forward`` after copying its state over (``swap.sync_to_original``): for a
``BatchNorm2d`` on 8x32x4x4 that Python layer (momentum bookkeeping, ``F.batch_norm``'s
checks) costs 16 of the 40 us of the call (measured, 1 thread), more than the kernel.
Here the same computation is one call of the ATen op torch's forward ends in, with the
arguments read from the swapped module itself (it holds the very Parameter and buffer
objects, and the configuration attributes the original gets synced from), so nothing is
copied.

``direct_forward(original)`` returns ``run(module, args)`` for a torch module class whose
``forward`` is torch's own (a subclass that overrides it keeps its own forward), or None.
``run`` returns ``NotImplemented`` for a call it does not cover (keyword arguments,
another argument count, a configuration torch's forward treats specially, e.g.
``padding_mode="reflect"`` or ``return_indices=True``): the caller then runs the original
forward. Every runner does what torch 2.13's module forward does for the calls it takes
(tests/test_wrap_direct.py compares outputs, gradients and buffers for each).
"""

from __future__ import annotations

import torch
from torch import nn

_linear = torch._C._nn.linear
_gelu = torch._C._nn.gelu
_batch_norm = torch.batch_norm
_layer_norm = torch.layer_norm
_dropout, _dropout_ = torch.dropout, torch.dropout_
_cross_entropy = torch._C._nn.cross_entropy_loss
_cudnn_enabled = torch._C._get_cudnn_enabled  # what torch.backends.cudnn.enabled reads
_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # torch's _Reduction enum


def _linear_run(m, args):
    if len(args) != 1:
        return NotImplemented
    p = m._parameters
    return _linear(args[0], p["weight"], p["bias"])


def _gelu_run(m, args):
    if len(args) != 1:
        return NotImplemented
    return _gelu(args[0], approximate=m.__dict__["approximate"])


def _conv_run(fn):
    def run(m, args):
        d = m.__dict__
        if len(args) != 1 or d["padding_mode"] != "zeros":
            return NotImplemented
        p = m._parameters
        return fn(args[0], p["weight"], p["bias"], d["stride"], d["padding"], d["dilation"],
                  d["groups"])
    return run


def _max_pool_run(fn):
    def run(m, args):
        d = m.__dict__
        if len(args) != 1 or d["return_indices"]:
            return NotImplemented
        stride = d["stride"]
        return fn(args[0], d["kernel_size"], [] if stride is None else stride, d["padding"],
                  d["dilation"], d["ceil_mode"])
    return run


def _batch_norm_run(dims: tuple):
    """torch's ``_BatchNorm.forward`` (momentum or cumulative average, the
    ``num_batches_tracked`` count, batch statistics in training or without running ones)
    and ``F.batch_norm``'s checks (input rank, more than one value per channel in
    training), then ``torch.batch_norm``."""
    def run(m, args):
        if len(args) != 1:
            return NotImplemented
        x = args[0]
        d, b = m.__dict__, m._buffers
        if x.dim() not in dims:
            return NotImplemented  # torch's _check_input_dim raises the error
        training = d["training"]
        rm, rv = b["running_mean"], b["running_var"]
        use_batch = training or (rm is None and rv is None)
        if use_batch and x.numel() == x.shape[1]:
            return NotImplemented  # F.batch_norm's "more than 1 value per channel" error
        momentum = d["momentum"]
        factor = 0.0 if momentum is None else momentum
        if training and d["track_running_stats"]:
            nbt = b["num_batches_tracked"]
            if nbt is not None:
                nbt.add_(1)
                if momentum is None:
                    factor = 1.0 / float(nbt)
        track = not training or d["track_running_stats"]
        p = m._parameters
        return _batch_norm(x, p["weight"], p["bias"], rm if track else None,
                           rv if track else None, use_batch, factor, d["eps"],
                           _cudnn_enabled())
    return run


def _layer_norm_run(m, args):
    if len(args) != 1:
        return NotImplemented
    d, p = m.__dict__, m._parameters
    return _layer_norm(args[0], d["normalized_shape"], p["weight"], p["bias"], d["eps"],
                       _cudnn_enabled())


def _dropout_run(m, args):
    d = m.__dict__
    p = d["p"]
    if len(args) != 1 or not 0.0 <= p <= 1.0:
        return NotImplemented  # F.dropout raises the error
    return (_dropout_ if d["inplace"] else _dropout)(args[0], p, d["training"])


def _cross_entropy_run(m, args):
    d = m.__dict__
    red = _REDUCTIONS.get(d["reduction"])
    if len(args) != 2 or red is None:
        return NotImplemented
    return _cross_entropy(args[0], args[1], m._buffers["weight"], red, d["ignore_index"],
                          d["label_smoothing"])


_RUNNERS = {
    nn.Linear: _linear_run,
    nn.GELU: _gelu_run,
    nn.Conv1d: _conv_run(torch.conv1d),
    nn.Conv2d: _conv_run(torch.conv2d),
    nn.Conv3d: _conv_run(torch.conv3d),
    nn.MaxPool1d: _max_pool_run(torch.max_pool1d),
    nn.MaxPool2d: _max_pool_run(torch.max_pool2d),
    nn.MaxPool3d: _max_pool_run(torch.max_pool3d),
    nn.BatchNorm1d: _batch_norm_run((2, 3)),
    nn.BatchNorm2d: _batch_norm_run((4,)),
    nn.BatchNorm3d: _batch_norm_run((5,)),
    nn.LayerNorm: _layer_norm_run,
    nn.Dropout: _dropout_run,
    nn.CrossEntropyLoss: _cross_entropy_run,
}


def direct_forward(original: nn.Module):
    """``run(module, args)`` computing ``original``'s forward from the swapped module's
    state, or None where none is written for its class (or the class overrides torch's
    forward)."""
    for cls, run in _RUNNERS.items():
        if isinstance(original, cls):
            return run if type(original).forward is cls.forward else None
    return None
