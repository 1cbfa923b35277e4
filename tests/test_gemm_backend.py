"""The GEMM backends (native/src/gemm.h): OpenBLAS and torch's MKL, chosen by
ORTCPU_GEMM / set_gemm_backend, `auto` deciding per shape class by measurement.

Every backend is checked against a float64 evaluation: transposes, alpha/beta, odd and
empty sizes, one and two threads, batched GEMMs, and the LSTM whose recurrent weights go
through the packed GEMM. The fallback is forced with the setting (`openblas`) and by
binding a library without the symbols."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest
import torch

from ortcpu_torch import kernels as K
from ortcpu_torch._native import blas, ffi, lib, ptr

HAVE_MKL = blas.mkl_available()["gemm"]
BACKENDS = ["openblas", "auto"] + (["mkl", "mkl_threaded"] if HAVE_MKL else [])
SIZES = [(1, 1, 1), (7, 13, 5), (65, 33, 129), (300, 257, 31), (0, 5, 3), (4, 0, 3),
         (5, 4, 0), (130, 70, 300)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    saved = blas.get_gemm_backend()
    blas.set_gemm_backend(request.param)
    yield request.param
    blas.set_gemm_backend(saved)


def _gemm(dtype, ta, tb, m, n, k, alpha, beta, threads):
    a = torch.randn((k, m) if ta else (m, k), dtype=dtype)
    b = torch.randn((n, k) if tb else (k, n), dtype=dtype)
    c = torch.randn(m, n, dtype=dtype)
    opa = a.double().T if ta else a.double()
    opb = b.double().T if tb else b.double()
    ref = alpha * (opa @ opb) + beta * c.double()
    # float rounding bound per element: ~k ulps of sum |alpha a b| + |beta c|
    mag = abs(alpha) * (opa.abs() @ opb.abs()) + abs(beta) * c.double().abs()
    fn = lib.ortcpu_gemm_mt_f32 if dtype == torch.float32 else lib.ortcpu_gemm_mt_f64
    st = fn(ta, tb, m, n, k, alpha, ptr(a), max(a.shape[1], 1), ptr(b), max(b.shape[1], 1),
            beta, ptr(c), max(n, 1), threads)
    assert st == 0, ffi.string(lib.ortcpu_last_error()).decode()
    return c, ref, mag


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_matches_float64(backend, dtype, ta, tb):
    eps = 2e-7 if dtype == torch.float32 else 5e-16
    for m, n, k in SIZES:
        # only the largest size is split over threads (>= 4 MFLOP)
        for threads in ((1, 2) if m * n * k > 2e6 else (1,)):
            for alpha, beta in ((1.0, 0.0), (-2.0, 0.25)):
                c, ref, mag = _gemm(dtype, ta, tb, m, n, k, alpha, beta, threads)
                excess = (c.double() - ref).abs() - 2 * eps * (k + 2) * mag
                assert not (excess > 0).any(), (m, n, k, threads, alpha, beta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_matrix_vector_gemm_matches_float64(dtype, ta, tb):
    """m == 1 or n == 1 runs as a GEMV (row slabs over threads); padded leading dims, NaN in
    C under beta = 0, a strided output column (ldc > n)."""
    eps = 2e-7 if dtype == torch.float32 else 5e-16
    fn = lib.ortcpu_gemm_mt_f32 if dtype == torch.float32 else lib.ortcpu_gemm_mt_f64
    for m, n, k in ((1, 1000, 300), (1, 37, 5), (700, 1, 300), (1, 1, 300), (3, 1, 2)):
        for threads in (1, 2):
            for alpha, beta in ((1.0, 0.0), (-2.0, 0.25)):
                pad = 3  # leading dims larger than the rows
                a = torch.randn((k, m + pad) if ta else (m, k + pad), dtype=dtype)
                b = torch.randn((n, k + pad) if tb else (k, n + pad), dtype=dtype)
                ldc = n + pad
                c = torch.randn(m, ldc, dtype=dtype)
                if beta == 0:
                    c[:, :n] = float("nan")
                before = c.clone()
                opa = (a[:, :m].double().T if ta else a[:, :k].double())
                opb = (b[:, :k].double().T if tb else b[:, :n].double())
                cc = torch.nan_to_num(before[:, :n].double()) if beta else 0
                ref = alpha * (opa @ opb) + beta * cc
                mag = abs(alpha) * (opa.abs() @ opb.abs()) + abs(beta) * abs(cc)
                st = fn(ta, tb, m, n, k, alpha, ptr(a), a.shape[1], ptr(b), b.shape[1], beta,
                        ptr(c), ldc, threads)
                assert st == 0, ffi.string(lib.ortcpu_last_error()).decode()
                excess = (c[:, :n].double() - ref).abs() - 2 * eps * (k + 2) * mag
                assert not (excess > 0).any() and not c[:, :n].isnan().any(), (m, n, k)
                assert torch.equal(c[:, n:], before[:, n:])  # the padding is not written


def test_large_threaded_gemm_and_nan_beta(backend):
    # big enough to split over threads (>= 4 MFLOP); beta = 0 ignores NaN in C (BLAS rule)
    m, n, k = 256, 384, 128
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.full((m, n), float("nan"))
    st = lib.ortcpu_gemm_mt_f32(0, 0, m, n, k, 1.0, ptr(a), k, ptr(b), n, 0.0, ptr(c), n, 2)
    assert st == 0
    ref = a.double() @ b.double()
    assert (c.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bmm_and_matmul(backend, dtype):
    eps = 2e-7 if dtype == torch.float32 else 5e-16
    for batch, m, n, k in ((64, 33, 17, 9), (3, 128, 64, 128), (1, 5, 1, 7), (0, 4, 4, 4)):
        a = torch.randn(batch, k, m, dtype=dtype)
        b = torch.randn(batch, n, k, dtype=dtype)
        c = torch.empty(batch, m, n, dtype=dtype)
        fn = lib.ortcpu_bmm_f32 if dtype == torch.float32 else lib.ortcpu_bmm_f64
        assert fn(1, 1, ptr(a), ptr(b), ptr(c), batch, m, n, k, 2) == 0
        ref = a.double().transpose(1, 2) @ b.double().transpose(1, 2)
        if batch:
            assert (c.double() - ref).abs().max().item() <= 8 * eps * k * ref.abs().max().item()
    A, B = torch.randn(2, 3, 20, 30, dtype=dtype), torch.randn(3, 30, 10, dtype=dtype)
    ref = A.double() @ B.double()
    assert (K.MatMul(A, B).double() - ref).abs().max().item() <= 8 * eps * 30 * ref.abs().max()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_lstm_packed_recurrence_vs_float64(backend, threads, batch):
    """The LSTM's per-step GEMMs run on the packed recurrent weights (MKL) or the plain
    ones (OpenBLAS); both agree with a float64 evaluation of the same kernel."""
    import ortcpu_torch
    ortcpu_torch.set_num_threads(threads)
    S, n_in, H = 5, 12, 24
    x = torch.randn(S, batch, n_in)
    w, r = torch.randn(1, 4 * H, n_in) * 0.3, torch.randn(1, 4 * H, H) * 0.3
    bias = torch.randn(1, 8 * H) * 0.1
    h0, c0 = torch.randn(1, batch, H), torch.randn(1, batch, H)
    args32 = (x, w, r, bias, None, h0, c0)
    args64 = tuple(None if t is None else t.double() for t in args32)
    y32 = K.LSTMTraining(*args32, hidden_size=H)
    y64 = K.LSTMTraining(*args64, hidden_size=H)
    for a32, a64 in zip(y32, y64, strict=True):
        assert (a32.double() - a64).abs().max().item() <= 2e-5
    dy = torch.randn(S, 1, batch, H)
    g32 = K.LSTMGrad(x, w, r, None, h0, c0, y32[0], y32[3], y32[4], dy, hidden_size=H)
    g64 = K.LSTMGrad(*(t.double() for t in (x, w, r)), None, h0.double(), c0.double(),
                     y64[0], y64[3], y64[4], dy.double(), hidden_size=H)
    for a32, a64 in zip(g32, g64, strict=True):
        if a32 is not None:
            scale = a64.abs().max().item() + 1
            assert (a32.double() - a64).abs().max().item() <= 3e-5 * scale


def test_auto_records_a_decision_per_class():
    if not HAVE_MKL:
        pytest.skip("this torch build exports no MKL GEMM: auto is OpenBLAS only")
    saved = blas.get_gemm_backend()
    try:
        blas.set_gemm_backend("auto")
        assert blas.auto_choice(torch.float32, 96, 80, 72, threaded=False) is None
        c, ref, _ = _gemm(torch.float32, 0, 0, 96, 80, 72, 1.0, 0.0, 1)
        assert (c.double() - ref).abs().max().item() < 1e-4
        assert blas.auto_choice(torch.float32, 96, 80, 72, threaded=False) in ("openblas", "mkl")
        # another bucket of m is another class, not decided yet
        assert blas.auto_choice(torch.float32, 200, 80, 72, threaded=False) is None
        c, ref, _ = _gemm(torch.float32, 0, 1, 512, 384, 256, 1.0, 0.0, 2)
        assert (c.double() - ref).abs().max().item() < 1e-3
        # a threaded class also weighs MKL on its own threads
        assert blas.auto_choice(torch.float32, 512, 384, 256, trans_b=True) in (
            "openblas", "mkl", "mkl_threaded")
    finally:
        blas.set_gemm_backend(saved)


def test_setting_errors_and_fallback_binding():
    with pytest.raises(ValueError, match="GEMM backend must be one of"):
        blas.set_gemm_backend("cublas")
    before = blas.mkl_available()
    # a loaded library without the symbols, and one that is not loaded: refused, and the
    # binding already in place (or its absence) is kept
    libc = ctypes.util.find_library("c") or "libc.so.6"
    assert not blas.bind_mkl(libc)
    assert "lacks sgemm_" in ffi.string(lib.ortcpu_last_error()).decode()
    assert not blas.bind_mkl("/nonexistent/libblas.so")
    assert blas.mkl_available() == before
    assert lib.ortcpu_gemm_set_backend(7) != 0
    # a leading dimension the BLAS would reject is our error, not BLAS's stdout message
    a = torch.randn(4, 4)
    st = lib.ortcpu_gemm_f32(0, 0, 4, 4, 4, 1.0, ptr(a), 2, ptr(a), 4, 0.0, ptr(a), 4)
    assert st != 0 and "leading dimension" in ffi.string(lib.ortcpu_last_error()).decode()


def _run_with_env(env_value: str, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ORTCPU_GEMM=env_value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


def test_environment_setting():
    code = ("import torch, ortcpu_torch\n"
            "from ortcpu_torch._native import blas\n"
            "a, b = torch.randn(50, 40), torch.randn(40, 30)\n"
            "y = ortcpu_torch.kernels.MatMul(a, b)\n"
            "assert (y.double() - a.double() @ b.double()).abs().max() < 1e-4\n"
            "print(blas.get_gemm_backend())\n")
    out = _run_with_env("openblas", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "openblas"
    bad = _run_with_env("fastest", code)
    assert bad.returncode != 0 and "ORTCPU_GEMM must be one of" in bad.stderr


def _openblas_core_in(env: dict) -> str:
    code = ("import os, torch, ortcpu_torch\n"
            "from ortcpu_torch._native import openblas_core\n"
            "a, b = torch.randn(70, 300), torch.randn(300, 50)\n"
            "y = ortcpu_torch.kernels.MatMul(a, b)\n"
            "assert (y.double() - a.double() @ b.double()).abs().max() < 1e-3\n"
            "print(openblas_core(), os.environ.get('OPENBLAS_CORETYPE'))\n")
    full = {k: v for k, v in os.environ.items()
            if k not in ("OPENBLAS_CORETYPE", "ORTCPU_OPENBLAS_CORETYPE")}
    out = subprocess.run([sys.executable, "-c", code], env={**full, **env}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_private_openblas_detects_the_cpu_unless_told():
    """A machine-wide OPENBLAS_CORETYPE does not pin our private copy (``env`` honours it,
    a core name forces one); the process's environment is left as it was."""
    detected = _openblas_core_in({})
    assert detected.endswith(" None") and detected != " None"
    assert _openblas_core_in({"OPENBLAS_CORETYPE": "Haswell"}) == f"{detected[:-5]} Haswell"
    assert _openblas_core_in({"OPENBLAS_CORETYPE": "Haswell",
                              "ORTCPU_OPENBLAS_CORETYPE": "env"}) == "Haswell Haswell"
    assert _openblas_core_in({"ORTCPU_OPENBLAS_CORETYPE": "Haswell"}) == "Haswell None"
