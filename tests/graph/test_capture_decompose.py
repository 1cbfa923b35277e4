"""capture.decompose (the decomposition tables built without enumerating every ATen op) is
torch's ``run_decompositions(decomposition_table())``: same tables where they matter, same
decomposed programs for the test models. Guards the equivalence across torch upgrades."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from .capture_models import NAMES, make

cap = importlib.import_module("ortcpu_torch.graph.capture")


def _default_split():
    from torch.export.exported_program import _split_decomp_table_to_cia_and_python_decomp

    return _split_decomp_table_to_cia_and_python_decomp(dict(cap.decomposition_table()))


def test_tables_match_torchs_split():
    from torch._export.utils import _special_op_to_preserve_cia

    tables = cap._split_tables()
    assert tables is not None, "this torch lacks the private names decompose() uses"
    cia, python = tables
    d_cia, d_python = _default_split()
    assert python.keys() == d_python.keys()
    assert all(python[op] is d_python[op] for op in python)
    preserve = {op for op, fn in cia.items() if fn is _special_op_to_preserve_cia}
    d_preserve = {op for op, fn in d_cia.items() if fn is _special_op_to_preserve_cia}
    assert preserve == d_preserve
    assert set(cia) <= set(d_cia)
    assert all(cia[op] is d_cia[op] for op in cia if op not in preserve)
    # every entry left out is the op's own composite kernel (what dispatch runs anyway)
    dk = torch._C.DispatchKey.CompositeImplicitAutograd
    for op, fn in d_cia.items():
        if op in cia:
            continue
        generic = (isinstance(fn, functools.partial)
                   and fn.func.__name__ == "_special_op_to_decompose_cia"
                   and fn.keywords.get("kernel") is op)
        assert generic or op.py_kernels.get(dk) is fn, op


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("train", [True, False])
def test_same_program_as_run_decompositions(name, train):
    model, args = make(name)
    model.train(train)
    cap._import_export_machinery()
    ep = torch.export.export(model, args, strict=False)
    ours = cap.decompose(ep)
    theirs = ep.run_decompositions(cap.decomposition_table())
    assert ours.graph_module.code == theirs.graph_module.code
    assert str(ours.graph_signature) == str(theirs.graph_signature)
