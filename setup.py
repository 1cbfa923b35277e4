"""cffi_modules cannot be declared in pyproject.toml; everything else lives there."""

from setuptools import setup

setup(cffi_modules=["ortcpu_torch/_native/build.py:ffibuilder"])
