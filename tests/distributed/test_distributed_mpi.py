"""Multi-process tests: each launches ``mpiexec -n 2 python -m mpi4py <worker>`` with a
bounded timeout. The workers hold the checks (see tests/distributed/workers/)."""

from __future__ import annotations

import time

from .conftest import needs_mpi, run_mpi

pytestmark = needs_mpi


def test_point_to_point_kernels_and_collectives(tmp_path):
    """Every dtype and several shapes both ways, non-contiguous layouts, out=, mismatched
    dtype/shape errors (channel stays in sync), isend/irecv out of order, Send/Recv
    kernels with variadic heterogeneous tensors, broadcast_/allreduce_ of every
    reducible dtype (bfloat16 in float32), autograd-aware send/recv; the TensorBoard
    writer writes on rank 0 only."""
    proc = run_mpi("p2p_worker.py", str(tmp_path / "tb"), timeout=120)
    for r in (0, 1):
        assert f"rank {r}: dtypes:" in proc.stdout
        assert "autograd send/recv ok" in proc.stdout
    assert proc.stdout.count("summary writer on rank 0 only ok") == 2


def test_data_parallel_grads_equal_concatenated_batch():
    proc = run_mpi("dp_worker.py", timeout=120)
    assert proc.stdout.count("DataParallel grads match the concatenated batch") == 2


def test_exception_on_one_rank_aborts_the_job():
    """Rank 1 raises while rank 0 waits for it in recv: the job must end (non-zero) well
    before the 60 s timeout instead of hanging (python -m mpi4py calls MPI_Abort)."""
    t0 = time.monotonic()
    proc = run_mpi("abort_worker.py", timeout=60, check=False)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "deliberate failure on rank 1" in proc.stderr
    assert elapsed < 60  # bounded by the timeout above; typically ~2 s


def test_data_parallel_unused_parameters_error_or_zeros():
    """A parameter without a gradient on one rank (a branch taken there only, or a
    backward reaching no parameter): without find_unused_parameters a RuntimeError on
    both ranks within seconds (the worker times each), then the wrapper works again; with
    it, zeros are averaged in. Every overlap mode, one bucket and one per parameter."""
    t0 = time.monotonic()
    proc = run_mpi("dp_unused_worker.py", timeout=120)
    assert proc.stdout.count("unused parameters ok") == 2 * 3 * 2, proc.stdout
    assert time.monotonic() - t0 < 120
