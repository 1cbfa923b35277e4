/* gemm.h -- internal: the library's GEMM, on one of two BLAS backends.
 *
 * Backends (gemm_backend.c): OpenBLAS (scipy-openblas32, always there) and the MKL BLAS
 * that torch's x86 wheel exports from libtorch_cpu.so (Fortran sgemm_/dgemm_ and the
 * packed cblas_sgemm_pack/compute), bound at load time by ortcpu_gemm_bind_mkl. Which
 * one runs is ortcpu_gemm_set_backend's setting (ORTCPU_GEMM=auto|openblas|mkl on the
 * Python side); `auto` times both on the first GEMM of each shape class (dtype,
 * transposes, log2 buckets of m, n, k, threaded or not, packed or not) and keeps the
 * faster one for that class.
 *
 * Threads: OpenBLAS (a pthreads build) is pinned to ONE thread when the extension loads,
 * and MKL (GNU threading layer, torch's libgomp: the same OpenMP pool as ours) runs each
 * call on one thread (MKL_Set_Num_Threads_Local, restored after the call). A parallel
 * GEMM is ours on either backend: split into column (or row) slabs, one single-threaded
 * call per OpenMP thread (MKL's own threading measured slower at small-m shapes); inside
 * a parallel region every GEMM is single-threaded. Two thread pools never spin side by
 * side. */
#ifndef ORTCPU_GEMM_H
#define ORTCPU_GEMM_H
#include <stddef.h>
#include <stdint.h>

/* C = alpha*op(A)*op(B) + beta*C (row-major), split over up to `nthreads` threads
 * (serial when called inside a parallel region or when the work is small). */
int ort_gemm_mt_f32(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, int nthreads);
int ort_gemm_mt_f64(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                    const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                    double *c, int64_t ldc, int nthreads);

/* A right-hand operand op(B) (k x n) reused by many GEMMs C = A op(B) + beta C (the
 * recurrent weights of an RNN, one per step): packed once by MKL's packed GEMM where that
 * backend is chosen, kept as the plain matrix otherwise. */
typedef struct {
    const void *b;   /* the plain matrix (always kept: the OpenBLAS path uses it) */
    int64_t ldb, n, k;
    int trans_b;
    void *packed;    /* MKL's packed copy, or NULL */
} ort_packed_b;

/* Pack op(B) for GEMMs of about `m_hint` rows; on error *pb is left unpacked (usable). */
int ort_gemm_pack_b_f32(ort_packed_b *pb, int trans_b, int64_t m_hint, int64_t n, int64_t k,
                        const float *b, int64_t ldb);
int ort_gemm_pack_b_f64(ort_packed_b *pb, int trans_b, int64_t m_hint, int64_t n, int64_t k,
                        const double *b, int64_t ldb);
/* C (m x n) = A (m x k) . op(B) + beta*C on the calling thread. */
int ort_gemm_packed_f32(const ort_packed_b *pb, int64_t m, const float *a, int64_t lda,
                        float beta, float *c, int64_t ldc);
int ort_gemm_packed_f64(const ort_packed_b *pb, int64_t m, const double *a, int64_t lda,
                        double beta, double *c, int64_t ldc);
void ort_gemm_unpack_b(ort_packed_b *pb);

/* ---- backend selection (gemm_backend.c), used by gemm.inc ---- */
/* ORT_BE_MKL_MT: MKL's own threading, one call over the class's threads (threaded,
 * unpacked classes: auto's third candidate there, and the "mkl_threaded" setting) */
enum { ORT_BE_OPENBLAS = 1, ORT_BE_MKL = 2, ORT_BE_MKL_MT = 3 };

/* Fortran-convention BLAS entry points of the MKL copy (column-major, by reference). */
typedef void (*ort_fgemm_f32)(const char *ta, const char *tb, const int *m, const int *n,
                              const int *k, const float *alpha, const float *a, const int *lda,
                              const float *b, const int *ldb, const float *beta, float *c,
                              const int *ldc);
typedef void (*ort_fgemm_f64)(const char *ta, const char *tb, const int *m, const int *n,
                              const int *k, const double *alpha, const double *a,
                              const int *lda, const double *b, const int *ldb,
                              const double *beta, double *c, const int *ldc);
typedef size_t (*ort_pack_size_fn)(int identifier, int m, int n, int k);
typedef void (*ort_pack_fn)(int layout, int identifier, int trans, int m, int n, int k,
                            float alpha, const float *src, int ld, float *dest);
typedef void (*ort_pack_compute_fn)(int layout, int trans_a, int trans_b, int m, int n, int k,
                                    const float *a, int lda, const float *b, int ldb,
                                    float beta, float *c, int ldc);
typedef struct {
    ort_fgemm_f32 sgemm;
    ort_fgemm_f64 dgemm;
    ort_pack_size_fn pack_size;       /* the packed trio: all or none */
    ort_pack_fn pack;
    ort_pack_compute_fn compute;
    int (*set_threads_local)(int);    /* mkl_set_num_threads_local */
} ort_mkl_api;

/* The bound MKL entry points (NULL members when not bound). */
const ort_mkl_api *ort_mkl(void);

/* A shape class: the key `auto` decides on. */
uint32_t ort_gemm_class(int is_f64, int packed, int trans_a, int trans_b, int64_t m,
                        int64_t n, int64_t k, int threaded);

/* Runs one trial of the GEMM being decided with backend `be` (into scratch output). */
typedef void (*ort_gemm_trial_fn)(void *ctx, int be);

/* The backend for this class: the setting, or auto's decision for the class, timed now
 * (with `trial`, on the caller's operands) if this is the class's first GEMM. `packed`
 * classes need MKL's packed trio, the others its sgemm/dgemm. */
int ort_gemm_backend_for(uint32_t cls, int packed, int is_f64, double flops,
                         ort_gemm_trial_fn trial, void *ctx);
/* The backend auto has settled on for a class, 0 if none yet (no timing). */
int ort_gemm_backend_known(uint32_t cls, int packed, int is_f64);
#endif
