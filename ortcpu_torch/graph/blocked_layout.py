"""The channel-blocked layout (NCHW16c) of inference graphs, the last rewrite of
``fusions.apply_fusions``.

Float32 Convs with constant weights, one group and input channels in whole blocks of 16
(outputs padded with zero channels to a block, or to 64: ``padded_channels``) run on the
blocked kernels (native ``conv_nchw16c`` / ``conv1x1_nchw16c``: every tile reads 16
consecutive channels of a position, one cache line), and the values between them stay
blocked, [N, C/16, H, W, 16]: pools (``Pool16c``), Relu, Add and channel Concat run on
them as they are (elementwise ops and a Concat of whole blocks along dim 1 do not care),
and Convs written into their Concat's buffer (``fusions._concat_in_place``) write its
blocked slices. Reorders (``ToNCHW16c`` / ``FromNCHW16c``) sit at the region's edges: a
stem of 3 channels, a classifier of 1000, any op that reads NCHW. A Conv that would be
blocked alone, with a reorder on both sides, stays NCHW. A blocked value is named
``<name>::nchw16c``; its NCHW name exists only where something reads it.

Where it applies: AVX-512 builds (the blocked kernels are x86-64-v4 only) and layout
"auto" (``set_layout``; ``ORTCPU_GRAPH_LAYOUT=nchw`` turns it off at import).
"""

from __future__ import annotations

import os

import onnx
import torch
from onnx import helper

from .._native import lib
from ..kernels.conv import conv_geometry
from ..kernels.pool import pool_geometry
from .conv_infer import infer_geometry
from .fusions import INTERNAL_DOMAIN, epilogue_steps
from .op_table import parse_attrs

BLOCK = 16
SUFFIX = "::nchw16c"
LAYOUTS = ("auto", "nchw")
_LAYOUT = [os.environ.get("ORTCPU_GRAPH_LAYOUT", "auto").strip().lower() or "auto"]
if _LAYOUT[0] not in LAYOUTS:
    raise ValueError(f"ORTCPU_GRAPH_LAYOUT must be one of {LAYOUTS}, got {_LAYOUT[0]!r}")

_ONNX = ("", "ai.onnx")
_POOLS = ("MaxPool", "AveragePool", "GlobalAveragePool")
#: ops that run on blocked values unchanged when every data input is blocked (Dropout:
#: inference only, where it returns its input)
_LAYOUT_FREE = ("Relu", "Add", "Concat", "Dropout")
_EPILOGUES = ([], ["relu"], ["add"], ["add", "relu"])


def set_layout(layout: str) -> None:
    """``"auto"``: plans built from now on keep channel-blocked regions where the blocked
    kernels apply (the default); ``"nchw"``: every Conv runs on NCHW (A/B comparisons)."""
    if layout not in LAYOUTS:
        raise ValueError(f"set_layout: layout must be one of {LAYOUTS}, got {layout!r}")
    _LAYOUT[0] = layout


def get_layout() -> str:
    return _LAYOUT[0]


def padded_channels(c: int) -> int:
    """The blocked channel count of ``c`` channels: ``c`` in whole blocks, else rounded up
    to 16, or to 64 (the 6 x 64 tile's groups) where that adds at most 1/16 (squeezenet's
    1000-class Conv: 1024). The channels beyond ``c`` hold zeros."""
    if c % BLOCK == 0:
        return c
    c64 = -(-c // 64) * 64
    return c64 if c > 64 and c64 - c <= c // 16 else -(-c // BLOCK) * BLOCK


def blocked_shape(shape) -> tuple:
    """[N, C, H, W] -> [N, padded_channels(C)/16, H, W, 16]."""
    n, c, h, w = shape
    return (n, padded_channels(c) // BLOCK, h, w, BLOCK)


def _static4(shape) -> bool:
    return shape is not None and len(shape) == 4 and \
        all(isinstance(d, int) and d >= 1 for d in shape)


def _whole_blocks(shape) -> bool:
    return _static4(shape) and shape[1] % BLOCK == 0


def _meta(shape):
    return torch.empty(tuple(shape), device="meta")


def _own_attrs(node) -> dict:
    return {k: v for k, v in parse_attrs(node).items() if not k.startswith("ortcpu_")}


def conv_inputs(node) -> tuple[list, str | None, str | None]:
    """A (fused) Conv's inputs: ([x, w, b?], residual or None, Concat buffer or None)."""
    ins = list(node.input)
    offset = any(a.name == "ortcpu_out_offset" for a in node.attribute)
    res = ins.pop() if "add" in epilogue_steps(node) else None
    buf = ins.pop() if offset else None
    return ins, res, buf


def _conv_ok(node, consts, shapes, types) -> bool:
    """A float32 Conv of one group with constant weights (and bias) and a geometry the
    blocked kernels take: input channels in whole blocks (or an NCHW stem,
    ``_nchw_input_ok``), at least 16 output channels (padded to ``padded_channels``
    where they are not whole blocks, then without residual or Concat buffer)."""
    if node.op_type != "Conv" or node.domain not in _ONNX:
        return False
    (x, *wb), res, buf = conv_inputs(node)
    if not wb or epilogue_steps(node) not in _EPILOGUES or res in consts:
        return False
    w = consts.get(wb[0])
    b = consts.get(wb[1]) if len(wb) > 1 and wb[1] else None
    if not isinstance(w, torch.Tensor) or w.dtype != torch.float32 or w.dim() != 4 or \
            (len(wb) > 1 and wb[1] and (not isinstance(b, torch.Tensor) or
                                        b.dtype != torch.float32)):
        return False
    xs, ys = shapes.get(x), shapes.get(node.output[0])
    if types.get(x) not in (None, onnx.TensorProto.FLOAT) or x in consts or \
            not _static4(xs) or not _static4(ys) or ys[1] < BLOCK or \
            (ys[1] % BLOCK and (res or buf)):  # padded outputs: no residual, no Concat
        return False
    if not _whole_blocks(xs) and not _nchw_input_ok(xs, ys, w, res or buf):
        return False
    try:
        geom, out = conv_geometry("Conv", _meta(xs), _meta(w.shape), **_own_attrs(node))
    except (TypeError, ValueError):
        return False
    g16 = infer_geometry(geom)
    return g16 is not None and g16[5] == 1 and tuple(out) == tuple(ys)


#: the 6 x 64 tile's longest reduction (native CQ_MAX_K)
CQ_MAX_K = 2304


def _nchw_input_ok(xs, ys, w, extra) -> bool:
    """A Conv reading NCHW X (channels not in whole blocks: a 3-channel stem) writes a
    blocked Y with native ``conv_nchw_to16c``: groups of 64 output channels, a reduction
    of at most CQ_MAX_K, no residual or Concat buffer."""
    return not extra and ys[1] % 64 == 0 and w[0].numel() <= CQ_MAX_K


def conv_reads_nchw(x_shape) -> bool:
    """Whether a blocked Conv's X stays NCHW (its channels are not whole blocks)."""
    return x_shape[1] % BLOCK != 0


def pool_kwargs(op: str, attrs: dict, spatial) -> tuple[dict, int, int] | None:
    """``pool_geometry`` keywords, max?, include_pad for a pool the blocked kernel runs
    (dilation 1), else None."""
    attrs = dict(attrs)
    if op == "GlobalAveragePool":
        return {"kernel_shape": list(spatial)}, 0, 0
    if any(d != 1 for d in attrs.pop("dilations", None) or []):
        return None
    if op == "MaxPool":
        attrs.pop("storage_order", None)
        return attrs, 1, 0
    cip = attrs.pop("count_include_pad", 0)
    if cip not in (0, 1):
        return None
    return attrs, 0, 2 * cip


def _pool_ok(node, shapes, used) -> bool:
    if node.op_type not in _POOLS or node.domain not in _ONNX:
        return False
    if any(used.get(o) for o in node.output[1:] if o):  # MaxPool's Indices
        return False
    xs, ys = shapes.get(node.input[0]), shapes.get(node.output[0])
    if not _static4(xs) or not _static4(ys):
        return False
    kw = pool_kwargs(node.op_type, _own_attrs(node), xs[2:])
    if kw is None:
        return False
    try:
        _, out = pool_geometry(node.op_type, xs, 2, **kw[0])
    except (TypeError, ValueError):
        return False
    return tuple(out) == tuple(ys[2:])


def _free_ok(node, shapes, used) -> bool:
    if node.op_type not in _LAYOUT_FREE or node.domain not in _ONNX:
        return False
    ys = shapes.get(node.output[0])
    if not _static4(ys) or any(used.get(o) for o in node.output[1:] if o):
        return False
    if node.op_type == "Dropout":  # no training_mode input, no mask read: the identity
        return (len(node.input) < 3 or not node.input[2]) and shapes.get(node.input[0]) == ys
    ins = [shapes.get(i) for i in node.input]
    if node.op_type == "Concat":
        axis = parse_attrs(node).get("axis")
        return axis in (1, -3) and all(_whole_blocks(s) and s[2:] == ys[2:] and
                                       s[0] == ys[0] for s in ins)
    return all(s == ys for s in ins) and len(ins) == (1 if node.op_type == "Relu" else 2)


class _Groups:
    """Convs written into a Concat's buffer, by buffer: all blocked or none."""

    def __init__(self, nodes):
        self.buffer = {}  # buffer name -> ConcatBuffer node
        self.convs: dict[str, list] = {}
        self.concat = {}  # buffer name -> ConcatInPlace node
        for n in nodes:
            if n.op_type == "ConcatBuffer":
                self.buffer[n.output[0]] = n
            elif n.op_type == "ConcatInPlace":
                self.concat[n.input[0]] = n
            elif n.op_type == "Conv":
                buf = conv_inputs(n)[2]
                if buf:
                    self.convs.setdefault(buf, []).append(n)


def apply_blocked_layout(nodes, consts, outputs, shapes, types, opsets, done):
    """Rewrite ``nodes`` (after the other fusions) into blocked regions; ``shapes`` and
    ``types`` gain the blocked values. Returns the new node list."""
    if _LAYOUT[0] != "auto" or not lib.ortcpu_conv_p16_available():
        return nodes
    used: dict[str, int] = {}
    for n in nodes:
        for i in n.input:
            used[i] = used.get(i, 0) + 1
    for o in outputs:
        used[o] = used.get(o, 0) + 1
    groups = _Groups(nodes)
    role = {}  # id(node) -> "conv" / "pool" / "free" / "buffer": what may run blocked
    for n in nodes:
        if _conv_ok(n, consts, shapes, types):
            role[id(n)] = "conv"
        elif _pool_ok(n, shapes, used):
            role[id(n)] = "pool"
        elif _free_ok(n, shapes, used):
            role[id(n)] = "free"
    for buf, node in groups.buffer.items():
        convs, cat = groups.convs.get(buf, []), groups.concat.get(buf)
        shape = tuple(parse_attrs(node).get("shape") or ())
        if cat is not None and _whole_blocks(shape) and all(role.get(id(c)) == "conv"
                                                            for c in convs):
            role[id(node)] = role[id(cat)] = "buffer"
        else:
            for c in convs:
                role.pop(id(c), None)
    blocked = _assign(nodes, role, shapes)
    if not blocked:
        return nodes
    return _rewrite(nodes, blocked, role, consts, outputs, shapes, types, opsets, done)


def _data_inputs(node, role, shapes) -> list:
    """The inputs that carry the layout (a Conv's X, unless it stays NCHW, and residual or
    buffer; a pool's X; every input of the others)."""
    r = role.get(id(node))
    if r == "conv":
        (x, *_), res, buf = conv_inputs(node)
        return [i for i in (x, res, buf)
                if i and not (i == x and conv_reads_nchw(shapes[x]))]
    if r == "pool" or node.op_type == "Dropout":
        return [node.input[0]]
    return [i for i in node.input if i]


def _assign(nodes, role, shapes) -> set:
    """ids of the nodes that run blocked: every candidate Conv and Concat group, and the
    pools and layout-free ops whose data inputs are all blocked; then Convs left alone
    between reorders (input NCHW, no blocked reader) go back to NCHW, until none is."""
    nchw_forced: set = set()
    readers: dict[str, list] = {}
    for n in nodes:
        for i in _data_inputs(n, role, shapes):
            readers.setdefault(i, []).append(n)
    while True:
        out_blocked: set[str] = set()
        blocked = set()
        for n in nodes:
            r = role.get(id(n))
            if r is None or id(n) in nchw_forced:
                continue
            if r in ("conv", "buffer") or all(i in out_blocked
                                                for i in _data_inputs(n, role, shapes)):
                blocked.add(id(n))
                out_blocked.update(o for o in n.output[:1] if o)
        lone = set()
        for n in nodes:
            if id(n) not in blocked or role.get(id(n)) != "conv" or conv_inputs(n)[2]:
                continue
            x = n.input[0]
            if x not in out_blocked and not any(id(m) in blocked
                                                for m in readers.get(n.output[0], [])):
                lone.add(id(n))
        if not lone:
            return blocked
        nchw_forced |= lone


def _rewrite(nodes, blocked, role, consts, outputs, shapes, types, opsets, done):
    out_set = set(outputs)
    produced_blocked = {n.output[0] for n in nodes if id(n) in blocked}
    nchw_readers = set(outputs)
    for n in nodes:
        if id(n) in blocked:
            data = set(_data_inputs(n, role, shapes))
            nchw_readers.update(i for i in n.input if i and i not in data)
        else:
            nchw_readers.update(i for i in n.input if i)
    converted: set[str] = set()
    out = []
    counts = {"conv": 0, "pool": 0, "reorder": 0}

    def bname(v):
        return v + SUFFIX

    def declare(v):
        shapes[bname(v)] = blocked_shape(shapes[v])
        types[bname(v)] = onnx.TensorProto.FLOAT

    for n in nodes:
        if id(n) not in blocked:
            out.append(n)
            continue
        data = set(_data_inputs(n, role, shapes))
        for i in dict.fromkeys(i for i in n.input if i in data):
            if i not in produced_blocked and i not in converted:
                declare(i)
                out.append(helper.make_node("ToNCHW16c", [i], [bname(i)],
                                            domain=INTERNAL_DOMAIN, name=bname(i)))
                converted.add(i)
                counts["reorder"] += 1
        new = onnx.NodeProto()
        new.CopyFrom(n)
        for k, i in enumerate(new.input):
            if i in data:
                new.input[k] = bname(i)
        y = n.output[0]
        if n.op_type == "ConcatBuffer":
            shapes.setdefault(y, tuple(parse_attrs(n)["shape"]))
        new.output[0] = bname(y)
        declare(y)
        r = role[id(n)]
        if r == "conv":
            new.op_type, new.domain = "Conv16c", INTERNAL_DOMAIN
            counts["conv"] += 1
        elif r == "pool":
            new.op_type, new.domain = "Pool16c", INTERNAL_DOMAIN
            del new.output[1:]
            new.attribute.append(helper.make_attribute("op", n.op_type))
            counts["pool"] += 1
        elif n.op_type == "ConcatBuffer":
            for a in new.attribute:
                if a.name == "shape":
                    del a.ints[:]
                    a.ints.extend(blocked_shape(shapes[y]))
        elif n.op_type == "Concat":
            for a in new.attribute:
                if a.name == "axis":
                    a.i = 1
        out.append(new)
        if y in nchw_readers or y in out_set:
            out.append(helper.make_node("FromNCHW16c", [bname(y)], [y],
                                        domain=INTERNAL_DOMAIN, name=y + "::nchw"))
            counts["reorder"] += 1
    opsets.setdefault(INTERNAL_DOMAIN, 1)
    done.append(f"channel-blocked (NCHW16c) region: {counts['conv']} Conv, "
                f"{counts['pool']} pools, {counts['reorder']} reorders")
    return out
