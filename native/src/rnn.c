/* rnn.c -- LSTM and GRU training kernels (spec §8), one direction per call.
 *
 * Layouts are ONNX Runtime's with num_directions dropped: X [S,B,I]; LSTM W [4H,I],
 * R [4H,H], bias [8H] = (Wb, Rb), peepholes [3H] = (Pi, Po, Pf), gate order [i,o,f,c];
 * GRU W [3H,I], R [3H,H], bias [6H] = (Wb, Rb), gate order [z,r,h]. States [B,H].
 * `reverse` runs time from S-1 down to 0 (HAll[t] is still the state at time t).
 *
 * The input projection of all steps is one GEMM ([S*B, I] x [I, gates]); each step
 * adds one recurrence GEMM ([B,H] x [H, gates]) and one fused pass over the gate
 * math. The backward collects the per-step pre-activation gradients dG [S,B,gates]
 * and finishes with whole-sequence GEMMs for dX, dW, dR and the bias sums. The LSTM's
 * recurrent weights are packed once per call (gemm.h: MKL's packed GEMM where it is the
 * faster backend for the step's shape) for the S per-step GEMMs of each direction.
 */
#include "common.h"
#include "gemm.h"

#include <cblas.h>
#undef I /* complex.h (pulled in by cblas.h) defines I; our sizes use it */

#define GEMM_OK(call) do { st = (call); if (st) goto done; } while (0)

/* Threads. The recurrence is independent across batch rows, so each thread runs the
 * whole time loop for its own slice of the batch: per step, a GEMM for its rows and the
 * fused gate pass, with no synchronisation between steps. The whole-sequence GEMMs
 * (input projection, dX, dW, dR) are split by output rows over the same OpenMP threads.
 * OpenBLAS runs single-threaded inside each call (its thread count is saved on entry and
 * restored on exit): one thread pool only. Waking torch's OpenMP pool and OpenBLAS's
 * pthreads pool in turn, several times per step, spins the two against each other on
 * 2 cores (measured several times slower than torch under load). */
typedef void (*rnn_slice_fn)(void *ctx, int64_t b0, int64_t b1, int *status);

static int rnn_threads(int64_t rows, int64_t min_rows, int nthreads)
{
    int64_t k = nthreads < 1 ? 1 : nthreads;
    if (k > rows / min_rows) k = rows / min_rows;
    if (k > 64) k = 64;
    return k < 1 ? 1 : (int)k;
}

/* rows of the largest batch slice rnn_run_slices gives a thread */
static int64_t rnn_slice_rows(int64_t B, int nthreads)
{
    int k = rnn_threads(B, 4, nthreads);
    return (B + k - 1) / k;
}

static int rnn_run_slices(int64_t B, int nthreads, rnn_slice_fn fn, void *ctx)
{
    int k = rnn_threads(B, 4, nthreads);
    if (k <= 1) {
        int st = ORTCPU_OK;
        fn(ctx, 0, B, &st);
        return st;
    }
    int status[64] = {0};
#pragma omp parallel for num_threads(k) schedule(static, 1)
    for (int c = 0; c < k; c++) fn(ctx, B * c / k, B * (c + 1) / k, &status[c]);
    for (int c = 0; c < k; c++)
        if (status[c]) return status[c];
    return ORTCPU_OK;
}

static int rnn_blas_enter(void)
{
    int saved = scipy_openblas_get_num_threads();
    if (saved != 1) scipy_openblas_set_num_threads(1);
    return saved;
}

static void rnn_blas_leave(int saved)
{
    if (saved != 1) scipy_openblas_set_num_threads(saved);
}

#define ORT_TEMPLATE "rnn.inc"
#include "instantiate.h"
