"""Picks and imports the native library build: one per x86-64 ISA level (build.py).

The best build this CPU runs is imported, capped by the environment at import time:

- ``ORTCPU_ISA=avx512|avx2|baseline``: use at most that level (a cap, never more than the
  CPU has), so any machine can exercise the narrower code paths; unset or ``auto``: best.
- ``ORTCPU_NATIVE_LIB=/path/to/_ortcpu_<name>.so``: import that extension file instead
  (the sanitizer build of ``make test-sanitize``).

OpenBLAS is not ours and does its own dispatch (``ORTCPU_OPENBLAS_CORETYPE``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

#: ISA level names, lowest first; the index is ``ortcpu_isa_level()``'s value
LEVELS = ("baseline", "avx2", "avx512")
#: the extension module of each level (build.py's VARIANTS)
MODULES = {"baseline": "_ortcpu", "avx2": "_ortcpu_avx2", "avx512": "_ortcpu_avx512"}


def requested_cap(env=None) -> str | None:
    """The level ``ORTCPU_ISA`` asks for (None: no cap); ValueError on anything else."""
    value = (env if env is not None else os.environ).get("ORTCPU_ISA", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in LEVELS:
        raise ValueError(f"ORTCPU_ISA must be one of {', '.join(LEVELS)} or auto, "
                         f"got {value!r}")
    return value


def _import_file(path: str):
    name = os.path.basename(path).split(".")[0]
    spec = importlib.util.spec_from_file_location(f"{__package__}.{name}", path)
    if spec is None:
        raise ImportError(f"ORTCPU_NATIVE_LIB={path!r} is not an extension module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _load():
    cap = requested_cap()
    override = os.environ.get("ORTCPU_NATIVE_LIB")
    if override:
        mod = _import_file(override)
        level = LEVELS[mod.lib.ortcpu_isa_level()]
        return mod, level, LEVELS[mod.lib.ortcpu_cpu_isa_level()], cap
    base = importlib.import_module(f".{MODULES['baseline']}", __package__)
    cpu = LEVELS[base.lib.ortcpu_cpu_isa_level()]
    level = cpu if cap is None else LEVELS[min(LEVELS.index(cpu), LEVELS.index(cap))]
    if level == "baseline":
        return base, level, cpu, cap
    try:
        return importlib.import_module(f".{MODULES[level]}", __package__), level, cpu, cap
    except ImportError as e:  # a build without that variant (e.g. not x86-64)
        raise ImportError(f"ortcpu_torch: the {level} build of the native library is "
                          f"missing ({e}); rebuild (make build) or set ORTCPU_ISA=baseline"
                          ) from e


_module, ISA, CPU_ISA, CAP = _load()
ffi, lib = _module.ffi, _module.lib
#: the extension file in use
PATH = _module.__file__


def below_best() -> str | None:
    """The level one below the CPU's best (None on a baseline-only CPU): what ``make
    test`` caps the second kernel-test run at."""
    i = LEVELS.index(CPU_ISA)
    return LEVELS[i - 1] if i > 0 else None

