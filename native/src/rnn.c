/* rnn.c -- LSTM and GRU training kernels (spec §8), one direction per call.
 *
 * Layouts are ONNX Runtime's with num_directions dropped: X [S,B,I]; LSTM W [4H,I],
 * R [4H,H], bias [8H] = (Wb, Rb), peepholes [3H] = (Pi, Po, Pf), gate order [i,o,f,c];
 * GRU W [3H,I], R [3H,H], bias [6H] = (Wb, Rb), gate order [z,r,h]. States [B,H].
 * `reverse` runs time from S-1 down to 0 (HAll[t] is still the state at time t).
 *
 * The input projection of all steps is one GEMM ([S*B, I] x [I, gates]); each step
 * adds one recurrence GEMM ([B,H] x [H, gates]) and the gate math (a few short passes
 * over each row, see lstm_cell_row). The backward collects the per-step pre-activation
 * gradients dG [S,B,gates] and finishes with whole-sequence GEMMs for dX, dW, dR and
 * the bias sums. Every GEMM but the bias sums runs on rnn_gemm.inc's own packed GEMM
 * (AVX-512 where the build has it; the BLAS backends run AVX2 kernels on AVX-512 AMD
 * CPUs, see there). The recurrent weights are packed once per call for the S per-step
 * GEMMs of each direction: the LSTM's R as one operand, the GRU's as one
 * (linear_before_reset=1) or as its z,r rows and h rows apart (=0: the h rows multiply
 * r*h_prev).
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

/* ---- gate nonlinearities ---------------------------------------------------------
 * The cells spend most of their non-GEMM time here. common.h's ort_sigmoid_pair_f32 /
 * ort_tanh_f32 keep denormal results exact (a two-factor scale) and return 1 - sigma as
 * well; gates need neither: for |z| > 87 a gate is 0 or 1 to float32 precision, so e^-|z|
 * is capped at e^-87 and one scale factor suffices. Each is branch-free (the cells'
 * loops vectorize at the build's ISA level), NaN propagates, |rel. error| < 2e-7. */
static inline uint32_t rnn_f32_bits(float f)
{
    union { float f; uint32_t u; } v = {f};
    return v.u;
}

static inline float rnn_bits_f32(uint32_t u)
{
    union { uint32_t u; float f; } v = {u};
    return v.f;
}

/* e^-a for a >= 0 (NaN gives NaN), a capped at 87 */
static inline float rnn_exp_neg_f32(float a)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    a = 87.0f < a ? 87.0f : a;       /* min(87, a) with NaN kept */
    float k = a * -1.44269504088896341f + magic;
    float n = k - magic;             /* round(-a / ln2), in [-126, 0] */
    float r = n * -0.693145751953125f - a; /* -a - n ln2, ln2 split in two parts */
    r = n * -1.428606765330187045e-06f + r;
    float p = ort_exp_taylor7_f32(r);
    /* 2^n from k's bits (its mantissa holds 0x400000 + n); unsigned: no overflow for NaN */
    return p * rnn_bits_f32((rnn_f32_bits(k) - 0x4B400000u + 127u) << 23);
}

static inline float rnn_sigmoid_f32(float z)
{
    float e = rnn_exp_neg_f32(fabsf(z));
    float q = 1.0f / (1.0f + e);
    return z < 0.0f ? e * q : q;
}

/* tanh(v) = sign(v) (1 - e)/(1 + e), e = e^-2|v|; below |v| = 0.3, where 1 - e cancels,
 * the odd Taylor polynomial through v^11 (truncation < 2e-9) */
static inline float rnn_tanh_f32(float v)
{
    float a = fabsf(v);
    float e = rnn_exp_neg_f32(2.0f * a);
    float big = (1.0f - e) / (1.0f + e);
    return a < 0.3f ? ort_tanh_small_f32(v) : copysignf(big, v);
}

static inline double rnn_sigmoid_f64(double z)
{
    double s, oms;
    ort_sigmoid_pair_f64(z, &s, &oms);
    return s;
}

static inline double rnn_tanh_f64(double v) { return tanh(v); }

/* Gate block order of W, R, the biases and the saved gate values (gate_order argument):
 * 0 = ORT's (LSTM [i,o,f,c], GRU [z,r,h]), 1 = torch's (LSTM [i,f,g,o], GRU [r,z,n]), so
 * that nn.LSTM / nn.GRU pass their parameters without a reordering copy. Peepholes keep
 * ORT's (Pi, Po, Pf) order either way; the GRU's h (torch: n) block is third in both. */
typedef struct {
    int64_t i, o, f, c; /* element offsets of the blocks in a row of 4H */
} rnn_lstm_gates;

static rnn_lstm_gates rnn_lstm_order(int gate_order, int64_t H)
{
    rnn_lstm_gates ort = {0, H, 2 * H, 3 * H}, torch = {0, 3 * H, H, 2 * H};
    return gate_order ? torch : ort;
}

/* rnn_gemm.inc's register tile: RG_MR rows x two vectors of RG_VB bytes (16 of the 32
 * zmm registers at x86-64-v4, 12 of the 16 ymm at v3 and xmm at the baseline); A blocks of
 * RG_MC x RG_KC elements (L2), B panels of RG_KC x 2 vectors (L1). 8 rows at v4, not 12:
 * a thread's batch slice of 32 or 64 rows fills whole tiles (12 left a 4- or 8-row tile
 * computed as 12); measured equal at 1 thread and ~7% less CPU time at 2 threads (batch
 * 64 split in two) on the train_step LSTM (perf sample counts, same iterations). The
 * tile code also takes RG_MR 12. */
#if ORT_ISA_LEVEL >= 2
#define RG_VB 64
#define RG_MR 8
#elif ORT_ISA_LEVEL == 1
#define RG_VB 32
#define RG_MR 6
#else
#define RG_VB 16
#define RG_MR 6
#endif
#define RG_MC (8 * RG_MR)
#define RG_KC 256
#define RG_WS ((int64_t)RG_MC * RG_KC) /* elements of one thread's A-block buffer */

#define ORT_TEMPLATE "rnn.inc"
#include "instantiate.h"
