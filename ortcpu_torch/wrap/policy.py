"""Fallback policy and per-wrap bookkeeping: what may run on our kernels (support checks),
what one ``wrap()`` decided and counted (``State``), and how a fallback is announced
(warn once per kind and reason, raise, or stay silent)."""

from __future__ import annotations

import fnmatch
import re
import sys
import threading
import warnings

import torch

POLICIES = ("warn", "error", "silent")
FLOATS = (torch.float32, torch.float64)
STATE_ATTR = "_ortcpu_wrap_state"  # on the root module
INFO_ATTR = "_ortcpu_swap"  # on each swapped submodule


class FallbackWarning(UserWarning):
    """Something in a wrapped model ran on torch instead of ortcpu_torch kernels."""


class FallbackError(RuntimeError):
    """Raised instead of falling back when ``fallback="error"``."""


class Unsupported(Exception):
    """Internal: this call cannot run on our kernels; ``args[0]`` is the reason."""



#: dtypes a plain CPU tensor may have without disqualifying a call
_OK_DTYPES = frozenset((*FLOATS, torch.int64, torch.int32, torch.int16, torch.int8,
                        torch.uint8, torch.bool))
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def tensor_reason(t: torch.Tensor) -> str | None:
    # the common case in a few attribute reads (this runs for every tensor of every call)
    if type(t) in PLAIN_TYPES and t.is_cpu and t.layout is torch.strided \
            and t.dtype in _OK_DTYPES:
        return None
    if t.device.type != "cpu":
        return f"{t.device.type} tensor"
    if t.layout != torch.strided:
        return f"{str(t.layout).replace('torch.', '')} tensor"
    if (t.is_floating_point() or t.is_complex()) and t.dtype not in FLOATS:
        return f"dtype {str(t.dtype).replace('torch.', '')} has no kernel"
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return f"tensor subclass {type(t).__name__}"
    return None


def values_reason(values) -> str | None:
    for v in values:
        if isinstance(v, torch.Tensor):
            r = tensor_reason(v)
        elif isinstance(v, (list, tuple)):
            r = values_reason(v)
        else:
            continue
        if r is not None:
            return r
    return None


def module_call_reason(module: torch.nn.Module, args, kwargs) -> str | None:
    """``values_reason`` of a swapped module's call: its arguments, parameters and buffers,
    in one loop over the common case (plain CPU tensors)."""
    return _groups_reason((args, module._parameters.values(), module._buffers.values(),
                           kwargs.values() if kwargs else ()))


def call_args_reason(args, kwargs) -> str | None:
    """``module_call_reason`` without the module's parameters and buffers."""
    return _groups_reason((args, kwargs.values()) if kwargs else (args,))


def _groups_reason(groups) -> str | None:
    for group in groups:
        for v in group:
            if type(v) in PLAIN_TYPES and v.is_cpu and v.layout is torch.strided \
                    and v.dtype in _OK_DTYPES:
                continue
            if v is not None:
                r = values_reason((v,))
                if r is not None:
                    return r
    return None


def context_reason() -> str | None:
    """Why nothing may run on our kernels now: TorchScript tracing (scripted code does not
    call Python forwards), torch.compile tracing, CPU autocast; None otherwise."""
    if torch._C._is_tracing():
        return "TorchScript tracing/scripting"
    if torch.compiler.is_compiling():
        return "torch.compile tracing"
    if torch.is_autocast_enabled("cpu"):
        return "CPU autocast is active"
    return None


_DIGITS = re.compile(r"\d+")


def exc_reason(op: str, e: Exception) -> str:
    return f"ortcpu_torch.{op} rejected the arguments: {e}"


def _reason_key(reason: str) -> str:
    # one warning per reason *kind*: shapes and sizes in the message do not make it new
    return _DIGITS.sub("N", reason)



# ---- per-wrap state --------------------------------------------------------------------

class _PerThread(threading.local):
    """A wrap's per-thread stacks: its kernel modes, root forwards and include/exclude
    scopes (each thread gets empty ones on its first use)."""

    def __init__(self):
        self.modes, self.runs, self.scopes = [], [], []


CHOSE_TORCH = "torch measured faster for this input signature (select='fastest')"
RANDOM_TORCH = ("a random op: kept on torch so that torch.manual_seed gives plain torch's "
                "run (select='fastest' does not time random ops)")


class Stats:
    """Calls of one swapped module or routed functional: on ours, on torch (and why).

    A call run on torch by select's choice is one increment of ``chosen`` (the steady
    path of every such call pays just that; ``chose_why`` says why: torch measured faster,
    or a random op); ``reasons`` holds the others."""

    __slots__ = ("ours", "fell", "chosen", "reasons", "chose_why")

    def __init__(self):
        self.ours = 0
        self.fell = 0  # calls on torch for any reason but select's choice
        self.chosen = 0  # calls on torch by select's choice
        self.reasons: dict[str, list] = {}  # reason key -> [first message, count]
        self.chose_why = CHOSE_TORCH

    @property
    def torch(self) -> int:
        return self.fell + self.chosen

    def chose_torch(self) -> None:
        """Count one call run on torch because torch measured faster (not a fallback)."""
        self.chosen += 1

    def reason_counts(self) -> dict:
        """{message: calls} of every reason a call ran on torch (select's choice last)."""
        out = {msg: n for msg, n in self.reasons.values()}
        if self.chosen:
            out[self.chose_why] = self.chosen
        return out

    def fallback(self, reason: str) -> bool:
        """Count one fallback; True when this reason is new for this entry."""
        self.fell += 1
        k = _reason_key(reason)
        r = self.reasons.get(k)
        if r is None:
            self.reasons[k] = [reason, 1]
            return True
        r[1] += 1
        return False

    def __getstate__(self):
        return (self.ours, self.fell, self.chosen, self.reasons, self.chose_why)

    def __setstate__(self, s):
        if len(s) == 3:  # pickled before ``chosen`` was counted apart
            ours, torch_calls, reasons = s
            chosen = reasons.pop(CHOSE_TORCH, [None, 0])[1]
            s = (ours, torch_calls - chosen, chosen, reasons)
        if len(s) == 4:  # pickled before ``chose_why``
            s = (*s, CHOSE_TORCH)
        self.ours, self.fell, self.chosen, self.reasons, self.chose_why = s


def matches(patterns, *names) -> bool:
    """Whether one of ``patterns`` (classes, or fnmatch patterns for strings) matches one
    of ``names``."""
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


SIDES = ("ours", "torch")


class State:
    """What one ``wrap()`` (or one ``kernels_enabled()``) decided and counted. Lives on the
    root module; picklable (the per-thread stacks of active modes and module scopes are
    not saved).

    Scopes: while a module that ``exclude`` names runs, everything inside it stays on
    torch (scope ``False``); while a module that ``include`` names runs, every functional
    inside it is routed (scope ``True``); elsewhere a functional is routed when its own
    name is selected."""

    def __init__(self, fallback: str, include=None, exclude=None, timing: bool = False,
                 select="fastest", compile_kernels="auto"):
        from .compiled import check_compile_kernels
        from .select import check_select

        if fallback not in POLICIES:
            raise ValueError(f"wrap: fallback must be one of {POLICIES}, got {fallback!r}")
        for n, v in (("include", include), ("exclude", exclude)):
            if v is not None and (isinstance(v, (str, type)) or not hasattr(v, "__iter__")):
                raise TypeError(f"wrap: {n} must be a list of names or classes, got {v!r}")
        self.fallback = fallback
        self.include = None if include is None else list(include)
        self.exclude = list(exclude or ())
        matches(self.include or (), "")  # type-check the patterns now
        matches(self.exclude, "")
        self.modules: dict[str, dict] = {}  # qualname -> {"type", "ours", "stats"}
        self.skipped: list[tuple[str, str, str]] = []  # (qualname, class path, reason)
        self.funcs: dict[str, Stats] = {}  # routed functional name -> calls
        # torch functions that ran on torch, by (function name, calling module class path)
        self.torch_calls: dict[tuple[str, str], int] = {}
        self.warned: set = set()
        self.optimizer: str | None = None
        self.no_counterpart: dict[str, list] = {}  # class path -> qualnames (run on torch)
        self.func_selected: dict[str, bool] = {}  # functional name -> include/exclude says
        self.compiled = False  # traced by torch.compile at least once
        self.timing = bool(timing)
        # select: "fastest" | "ours"; choices: readable signature -> {"side", timings};
        # sides: the same choices by a cheap tuple key (rebuilt after unpickling)
        self.select, self.choices = check_select(select)
        self.sides: dict = {}
        # model_check.py: the in-model check of a fresh "fastest" selection (None once
        # decided), its outcome, and the switches it turns: torch_arm while its all-torch
        # arm runs, all_torch once it put every choice on torch
        self.check = None
        self.model_check: dict | None = None
        self.torch_arm = False
        self.all_torch = False
        # census.py: root input signature -> Plan of its later forwards (rebuilt after
        # unpickling); forwards run [counted by the full mode, in steady state]
        self.plans: dict = {}
        self.forwards = [0, 0]
        self.times = {"forward": dict.fromkeys(SIDES, 0), "backward": dict.fromkeys(SIDES, 0)}
        self._local = _PerThread()
        # torch.compile: the families routed to ortcpu:: ops while Dynamo traces, and the
        # one CompiledKernelMode the root's hooks enter and leave, built now (nothing may
        # be computed, or read and then changed, while tracing); None for "torch"
        self.compile_kernels = check_compile_kernels(compile_kernels)
        self.compile_auto = isinstance(compile_kernels, str) and compile_kernels == "auto"
        self._build_compile_mode()

    def _build_compile_mode(self) -> None:
        from .compiled import CompiledKernelMode, tables

        self.compile_mode = CompiledKernelMode(*tables(self)) if self.compile_kernels \
            else None

    def __getstate__(self):
        d = dict(self.__dict__)
        for k in ("_local", "compile_mode"):
            d.pop(k, None)
        d["sides"] = {}
        d["plans"] = {}
        d["check"] = None  # a copy keeps the outcome, not an alternation half done
        d["torch_arm"] = False
        return d

    def __setstate__(self, d):
        from .compiled import check_compile_kernels

        self.__dict__.update(d)
        self.__dict__.setdefault("plans", {})
        for k, v in (("check", None), ("model_check", None), ("torch_arm", False),
                     ("all_torch", False)):
            self.__dict__.setdefault(k, v)
        self.__dict__.setdefault("forwards", [0, 0])
        self._local = _PerThread()
        self.compile_kernels = check_compile_kernels(d.get("compile_kernels", "auto"))
        self._build_compile_mode()

    @property
    def modes(self) -> list:
        return self._local.modes

    @property
    def runs(self) -> list:
        """This thread's root forwards begun by ``EnterHook`` (``census.RootRun``)."""
        return self._local.runs

    @property
    def scopes(self) -> list:
        return self._local.scopes

    def scope(self):
        """``False`` inside an excluded module (or a fallback to torch's forward),
        ``True`` inside an included one, else None."""
        s = self._local.scopes
        return s[-1] if s else None

    def selected(self, *names) -> bool:
        if self.include is not None and not matches(self.include, *names):
            return False
        return not matches(self.exclude, *names)

    def fell_back(self, what: str, kind: str, stats: Stats, reason: str) -> None:
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
                              FallbackWarning, stacklevel=user_stacklevel())


PACKAGE_DIR = __file__.rsplit("/", 2)[0] + "/"  # ortcpu_torch/
INTERNAL_DIRS = (PACKAGE_DIR, torch.__file__.rsplit("/", 1)[0] + "/")


def user_stacklevel() -> int:
    """stacklevel for warnings.warn pointing at the first frame outside torch and
    ortcpu_torch: the user's line that called the model (or the functional)."""
    f, level = sys._getframe(1), 1
    while f is not None and f.f_code.co_filename.startswith(INTERNAL_DIRS):
        f, level = f.f_back, level + 1
    return level
