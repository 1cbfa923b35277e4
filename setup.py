"""cffi_modules cannot be declared in pyproject.toml; everything else lives there.
One extension per ISA level (ortcpu_torch/_native/build.py, VARIANTS)."""

import runpy

from setuptools import setup

_BUILD = "ortcpu_torch/_native/build.py"
setup(cffi_modules=[f"{_BUILD}:{name}" for name in runpy.run_path(_BUILD)["CFFI_MODULES"]])
