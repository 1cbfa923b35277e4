"""Modules outside ``torch.nn`` whose forward is one of our kernels written as a formula:
Hugging Face's ``NewGELUActivation`` / ``FastGELUActivation`` (tanh-GELU), ``SiLU``-style
activations, and the RMSNorm modules of Llama/T5-style models
(``weight * x * rsqrt(mean(x²) + eps)``). A candidate is picked by its shape (class name,
parameters) and swapped only after its forward was checked numerically against our kernel
on inputs that tell the variants apart (a tanh vs an erf GELU, ``(1 + weight)`` scaling,
eps inside vs outside the square root)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .tables import ModuleEntry

_ACT_WORDS = ("gelu", "silu", "swish")
#: (counterpart table name, its constructor arguments, reference on a float64 tensor)
_ACTIVATIONS = (
    ("GELU", {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    ("GELU", {"approximate": "none"}, F.gelu),
    ("SiLU", {}, F.silu),
)


def _probe() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.linspace(-8, 8, 401, dtype=torch.float64),
                      3 * torch.randn(199, generator=g, dtype=torch.float64)]).view(6, 100)


def _activation(m: torch.nn.Module):
    name = type(m).__name__.lower()
    if not any(w in name for w in _ACT_WORDS) or m._parameters or m._buffers or m._modules:
        return None, None
    x = _probe()
    try:
        with torch.no_grad():
            y = m(x)
    except Exception:  # noqa: BLE001 - a forward we cannot probe is simply not swapped
        return None, None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        return None, None
    for table_name, kwargs, ref in _ACTIVATIONS:
        # 1e-7: a formula with a truncated constant (0.7978845608) is still tanh-GELU
        if y.dtype == torch.float64 and float((y - ref(x)).abs().max()) <= 1e-7:
            return ModuleEntry(table_name, args=lambda cls, m, kw=kwargs: dict(kw)), None
    return None, "not swapped: its forward matches none of tanh-GELU, GELU, SiLU " \
                  "(checked numerically)"


def _rms_eps(m):
    for k in ("variance_epsilon", "eps", "epsilon"):
        v = m.__dict__.get(k)
        if isinstance(v, float) and not isinstance(v, bool):
            return v
    return None


def _rms_norm(m: torch.nn.Module):
    name = type(m).__name__
    if not (name.endswith("RMSNorm") or name == "T5LayerNorm") or m._modules:
        return None, None
    w = m._parameters.get("weight")
    eps = _rms_eps(m)
    if set(m._parameters) != {"weight"} or w is None or w.dim() != 1 or eps is None \
            or m._buffers or w.device.type != "cpu":
        return None, "not swapped: not a weight-only RMSNorm with a float eps"
    h = w.shape[0]
    g = torch.Generator().manual_seed(0)
    # rows of very different scales: eps placement and (1 + weight) variants differ
    x = torch.randn(4, 3, h, generator=g) * torch.tensor([1.0, 1e-3, 30.0]).view(1, 3, 1)
    probe = copy.deepcopy(m).float()
    with torch.no_grad():
        probe.weight.copy_(torch.randn(h, generator=g) + 0.5)
        try:
            y = probe(x)
        except Exception:  # noqa: BLE001 - cannot probe: not swapped
            return None, "not swapped: its forward could not be checked"
        ref = F.rms_norm(x.double(), (h,), probe.weight.double(), eps)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or \
            float((y.double() - ref).abs().max()) > 1e-4 * float(ref.abs().max()):
        return None, "not swapped: its forward is not weight * x * rsqrt(mean(x²) + eps) " \
                     "(checked numerically)"
    args = {"normalized_shape": (h,), "eps": eps, "elementwise_affine": True}
    return ModuleEntry("RMSNorm", args=lambda cls, m, kw=args: dict(kw)), None


def detect(m: torch.nn.Module):
    """``(entry, None)``: swap ``m`` by ``entry``'s counterpart; ``(None, reason)``: a
    candidate whose forward is not ours; ``(None, None)``: not a candidate."""
    for fn in (_activation, _rms_norm):
        entry, why = fn(m)
        if entry is not None or why is not None:
            return entry, why
    return None, None
