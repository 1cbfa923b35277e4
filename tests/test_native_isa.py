"""ISA dispatch: the native library exists once per x86-64 level and the loader imports
the best one the CPU runs, capped by ``ORTCPU_ISA`` at import time (``make test`` runs
the kernel tests again one level below the machine's best)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

from ortcpu_torch._native import lib, loader

from .conftest import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVELS = loader.LEVELS


def test_the_loaded_build_is_the_one_the_loader_chose():
    assert LEVELS[lib.ortcpu_isa_level()] == loader.ISA  # the build's compile-time level
    assert LEVELS[lib.ortcpu_cpu_isa_level()] == loader.CPU_ISA
    if os.environ.get("ORTCPU_NATIVE_LIB"):
        return
    want = loader.CPU_ISA if loader.CAP is None else \
        LEVELS[min(LEVELS.index(loader.CPU_ISA), LEVELS.index(loader.CAP))]
    assert loader.ISA == want
    assert os.path.basename(loader.PATH).startswith(loader.MODULES[loader.ISA] + ".")


def _run(env_value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ORTCPU_ISA", "ORTCPU_NATIVE_LIB")}
    if env_value is not None:
        env["ORTCPU_ISA"] = env_value
    code = ("from ortcpu_torch._native import lib, loader; "
            "print(loader.ISA, loader.LEVELS[lib.ortcpu_isa_level()])")
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_ortcpu_isa_values():
    assert loader.requested_cap({}) is None
    assert loader.requested_cap({"ORTCPU_ISA": "auto"}) is None
    assert loader.requested_cap({"ORTCPU_ISA": " AVX2 "}) == "avx2"
    with pytest.raises(ValueError, match="ORTCPU_ISA must be one of baseline, avx2, avx512 "
                                         "or auto, got 'sse9'"):
        loader.requested_cap({"ORTCPU_ISA": "sse9"})


def test_ortcpu_isa_caps_the_build_in_a_fresh_process():
    """Every level as a cap (one above the CPU's best stays at the best: a cap, not a
    demand), and a bad value, which fails the import naming the variable. Two processes
    at a time (each imports torch)."""
    cpu = LEVELS.index(loader.CPU_ISA)
    values = [*LEVELS, "sse9"]
    for pair in (values[:2], values[2:]):
        procs = {v: _run(v) for v in pair}
        for value, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            if value == "sse9":
                assert proc.returncode != 0
                assert "ORTCPU_ISA must be one of baseline, avx2, avx512 or auto" in err
                continue
            assert proc.returncode == 0, err
            want = LEVELS[min(cpu, LEVELS.index(value))]
            assert out.split() == [want, want], (value, out)


def test_every_build_this_cpu_runs_gives_the_same_results():
    """The builds the CPU can run, side by side in one process, on a few kernels whose
    hot loops are the ones the wide builds exist for: all within float32 tolerances of
    each other (they differ by FMA contraction and vector width, not in method)."""
    from ortcpu_torch._native import ffi

    levels = LEVELS[: LEVELS.index(loader.CPU_ISA) + 1]
    libs = {lv: importlib.import_module(f"ortcpu_torch._native.{loader.MODULES[lv]}").lib
            for lv in levels}
    x = torch.randn(37, 1001) * 4
    def p(t):
        return ffi.cast("void *", t.data_ptr())
    out = {}
    for lv, lb in libs.items():
        assert LEVELS[lb.ortcpu_isa_level()] == lv
        gelu, soft = torch.empty_like(x), torch.empty_like(x)
        assert lb.ortcpu_gelu_forward_f32(p(x), ffi.NULL, p(gelu), 37, 1001, 0, 2) == 0
        assert lb.ortcpu_softmax_forward_f32(p(x), p(soft), 37, 1001, 1, 0, 2) == 0
        out[lv] = (gelu, soft)
    ref = out["baseline"]
    for lv in levels[1:]:
        assert_close(out[lv][0], ref[0], rtol=5e-7, atol=1e-7, msg=f"gelu {lv}")
        assert_close(out[lv][1], ref[1], rtol=2e-6, atol=1e-9, msg=f"softmax {lv}")

