"""Helpers for the MPI tests: launch ``mpiexec -n N python -m mpi4py <worker>``.

Every launch has a bounded timeout; the tests skip cleanly when mpiexec or mpi4py
is missing (install the extra: ``pip install ortcpu-torch[mpi]``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"


def find_mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    return shutil.which("mpiexec")


def mpi_available() -> bool:
    return find_mpiexec() is not None and importlib.util.find_spec("mpi4py") is not None


needs_mpi = pytest.mark.skipif(
    not mpi_available(), reason="mpiexec/mpi4py not installed (pip install ortcpu-torch[mpi])")


def run_mpi(script: str | Path, *args: str, n: int = 2, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run ``script`` on ``n`` ranks; fail (not hang) if it exceeds ``timeout`` seconds."""
    script = Path(script)
    if not script.is_absolute():
        script = WORKERS / script
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", str(script), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=str(ROOT))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s\nstdout:\n{e.stdout}\n"
                    f"stderr:\n{e.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited with {proc.returncode}\nstdout:\n{proc.stdout}\n"
                    f"stderr:\n{proc.stderr}")
    return proc


def run_single(script: str | Path, *args: str, timeout: float = 120) -> str:
    """Run ``script`` as one ordinary process (world size 1); returns stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
