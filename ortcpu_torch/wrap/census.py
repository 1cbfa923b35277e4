"""Steady state of a wrapped root's forward: what it costs the torch calls we do not route.

Under the counting ``KernelMode`` every torch call of the forward (outside swapped
modules) pays a Python ``__torch_function__`` (a frame walk to find the calling module,
a counter): ~6-15 us against ~2 us for a small call itself (``benchmarks/mode_tax.py``),
and the small Hugging Face models of ``benchmarks/models.py`` make 50-130 per forward. So
the mode counts only a *census*: the first forward of each root input signature
(``root_key``: shapes, dtypes and ``requires_grad`` of the tensor arguments, the other
arguments' values or types, the training flag, grad mode). The census decides the plan
for the later forwards with that signature (``plan_of``):

- ``NO_MODE``: no routable functional ran ours (every one chose torch, fell back, was
  not selected, or none was called): the forward runs with no torch function mode at
  all. Swapped modules route themselves and need none.
- patch (a ``Plan`` naming functionals): the functionals that ran ours, each seen only
  through its module attribute (``torch.nn.functional.scaled_dot_product_attention``,
  ``torch.softmax``, ``torch.Tensor.softmax`` ...), are routed by swapping those
  attributes for routers (``_Patch``) for the duration of the root forward. A router
  routes only on the thread running the forward (every other thread gets torch's
  callable straight through) and lets nested calls through (the torch calls of our op
  or of torch's functional). The census runs with every router installed and tells the
  mode which call came through one (``_tl.via``), so a call the patches cannot catch
  (a name bound at import time, ``from torch.nn.functional import gelu``; ``a @ b`` is
  caught by ``Tensor.__matmul__``'s router) is seen, and that signature gets:
- ``LEAN``: a torch function mode that routes and counts nothing else (~2 us a call).

A later forward that calls a routable functional its census did not see (control flow
that changed) runs that call on torch, or routes it through a router installed for
another call: never wrong, at worst on torch. With ``timing`` on, under tracing or
autocast, every forward is counted by the full mode; so is a forward whose signature
arrives after ``MAX_PLANS`` others (the oldest plan is dropped). ``report()`` says how
many forwards were counted: its functional and torch-function call counts cover those.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
import weakref

import torch
from torch.overrides import TorchFunctionMode

from .policy import Stats
from .routing import KernelMode, route_call, selection
from .tables import BY_FUNC, FUNCTIONALS, FuncEntry

MAX_PLANS = 256  # root input signatures remembered per wrap (oldest dropped first)
#: False: every forward is counted by the full mode, as before this module existed (an
#: A/B switch for benchmarks/mode_tax.py; plans already made are not used either)
ENABLED = True


class _Local(threading.local):
    """Per thread (class attributes are the defaults: plain reads, no ``getattr``):
    ``active``, the State the attribute routers route for (``_CENSUS`` during a census,
    None: straight to torch); ``root``, the State whose root forward runs in steady state
    without a mode of ours on top; ``mode``, the census's counting mode; ``via``, the
    entry whose router the census mode's next call came through."""

    active = root = mode = via = None


_tl = _Local()
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
per_thread = _tl  # read inline by swap.py's steady path (.root, .active)
_is_tracing = torch._C._is_tracing
# any device's autocast (one argument-free call; a CUDA autocast around a CPU model only
# costs its forwards the census's savings)
_any_autocast = torch._C._is_any_autocast_enabled
_is_compiling = torch.compiler.is_compiling
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_push = torch._C._push_on_torch_function_stack
_pop = torch._C._pop_torch_function_stack


class Plan:
    """How later forwards of one root input signature run: ``kind`` is "none", "patch"
    (routers for the functionals named in ``names``) or "lean"."""

    __slots__ = ("kind", "names")

    def __init__(self, kind: str, names: tuple = ()):
        self.kind, self.names = kind, names

    def __repr__(self):
        return f"Plan({self.kind!r}, {self.names!r})"


NO_MODE, LEAN = Plan("none"), Plan("lean")


class Census:
    """What one counted forward saw: the functionals that ran ours (``ours``) and those
    called without coming through their router (``missed``)."""

    __slots__ = ("ours", "missed")

    def __init__(self):
        self.ours: set = set()
        self.missed: set = set()

    def saw(self, entry: FuncEntry) -> None:
        if _tl.via is entry:
            _tl.via = None
        else:
            self.missed.add(entry.name)


def plan_of(census: Census) -> Plan:
    ours = census.ours
    if not ours:
        return NO_MODE
    if ours & census.missed or not ours <= _PATCHES.keys():
        return LEAN
    return Plan("patch", tuple(sorted(ours)))


# ---- the root input signature ----------------------------------------------------------

_TENSORS = (torch.Tensor, torch.nn.Parameter)
_BY_VALUE = frozenset((int, bool, str, type(None)))


def _key(v):
    t = type(v)
    if t in _TENSORS or isinstance(v, torch.Tensor):
        return (t, v.shape, v.dtype, v.requires_grad, v.device, v.layout)
    if t in _BY_VALUE:
        return v
    if t is list or t is tuple:
        return (t, *[_key(x) for x in v])
    if t is dict:
        return (dict, *[(k, _key(x)) for k, x in v.items()])
    return t  # any other object by its type (its identity would make every call new)


def root_key(module, args, kwargs):
    """The census key of a root forward call. Plain tensor arguments, the common call,
    are keyed inline by shape, dtype and ``requires_grad`` (this runs on every root
    forward): not by device or layout, since a plan only says where routing may pay and
    every routed call and swapped module checks its own values (a CUDA or sparse input
    sharing a CPU signature's plan runs on torch all the same)."""
    key = [module.training, _grad_enabled()]
    for v in args:
        if type(v) is _Tensor:
            key.append((v.shape, v.dtype, v.requires_grad))
        else:
            key.append((_key(v),))  # never equal to a plain tensor's 3-tuple
    if kwargs:
        key.append(_key(kwargs))
    return tuple(key)


# ---- attribute patches -----------------------------------------------------------------

_OWNERS = {"F": torch.nn.functional, "torch": torch, "Tensor": torch.Tensor}


class _Patch:
    """The router of one attribute of a routable functional and its install count."""

    __slots__ = ("owner", "attr", "saved", "router", "users")

    def __init__(self, entry: FuncEntry, owner, attr: str):
        self.owner, self.attr = owner, attr
        self.saved = owner.__dict__.get(attr, _ABSENT)  # Tensor's come from TensorBase
        self.router = _router(entry, getattr(owner, attr))
        self.users = 0


_ABSENT = object()


def _router(entry: FuncEntry, orig):
    def router(*args, **kwargs):
        if _is_compiling():
            return orig(*args, **kwargs)
        state = _tl.active
        if state is None:  # another thread, or nothing to route through us
            return orig(*args, **kwargs)
        if state is _CENSUS:
            # tell the census mode this call came through the attribute: only a call the
            # mode will see next (it is innermost); nested calls have it popped
            mode = _tl.mode
            n = _stack_len()
            if n and _stack_at(n - 1) is mode:
                _tl.via = entry
            return orig(*args, **kwargs)
        _tl.active = None  # torch calls made by our op or by torch's own: straight through
        try:
            return route_steady(state, entry, orig, args, kwargs)
        finally:
            _tl.active = state

    functools.update_wrapper(router, orig)
    # picklable by reference (code holding the functional it read during a patched
    # forward holds the router): a name of this module; it behaves as torch's outside
    router.__module__, router.__qualname__ = __name__, (
        f"_router_{entry.name.replace('.', '_')}_{orig.__name__}")
    globals()[router.__qualname__] = router
    return router


_CENSUS = object()  # _tl.active during a census: routers only mark, the mode routes
# spellings that reach a functional without its own attribute: ``a @ b`` dispatches to
# Tensor.matmul through the type slot of Tensor.__matmul__
_MORE_ATTRS = {"Tensor.matmul": ("__matmul__",)}


def _patches() -> dict:
    out = {}
    for e in FUNCTIONALS:
        prefix, attr = e.name.split(".", 1)
        owner = _OWNERS.get(prefix)
        if owner is None or getattr(owner, attr, None) is not e.func:
            continue
        ps = out[e.name] = tuple(_Patch(e, owner, a)
                                 for a in (attr, *_MORE_ATTRS.get(e.name, ())))
        # a functional written in Python dispatches to the mode with the callable its
        # module globals name: the router while installed
        BY_FUNC[ps[0].router] = e
    return out


_PATCHES: dict[str, tuple[_Patch, ...]] = _patches()
_ALL = tuple(_PATCHES)
_lock = threading.Lock()
_warm = []


def _warm_caches() -> None:
    """Build, with torch's own callables in place, the tables torch and Dynamo fill on
    first use by reading ``torch.nn.functional``/``torch``/``torch.Tensor`` attributes
    (names of overridable functions, Dynamo's rules per torch object): filled while a
    router is installed they would hold the router instead."""
    o = torch.overrides
    o.get_ignored_functions()
    o.get_testing_overrides()
    o.get_overridable_functions()
    o.is_tensor_method_or_property(torch.Tensor.add)
    o.get_default_nowrap_functions()
    if "torch._dynamo" in sys.modules:
        from torch._dynamo import trace_rules

        trace_rules.get_torch_obj_rule_map()
        trace_rules.get_tensor_method()
    _warm.append(True)


def install(names) -> None:
    with _lock:
        if not _warm:
            _warm_caches()
        for n in names:
            for p in _PATCHES[n]:
                if not p.users:
                    setattr(p.owner, p.attr, p.router)
                p.users += 1


def uninstall(names) -> None:
    with _lock:
        for n in names:
            for p in _PATCHES[n]:
                p.users -= 1
                # restored only if still ours (someone may have patched it after us)
                if not p.users and p.owner.__dict__.get(p.attr) is p.router:
                    if p.saved is _ABSENT:
                        delattr(p.owner, p.attr)
                    else:
                        setattr(p.owner, p.attr, p.saved)


def route_steady(state, entry: FuncEntry, func, args, kwargs):
    """A routable call in steady state: routed as under the mode, counted nowhere."""
    if kwargs is None:
        kwargs = {}
    sel, _why = selection(state, entry)
    if not sel:
        return func(*args, **kwargs)
    # counted nowhere (report: census forwards), but a fallback reason new to this call
    # is still announced per the policy (state.warned keeps warnings once per reason)
    return route_call(state, entry, func, args, kwargs, Stats())


class LeanKernelMode(TorchFunctionMode):
    """Steady state when a routed functional cannot be caught by its attribute: routes
    the functionals of ``FUNCTIONALS``, counts nothing."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        entry = BY_FUNC.get(func)
        if entry is None or torch.compiler.is_compiling():
            return func(*args, **(kwargs or {}))
        return route_steady(self.state, entry, entry.func, args, kwargs)


# ---- one root forward --------------------------------------------------------------------

class RootRun:
    """What ``begin`` set up for one root forward, undone by ``end``."""

    __slots__ = ("state", "mode", "census", "key", "patched", "active", "mode_prev",
                 "root_prev")

    def end(self, ok: bool) -> None:
        state = self.state
        if self.mode is not None:
            state.modes.pop()
            _pop()
        if self.patched:
            uninstall(self.patched)
        _tl.active, _tl.root = self.active, self.root_prev
        if self.census is not None:
            _tl.mode = self.mode_prev
            if ok:  # a census cut short (an exception) decides nothing
                plans = state.plans
                if len(plans) >= MAX_PLANS:
                    plans.pop(next(iter(plans)))
                plans[self.key] = plan_of(self.census)


def _steady_plan(state, module, args, kwargs):
    """(census key, plan) of a root forward: the key is None where every forward is
    counted (the census switched off, ``timing``, TorchScript tracing, autocast; the
    callers took torch.compile's path before), the plan None where there is none yet."""
    if not ENABLED or state.timing or _is_tracing() or _any_autocast():
        return None, None
    key = root_key(module, args, kwargs)
    return key, state.plans.get(key)


def begin(state, module, args, kwargs) -> RootRun:
    """Enter the routing of one root forward per its signature's plan (a census, with
    the counting mode, if it has none yet)."""
    return _begin(state, *_steady_plan(state, module, args, kwargs))


def _begin(state, key, plan) -> RootRun:
    run = RootRun()
    tl = _tl
    run.state, run.census, run.patched = state, None, ()
    run.active, run.root_prev = tl.active, tl.root
    if plan is None:  # counted by the full mode (a census when there is a key)
        tl.root = None  # swapped modules find the mode on top (swap.py)
        state.forwards[0] += 1
        census = None
        if key is not None:
            census = run.census = Census()
            run.key, run.mode_prev = key, tl.mode
        mode = run.mode = KernelMode(state, census)
        _push(mode)  # mode.__enter__ without its layers
        state.modes.append(mode)
        if census is not None:
            install(_ALL)
            run.patched = _ALL
            tl.active, tl.mode, tl.via = _CENSUS, mode, None
        else:
            tl.active = None
        return run
    state.forwards[1] += 1
    tl.root = state  # swapped modules take their short path without a mode (swap.py)
    kind = plan.kind
    if kind == "none":
        run.mode = None
        tl.active = None
    elif kind == "patch":
        run.mode = None
        install(plan.names)
        run.patched = plan.names
        tl.active = state
    else:
        tl.root = None  # swapped modules find the lean mode on top and pop it (swap.py)
        mode = run.mode = LeanKernelMode(state)
        _push(mode)
        state.modes.append(mode)
        tl.active = None
    return run


# ---- the root's forward wrapper and hooks ------------------------------------------------

class RootForward:
    """The wrapped root's ``forward``, set as an instance attribute (picklable): the class's
    forward as one root forward (``begin``/``end``; the common steady state, a signature
    whose plan routes nothing, inline). Cheaper than a forward pre-hook and an
    always-called forward hook (those send every call of the root through
    ``Module._call_impl``'s hook path). While torch.compile traces, the compile-time mode
    instead (``compiled.py``). ``EnterHook``/``ExitHook`` do the same for a root that has
    a ``forward`` attribute of its own. It holds the root by weak reference: a strong one
    would be a reference cycle (root -> its ``forward`` -> root), leaving a dropped
    model's memory to the cyclic garbage collector.

    Each instance is of its own subclass whose ``__call__`` has a code object of its own:
    Dynamo keeps its compiled entries (and their recompile limit, 8) per code object, and
    with one shared ``__call__`` the ninth model wrapped and compiled in a process ran
    uncompiled."""

    def __new__(cls, module, state):
        if cls is RootForward:
            call = RootForward.__call__
            own = types.FunctionType(call.__code__.replace(), call.__globals__, call.__name__,
                                     call.__defaults__, call.__closure__)
            cls = type("RootForward", (RootForward,),
                       {"__call__": own, "__module__": __name__, "__slots__": ()})
        return object.__new__(cls)

    def __init__(self, module, state):
        self._module, self.state = weakref.ref(module), state

    @property
    def module(self):
        return self._module()

    def __reduce__(self):  # pickle/deepcopy: rebuilt around the copied root
        return (RootForward, (self._module(), self.state))

    @property
    def __wrapped__(self):  # inspect.signature(model.forward) reads the class's forward
        return type(self.module).forward.__get__(self.module)

    def __call__(self, *args, **kwargs):
        module, state = self._module(), self.state
        forward = type(module).forward
        if _is_compiling():
            mode = state.compile_mode  # made at wrap time (see EnterHook)
            if mode is None:
                return forward(module, *args, **kwargs)
            with mode:
                return forward(module, *args, **kwargs)
        if state.check is not None and module.training and _grad_enabled():
            state.check.tick(module)  # select's in-model check (model_check.py)
        key = plan = None
        if ENABLED and not state.timing and not _is_tracing() and not _any_autocast():
            # (_steady_plan and root_key, inline: this runs on every root forward, and a
            # one-op root such as a wrapped loss pays every Python step of it per call)
            key = [module.training, _grad_enabled()]
            for v in args:
                if type(v) is _Tensor:
                    key.append((v.shape, v.dtype, v.requires_grad))
                else:
                    key.append((_key(v),))
            if kwargs:
                key.append(_key(kwargs))
            key = tuple(key)
            plan = state.plans.get(key)
            if plan is NO_MODE:
                state.forwards[1] += 1
                tl = _tl
                root = tl.root
                tl.root = state  # as _begin does for a "none" plan
                active = tl.active
                if active is None:  # the common call: one thread-local write less each way
                    try:
                        return forward(module, *args, **kwargs)
                    finally:
                        tl.root = root
                tl.active = None
                try:
                    return forward(module, *args, **kwargs)
                finally:
                    tl.root, tl.active = root, active
        run = _begin(state, key, plan)
        ok = False
        try:
            out = forward(module, *args, **kwargs)
            ok = True
            return out
        finally:
            run.end(ok)


class EnterHook:
    """Forward pre-hook on the root: begin the routing of this forward (picklable). While
    torch.compile traces, the compile-time mode instead (``compiled.py``: our custom ops
    in the graph, no bookkeeping)."""

    def __init__(self, state):
        self.state = state

    def __call__(self, module, args):
        if _is_compiling():
            # one mode object made at wrap time: creating (or stacking) it here would be
            # state Dynamo rebuilds after every call of the compiled graph
            mode = self.state.compile_mode
            if mode is not None:
                mode.__enter__()
            return
        state = self.state
        if state.check is not None and module.training and _grad_enabled():
            state.check.tick(module)  # select's in-model check (model_check.py)
        state.runs.append(begin(state, module, args, None))


class ExitHook:
    """Always-called forward hook on the root: end the routing of this forward."""

    def __init__(self, state):
        self.state = state

    def __call__(self, module, args, output):
        if _is_compiling():
            mode = self.state.compile_mode
            if mode is not None:
                mode.__exit__(None, None, None)
            return
        runs = self.state.runs
        if runs:
            # called from torch's exception handler too: then the census decides nothing
            runs.pop().end(sys.exc_info()[0] is None)
