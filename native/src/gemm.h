/* gemm.h -- internal: multi-threaded GEMM on single-threaded OpenBLAS.
 *
 * Thread-pool decision for the whole library (measured, see benchmarks/README or
 * kernels/gemm.py): OpenBLAS (a pthreads build) is pinned to ONE thread when the
 * extension loads; all parallelism comes from our OpenMP threads (torch's libgomp).
 * Kernels that run many GEMMs (conv over a batch, batched MatMul) give each OpenMP
 * thread whole GEMMs; a single large GEMM is split into column (or row) slabs, one
 * single-threaded OpenBLAS call per thread. Two thread pools spinning on 2 cores never
 * happens this way. */
#ifndef ORTCPU_GEMM_H
#define ORTCPU_GEMM_H
#include <stdint.h>

/* C = alpha*op(A)*op(B) + beta*C (row-major), split over up to `nthreads` OpenMP threads
 * (serial when called inside a parallel region or when the work is small). */
int ort_gemm_mt_f32(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, int nthreads);
int ort_gemm_mt_f64(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                    const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                    double *c, int64_t ldc, int nthreads);
#endif
