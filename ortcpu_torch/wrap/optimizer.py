"""``optimize()``'s optimizer conversion: a ``torch.optim.AdamW/Adam/SGD`` becomes
ortcpu_torch's (same param groups, state carried over) when its settings allow."""

from __future__ import annotations

import importlib
import inspect

import torch

from .routing import accepted_names

_OPTIM_KEEP_OUT = frozenset({"params", "foreach", "fused", "capturable", "differentiable"})


def convert_optimizer(optimizer):
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
        optim = importlib.import_module("ortcpu_torch.optim")
    except ModuleNotFoundError as e:
        if e.name != "ortcpu_torch.optim":
            raise
        optim = None
    ours = getattr(optim, name, None) if optim is not None else None
    if ours is None:
        return optimizer, f"torch.optim.{name} kept: ortcpu_torch.optim.{name} is not " \
                          "available in this build", False
    accepted = accepted_names(ours.__init__)
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

