"""Under ``make test-sanitize`` (ASan + UBSan library via ORTCPU_NATIVE_LIB, libasan
preloaded): proof that the sanitizers are live, so a clean run means something. A kernel
is made to write past its output, in a plain allocation and inside an arena block's
class padding (poisoned by the arena under ASan); each child process must die with
AddressSanitizer's report. Skipped outside the sanitizer run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    "libasan" not in os.environ.get("LD_PRELOAD", "") or not os.environ.get("ORTCPU_NATIVE_LIB"),
    reason="only under make test-sanitize")

_OVERRUN = """
import torch
from ortcpu_torch import _native as N
n_out = {n_out}
x = torch.randn(n_out + 100)
y = N.empty((n_out,), torch.float32)
N.lib.ortcpu_gelu_forward_f32(N.ptr(x), N.ffi.NULL, N.ptr(y), 1, n_out + 100, 0, 1)
print("no report")
"""


@pytest.mark.parametrize("n_out,report", [
    (100, "heap-buffer-overflow"),          # below the arena's size: a torch allocation
    (100_000, "use-after-poison"),          # an arena block: its class padding is poisoned
])
def test_an_overrun_is_reported(n_out, report):
    env = dict(os.environ)  # the report on stderr here, not in make's log files
    env["ASAN_OPTIONS"] = ":".join(o for o in env.get("ASAN_OPTIONS", "").split(":")
                                   if not o.startswith("log_path="))
    proc = subprocess.run([sys.executable, "-c", _OVERRUN.format(n_out=n_out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0 and "no report" not in proc.stdout
    assert f"AddressSanitizer: {report}" in proc.stderr, proc.stderr[-2000:]
    assert "gelu_fwd_run_f32" in proc.stderr
