"""Module swap: a supported ``torch.nn`` module is replaced, in its parent, by its
``ortcpu_torch.nn`` counterpart built with the same configuration (read from the torch
module's attributes by the table entry's argument mapping) and pointed at the *same*
Parameter and buffer objects (nothing is copied). The counterpart runs as a thin subclass
(``Wrapped<Name>``, defined here so pickling finds it) whose ``forward`` checks the
inputs, runs our kernels, and falls back to the original torch module (kept aside, not a
child, so ``state_dict`` keys are unchanged) for anything we do not support.

Also here: the scope hooks that keep everything inside an excluded module on torch (and
route everything inside an included one)."""

from __future__ import annotations

import operator

import torch

from .census import LeanKernelMode, per_thread
from .direct import direct_forward
from .policy import (
    INFO_ATTR,
    call_args_reason,
    context_reason,
    exc_reason,
    module_call_reason,
)
from .routing import KernelMode
from .select import RANDOM_MODULES, call_key, choose, module_runner
from .tables import MODULES, ModuleEntry
from .timing import timed

CHOSE = "torch chosen"  # marker: torch runs because it measured faster, not a fallback
_UNSET = object()  # SwapInfo.torch_direct not looked up yet


class SwapInfo:
    """Kept on a swapped module (not a child: state_dict is unchanged)."""

    config = ""  # (class default for objects unpickled from before it existed)

    def __init__(self, original, entry_name, qualname, state, attrs, config=""):
        self.original = original
        self.config = config  # extra_repr at wrap time: part of select's signature key
        self.entry_name = entry_name
        self.qualname = qualname
        self.state = state
        self.attrs = attrs  # public config attributes to mirror onto the original on fallback
        self.__setstate__(self.__dict__)

    def __getstate__(self):
        d = dict(self.__dict__)
        for k in ("sides", "steady", "stats", "ours_forward", "torch_direct"):
            d.pop(k, None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        # per call, looked up once: select's choices for this module by (training flag,
        # call_key), the module's Stats, the counterpart's own forward, torch's forward
        # as a direct ATen call (direct.py; None where there is none; built on first use)
        # and by (training flag, *call_key) the signatures whose side is that direct call
        self.sides: dict = {}
        self.steady: dict = {}
        self.stats = None
        self.ours_forward = None
        self.torch_direct = _UNSET


_disabled = torch._C.DisableTorchFunction
_is_compiling = torch.compiler.is_compiling
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_is_tracing = torch._C._is_tracing
_autocast = torch.is_autocast_enabled
_strided = torch.strided
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_SLOW = object()  # _fast_forward's "take the general path"
_OUR_MODES = (KernelMode, LeanKernelMode)


def _wrapped_forward(self, *args, **kwargs):
    info: SwapInfo = self.__dict__[INFO_ATTR]
    if _is_compiling():
        # torch.compile traces torch's forward; the root's compile-time mode routes the
        # functionals it calls (F.linear, F.batch_norm, ...) to our custom ops
        # (compiled.py). Nothing is counted here: a counter read while tracing becomes a
        # guard, and a guard that changes every call recompiles every call.
        # Nothing is synced: the parameter and buffer dicts are shared (build_swap) and
        # attribute writes reach the original as they happen (_wrapped_setattr); reading
        # both modules here would guard every attribute twice, and two sources of one
        # tensor cost a guard function run in Python, on every call
        return info.original.forward(*args, **kwargs)
    state = info.state
    tl = per_thread
    if tl.root is state and not kwargs:
        # the steadiest call: a root forward in steady state without a mode of ours
        # (census.py), a signature select gave to torch, torch's forward as its direct
        # ATen call (direct.py; no Python routers on that path, so they stay as they are)
        try:
            key = [self.training]
            for a in args:
                key.append((a.shape, a.dtype, a.requires_grad, a.is_contiguous()))
        except AttributeError:  # not a tensor: the paths below
            pass
        else:
            run = info.steady.get(tuple(key))
            if run is not None:
                out = run(self, args)
                if out is not NotImplemented:
                    info.stats.chosen += 1
                    return out
    stats = info.stats
    if stats is None:
        stats = info.stats = state.modules[info.qualname]["stats"]
        info.ours_forward = type(self).__mro__[1].forward
    if not state.timing:
        out = _SLOW
        if tl.root is state:
            # a steady-state root forward without a mode of ours (census.py: a "none" or
            # "patch" plan); torch's side runs as torch's, as it does below with the mode
            # popped (the attribute routers off)
            active = tl.active
            if active is None:
                out = _fast_forward(self, info, state, stats, args, kwargs)
            else:
                tl.active = None
                try:
                    out = _fast_forward(self, info, state, stats, args, kwargs)
                finally:
                    tl.active = active
        else:
            n = _stack_len()
            top = _stack_at(n - 1) if n else None
            if type(top) is KernelMode and (_is_tracing() or _autocast("cpu")):
                pass  # a counted forward in a context ours may not run in: the general
                # path counts torch's call as that fallback (a steady root forward is
                # never in one: census.py; autocast entered inside it still keeps ours
                # off, _fast_forward)
            elif type(top) in _OUR_MODES and top.state is state:
                # the common call, inside the wrapped root's forward, of a signature seen
                # before: everything below runs with our kernel mode popped (no Python
                # __torch_function__ per tensor attribute read or per torch call)
                torch._C._pop_torch_function_stack()
                try:
                    out = _fast_forward(self, info, state, stats, args, kwargs)
                finally:
                    torch._C._push_on_torch_function_stack(top)
        if out is not _SLOW:
            if type(out) is _Fallback:
                return _fall_back(self, info, state, stats, out.reason, args, kwargs)
            return out
    return _general_forward(self, info, state, stats, args, kwargs)


class _Fallback:
    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def _fast_forward(self, info: SwapInfo, state, stats, args, kwargs):
    """A call whose signature select has decided before: torch's forward (its arguments
    checked only for keyword calls: torch's side runs whatever torch takes), or ours (its
    arguments, parameters, buffers and context checked); ``_SLOW`` for anything else (a
    new signature, a context where nothing may run ours), a ``_Fallback`` when ours
    rejected the call."""
    if state.select == "ours":
        side = "ours"
    else:
        if kwargs:
            key = call_key(args, kwargs)
        else:  # call_key(args, {}) of the common call, inline
            key = []
            for a in args:
                if type(a) not in _PLAIN_TYPES:
                    return _SLOW
                key.append((a.shape, a.dtype, a.requires_grad, a.is_contiguous()))
            key = tuple(key)
        side = info.sides.get((self.training, key))
    if side == "torch":
        if kwargs:
            if call_args_reason(args, kwargs) is not None:
                return _SLOW
        else:
            run = info.torch_direct
            if run is _UNSET:
                run = info.torch_direct = direct_forward(info.original)
            if run is not None:
                out = run(self, args)
                if out is not NotImplemented:
                    stats.chosen += 1
                    # plain tensors (the key above): _wrapped_forward's steadiest call
                    info.steady[(self.training, *key)] = run
                    return out
        stats.chosen += 1
        orig = info.original
        sync_to_original(self, orig, info.attrs)
        return orig.forward(*args, **kwargs)
    if side != "ours" or _is_tracing() or _autocast("cpu"):  # context_reason, compiling
        return _SLOW                                         # excluded above
    with _disabled():
        reason = module_call_reason(self, args, kwargs)
        if reason is not None:
            return _SLOW
        try:
            out = info.ours_forward(self, *args, **kwargs)
        except (TypeError, ValueError) as e:
            return _Fallback(exc_reason(f"nn.{type(self).__mro__[1].__name__}", e))
    stats.ours += 1
    return out


def _general_forward(self, info: SwapInfo, state, stats, args, kwargs):
    # the checks too run without the kernel mode: under it every tensor attribute read
    # is a Python __torch_function__ call
    with _disabled():
        reason = context_reason() or module_call_reason(self, args, kwargs)
        if reason is None and state.select != "ours":
            # this module's choices by a short key, filled from the wrap-wide ones
            fast = (self.training, call_key(args, kwargs))
            side = info.sides.get(fast)
            if side is None:
                # the wrap-wide choice, measured for a new signature (once per module
                # and signature: the runners are built for it)
                side = info.sides[fast] = choose(
                    state, info.entry_name, (type(info.original), self.training, info.config),
                    module_runner(self, info.ours_forward),
                    module_runner(info.original, type(info.original).forward,
                                  lambda: sync_to_original(self, info.original, info.attrs)),
                    args, kwargs, (info.entry_name, info.config, fast[0], fast[1]), stats,
                    info.entry_name in RANDOM_MODULES and RANDOM_MODULES[info.entry_name](self))
            if side == "torch":
                stats.chose_torch()
                reason = CHOSE
        if reason is None:
            try:
                out = timed(state, "ours", info.ours_forward, self, *args, **kwargs) \
                    if state.timing else info.ours_forward(self, *args, **kwargs)
                stats.ours += 1
                return out
            except (TypeError, ValueError) as e:
                reason = exc_reason(f"nn.{type(self).__mro__[1].__name__}", e)
    return _fall_back(self, info, state, stats, reason, args, kwargs)


def _fall_back(self, info: SwapInfo, state, stats, reason, args, kwargs):
    """torch's forward for this call: ``reason`` is CHOSE (torch measured faster) or why
    ours cannot run it (a fallback, announced per the policy)."""
    orig = info.original
    sync_to_original(self, orig, info.attrs)
    if reason is CHOSE:
        # torch measured faster: its forward runs as plain torch, without the kernel mode
        # (whose only work inside a swapped module run by torch would be counting the
        # calls report() already attributes to this module)
        mode = _our_mode_on_top(state)
        if mode is not None:
            torch._C._pop_torch_function_stack()
            try:
                if state.timing:
                    return timed(state, "torch", orig.forward, *args, **kwargs)
                return orig.forward(*args, **kwargs)
            finally:
                torch._C._push_on_torch_function_stack(mode)
    else:
        state.fell_back(f"{info.qualname or 'model'} ({info.entry_name})", info.entry_name,
                        stats, reason)
    scopes = state.scopes
    scopes.append(False)  # torch's forward runs as torch's, functionals included
    try:
        if state.timing:
            return timed(state, "torch", orig.forward, *args, **kwargs)
        return orig.forward(*args, **kwargs)
    finally:
        scopes.pop()


def _our_mode_on_top(state):
    """This wrap's active kernel mode if it is the innermost torch function mode (so it
    can be popped and pushed back around a call), else None."""
    modes = state.modes
    n = torch._C._len_torch_function_stack()
    if modes and n and torch._C._get_function_stack_at(n - 1) is modes[-1]:
        return modes[-1]
    return None


_module_setattr = torch.nn.Module.__setattr__  # (our nn classes keep torch's)


def _wrapped_setattr(self, name, value):
    """``Module.__setattr__`` of a swapped module, passing the training flag and the
    configuration attributes on to the original as they are set (``model.eval()``,
    ``bn.momentum = 0.01``), so that torch.compile can run the original's forward without
    reading both modules."""
    _module_setattr(self, name, value)
    d = self.__dict__
    info = d.get(INFO_ATTR)
    if info is not None and name in d and (name == "training" or name in info.attrs):
        info.original.__dict__[name] = d[name]


def sync_to_original(new, orig, attrs) -> None:
    """The original runs the fallback: give it what may have changed on the swapped module
    since wrapping (training flag, config attributes written past ``_wrapped_setattr``,
    parameter and buffer dicts the caller replaced on the swapped module)."""
    nd, od = new.__dict__, orig.__dict__
    # written only when changed: under torch.compile a write is replayed after every call
    if od["training"] is not nd["training"]:
        od["training"] = nd["training"]  # a plain attribute: what Module.__setattr__ does
    for k in attrs:
        if k in nd and od.get(k) is not nd[k]:
            od[k] = nd[k]
    for d in ("_parameters", "_buffers"):
        odd, ndd = od[d], nd[d]
        if odd is ndd:  # shared since build_swap, unless the caller replaced a dict
            continue
        # the common case, nothing re-assigned (same order: build_swap), in one C loop
        if len(odd) == len(ndd) and all(map(operator.is_, odd.values(), ndd.values())):
            continue
        for k, v in ndd.items():
            if odd.get(k, None) is not v:
                setattr(orig, k, v)  # setattr: modules caching parameter lists update them


_nn_module = torch.nn.modules.module
_module_call = torch.nn.Module.__call__  # torch's own (FX's tracer patches the class's)
_tracing_state = torch._C._get_tracing_state


def _wrapped_call(self, *args, **kwargs):
    """``Module.__call__`` of a swapped module, one Python frame shorter: with no hooks
    (its own or global), no ``module.compile()``, no TorchScript tracing and torch's
    ``Module.__call__`` unpatched, straight to ``forward`` (all ``_call_impl`` does then;
    on a tiny op such as a loss the frame is a measurable share of the call); else
    ``torch.nn.Module.__call__`` as it is now."""
    if (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
            or self._backward_pre_hooks or self._compiled_call_impl is not None):
        return torch.nn.Module.__call__(self, *args, **kwargs)
    m = _nn_module
    if (m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
            or m._global_backward_pre_hooks or _tracing_state()
            or m.Module.__call__ is not _module_call):
        return m.Module.__call__(self, *args, **kwargs)
    return self.forward(*args, **kwargs)


def _wrapped_get_name(self) -> str:
    return f"ortcpu_torch.nn.{type(self).__mro__[1].__name__}"


_WRAPPED: dict[str, type] = {}


def wrapped_class(entry: ModuleEntry) -> type | None:
    """``Wrapped<Name>``: the counterpart with the fallback-aware forward. Defined in this
    module's namespace (``__getattr__`` below) so pickle finds it by name."""
    cls = _WRAPPED.get(entry.torch_name)
    if cls is None:
        cp = entry.counterpart()
        if cp is None:
            return None
        cls = type(f"Wrapped{entry.torch_name}", (cp,), {
            "forward": _wrapped_forward,
            "__call__": _wrapped_call,
            "_get_name": _wrapped_get_name,
            "__setattr__": _wrapped_setattr,
            "__module__": __name__,
            "__doc__": f"ortcpu_torch.nn.{cp.__name__} swapped in by ortcpu_torch.wrap() "
                       f"for a {entry.torch_path}; falls back to it when needed.",
        })
        _WRAPPED[entry.torch_name] = cls
    return cls


def __getattr__(name: str):
    if name.startswith("Wrapped"):
        for e in MODULES:
            if name == f"Wrapped{e.torch_name}":
                cls = wrapped_class(e)
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


def build_swap(entry: ModuleEntry, m: torch.nn.Module, qualname: str, state):
    """The swapped module for ``m``, or a reason why not."""
    cls = wrapped_class(entry)
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
    # the original's own dicts, so state_dict() is key-for-key the same and the fallback
    # sees re-assigned parameters without a copy; under torch.compile the tensors are then
    # reached through one source only (two sources of one tensor cost a guard function in
    # Python on every call)
    new._parameters, new._buffers = m._parameters, m._buffers
    new._non_persistent_buffers_set = m._non_persistent_buffers_set
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
    new.__dict__[INFO_ATTR] = SwapInfo(m, entry.torch_name, qualname, state, attrs,
                                       new.extra_repr())
    return new, None


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks")


def restore_originals(model: torch.nn.Module, keep_hooked: bool = False) -> None:
    """Put each swapped submodule's torch original back in its place (the same Parameter
    and buffer objects; configuration and training flag synced from the swapped one).
    ``keep_hooked``: leave a swapped module that has hooks (registered on it after the
    wrap: the original does not have them) where it is."""
    for qualname, m in list(model.named_modules(remove_duplicate=False)):
        info = m.__dict__.get(INFO_ATTR)
        if info is None or not qualname:
            continue
        if keep_hooked and any(getattr(m, h, None) for h in _HOOK_DICTS):
            continue
        sync_to_original(m, info.original, info.attrs)
        set_child(model, qualname, info.original)


def set_child(root: torch.nn.Module, qualname: str, new: torch.nn.Module) -> None:
    parent_name, _, child = qualname.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    parent._modules[child] = new


# ---- scopes: excluded modules stay on torch, included ones route everything ----------


class ScopeEnter:
    """Forward pre-hook of an excluded (``on=False``) or included (``on=True``) module."""

    def __init__(self, state, on: bool):
        self.state, self.on = state, on

    def __call__(self, module, args):
        if not torch.compiler.is_compiling():
            self.state.scopes.append(self.on)
        elif self.state.compile_mode is not None:
            self.state.compile_mode.scopes.append(self.on)


class ScopeExit:
    """Always-called forward hook closing a ``ScopeEnter``."""

    def __init__(self, state):
        self.state = state

    def __call__(self, module, args, output):
        if not torch.compiler.is_compiling():
            scopes = self.state.scopes
        elif self.state.compile_mode is not None:
            scopes = self.state.compile_mode.scopes
        else:
            return
        if scopes:
            scopes.pop()


def add_scope(state, module: torch.nn.Module, on: bool) -> None:
    module.register_forward_pre_hook(ScopeEnter(state, on))
    module.register_forward_hook(ScopeExit(state), always_call=True)


def remove_hooks(module: torch.nn.Module, kinds: tuple) -> None:
    """Remove the forward (pre-)hooks of ``module`` that are instances of ``kinds``."""
    for d in ("_forward_pre_hooks", "_forward_hooks"):
        hooks = getattr(module, d)
        for k in [k for k, h in hooks.items() if isinstance(h, kinds)]:
            del hooks[k]
            module._forward_hooks_always_called.pop(k, None)

