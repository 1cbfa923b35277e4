"""One-line wrapping of an existing model: ``ortcpu_torch.wrap(model)``.

Two mechanisms, both table-driven:

- **Module swap** (``MODULES``): every submodule whose type is exactly a supported
  ``torch.nn`` class is replaced, in its parent, by the ``ortcpu_torch.nn`` counterpart
  built with the same configuration (read from the torch module's attributes by an
  argument-mapping function) and then pointed at the *same* Parameter and buffer objects
  (nothing is copied). The counterpart runs as a thin subclass (``Wrapped<Name>``, defined
  here so pickling finds it) whose ``forward`` checks the inputs, runs our kernels, and
  falls back to the original torch module (kept aside, not a child, so ``state_dict`` keys
  are unchanged) for anything we do not support.
- **Functional routing** (``FUNCTIONALS``): while the wrapped model's ``forward`` runs, a
  ``torch.overrides.TorchFunctionMode`` (entered by a forward pre-hook on the root module,
  left by an always-called forward hook) sends ``F.gelu``, ``torch.softmax``, ... to the
  ``ortcpu_torch.ops`` function of the same name, looked up lazily, so an entry activates
  as soon as its kernel family exists. Standalone: ``with ortcpu_torch.kernels_enabled():``.

Adding a family is one ``ModuleEntry`` (plus an argument-mapping function when the
counterpart's constructor arguments are not plain attributes of the torch module) and one
``FuncEntry`` per functional spelling.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import re
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import nn as _onn
from . import ops as _oops

__all__ = [
    "FallbackError",
    "FallbackWarning",
    "kernels_enabled",
    "optimize",
    "report",
    "unwrap",
    "wrap",
]

POLICIES = ("warn", "error", "silent")
_FLOATS = (torch.float32, torch.float64)
_STATE_ATTR = "_ortcpu_wrap_state"  # on the root module
_INFO_ATTR = "_ortcpu_swap"  # on each swapped submodule


class FallbackWarning(UserWarning):
    """Something in a wrapped model ran on torch instead of ortcpu_torch kernels."""


class FallbackError(RuntimeError):
    """Raised instead of falling back when ``fallback="error"``."""


class _Unsupported(Exception):
    """Internal: this call cannot run on our kernels; ``args[0]`` is the reason."""


# ---- the tables ------------------------------------------------------------------------


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
    # activations (main)
    "GELU", "LeakyReLU", "Softmax", "LogSoftmax",
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


_IGNORED_ARGS = frozenset({"_stacklevel"})
_NO_DEFAULT = inspect.Parameter.empty


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

    def __post_init__(self):
        ps = inspect.signature(self.sig).parameters.items()
        self.params = tuple((n, p.default) for n, p in ps)

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
_BY_FUNC: dict = {e.func: e for e in FUNCTIONALS}


# ---- support checks --------------------------------------------------------------------


#: dtypes a plain CPU tensor may have without disqualifying a call
_OK_DTYPES = frozenset((*_FLOATS, torch.int64, torch.int32, torch.int16, torch.int8,
                        torch.uint8, torch.bool))
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _tensor_reason(t: torch.Tensor) -> str | None:
    # the common case in a few attribute reads (this runs for every tensor of every call)
    if type(t) in _PLAIN_TYPES and t.is_cpu and t.layout is torch.strided \
            and t.dtype in _OK_DTYPES:
        return None
    if t.device.type != "cpu":
        return f"{t.device.type} tensor"
    if t.layout != torch.strided:
        return f"{str(t.layout).replace('torch.', '')} tensor"
    if (t.is_floating_point() or t.is_complex()) and t.dtype not in _FLOATS:
        return f"dtype {str(t.dtype).replace('torch.', '')} has no kernel"
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return f"tensor subclass {type(t).__name__}"
    return None


def _values_reason(values) -> str | None:
    for v in values:
        if isinstance(v, torch.Tensor):
            r = _tensor_reason(v)
        elif isinstance(v, (list, tuple)):
            r = _values_reason(v)
        else:
            continue
        if r is not None:
            return r
    return None


def _context_reason() -> str | None:
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return "TorchScript tracing/scripting"
    if torch.compiler.is_compiling():
        return "torch.compile tracing"
    if torch.is_autocast_enabled("cpu"):
        return "CPU autocast is active"
    return None


_DIGITS = re.compile(r"\d+")


def _exc_reason(op: str, e: Exception) -> str:
    return f"ortcpu_torch.{op} rejected the arguments: {e}"


def _reason_key(reason: str) -> str:
    # one warning per reason *kind*: shapes and sizes in the message do not make it new
    return _DIGITS.sub("N", reason)


# ---- per-wrap state --------------------------------------------------------------------


class _Stats:
    __slots__ = ("ours", "torch", "reasons")

    def __init__(self):
        self.ours = 0
        self.torch = 0
        self.reasons: dict[str, list] = {}  # reason key -> [first message, count]

    def fallback(self, reason: str) -> bool:
        """Count one fallback; True when this reason is new for this entry."""
        self.torch += 1
        k = _reason_key(reason)
        r = self.reasons.get(k)
        if r is None:
            self.reasons[k] = [reason, 1]
            return True
        r[1] += 1
        return False


def _matches(patterns, *names) -> bool:
    for p in patterns:
        if isinstance(p, type):
            if any(n is p for n in names):
                return True
        elif isinstance(p, str):
            if any(isinstance(n, str) and fnmatch.fnmatchcase(n, p) for n in names):
                return True
        else:
            raise TypeError("wrap: include/exclude entries must be str or torch.nn.Module "
                            f"classes, got {type(p).__name__}")
    return False


class _State:
    """What one ``wrap()`` (or one ``kernels_enabled()``) decided and counted. Lives on the
    root module; picklable (the active-mode stack is per process and not saved)."""

    def __init__(self, fallback: str, include=None, exclude=None):
        if fallback not in POLICIES:
            raise ValueError(f"wrap: fallback must be one of {POLICIES}, got {fallback!r}")
        for n, v in (("include", include), ("exclude", exclude)):
            if v is not None and (isinstance(v, (str, type)) or not hasattr(v, "__iter__")):
                raise TypeError(f"wrap: {n} must be a list of names or classes, got {v!r}")
        self.fallback = fallback
        self.include = None if include is None else list(include)
        self.exclude = list(exclude or ())
        _matches(self.include or (), "")  # type-check the patterns now
        _matches(self.exclude, "")
        self.modules: dict[str, dict] = {}  # qualname -> {"type", "ours", "stats"}
        self.skipped: list[tuple[str, str, str]] = []  # (qualname, type, reason)
        self.funcs: dict[str, _Stats] = {}
        self.warned: set = set()
        self.optimizer: str | None = None
        self.torch_only: dict[str, int] = {}  # torch.nn leaf type -> count, no kernel of ours
        self.func_selected: dict[str, bool] = {}  # functional name -> include/exclude says
        self._local = threading.local()

    def __getstate__(self):
        d = dict(self.__dict__)
        d.pop("_local", None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._local = threading.local()

    @property
    def modes(self) -> list:
        m = getattr(self._local, "modes", None)
        if m is None:
            m = self._local.modes = []
        return m

    def selected(self, *names) -> bool:
        if self.include is not None and not _matches(self.include, *names):
            return False
        return not _matches(self.exclude, *names)

    def fell_back(self, what: str, kind: str, stats: _Stats, reason: str) -> None:
        new = stats.fallback(reason)
        if self.fallback == "error":
            raise FallbackError(f"ortcpu_torch.wrap: {what} cannot run on ortcpu_torch "
                                f"kernels: {reason} (fallback='error')")
        if self.fallback == "warn":
            key = (kind, _reason_key(reason))
            if new and key not in self.warned:
                self.warned.add(key)
                warnings.warn(f"ortcpu_torch.wrap: {kind} falls back to torch: {reason}. "
                              "(Warned once per type and reason; fallback='silent' hides "
                              "this, ortcpu_torch.report(model) counts it.)",
                              FallbackWarning, stacklevel=_user_stacklevel())


_INTERNAL_DIRS = (
    __file__.rsplit("/", 1)[0] + "/",  # ortcpu_torch
    torch.__file__.rsplit("/", 1)[0] + "/",  # torch
)


def _user_stacklevel() -> int:
    """stacklevel for warnings.warn pointing at the first frame outside torch and
    ortcpu_torch: the user's line that called the model (or the functional)."""
    f, level = sys._getframe(1), 1
    while f is not None and f.f_code.co_filename.startswith(_INTERNAL_DIRS):
        f, level = f.f_back, level + 1
    return level


# ---- swapped modules -------------------------------------------------------------------


class _SwapInfo:
    """Kept on a swapped module (not a child: state_dict is unchanged)."""

    def __init__(self, original, entry_name, qualname, state, attrs):
        self.original = original
        self.entry_name = entry_name
        self.qualname = qualname
        self.state = state
        self.attrs = attrs  # public config attributes to mirror onto the original on fallback


def _wrapped_forward(self, *args, **kwargs):
    info: _SwapInfo = self.__dict__[_INFO_ATTR]
    state = info.state
    stats = state.modules[info.qualname]["stats"]
    # the checks too run without the kernel mode: under it every tensor attribute read
    # is a Python __torch_function__ call
    with torch._C.DisableTorchFunction():
        reason = _context_reason() or _values_reason(args) \
            or _values_reason(kwargs.values()) or _values_reason(self._parameters.values()) \
            or _values_reason(self._buffers.values())
        if reason is None:
            try:
                out = type(self).__mro__[1].forward(self, *args, **kwargs)
                stats.ours += 1
                return out
            except (TypeError, ValueError) as e:
                reason = _exc_reason(f"nn.{type(self).__mro__[1].__name__}", e)
    state.fell_back(f"{info.qualname or 'model'} ({info.entry_name})", info.entry_name,
                    stats, reason)
    orig = info.original
    _sync_to_original(self, orig, info.attrs)
    local = state._local
    local.suppress = getattr(local, "suppress", 0) + 1  # torch's forward runs as torch's
    try:
        return orig.forward(*args, **kwargs)
    finally:
        local.suppress -= 1


def _sync_to_original(new, orig, attrs) -> None:
    """The original runs the fallback: give it what may have changed on the swapped module
    since wrapping (training flag, config attributes, re-assigned parameters)."""
    orig.training = new.training
    for k in attrs:
        if k in new.__dict__:
            orig.__dict__[k] = new.__dict__[k]
    for d in ("_parameters", "_buffers"):
        od, nd = getattr(orig, d), getattr(new, d)
        for k, v in nd.items():
            if od.get(k, None) is not v:
                setattr(orig, k, v)  # setattr: modules caching parameter lists update them


def _wrapped_get_name(self) -> str:
    return f"ortcpu_torch.nn.{type(self).__mro__[1].__name__}"


_WRAPPED: dict[str, type] = {}


def _wrapped_class(entry: ModuleEntry) -> type | None:
    """``Wrapped<Name>``: the counterpart with the fallback-aware forward. Defined in this
    module's namespace (``__getattr__`` below) so pickle finds it by name."""
    cls = _WRAPPED.get(entry.torch_name)
    if cls is None:
        cp = entry.counterpart()
        if cp is None:
            return None
        cls = type(f"Wrapped{entry.torch_name}", (cp,), {
            "forward": _wrapped_forward,
            "_get_name": _wrapped_get_name,
            "__module__": __name__,
            "__doc__": f"ortcpu_torch.nn.{cp.__name__} swapped in by ortcpu_torch.wrap() "
                       f"for a torch.nn.{entry.torch_name}; falls back to it when needed.",
        })
        _WRAPPED[entry.torch_name] = cls
    return cls


def __getattr__(name: str):
    if name.startswith("Wrapped"):
        for e in MODULES:
            if name == f"Wrapped{e.torch_name}":
                cls = _wrapped_class(e)
                if cls is not None:
                    return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


def _meta_leftovers(m: torch.nn.Module) -> str | None:
    """A tensor still on the meta device after re-pointing parameters and buffers means the
    counterpart keeps state of its own: refuse rather than compute with it."""
    for v in m.__dict__.values():
        vals = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        for t in vals:
            if isinstance(t, torch.Tensor) and t.is_meta:
                return "the counterpart keeps tensors of its own besides the parameters"
    return None


def _build_swap(entry: ModuleEntry, m: torch.nn.Module, qualname: str, state: _State):
    """The swapped module for ``m``, or a reason why not."""
    cls = _wrapped_class(entry)
    if cls is None:
        return None, f"ortcpu_torch.nn.{entry.ours_name} is not available in this build"
    cp = cls.__mro__[1]
    try:
        kwargs = entry.args(cp, m)
        with torch.device("meta"):  # nothing allocated: every tensor is replaced below
            new = cls(**kwargs)
    except (TypeError, ValueError) as e:
        return None, f"ortcpu_torch.nn.{cp.__name__} does not take this configuration: {e}"
    if set(new._parameters) != set(m._parameters) or set(new._buffers) != set(m._buffers):
        return None, (f"ortcpu_torch.nn.{cp.__name__} has parameters/buffers "
                      f"{sorted(new._parameters) + sorted(new._buffers)}, torch's "
                      f"{sorted(m._parameters) + sorted(m._buffers)}")
    if new._modules:
        return None, f"ortcpu_torch.nn.{cp.__name__} has submodules"
    for name, p in m._parameters.items():
        setattr(new, name, p)  # setattr: lets modules that cache parameter lists update them
    for name, b in m._buffers.items():
        if b is None:
            new._buffers[name] = None
        else:
            setattr(new, name, b)
    # identical order and persistence, so state_dict() is key-for-key the same
    new._parameters = type(m._parameters)((k, new._parameters[k]) for k in m._parameters)
    new._buffers = type(m._buffers)((k, new._buffers[k]) for k in m._buffers)
    new._non_persistent_buffers_set = set(m._non_persistent_buffers_set)
    bad = _meta_leftovers(new)
    if bad:
        return None, f"ortcpu_torch.nn.{cp.__name__}: {bad}"
    for d in _HOOK_DICTS:  # hooks registered on the original keep firing (same dicts)
        if hasattr(m, d):
            setattr(new, d, getattr(m, d))
    new._is_full_backward_hook = getattr(m, "_is_full_backward_hook", None)
    new.training = m.training
    attrs = tuple(k for k in m.__dict__ if not k.startswith("_") and k in new.__dict__
                  and k != "training")
    new.__dict__[_INFO_ATTR] = _SwapInfo(m, entry.torch_name, qualname, state, attrs)
    return new, None


def _set_child(root: torch.nn.Module, qualname: str, new: torch.nn.Module) -> None:
    parent_name, _, child = qualname.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    parent._modules[child] = new


# ---- functional routing ----------------------------------------------------------------


def _ours_call(entry: FuncEntry, ours, args, kwargs):
    """Bind torch's arguments and call our op with those it takes (by name)."""
    bound = {}
    names = entry.params
    if len(args) > len(names):
        raise _Unsupported(f"{entry.name}: {len(args)} positional arguments")
    for (n, _), v in zip(names, args, strict=False):
        bound[n] = v
    for k, v in kwargs.items():
        if k in bound:
            raise _Unsupported(f"{entry.name}: argument {k} given twice")
        bound[k] = v
    r = _values_reason(bound.values())
    if r is not None:
        raise _Unsupported(r)
    accepted = _accepted(ours)
    call = {}
    defaults = dict(names)
    for k, v in bound.items():
        if k in _IGNORED_ARGS:
            continue
        if accepted is None or k in accepted:
            call[k] = v
            continue
        d = defaults.get(k, _NO_DEFAULT)
        if d is _NO_DEFAULT or not (v is d or (not isinstance(v, torch.Tensor) and v == d)):
            raise _Unsupported(f"argument {k}={v!r} is not implemented by "
                               f"ortcpu_torch.ops.{entry.op}")
    return ours(**call)


_ACCEPTED: dict = {}


def _accepted(fn) -> frozenset | None:
    """Parameter names ``fn`` takes by keyword; None if it takes ``**kwargs``."""
    try:
        return _ACCEPTED[fn]
    except KeyError:
        pass
    ps = inspect.signature(fn).parameters.values()
    acc = None if any(p.kind is p.VAR_KEYWORD for p in ps) else frozenset(
        p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    _ACCEPTED[fn] = acc
    return acc


class _KernelMode(TorchFunctionMode):
    """Routes the functionals in ``FUNCTIONALS`` to ``ortcpu_torch.ops`` while active."""

    def __init__(self, state: _State):
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = _BY_FUNC.get(func)
        if entry is None:
            return func(*args, **kwargs)
        state = self.state
        sel = state.func_selected.get(entry.name)
        if sel is None:
            sel = state.func_selected[entry.name] = state.selected(entry.name, entry.op)
        if not sel or getattr(state._local, "suppress", 0):
            return func(*args, **kwargs)
        stats = state.funcs.get(entry.name)
        if stats is None:
            stats = state.funcs[entry.name] = _Stats()
        ours = entry.ours()
        if ours is None:  # family not in this build: not a fallback, just not there yet
            stats.torch += 1
            k = f"no kernel in this build (ortcpu_torch.ops.{entry.op} missing)"
            stats.reasons.setdefault(k, [k, 0])[1] += 1
            return func(*args, **kwargs)
        reason = _context_reason()
        if reason is None:
            try:
                out = _ours_call(entry, ours, args, kwargs)
                stats.ours += 1
                return out
            except _Unsupported as e:
                reason = str(e.args[0])
            except (TypeError, ValueError) as e:
                reason = _exc_reason(f"ops.{entry.op}", e)
        state.fell_back(entry.name, entry.name, stats, reason)
        return func(*args, **kwargs)

    def report(self, file="stdout"):
        return report(self, file=file)


class _EnterHook:
    """Forward pre-hook on the root: enter the kernel mode (picklable)."""

    def __init__(self, state):
        self.state = state

    def __call__(self, module, args):
        mode = _KernelMode(self.state)
        mode.__enter__()
        self.state.modes.append(mode)


class _ExitHook:
    """Always-called forward hook on the root: leave the kernel mode."""

    def __init__(self, state):
        self.state = state

    def __call__(self, module, args, output):
        modes = self.state.modes
        if modes:
            modes.pop().__exit__(None, None, None)


def kernels_enabled(fallback: str = "warn", include=None, exclude=None) -> _KernelMode:
    """Context manager routing torch functionals (``F.gelu``, ``torch.softmax``, ...) to
    ortcpu_torch kernels inside the ``with`` block, with the same fallback policy as
    ``wrap``. ``ortcpu_torch.report(ctx)`` (or ``ctx.report()``) shows what ran where."""
    return _KernelMode(_State(fallback, include, exclude))


# ---- public API ------------------------------------------------------------------------


def wrap(model: torch.nn.Module, *, fallback: str = "warn", include=None, exclude=None):
    """Run ``model`` on ortcpu_torch kernels; returns the same object, changed in place.

    Swaps every submodule whose type is exactly a supported ``torch.nn`` class for its
    ``ortcpu_torch.nn`` counterpart sharing the same Parameter and buffer objects (an
    optimizer built before keeps working; ``state_dict()`` is unchanged), and routes
    supported functionals (``F.gelu``, ``torch.softmax``, ...) to our kernels while
    ``model.forward`` runs.

    ``fallback``: what to do when something cannot run on our kernels (CUDA/meta tensors,
    float16/bfloat16, argument combinations we do not implement, autocast, tracing): torch
    runs it in every case; ``"warn"`` warns once per type and reason, ``"error"`` raises
    ``FallbackError`` instead, ``"silent"`` does neither.
    ``include`` / ``exclude``: lists of torch module classes or name patterns (fnmatch),
    matched against the torch class name (``"LayerNorm"``), the functional (``"F.gelu"``,
    ``"torch.softmax"``) or its op name (``"gelu"``), and the submodule's qualified name
    (``"encoder.*.norm1"``). With ``include``, only what matches is swapped or routed.
    Submodule names select module swaps only: a functional is routed or not by its own
    name, wherever it is called from.

    Only the root module's forward turns functional routing on: calling a submodule
    directly runs its swapped modules on our kernels but its functionals on torch, and a
    loss computed outside ``model.forward`` stays on torch unless it is wrapped too
    (``criterion = wrap(nn.CrossEntropyLoss())``) or runs under ``kernels_enabled()``. While
    routing is on, torch's fused inference fast paths that refuse tensors with
    ``__torch_function__`` handling (e.g. ``TransformerEncoderLayer`` in eval mode) take
    their regular path instead.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"wrap: model must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, _STATE_ATTR, None) is not None:
        unwrap(model)
    state = _State(fallback, include, exclude)
    by_cls = {e.torch_cls: e for e in MODULES if e.torch_cls is not None}
    torch_only: dict[str, int] = {}
    swaps = []
    for qualname, m in model.named_modules(remove_duplicate=False):
        if _INFO_ATTR in m.__dict__:
            continue
        entry = by_cls.get(type(m))
        if entry is None and type(m).__module__.startswith(__package__ + "."):
            continue  # already one of ours (e.g. ortcpu_torch.nn.GELU used directly)
        if entry is None:
            base = next((c for c in type(m).__mro__[1:] if c in by_cls), None)
            if base is not None:
                state.skipped.append((qualname, type(m).__name__,
                                      f"subclass of torch.nn.{base.__name__} (its forward "
                                      "may differ): not swapped"))
            elif not m._modules and type(m).__module__.startswith("torch.nn"):
                torch_only[type(m).__name__] = torch_only.get(type(m).__name__, 0) + 1
            continue
        if not state.selected(type(m), entry.torch_name, qualname):
            state.skipped.append((qualname, entry.torch_name, "excluded"))
            continue
        if not qualname:
            state.skipped.append(("", entry.torch_name, "the root module itself is not "
                                  "swapped (wrap returns the same object); its functionals "
                                  "are still routed"))
            continue
        swaps.append((qualname, m, entry))
    # build every swap before changing the model: with fallback="error" a configuration
    # we cannot run raises with the model untouched
    built: dict[int, tuple] = {}  # a module reused under several names: one swap
    for qualname, m, entry in swaps:
        if id(m) not in built:
            built[id(m)] = (*_build_swap(entry, m, qualname, state), qualname)
    for qualname, m, entry in swaps:
        new, why, first = built[id(m)]
        if qualname != first:
            continue  # reported (and counted) under the first name
        if new is None:
            # a supported module type in a configuration our kernels do not take: torch
            # runs it, and that is a fallback like any other (warned / raised per policy)
            state.skipped.append((qualname, entry.torch_name, why))
            state.fell_back(f"{qualname} ({entry.torch_name})", entry.torch_name, _Stats(),
                            why)
            continue
        state.modules[qualname] = {"type": entry.torch_name, "ours": type(new).__mro__[1],
                                   "stats": _Stats()}
    for qualname, m, _entry in swaps:
        new = built[id(m)][0]
        if new is not None:
            _set_child(model, qualname, new)
    state.torch_only = torch_only
    object.__setattr__(model, _STATE_ATTR, state)
    model.register_forward_pre_hook(_EnterHook(state))
    model.register_forward_hook(_ExitHook(state), always_call=True)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Undo ``wrap``: the original torch modules come back (same Parameter objects, with
    the training flag and configuration the swapped modules had), the hooks go. Returns
    the same object."""
    state = model.__dict__.get(_STATE_ATTR)
    for qualname, m in list(model.named_modules(remove_duplicate=False)):
        info = m.__dict__.get(_INFO_ATTR)
        if info is None or not qualname:
            continue
        _sync_to_original(m, info.original, info.attrs)
        _set_child(model, qualname, info.original)
    for d in ("_forward_pre_hooks", "_forward_hooks"):
        hooks = getattr(model, d)
        for k in [k for k, h in hooks.items() if isinstance(h, (_EnterHook, _ExitHook))]:
            del hooks[k]
            model._forward_hooks_always_called.pop(k, None)
    if state is not None:
        del model.__dict__[_STATE_ATTR]
    return model


_OPTIM_KEEP_OUT = frozenset({"params", "foreach", "fused", "capturable", "differentiable"})


def _convert_optimizer(optimizer):
    """``(optimizer to use, what happened, fell_back)``. ``fell_back``: an optimizer type
    we have, kept on torch because of one of its settings (a fallback under wrap's policy;
    a type we do not have at all is just reported, like a torch.nn type without a kernel).
    The model is not touched."""
    if optimizer is None:
        return None, "none given", False
    name = type(optimizer).__name__
    if type(optimizer) not in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
        return optimizer, f"{type(optimizer).__module__}.{name} kept (no ortcpu_torch " \
                          "counterpart)", False
    try:
        optim = importlib.import_module(f"{__package__}.optim")
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.optim":
            raise
        optim = None
    ours = getattr(optim, name, None) if optim is not None else None
    if ours is None:
        return optimizer, f"torch.optim.{name} kept: ortcpu_torch.optim.{name} is not " \
                          "available in this build", False
    accepted = _accepted(ours.__init__)
    for g in optimizer.param_groups:
        for k in ("capturable", "differentiable"):
            if g.get(k):
                return optimizer, f"torch.optim.{name} kept: {k}=True is not supported", True
    # a torch setting our optimizer does not take must be at torch's default, else keep
    # torch's optimizer (it changes the arithmetic); keys torch's constructor does not
    # know (e.g. an LR scheduler's initial_lr) are carried over as they are
    torch_defaults = {k: p.default for k, p in
                      inspect.signature(type(optimizer).__init__).parameters.items()}
    groups = []
    for g in optimizer.param_groups:
        opts, extra = {}, {}
        for k, v in g.items():
            if k in _OPTIM_KEEP_OUT:
                continue
            if accepted is None or k in accepted:
                opts[k] = v
            elif k in torch_defaults:
                d = torch_defaults[k]
                if not (v is d or (not isinstance(v, torch.Tensor) and v == d)):
                    return optimizer, f"torch.optim.{name} kept: {k}={v!r} is not " \
                                      f"supported by ortcpu_torch.optim.{name}", True
            else:
                extra[k] = v
        groups.append((g, opts, extra))
    defaults = {k: v for k, v in optimizer.defaults.items() if k not in _OPTIM_KEEP_OUT
                and (accepted is None or k in accepted)}
    try:
        new = ours([{"params": g["params"], **opts} for g, opts, _ in groups], **defaults)
    except (TypeError, ValueError) as e:
        return optimizer, f"torch.optim.{name} kept: ortcpu_torch.optim.{name} rejected " \
                          f"its settings: {e}", True
    for ng, (_, _, extra) in zip(new.param_groups, groups, strict=True):
        for k, v in extra.items():  # e.g. initial_lr set by an LR scheduler
            ng.setdefault(k, v)
    for p, s in optimizer.state.items():
        new.state[p] = dict(s)
    return new, f"torch.optim.{name} replaced by ortcpu_torch.optim.{name} " \
                "(param groups and state carried over)", False


def optimize(model: torch.nn.Module, optimizer=None, *, fallback: str = "warn",
             include=None, exclude=None):
    """``wrap(model)`` and replace a ``torch.optim.AdamW/Adam/SGD`` by ortcpu_torch's
    (same param groups, state carried over) when ``ortcpu_torch.optim`` has it. Returns
    ``(model, optimizer)``; what was done is in ``report(model)``. An LR scheduler built on
    the old optimizer must be rebuilt on the returned one. One of those optimizers kept
    on torch because of a setting ours lacks is a fallback under ``fallback`` (with
    ``"error"``, raised before the model is touched)."""
    if fallback not in POLICIES:
        raise ValueError(f"optimize: fallback must be one of {POLICIES}, got {fallback!r}")
    new, note, fell_back = _convert_optimizer(optimizer)
    if fell_back and fallback == "error":
        raise FallbackError(f"ortcpu_torch.optimize: {note} (fallback='error')")
    wrap(model, fallback=fallback, include=include, exclude=exclude)
    state = model.__dict__[_STATE_ATTR]
    state.optimizer = note
    if fell_back:
        state.fell_back("optimizer", f"torch.optim.{type(optimizer).__name__}", _Stats(),
                        note)
    return model, new


# ---- report ----------------------------------------------------------------------------


@dataclass
class Report:
    """What ``report()`` found; ``str(report)`` is the printed text."""

    fallback: str
    modules: list  # dicts: name, type, ours, calls_ours, calls_torch, reasons
    skipped: list  # dicts: name, type, reason
    torch_only: dict  # torch.nn leaf type -> count, no kernel of ours
    functionals: list  # dicts: name, calls_ours, calls_torch, reasons
    functionals_available: list  # names routable in this build
    functionals_missing: list  # names whose op is not in this build
    optimizer: str | None
    text: str = ""

    def __str__(self) -> str:
        return self.text


def _reasons(stats: _Stats) -> dict:
    return {msg: n for msg, n in stats.reasons.values()}


def report(model, file="stdout") -> Report:
    """Print (to ``file``, default ``sys.stdout``; None: do not print) and return which
    modules and functionals of a wrapped ``model`` (or a ``kernels_enabled()`` context) ran
    on ortcpu_torch kernels, which fell back to torch and why, and what happened to the
    optimizer."""
    if isinstance(model, _KernelMode):
        state = model.state
    else:
        state = getattr(model, "__dict__", {}).get(_STATE_ATTR)
        if state is None:
            raise ValueError("report: this model is not wrapped (call ortcpu_torch.wrap or "
                             "ortcpu_torch.optimize first)")
    mods = [{"name": q, "type": d["type"], "ours": f"ortcpu_torch.nn.{d['ours'].__name__}",
             "calls_ours": d["stats"].ours, "calls_torch": d["stats"].torch,
             "reasons": _reasons(d["stats"])} for q, d in state.modules.items()]
    skipped = [{"name": q, "type": t, "reason": r} for q, t, r in state.skipped]
    funcs = [{"name": n, "calls_ours": s.ours, "calls_torch": s.torch, "reasons": _reasons(s)}
             for n, s in state.funcs.items()]
    avail = [e.name for e in FUNCTIONALS if e.ours() is not None]
    missing = [e.name for e in FUNCTIONALS if e.ours() is None]
    torch_only = dict(state.torch_only)
    lines = [f"ortcpu_torch.wrap report (fallback={state.fallback!r})"]
    if mods:
        lines.append("modules swapped for ortcpu_torch.nn counterparts (calls: ours / torch):")
        for d in mods:
            lines.append(f"  {d['name']:<28} torch.nn.{d['type']} -> {d['ours']}  "
                         f"{d['calls_ours']} / {d['calls_torch']}")
            lines.extend(f"      fell back {n}x: {msg}" for msg, n in d["reasons"].items())
    elif not isinstance(model, _KernelMode):
        lines.append("modules swapped: none")
    if skipped:
        lines.append("modules left on torch:")
        grouped: dict[tuple, list] = {}
        for d in skipped:
            grouped.setdefault((d["type"], d["reason"]), []).append(d["name"] or "(root)")
        for (t, r), names in grouped.items():
            where = names[0] if len(names) == 1 else \
                f"{len(names)}x: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
            lines.append(f"  torch.nn.{t} ({where}): {r}")
    if torch_only:
        lines.append("torch.nn layers with no ortcpu_torch kernel (run on torch): " + ", ".join(
            f"{k} x{v}" for k, v in sorted(torch_only.items())))
    if funcs:
        lines.append("functionals called during forward (calls: ours / torch):")
        for d in funcs:
            lines.append(f"  {d['name']:<28} {d['calls_ours']} / {d['calls_torch']}")
            lines.extend(f"      on torch {n}x: {msg}" for msg, n in d["reasons"].items())
    else:
        lines.append("functionals routed during forward: none called so far")
    lines.append("functionals routable in this build: " + (", ".join(avail) or "none"))
    if missing:
        lines.append("not yet in this build (run on torch): " + ", ".join(missing))
    if state.optimizer is not None:
        lines.append(f"optimizer: {state.optimizer}")
    rep = Report(state.fallback, mods, skipped, torch_only, funcs, avail, missing,
                 state.optimizer, "\n".join(lines))
    if file is not None:
        print(rep.text, file=sys.stdout if file == "stdout" else file)
    return rep
