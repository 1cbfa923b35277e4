"""``wrap`` / ``unwrap`` / ``optimize``: walk the model once, decide for every module
(swap it, leave it on torch and say why, or scope it), install the hooks that turn
functional routing on while the root's ``forward`` runs."""

from __future__ import annotations

import torch

from .census import EnterHook, ExitHook, RootForward
from .detect import detect
from .model_check import ModelCheck
from .optimizer import convert_optimizer
from .policy import INFO_ATTR, POLICIES, STATE_ATTR, FallbackError, State, Stats, matches
from .swap import (
    ScopeEnter,
    ScopeExit,
    add_scope,
    build_swap,
    remove_hooks,
    restore_originals,
    set_child,
)
from .tables import MODULES, class_path

_PACKAGE = __package__.rsplit(".", 1)[0]  # "ortcpu_torch"


def _under(qualname: str, prefixes) -> bool:
    return any(qualname == p or qualname.startswith(p + ".") for p in prefixes)


def wrap(model: torch.nn.Module, *, fallback: str = "warn", include=None, exclude=None,
         timing: bool = False, select="fastest", compile_kernels="auto"):
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

    ``include`` / ``exclude``: lists of module classes or name patterns (fnmatch), matched
    against a module's class (``nn.BatchNorm2d``), class name (``"BatchNorm2d"``), class
    path (``"timm.layers.norm.LayerNorm2d"``) or qualified name (``"encoder.*.norm1"``), and
    against a functional's name (``"F.gelu"``, ``"torch.softmax"``) or op (``"gelu"``).
    An excluded module is not swapped and *everything inside it* (its submodules, the
    functionals its forward calls) stays on torch. With ``include``, only what matches is
    swapped or routed, and everything inside an included module is swapped and routed.
    A functional called outside excluded/included modules is routed by its own name.

    ``select``: which side runs each supported call. ``"fastest"`` (default): the first
    call with a new input signature times ours and torch's (forward+backward CPU time of
    the calling thread, on copies: nothing of the model changes) and ours runs from then
    on only where it measured at least ``select.MARGIN`` (5%) faster, so the wrap never
    makes an op slower and ties go to torch, the same way in every run (ours trails on
    tiny tensors, where a Python autograd.Function's fixed cost dominates, and leads on
    large ones). Random ops (dropout) are not timed and run on torch, so a wrapped model
    draws plain torch's random numbers (``torch.manual_seed`` reproduces plain torch's
    run). Once the choices settle, and if some are ours, an in-model check alternates
    training steps between the selection and everything on torch (``PAIRS`` each, the
    whole step timed) and keeps the selection only if its median step is faster; else
    every choice, and every later one, goes to torch and the torch modules come back
    (``wrap/model_check.py``; an op faster alone can slow its neighbours down).
    ``"ours"``: always ours.
    ``report(model).selection``, passed back as ``select=``, replays the choices
    (without the check).

    ``timing``: also measure the forward and backward time spent on ours and on torch
    (a few microseconds per call); ``report(model, timing=True)`` prints the shares.

    Only the root module's forward turns functional routing on: calling a submodule
    directly runs its swapped modules on our kernels but its functionals on torch, and a
    loss computed outside ``model.forward`` stays on torch unless it is wrapped too
    (``criterion = wrap(nn.CrossEntropyLoss())``) or runs under ``kernels_enabled()``. While
    a torch function mode is on, torch's fused inference fast paths that refuse tensors
    with ``__torch_function__`` handling (e.g. ``TransformerEncoderLayer`` in eval mode)
    take their regular path instead.

    What routing costs the torch calls it does not route (``wrap/census.py``): the first
    forward of each input signature (tensor shapes, dtypes and ``requires_grad``, the
    other arguments, the training flag) runs under a counting TorchFunctionMode, a census
    of what ran where for ``report()``; later forwards of that signature run with no torch
    function mode when nothing routable ran ours, with the module attributes of the
    functionals that ran ours (``torch.nn.functional.scaled_dot_product_attention``,
    ``torch.softmax``, ``Tensor.softmax``, ``@``) swapped for thread-checking routers
    during the forward otherwise, and under a routing-only mode when one of those calls
    does not go through its attribute (a name imported with ``from torch.nn.functional
    import gelu``). ``report()``'s call counts of functionals and torch functions cover
    the counted forwards (it says how many); with ``timing`` every forward is counted.

    ``compile_kernels``: what ``torch.compile(model)`` puts in the compiled graph for the
    supported functionals and swapped modules: our kernels as ``torch.library`` operators
    (``ortcpu::conv``, ``ortcpu::linear``, ...; see ``ortcpu_torch.ops.library``) with
    fake shapes and autograd formulas, so the graph calls our forward and gradient
    kernels and Inductor compiles the rest, or torch's own ops. ``"auto"`` (default):
    ours for the families that measured faster inside a compiled graph
    (``compiled.auto_families``: convolution, pooling; GEMMs (``F.linear``, and
    ``torch.addmm`` with a 1-D bias as Hugging Face's ``Conv1D`` computes) and
    scaled_dot_product_attention where ours measure clearly faster than torch's; GELU,
    LayerNorm and cross entropy on our AVX-512 build, cross entropy from 512 classes and
    128K logits), torch's for the rest; ``"ours"``:
    every family ours; ``"torch"``: the wrapper steps aside and the compiled graph is
    torch's; or a list of families from
    ``ortcpu_torch.wrap.compiled.FAMILIES`` (``["linear", "layer_norm"]``).
    ``include``/``exclude`` apply as in eager. Either way the model compiles once (nothing
    the wrapper counts is read while Dynamo traces), and ``select`` does not apply under
    compile (nothing is measured while tracing). Why ``"auto"`` (``python -m
    benchmarks.wrap_compile``, training steps, AVX2 EPYC, 1 thread, machine loaded, two
    runs; ratio = eager wrapped time / this): on a ResNet-style CNN block "auto" ran
    1.02-1.08x, every family ours 0.96-0.97x, torch's inside 0.76-0.84x (Inductor's CPU
    convolutions and BatchNorm trail ours); on a GPT-style block every family ours ran
    0.99-1.09x against 1.01-1.15x with torch's inside, on a small MLP (64x256) 0.66-0.95x
    against 0.88-1.08x (each ortcpu:: call pays ~10-20 us of dispatch through
    torch.library's Python autograd layer, and Inductor fuses what surrounds torch's
    ops). On whole models (``python -m benchmarks.models --compile``, Zen 5, 2 threads)
    BatchNorm measured faster as Inductor's, fused with the ReLU and residual add around
    it (ResNet-style 0.92-0.95x -> 1.03-1.06x, MobileNetV3-style 0.96x -> 1.06-1.08x),
    so "auto" leaves it to Inductor.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"wrap: model must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, STATE_ATTR, None) is not None:
        unwrap(model)
    state = State(fallback, include, exclude, timing, select, compile_kernels)
    if state.select == "fastest" and not state.choices:  # not a replayed selection
        state.check = ModelCheck(state)
    by_cls = {e.torch_cls: e for e in MODULES if e.torch_cls is not None}
    swaps, excluded, included = [], [], []
    for qualname, m in model.named_modules(remove_duplicate=False):
        if INFO_ATTR in m.__dict__ or _under(qualname, excluded):
            continue  # swapped already, or inside an excluded module (reported with it)
        cls = type(m)
        path = class_path(cls)
        names = (cls, cls.__name__, path) + ((qualname,) if qualname else ())
        if matches(state.exclude, *names):
            n_inside = sum(1 for _ in m.modules()) - 1
            state.skipped.append((qualname, path, "excluded: it and everything inside it "
                                  f"({n_inside} submodules, every functional) run on torch"))
            excluded.append(qualname)
            continue
        in_scope = state.include is None or _under(qualname, included) or \
            matches(state.include, *names)
        if state.include is not None and in_scope and not _under(qualname, included):
            included.append(qualname)
        entry = by_cls.get(cls)
        if entry is None:
            if cls.__module__.startswith(_PACKAGE + "."):
                continue  # already one of ours (e.g. ortcpu_torch.nn.GELU used directly)
            base = next((c for c in cls.__mro__[1:] if c in by_cls), None)
            found, why = detect(m) if base is None and qualname else (None, None)
            if found is not None and in_scope:
                swaps.append((qualname, m, found))
            elif why is not None:
                state.skipped.append((qualname, path, why))
            elif base is not None:
                state.skipped.append((qualname, path, f"subclass of {class_path(base)} (its "
                                      "forward may differ): not swapped; the functionals "
                                      "it calls are routed"))
            else:
                state.no_counterpart.setdefault(path, []).append(qualname or "(root)")
            continue
        if not in_scope:
            state.skipped.append((qualname, path, "not included"))
            continue
        if not qualname:
            state.skipped.append(("", path, "the root module itself is not swapped (wrap "
                                  "returns the same object); its functionals are routed"))
            continue
        swaps.append((qualname, m, entry))
    # build every swap before changing the model: with fallback="error" a configuration
    # we cannot run raises with the model untouched
    built: dict[int, tuple] = {}  # a module reused under several names: one swap
    for qualname, m, entry in swaps:
        if id(m) not in built:
            built[id(m)] = (*build_swap(entry, m, qualname, state), qualname)
    for qualname, m, entry in swaps:
        new, why, first = built[id(m)]
        if qualname != first:
            continue  # reported (and counted) under the first name
        if new is None:
            # a supported module type in a configuration our kernels do not take: torch
            # runs it, and that is a fallback like any other (warned / raised per policy)
            state.skipped.append((qualname, class_path(type(m)), why))
            state.fell_back(f"{qualname} ({entry.torch_name})", entry.torch_name, Stats(),
                            why)
            continue
        state.modules[qualname] = {"type": class_path(type(m)), "ours": type(new).__mro__[1],
                                   "stats": Stats()}
    for qualname, m, _entry in swaps:
        new = built[id(m)][0]
        if new is not None:
            set_child(model, qualname, new)
    for qualname in excluded:
        add_scope(state, model.get_submodule(qualname), False)
    if state.include is not None:
        for qualname in included:
            sub = model.get_submodule(qualname)
            if INFO_ATTR not in sub.__dict__:  # a swapped module runs ours anyway
                add_scope(state, sub, True)
    object.__setattr__(model, STATE_ATTR, state)
    if "forward" not in model.__dict__:
        model.__dict__["forward"] = RootForward(model, state)
    else:  # a forward of its own (e.g. patched by another library): hooks around it
        model.register_forward_pre_hook(EnterHook(state))
        model.register_forward_hook(ExitHook(state), always_call=True)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Undo ``wrap``: the original torch modules come back (same Parameter objects, with
    the training flag and configuration the swapped modules had), the hooks go. Returns
    the same object."""
    state = model.__dict__.get(STATE_ATTR)
    restore_originals(model)
    for m in model.modules():
        remove_hooks(m, (ScopeEnter, ScopeExit))
    remove_hooks(model, (EnterHook, ExitHook))
    if isinstance(model.__dict__.get("forward"), RootForward):
        del model.__dict__["forward"]
    if state is not None:
        del model.__dict__[STATE_ATTR]
    return model


def optimize(model: torch.nn.Module, optimizer=None, *, fallback: str = "warn",
             include=None, exclude=None, timing: bool = False, select="fastest",
             compile_kernels="auto"):
    """``wrap(model)`` and replace a ``torch.optim.AdamW/Adam/SGD`` by ortcpu_torch's
    (same param groups, state carried over) when ``ortcpu_torch.optim`` has it. Returns
    ``(model, optimizer)``; what was done is in ``report(model)``. An LR scheduler built on
    the old optimizer must be rebuilt on the returned one. One of those optimizers kept
    on torch because of a setting ours lacks is a fallback under ``fallback`` (with
    ``"error"``, raised before the model is touched). ``select``, ``timing``,
    ``compile_kernels``: as in ``wrap``."""
    if fallback not in POLICIES:
        raise ValueError(f"optimize: fallback must be one of {POLICIES}, got {fallback!r}")
    new, note, fell_back = convert_optimizer(optimizer)
    if fell_back and fallback == "error":
        raise FallbackError(f"ortcpu_torch.optimize: {note} (fallback='error')")
    wrap(model, fallback=fallback, include=include, exclude=exclude, timing=timing,
         select=select, compile_kernels=compile_kernels)
    state = model.__dict__[STATE_ATTR]
    state.optimizer = note
    if fell_back:
        state.fell_back("optimizer", f"torch.optim.{type(optimizer).__name__}", Stats(),
                        note)
    return model, new
