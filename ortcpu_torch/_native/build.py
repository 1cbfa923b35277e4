"""cffi builders for the native kernels (API mode), one per x86-64 ISA level.

Compiles native/src/*.c against native/include/ortcpu.h and the headers of the
scipy-openblas32 wheel. The OpenBLAS library path is *not* baked in: at run time
``ortcpu_torch._native`` loads ``libscipy_openblas.so`` from the installed
``scipy_openblas32`` package (RTLD_GLOBAL) before importing this extension.

The library is built once per level (``VARIANTS``: baseline, x86-64-v3 = AVX2+FMA,
x86-64-v4 = AVX-512; only baseline elsewhere; the level applies to the hot loops marked
``ORT_SIMD_CLONES``) and ``loader.py`` imports the best one the CPU runs, capped by
``ORTCPU_ISA`` (see native/src/common.h, "ISA dispatch").

``python ortcpu_torch/_native/build.py --sanitize DIR`` builds the baseline library with
AddressSanitizer + UndefinedBehaviorSanitizer into DIR and prints the path of the
extension (``make test-sanitize`` loads it with ``ORTCPU_NATIVE_LIB``).
"""

import argparse
import glob
import os
import platform

import scipy_openblas32
from cffi import FFI

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = os.path.join(ROOT, "native", "include")
SOURCES = sorted(glob.glob(os.path.join(ROOT, "native", "src", "*.c")))
# headers and templates: setuptools only rebuilds on a change it is told about
DEPENDS = sorted(
    glob.glob(os.path.join(ROOT, "native", "src", "*.h"))
    + glob.glob(os.path.join(ROOT, "native", "src", "*.inc"))
    + glob.glob(os.path.join(INCLUDE, "*.h"))
)
COMPILE_ARGS = [
    "-std=gnu99",
    "-O3",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-Wall",
    "-Wno-unknown-pragmas",
]
# -O1 (after -O3: the last wins) as ASan recommends; every report aborts (no recovery)
SANITIZE_ARGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                 "-fno-sanitize-recover=undefined"]

X86_64 = platform.machine().lower() in ("x86_64", "amd64")
#: ISA level name -> (extension module, extra compiler flags); loader.py imports these names
VARIANTS = {"baseline": ("_ortcpu", [])}
if X86_64:
    VARIANTS["avx2"] = ("_ortcpu_avx2", ["-DORT_ISA_LEVEL=1"])     # x86-64-v3 hot loops
    VARIANTS["avx512"] = ("_ortcpu_avx512", ["-DORT_ISA_LEVEL=2"])  # x86-64-v4 hot loops


def _cdef_text() -> str:
    """The public header minus preprocessor lines (cffi parses declarations only)."""
    with open(os.path.join(INCLUDE, "ortcpu.h")) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


def make_builder(module: str, extra_args=(), extra_link_args=(), relative=True) -> FFI:
    """The FFI builder of extension ``ortcpu_torch._native.<module>``."""
    ffi = FFI()
    ffi.cdef(_cdef_text())
    ffi.set_source(
        f"ortcpu_torch._native.{module}",
        '#include "ortcpu.h"',
        sources=[os.path.relpath(s, ROOT) if relative else s for s in SOURCES],
        depends=[os.path.relpath(d, ROOT) if relative else d for d in DEPENDS],
        include_dirs=[INCLUDE, scipy_openblas32.get_include_dir()],
        library_dirs=[scipy_openblas32.get_lib_dir()],
        libraries=[scipy_openblas32.get_library(), "m"],
        extra_compile_args=COMPILE_ARGS + list(extra_args),
        extra_link_args=["-fopenmp", *extra_link_args],
    )
    return ffi


ffibuilder = make_builder(*VARIANTS["baseline"])
if X86_64:
    ffibuilder_avx2 = make_builder(*VARIANTS["avx2"])
    ffibuilder_avx512 = make_builder(*VARIANTS["avx512"])
#: what setup.py hands to cffi_modules
CFFI_MODULES = ["ffibuilder"] + (["ffibuilder_avx2", "ffibuilder_avx512"] if X86_64 else [])


def build_sanitized(out_dir: str) -> str:
    """Compile the ASan+UBSan extension into ``out_dir``; returns the .so's path."""
    ffi = make_builder("_ortcpu_sanitize", SANITIZE_ARGS, ["-fsanitize=address,undefined"],
                       relative=False)
    os.makedirs(out_dir, exist_ok=True)
    return os.path.abspath(ffi.compile(tmpdir=out_dir, verbose=False))


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python ortcpu_torch/_native/build.py")
    p.add_argument("--sanitize", metavar="DIR", help="build the ASan+UBSan library into DIR")
    a = p.parse_args()
    if a.sanitize:
        print(build_sanitized(a.sanitize))
    else:
        ffibuilder.compile(verbose=True)
