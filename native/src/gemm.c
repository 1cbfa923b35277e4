/* gemm.c -- MatMul / Gemm registry kernels, the library's GEMM on OpenBLAS
 * (scipy-openblas32, pinned to one thread) or torch's MKL (gemm.h, gemm_backend.c), and
 * the packed right-hand operand of repeated GEMMs. */
#include "common.h"
#include "gemm.h"

#include <omp.h>

#include <cblas.h>

#define ORT_TRANS(t) ((t) ? CblasTrans : CblasNoTrans)

/* MKL's CBLAS constants for the packed GEMM (not in OpenBLAS's cblas.h) */
enum { MKL_ROW_MAJOR = 101, MKL_NO_TRANS = 111, MKL_TRANS = 112, MKL_PACKED = 151,
       MKL_B_MATRIX = 162 };

static int gemm_check(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                      int64_t ldb, int64_t ldc)
{
    const int64_t lim = 2147483647;
    if (m < 0 || n < 0 || k < 0)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm: negative size m=%lld n=%lld k=%lld",
                        (long long)m, (long long)n, (long long)k);
    if (m > lim || n > lim || k > lim || lda > lim || ldb > lim || ldc > lim)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm: sizes exceed the 32-bit BLAS");
    /* row strides the BLAS would reject (with a message on stdout): only where it reads */
    if (m > 0 && n > 0 && k > 0 && (lda < (trans_a ? m : k) || ldb < (trans_b ? k : n)))
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                        "gemm: leading dimension too small (lda=%lld ldb=%lld for m=%lld "
                        "n=%lld k=%lld, trans %d %d)", (long long)lda, (long long)ldb,
                        (long long)m, (long long)n, (long long)k, trans_a, trans_b);
    if (m > 0 && n > 0 && ldc < n)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm: ldc=%lld < n=%lld", (long long)ldc,
                        (long long)n);
    return ORTCPU_OK;
}

void ortcpu_blas_set_num_threads(int n) { scipy_openblas_set_num_threads(n < 1 ? 1 : n); }
int ortcpu_blas_get_num_threads(void) { return scipy_openblas_get_num_threads(); }

void ort_gemm_unpack_b(ort_packed_b *pb)
{
    ort_scratch_free(pb->packed);
    pb->packed = NULL;
}

#define T float
#define SFX f32
#define IS_F64 0
#define HAVE_PACK 1
#define BLAS_GEMM scipy_cblas_sgemm
#define BLAS_GEMV scipy_cblas_sgemv
#define MKL_GEMM sgemm
#include "gemm.inc"
#undef T
#undef SFX
#undef IS_F64
#undef HAVE_PACK
#undef BLAS_GEMM
#undef BLAS_GEMV
#undef MKL_GEMM

#define T double
#define SFX f64
#define IS_F64 1
#define HAVE_PACK 0 /* MKL packs only float32 here (no dgemm_pack export) */
#define BLAS_GEMM scipy_cblas_dgemm
#define BLAS_GEMV scipy_cblas_dgemv
#define MKL_GEMM dgemm
#include "gemm.inc"
#undef T
#undef SFX
#undef IS_F64
#undef HAVE_PACK
#undef BLAS_GEMM
#undef BLAS_GEMV
#undef MKL_GEMM
