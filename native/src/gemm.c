/* gemm.c -- MatMul / Gemm registry kernels and the multi-threaded GEMM helper.
 * GEMMs run on OpenBLAS (scipy-openblas32), pinned to one thread; see gemm.h. */
#include "common.h"
#include "gemm.h"

#include <omp.h>

#include <cblas.h>

#define ORT_TRANS(t) ((t) ? CblasTrans : CblasNoTrans)

static int gemm_check(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc)
{
    const int64_t lim = 2147483647;
    if (m < 0 || n < 0 || k < 0)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm: negative size m=%lld n=%lld k=%lld",
                        (long long)m, (long long)n, (long long)k);
    if (m > lim || n > lim || k > lim || lda > lim || ldb > lim || ldc > lim)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm: sizes exceed the 32-bit BLAS");
    return ORTCPU_OK;
}

void ortcpu_blas_set_num_threads(int n) { scipy_openblas_set_num_threads(n < 1 ? 1 : n); }
int ortcpu_blas_get_num_threads(void) { return scipy_openblas_get_num_threads(); }

#define T float
#define SFX f32
#define BLAS_GEMM scipy_cblas_sgemm
#include "gemm.inc"
#undef T
#undef SFX
#undef BLAS_GEMM

#define T double
#define SFX f64
#define BLAS_GEMM scipy_cblas_dgemm
#include "gemm.inc"
#undef T
#undef SFX
#undef BLAS_GEMM
