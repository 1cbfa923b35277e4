"""Attribute handling shared by the conv and pool kernels: ONNX ``kernel_shape``,
``strides``, ``pads`` (all begins, then all ends), ``dilations``, ``auto_pad``,
``ceil_mode``, turned into per-axis geometry. 1-D and 2-D are padded to 3-D with
leading spatial sizes of 1 for the native code."""

from __future__ import annotations

import math

from ._checks import fmt_shape

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def int_list(op: str, name: str, value, n: int, default: int, minimum: int) -> list[int]:
    """``value`` as a list of ``n`` ints >= ``minimum`` (None -> ``default``s)."""
    if value is None:
        return [default] * n
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value] * n
    try:
        vals = list(value)
    except TypeError:
        raise TypeError(
            f"{op}: {name} must be a list of ints, got {type(value).__name__}"
        ) from None
    if len(vals) != n or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        raise ValueError(f"{op}: {name} must be {n} ints, got {value!r}")
    if any(v < minimum for v in vals):
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {vals}")
    return vals


def auto_pad_attr(op: str, auto_pad) -> str:
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if not isinstance(auto_pad, str) or auto_pad not in AUTO_PADS:
        raise ValueError(f"{op}: auto_pad must be one of {AUTO_PADS}, got {auto_pad!r}")
    return auto_pad


def resolve_pads(op: str, auto_pad: str, pads, in_sizes, kernel, strides, dilations,
                 ceil_mode: int = 0):
    """(pads_begin, pads_end, out_sizes). Explicit pads with NOTSET; SAME_* pad so that
    out = ceil(in / stride) with the odd pixel at the end (UPPER) or begin (LOWER);
    VALID pads nothing. ``ceil_mode`` rounds up, dropping a last window that would start
    in the end padding (torch's rule)."""
    n = len(in_sizes)
    if auto_pad in ("NOTSET", "VALID"):
        if auto_pad == "VALID":
            p = [0] * (2 * n)
        else:
            p = int_list(op, "pads", pads, 2 * n, 0, 0)
        pb, pe = p[:n], p[n:]
        out = []
        for i in range(n):
            ek = (kernel[i] - 1) * dilations[i] + 1
            span = in_sizes[i] + pb[i] + pe[i] - ek
            if span < 0:
                raise ValueError(
                    f"{op}: kernel (extent {ek} on spatial axis {i}) is larger than the padded "
                    f"input ({in_sizes[i]} + pads {pb[i]}+{pe[i]})"
                )
            if ceil_mode:
                o = -(-span // strides[i]) + 1
                if (o - 1) * strides[i] >= in_sizes[i] + pb[i]:
                    o -= 1
            else:
                o = span // strides[i] + 1
            out.append(o)
        return pb, pe, out
    pb, pe, out = [], [], []
    for i in range(n):
        o = math.ceil(in_sizes[i] / strides[i])
        ek = (kernel[i] - 1) * dilations[i] + 1
        total = max(0, (o - 1) * strides[i] + ek - in_sizes[i])
        small = total // 2
        b = small if auto_pad == "SAME_UPPER" else total - small
        pb.append(b)
        pe.append(total - b)
        out.append(o)
    return pb, pe, out


def pad3(vals, fill):
    """Left-pad a per-axis list to 3 entries (native code is 3-D)."""
    return [fill] * (3 - len(vals)) + list(vals)


def spatial_rank(op: str, name: str, t, ranks=(1, 2, 3)) -> int:
    r = t.dim() - 2
    if r not in ranks:
        raise ValueError(
            f"{op}: {name} must be [N, C, spatial...] with {'/'.join(map(str, ranks))} "
            f"spatial dims, got shape {fmt_shape(t)}"
        )
    return r
