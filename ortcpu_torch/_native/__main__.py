"""``python -m ortcpu_torch._native``: which native build this process loads;
``--below-best``: the ISA level one below the CPU's best (empty if none; make test)."""

import sys

from . import loader

if sys.argv[1:] == ["--below-best"]:
    print(loader.below_best() or "")
else:
    print(f"kernels: {loader.ISA} build ({loader.PATH}); CPU: {loader.CPU_ISA}; "
          f"ORTCPU_ISA cap: {loader.CAP or 'none'}")
