"""Functional routing: while the wrapped model's ``forward`` runs, ``F.gelu``,
``torch.softmax``, ... go to the ``ortcpu_torch.ops`` function of the same name (looked
up lazily, so an entry activates as soon as its kernel family exists). Each root forward
begins and ends in ``census.py`` (``RootForward``, ``EnterHook``/``ExitHook``): the
first forward of each input signature runs under ``KernelMode``, a
``torch.overrides.TorchFunctionMode`` that routes and counts every other torch function
by the module class whose ``forward`` called it, so ``report()`` can say what ran on
torch; later forwards of the signature run without it
(no mode, or routers in the routed functionals' attributes, or a routing-only mode).
``route_call`` is the routing of one call, shared by all of them (a swapped module that
``select`` runs on torch runs its forward without any of it: counted on the module).
Standalone: ``with ortcpu_torch.kernels_enabled():`` (the counting mode, every call)."""

from __future__ import annotations

import inspect
import sys

import torch
from torch.overrides import TorchFunctionMode

from .policy import State, Stats, Unsupported, context_reason, exc_reason, values_reason
from .select import call_key, choose
from .tables import BY_FUNC, IGNORED_ARGS, NO_DEFAULT, FuncEntry, class_path
from .timing import timed


def ours_call(entry: FuncEntry, ours, args, kwargs, checked: bool = False):
    """Bind torch's arguments and call our op with those it takes (by name); ``checked``:
    the caller has already found every value supported (``values_reason``)."""
    bound = {}
    names = entry.params
    if len(args) > len(names):
        raise Unsupported(f"{entry.name}: {len(args)} positional arguments")
    for (n, _), v in zip(names, args, strict=False):
        bound[n] = v
    for k, v in kwargs.items():
        if k in bound:
            raise Unsupported(f"{entry.name}: argument {k} given twice")
        bound[k] = v
    if not checked:
        r = values_reason(bound.values())
        if r is not None:
            raise Unsupported(r)
    accepted = accepted_names(ours)
    call = {}
    defaults = entry.defaults
    for k, v in bound.items():
        if k in IGNORED_ARGS:
            continue
        if accepted is None or k in accepted:
            call[k] = v
            continue
        d = defaults.get(k, NO_DEFAULT)
        if d is NO_DEFAULT or not (v is d or (not isinstance(v, torch.Tensor) and v == d)):
            # a tensor's repr would make every call's reason a new one (report keys)
            given = "a tensor" if isinstance(v, torch.Tensor) else repr(v)
            raise Unsupported(f"argument {k}={given} is not implemented by "
                              f"ortcpu_torch.ops.{entry.op}")
    return ours(**call)


_ACCEPTED: dict = {}


def accepted_names(fn) -> frozenset | None:
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


# ---- naming what ran on torch ----------------------------------------------------------

_NAMES: dict = {}  # torch callable -> display name
_SHORT = (("torch.nn.functional.", "F."), ("torch._C._nn.", "F."),
          ("torch._C.TensorBase.", "Tensor."), ("torch.Tensor.", "Tensor."))


def func_name(func) -> str:
    """``F.scaled_dot_product_attention``, ``torch.addmm``, ``Tensor.add`` ..."""
    try:
        return _NAMES[func]
    except (KeyError, TypeError):
        pass
    try:
        n = torch.overrides.resolve_name(func)
    except Exception:  # noqa: BLE001 - any callable torch hands us; the name is cosmetic
        n = None
    if not n:
        n = getattr(func, "__qualname__", None) or repr(func)
    for long, short in _SHORT:
        if n.startswith(long):
            n = short + n[len(long):]
            break
    try:
        _NAMES[func] = n
    except TypeError:
        pass
    return n


# torch functions that move no data or only make views: counted, reported as one line
_METADATA = frozenset("""
Tensor.size Tensor.dim Tensor.stride Tensor.numel Tensor.view Tensor.view_as Tensor.reshape
Tensor.reshape_as Tensor.permute Tensor.transpose Tensor.t Tensor.unsqueeze Tensor.squeeze
Tensor.expand Tensor.expand_as Tensor.flatten Tensor.unflatten Tensor.split Tensor.chunk
Tensor.unbind Tensor.narrow Tensor.__getitem__ Tensor.is_floating_point Tensor.is_complex
Tensor.contiguous Tensor.is_contiguous Tensor.detach Tensor.requires_grad_ Tensor.__len__
Tensor.__bool__ Tensor.__index__ Tensor.__int__ Tensor.__float__ Tensor.item Tensor.tolist
Tensor.data_ptr Tensor.element_size Tensor.type Tensor.get_device Tensor.untyped_storage
Tensor.storage_offset Tensor.has_names Tensor.is_nested Tensor.__hash__ Tensor.movedim
torch.split torch.chunk torch.unbind torch.flatten torch.transpose torch.permute
torch.reshape torch.squeeze torch.unsqueeze torch.narrow torch.is_floating_point
torch.is_complex torch.is_tensor torch.numel torch.broadcast_shapes torch.broadcast_to
torch.Size torch.finfo torch.iinfo torch.is_grad_enabled torch.get_default_dtype
""".split())


def is_metadata(name: str) -> bool:
    # property getters (Tensor.shape, .dtype, .device, .requires_grad, ...) and the views
    return name in _METADATA or name.endswith(".__get__") or name.endswith(".__set__")


_OWNER: dict = {}  # code object of a forward -> class path of its module ("" if none)
_SHARED = object()  # a forward inherited by several classes: look at `self` every time
OUTSIDE = "(no module: called outside any module's forward)"


def calling_module(frame) -> str:
    """Class path of the module whose ``forward`` is the innermost on the stack from
    ``frame``. Cached per forward's code object when that code is the forward of exactly
    the class found (an inherited forward, like BatchNorm2d's, is resolved per call)."""
    f = frame
    while f is not None:
        code = f.f_code
        if code.co_name == "forward":
            where = _OWNER.get(code)
            if where is None or where is _SHARED:
                owner = f.f_locals.get("self")
                if isinstance(owner, torch.nn.Module):
                    cls = type(owner)
                    where = class_path(cls)
                    if code not in _OWNER:
                        own = cls.__dict__.get("forward")
                        _OWNER[code] = where if getattr(own, "__code__", None) is code \
                            else _SHARED
                else:
                    where = _OWNER[code] = ""
            if where:
                return where
        f = f.f_back
    return OUTSIDE


# reasons a torch function ran on torch (keys of State.torch_calls)
NO_KERNEL = "no ortcpu_torch kernel"
#: ours write fresh outputs, never into a given tensor (Inductor's generated code passes
#: out= to ATen's matrix products, run under this mode after a graph break)
OUT_GIVEN = "out= given (ours write fresh outputs)"
NOT_SELECTED = "not selected by include/exclude"
IN_TORCH_SCOPE = "inside an excluded module, or a swapped module run by torch (a fallback, " \
                 "or torch measured faster)"


METADATA_CALLERS = "(views and metadata reads are not attributed to modules)"
_META_KEYS: dict = {}  # torch callable -> its State.torch_calls key if a view/metadata read
_UNSEEN = object()


def _meta_key(func):
    """``State.torch_calls`` key of ``func`` if it is a view or metadata read, else None
    (cached per callable)."""
    name = func_name(func)
    key = (name, METADATA_CALLERS, NO_KERNEL) if is_metadata(name) else None
    try:
        _META_KEYS[func] = key
    except TypeError:  # an unhashable callable: looked up every time
        pass
    return key


def selection(state: State, entry: FuncEntry):
    """(whether ``entry`` may run ours here, the reason if not): the innermost
    include/exclude scope, else ``include``/``exclude`` applied to the functional's name."""
    scope = state.scope()
    if scope is None:
        sel = state.func_selected.get(entry.name)
        if sel is None:
            sel = state.func_selected[entry.name] = state.selected(entry.name, entry.op)
        return sel, NOT_SELECTED
    return scope, IN_TORCH_SCOPE


def route_call(state: State, entry: FuncEntry, func, args, kwargs, stats: Stats,
               ran_ours: set | None = None):
    """One call of a routable functional: ours or torch's per ``select``, the support
    checks and the fallback policy, counted in ``stats``; ``ran_ours`` (a set) gets the
    functional's name when ours ran."""
    ours = entry.ours()
    if ours is None:  # family not in this build: not a fallback, just not there yet
        stats.fell += 1
        k = f"no kernel in this build (ortcpu_torch.ops.{entry.op} missing)"
        stats.reasons.setdefault(k, [k, 0])[1] += 1
        return func(*args, **kwargs)
    reason = context_reason() or values_reason(args) or (
        (OUT_GIVEN if kwargs.get("out") is not None else values_reason(kwargs.values()))
        if kwargs else None)
    if reason is None and state.select != "ours":
        key = (entry.name, call_key(args, kwargs))
        side = state.sides.get(key)
        if side is None:  # a new signature: measure
            side = choose(state, entry.name, None,
                          lambda *a, **k: ours_call(entry, ours, a, k), func, args,
                          kwargs, key, stats)
        if side == "torch":
            stats.chose_torch()
            return timed(state, "torch", func, *args, **kwargs) if state.timing \
                else func(*args, **kwargs)
    if reason is None:
        try:
            out = timed(state, "ours", ours_call, entry, ours, args, kwargs, True) \
                if state.timing else ours_call(entry, ours, args, kwargs, True)
            stats.ours += 1
            if ran_ours is not None:
                ran_ours.add(entry.name)
            return out
        except Unsupported as e:
            reason = str(e.args[0])
        except (TypeError, ValueError) as e:
            reason = exc_reason(f"ops.{entry.op}", e)
    state.fell_back(entry.name, entry.name, stats, reason)
    if state.timing:
        return timed(state, "torch", func, *args, **kwargs)
    return func(*args, **kwargs)


_OP_OVERLOAD = torch._ops.OpOverload


class KernelMode(TorchFunctionMode):
    """Routes the functionals in ``FUNCTIONALS`` to ``ortcpu_torch.ops`` while active and
    counts the rest by calling module. ``census`` (``census.Census``, a wrapped root's
    counted forward): also records which functionals ran ours and which of their calls
    did not come through the attribute patches (``census.py``)."""

    def __init__(self, state: State, census=None):
        super().__init__()
        self.state = state
        self.census = census

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # Dynamo tracing a frame under the eager mode: after a graph break in the
            # root's forward (a logging call, say) it compiles the inner frames as new
            # ones while this mode is on the stack; they route as the compile mode does
            mode = self.state.compile_mode
            if mode is None:
                return func(*args, **kwargs)
            return mode.__torch_function__(func, types, args, kwargs)
        if type(func) is _OP_OVERLOAD and func.namespace == "ortcpu":
            return func(*args, **kwargs)  # a compiled graph's call of our op: ours already
        state = self.state
        entry = BY_FUNC.get(func)
        if entry is None:
            # views and metadata reads (most of a transformer's torch calls): counted
            # without looking up the calling module (the report lists them as one line)
            key = _META_KEYS.get(func, _UNSEEN)
            if key is _UNSEEN:
                key = _meta_key(func)
            if key is not None:
                calls = state.torch_calls
                calls[key] = calls.get(key, 0) + 1
                if state.timing:
                    return timed(state, "torch", func, *args, **kwargs)
                return func(*args, **kwargs)
        why = NO_KERNEL
        if entry is not None:
            func = entry.func  # not a router (census.py) a Python functional dispatched
            census = self.census
            if census is not None:
                census.saw(entry)
            sel, why = selection(state, entry)
            if sel:
                stats = state.funcs.get(entry.name)
                if stats is None:
                    stats = state.funcs[entry.name] = Stats()
                return route_call(state, entry, func, args, kwargs, stats,
                                  None if census is None else census.ours)
        key = (func_name(func) if entry is None else entry.name,
               calling_module(sys._getframe(1)), why)
        calls = state.torch_calls
        calls[key] = calls.get(key, 0) + 1
        if state.timing:
            return timed(state, "torch", func, *args, **kwargs)
        return func(*args, **kwargs)

    def report(self, file="stdout", timing: bool = False):
        from .report import report

        return report(self, file=file, timing=timing)


def __getattr__(name: str):
    # the root's forward wrapper and hooks live in census.py (which builds on this
    # module); models pickled when they lived here name them by this module
    if name in ("RootForward", "EnterHook", "ExitHook"):
        from . import census

        return getattr(census, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def kernels_enabled(fallback: str = "warn", include=None, exclude=None,
                    timing: bool = False, select="ours") -> KernelMode:
    """Context manager routing torch functionals (``F.gelu``, ``torch.softmax``, ...) to
    ortcpu_torch kernels inside the ``with`` block, with the same fallback policy as
    ``wrap``. Unlike ``wrap``, ``select`` defaults to ``"ours"``: this block is an explicit
    request for our kernels (pass ``select="fastest"`` to let measurement decide).
    ``ortcpu_torch.report(ctx)`` (or ``ctx.report()``) shows what ran where."""
    return KernelMode(State(fallback, include, exclude, timing, select))
