/* ortcpu.h -- the whole C API of ortcpu_torch's native kernels.
 *
 * Conventions (see DESIGN.md):
 *  - every entry point returns an int status: ORTCPU_OK (0) or a negative code;
 *    ortcpu_last_error() then holds a message for the calling thread;
 *  - inputs are raw pointers plus int64 sizes, outputs are preallocated by the caller;
 *  - each kernel exists as _f32 and _f64, generated from one source;
 *  - `nthreads` is the number of threads the call may use (>= 1).
 *
 * This file is also read by cffi: keep it to plain declarations
 * (the builder drops preprocessor lines).
 */
#ifndef ORTCPU_H
#define ORTCPU_H
#include <stdint.h>
#include <stddef.h>

/* ---- status ------------------------------------------------------------ */
enum {
    ORTCPU_OK = 0,
    ORTCPU_E_INVALID_ARGUMENT = -1,
    ORTCPU_E_OUT_OF_MEMORY = -2,
    ORTCPU_E_INDEX_OUT_OF_RANGE = -3,
    ORTCPU_E_INTERNAL = -4
};
const char *ortcpu_status_name(int status);
const char *ortcpu_last_error(void);

/* ---- arena: caching allocator of already-touched blocks ------------------ */
void *ortcpu_arena_alloc(size_t nbytes);
void ortcpu_arena_free(void *ptr);
void ortcpu_arena_empty_cache(void);
void ortcpu_arena_set_limit(size_t max_cached_bytes);
/* stats: [0] bytes in use, [1] bytes cached, [2] cache hits, [3] cache misses,
 *        [4] peak bytes in use, [5] cache limit */
void ortcpu_arena_stats(int64_t stats[6]);

/* ---- memory bandwidth probe (benchmarks): dst[i] = src[i] ---------------- */
int ortcpu_stream_copy_f32(const float *src, float *dst, int64_t n, int nthreads);

/* ---- activations (spec §2, §17.1) ----------------------------------------
 * GELU family on a [rows, cols] view; `bias` (length cols) may be NULL.
 * approximate: 0 = exact (erf), 1 = tanh (FastGelu).
 * Backward: dx from dy and the forward input x (plus bias);
 * dbias (length cols, may be NULL) receives sum over rows of dx.        */
int ortcpu_gelu_forward_f32(const float *x, const float *bias, float *y,
                            int64_t rows, int64_t cols, int approximate, int nthreads);
int ortcpu_gelu_forward_f64(const double *x, const double *bias, double *y,
                            int64_t rows, int64_t cols, int approximate, int nthreads);
int ortcpu_gelu_backward_f32(const float *dy, const float *x, const float *bias,
                             float *dx, float *dbias, int64_t rows, int64_t cols,
                             int approximate, int nthreads);
int ortcpu_gelu_backward_f64(const double *dy, const double *x, const double *bias,
                             double *dx, double *dbias, int64_t rows, int64_t cols,
                             int approximate, int nthreads);

/* Pointwise ops selected by `op` (ORTCPU_ACT_*); `alpha` is used by
 * QuickGelu (alpha in sigmoid(alpha*x)) and LeakyRelu (negative slope).
 * Backward input `xy` is the forward input for RELU and QUICK_GELU and the
 * forward output for SIGMOID, TANH and LEAKY_RELU (ORT's convention).    */
enum {
    ORTCPU_ACT_RELU = 0,
    ORTCPU_ACT_SIGMOID = 1,
    ORTCPU_ACT_TANH = 2,
    ORTCPU_ACT_QUICK_GELU = 3,
    ORTCPU_ACT_LEAKY_RELU = 4
};
int ortcpu_act_forward_f32(int op, const float *x, float *y, int64_t n, double alpha,
                           int nthreads);
int ortcpu_act_forward_f64(int op, const double *x, double *y, int64_t n, double alpha,
                           int nthreads);
int ortcpu_act_backward_f32(int op, const float *dy, const float *xy, float *dx, int64_t n,
                            double alpha, int nthreads);
int ortcpu_act_backward_f64(int op, const double *dy, const double *xy, double *dx,
                            int64_t n, double alpha, int nthreads);

/* ---- softmax (spec §3) ----------------------------------------------------
 * The tensor is viewed as [outer, dim, inner]; the reduction runs over dim.
 * log_ = 0: softmax, 1: log-softmax.
 * Backward takes the forward *output* y:
 *   softmax:     dx = y * (dy - sum(dy * y))
 *   log-softmax: dx = dy - exp(y) * sum(dy)                               */
int ortcpu_softmax_forward_f32(const float *x, float *y, int64_t outer, int64_t dim,
                               int64_t inner, int log_, int nthreads);
int ortcpu_softmax_forward_f64(const double *x, double *y, int64_t outer, int64_t dim,
                               int64_t inner, int log_, int nthreads);
int ortcpu_softmax_backward_f32(const float *dy, const float *y, float *dx, int64_t outer,
                                int64_t dim, int64_t inner, int log_, int nthreads);
int ortcpu_softmax_backward_f64(const double *dy, const double *y, double *dx,
                                int64_t outer, int64_t dim, int64_t inner, int log_,
                                int nthreads);

/* ---- summaries (spec §16): histogram statistics and bucketing, event framing ----
 * Bucketing counts, for every value x, u(x) = #{i : edges[i] <= x} (an upper_bound on
 * the sorted `edges`, length nedges >= 1, no NaN). `lut` (ORTCPU_SUMMARY_LUT_SIZE int32)
 * and `cell_edge` (ORTCPU_SUMMARY_CELLS floats), both filled by ortcpu_summary_edges_lut for the same
 * edges, make that a table look-up (branch-free when no table cell holds more than one
 * edge, as for TensorFlow's/ORT's 1.1-ratio edges); lut = NULL means a binary search.
 * mode ORTCPU_HIST_ORT:   non-finite values are skipped; counts has nedges + 1 entries,
 *                         counts[min(u(x), nedges - 1)] += 1 (a value equal to the
 *                         last edge is counted under it; ORT 1.19.2 indexes past its
 *                         counts and aborts for any value >= 9.92e19); stats over the
 *                         finite values with min = +DBL_MAX, max = -DBL_MAX initially,
 *                         summed in order within a chunk (one thread: ORT's sums).
 * mode ORTCPU_HIST_NUMPY: numpy.histogram(x, bins=edges): counts has nedges - 1 entries,
 *                         bin u(x) - 1 for edges[0] <= x < edges[-1], the last bin
 *                         closed; values outside (and NaN) are not counted; stats over
 *                         all values (NaN/inf propagate, as numpy's min/max/sum do).
 * stats = [min, max, num, sum, sum_squares], accumulated in double.                  */
enum { ORTCPU_HIST_ORT = 0, ORTCPU_HIST_NUMPY = 1, ORTCPU_SUMMARY_LUT_SIZE = 131076,
       ORTCPU_SUMMARY_CELLS = 65536 };
int ortcpu_summary_edges_lut(const double *edges, int64_t nedges, int32_t *lut,
                             float *cell_edge);
int ortcpu_summary_histogram_f32(const float *x, int64_t n, const double *edges,
                                 int64_t nedges, const int32_t *lut, const float *cell_edge,
                                 int mode, double *counts, double *stats, int nthreads);
int ortcpu_summary_histogram_f64(const double *x, int64_t n, const double *edges,
                                 int64_t nedges, const int32_t *lut, const float *cell_edge,
                                 int mode, double *counts, double *stats, int nthreads);
/* TFRecord framing of `count` records stored back to back in `data` (lengths[i]
 * bytes each): out (sum(lengths) + 16*count bytes) receives, per record,
 * uint64 length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the
 * data (little-endian).                                                         */
int ortcpu_summary_frame_records(const uint8_t *data, const int64_t *lengths, int64_t count,
                                 uint8_t *out, int64_t out_size);
/* masked CRC-32C of n bytes into *crc (for readers and tests) */
int ortcpu_summary_masked_crc32c(const uint8_t *data, int64_t n, uint32_t *crc);

/* ---- BLAS (linked from scipy-openblas32): C = alpha*op(A)*op(B) + beta*C,
 * row-major; trans_a/trans_b are 0 or 1.                                   */
int ortcpu_gemm_f32(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc);
int ortcpu_gemm_f64(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                    const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                    double *c, int64_t ldc);

#endif
