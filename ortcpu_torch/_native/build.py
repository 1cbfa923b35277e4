"""cffi builder for the native kernels (API mode).

Compiles native/src/*.c against native/include/ortcpu.h and the headers of the
scipy-openblas32 wheel. The OpenBLAS library path is *not* baked in: at run time
``ortcpu_torch._native`` loads ``libscipy_openblas.so`` from the installed
``scipy_openblas32`` package (RTLD_GLOBAL) before importing this extension.
"""

import glob
import os

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


def _cdef_text() -> str:
    """The public header minus preprocessor lines (cffi parses declarations only)."""
    with open(os.path.join(INCLUDE, "ortcpu.h")) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "ortcpu_torch._native._ortcpu",
    '#include "ortcpu.h"',
    sources=[os.path.relpath(s, ROOT) for s in SOURCES],
    depends=[os.path.relpath(d, ROOT) for d in DEPENDS],
    include_dirs=[INCLUDE, scipy_openblas32.get_include_dir()],
    library_dirs=[scipy_openblas32.get_lib_dir()],
    libraries=[scipy_openblas32.get_library(), "m"],
    extra_compile_args=[
        "-std=gnu99",
        "-O3",
        "-fopenmp",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-Wall",
        "-Wno-unknown-pragmas",
    ],
    extra_link_args=["-fopenmp"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
