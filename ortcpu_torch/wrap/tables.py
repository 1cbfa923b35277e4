"""What ``wrap`` knows how to replace: the module table (``MODULES``: a ``torch.nn`` class
and its ``ortcpu_torch.nn`` counterpart) and the functional table (``FUNCTIONALS``: a torch
callable and the ``ortcpu_torch.ops`` function it is routed to).

Adding a family is one ``ModuleEntry`` (plus an argument-mapping function when the
counterpart's constructor arguments are not plain attributes of the torch module) and one
``FuncEntry`` per functional spelling.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import nn as _onn
from .. import ops as _oops


def _attrs_args(cls: type, m: torch.nn.Module) -> dict:
    """Default argument mapping: every constructor parameter of the counterpart ``cls``
    that the torch module ``m`` has as an attribute of the same name. A parameter whose
    default is a bool but whose attribute is a tensor or None (``bias`` of LayerNorm and
    Conv*) becomes "is present"."""
    out = {}
    for name, p in _init_params(cls).items():
        if name in ("self", "device", "dtype") or name.startswith("_") or \
                p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name not in m.__dict__ and not hasattr(m, name):
            continue
        v = getattr(m, name)
        if isinstance(p.default, bool) and (v is None or isinstance(v, torch.Tensor)):
            v = v is not None
        out[name] = v
    return out


def _init_params(cls: type) -> dict:
    """The constructor parameters of ``cls``; an ``__init__(self, *args, **kwargs)`` that
    only forwards (a counterpart subclassing torch's module) is looked through to the
    first class in the MRO that spells its parameters out."""
    for c in cls.__mro__:
        init = c.__dict__.get("__init__")
        if init is None:
            continue
        ps = inspect.signature(init).parameters
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in ps.values()):
            return dict(ps)
    return {}


@dataclass(frozen=True)
class ModuleEntry:
    """``torch.nn.<torch_name>`` is swapped for ``ortcpu_torch.nn.<ours>``.

    ``args(cls, m)`` returns the counterpart's constructor keyword arguments for the torch
    module ``m`` (default: same-named attributes, see ``_attrs_args``)."""

    torch_name: str
    ours: str | None = None  # default: same name
    args: Callable[[type, torch.nn.Module], dict] = _attrs_args

    @property
    def ours_name(self) -> str:
        return self.ours or self.torch_name

    @property
    def torch_path(self) -> str:
        return f"torch.nn.{self.torch_name}"

    @property
    def torch_cls(self) -> type | None:
        return getattr(torch.nn, self.torch_name, None)

    def counterpart(self) -> type | None:
        return getattr(_onn, self.ours_name, None)


def _rnn_args(cls: type, m: torch.nn.Module) -> dict:
    """torch's LSTM/GRU take ``*args, **kwargs``: their configuration spelled out."""
    out = {k: getattr(m, k) for k in ("input_size", "hidden_size", "num_layers", "bias",
                                      "batch_first", "dropout", "bidirectional")}
    if getattr(m, "proj_size", 0):
        out["proj_size"] = m.proj_size  # the counterpart may refuse it: then not swapped
    return out


MODULES: tuple[ModuleEntry, ...] = tuple(
    ModuleEntry(n, args=_rnn_args) if n in ("LSTM", "GRU") else ModuleEntry(n) for n in (
    # activations
    "GELU", "SiLU", "ReLU", "LeakyReLU", "Softmax", "LogSoftmax",
    "Hardswish", "Hardsigmoid", "ReLU6", "Hardtanh",
    # normalization / loss / dropout (issue 4)
    "LayerNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Dropout",
    "CrossEntropyLoss",
    # conv / pool (issue 5)
    "Conv1d", "Conv2d", "Conv3d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
    "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool2d",
    # RNN / embedding (issue 6)
    "LSTM", "GRU", "Embedding",
    # GEMM
    "Linear",
))


# Signatures of torch's functionals, written out (several are C builtins without an
# introspectable signature). Only used to bind the caller's arguments by name.
# ruff: noqa: E704
def _s_gelu(input, approximate="none"): ...
def _s_softmax_t(input, dim, dtype=None): ...
def _s_softmax_f(input, dim=None, _stacklevel=3, dtype=None): ...
def _s_leaky_relu(input, negative_slope=0.01, inplace=False): ...
def _s_inplace(input, inplace=False): ...
def _s_hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False): ...
def _s_unary(input): ...
def _s_addmm(input, mat1, mat2, beta=1, alpha=1, out=None): ...
def _s_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False): ...
def _s_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5): ...
def _s_rms_norm(input, normalized_shape, weight=None, eps=None): ...
def _s_batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
                  momentum=0.1, eps=1e-5): ...
def _s_dropout(input, p=0.5, training=True, inplace=False): ...
def _s_linear(input, weight, bias=None): ...
def _s_matmul(input, other): ...
def _s_conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): ...
def _s_max_pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False): ...
def _s_avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                  count_include_pad=True): ...
def _s_avg_pool(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None): ...
def _s_adaptive_avg_pool2d(input, output_size): ...
def _s_embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False): ...
def _s_cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                     reduce=None, reduction="mean", label_smoothing=0.0): ...


IGNORED_ARGS = frozenset({"_stacklevel"})
NO_DEFAULT = inspect.Parameter.empty


@dataclass
class FuncEntry:
    """The torch callable ``func`` (shown as ``name``) is routed to ``ortcpu_torch.ops.<op>``
    while a wrapped model runs. Arguments are bound to ``sig`` (torch's signature) and passed
    to our op by name; a torch argument our op does not take must have its default value,
    otherwise the call falls back to torch."""

    name: str
    func: Callable
    op: str
    sig: Callable
    params: tuple = field(init=False)
    defaults: dict = field(init=False)  # name -> default (NO_DEFAULT if none)

    def __post_init__(self):
        ps = inspect.signature(self.sig).parameters.items()
        self.params = tuple((n, p.default) for n, p in ps)
        self.defaults = dict(self.params)

    def ours(self):
        return getattr(_oops, self.op, None)


def _funcs() -> list[FuncEntry]:
    T = torch.Tensor
    rows = [
        ("F.gelu", F.gelu, "gelu", _s_gelu),
        ("F.softmax", F.softmax, "softmax", _s_softmax_f),
        ("torch.softmax", torch.softmax, "softmax", _s_softmax_t),
        ("Tensor.softmax", T.softmax, "softmax", _s_softmax_t),
        ("F.log_softmax", F.log_softmax, "log_softmax", _s_softmax_f),
        ("torch.log_softmax", torch.log_softmax, "log_softmax", _s_softmax_t),
        ("Tensor.log_softmax", T.log_softmax, "log_softmax", _s_softmax_t),
        ("F.leaky_relu", F.leaky_relu, "leaky_relu", _s_leaky_relu),
        ("F.silu", F.silu, "silu", _s_inplace),
        ("F.relu", F.relu, "relu", _s_inplace),
        ("F.hardswish", F.hardswish, "hardswish", _s_inplace),
        ("F.hardsigmoid", F.hardsigmoid, "hardsigmoid", _s_inplace),
        ("F.relu6", F.relu6, "relu6", _s_inplace),
        ("F.hardtanh", F.hardtanh, "hardtanh", _s_hardtanh),
        ("torch.relu", torch.relu, "relu", _s_unary),
        ("Tensor.relu", T.relu, "relu", _s_unary),
        ("torch.addmm", torch.addmm, "addmm", _s_addmm),
        ("F.scaled_dot_product_attention", F.scaled_dot_product_attention,
         "scaled_dot_product_attention", _s_sdpa),
        ("F.layer_norm", F.layer_norm, "layer_norm", _s_layer_norm),
        ("F.rms_norm", getattr(F, "rms_norm", None), "rms_norm", _s_rms_norm),
        ("F.batch_norm", F.batch_norm, "batch_norm", _s_batch_norm),
        ("F.dropout", F.dropout, "dropout", _s_dropout),
        ("F.linear", F.linear, "linear", _s_linear),
        ("torch.matmul", torch.matmul, "matmul", _s_matmul),
        ("Tensor.matmul", T.matmul, "matmul", _s_matmul),  # also the `@` operator
        ("torch.bmm", torch.bmm, "matmul", _s_matmul),
        ("F.conv1d", F.conv1d, "conv1d", _s_conv),
        ("F.conv2d", F.conv2d, "conv2d", _s_conv),
        ("F.conv3d", F.conv3d, "conv3d", _s_conv),
        ("F.max_pool1d", F.max_pool1d, "max_pool1d", _s_max_pool),
        ("F.max_pool2d", F.max_pool2d, "max_pool2d", _s_max_pool),
        ("F.max_pool3d", F.max_pool3d, "max_pool3d", _s_max_pool),
        ("F.avg_pool1d", F.avg_pool1d, "avg_pool1d", _s_avg_pool1d),
        ("F.avg_pool2d", F.avg_pool2d, "avg_pool2d", _s_avg_pool),
        ("F.avg_pool3d", F.avg_pool3d, "avg_pool3d", _s_avg_pool),
        ("F.adaptive_avg_pool2d", F.adaptive_avg_pool2d, "adaptive_avg_pool2d",
         _s_adaptive_avg_pool2d),
        ("F.embedding", F.embedding, "embedding", _s_embedding),
        ("F.cross_entropy", F.cross_entropy, "cross_entropy", _s_cross_entropy),
    ]
    return [FuncEntry(*r) for r in rows if r[1] is not None]


FUNCTIONALS: tuple[FuncEntry, ...] = tuple(_funcs())
BY_FUNC: dict = {e.func: e for e in FUNCTIONALS}


def class_path(cls: type) -> str:
    """``torch.nn.Linear`` for a public torch.nn class, else ``module.QualName``
    (``timm.layers.norm.LayerNorm2d``)."""
    if cls.__module__.startswith("torch.nn.") and getattr(torch.nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"
