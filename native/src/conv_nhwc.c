/* conv_nhwc.c -- depthwise 2-D convolution on channels-last (NHWC) memory: what a
 * channels_last model (ConvNeXt's 7x7 depthwise layers, MobileNet's 3x3 ones) hands a
 * depthwise Conv2d. The loops run over the channels, which are contiguous there, so their
 * speed does not depend on the map size: on ConvNeXt's 4x4..8x8 maps under a 7x7 kernel
 * the NCHW kernel's register tiles run mostly empty (conv_dw.inc: 6-18 GFLOP/s, and
 * torch's channels_last backward 1.9 ms for N16 C64 4x4, measured at 1 thread).
 *
 * Layouts: x [N, H, W, C], w [KH, KW, C] (the [C, 1, KH, KW] weight, tap-major), b [C] or
 * NULL, y [N, OH, OW, C]; multiplier 1 (group == C == M). geom is conv.c's int64 geom[23]
 * of a 2-D convolution (leading spatial size 1).
 *
 * Forward: per output position, the taps whose input lies inside the map form a
 * sub-rectangle of the kernel (no test per tap); channel blocks of DWL_CB elements
 * accumulate in registers over them. dX: the same gather per input position, over the
 * output positions whose window covers it. dW: per tap, the output positions whose input
 * lies inside the map form a rectangle: dot products of dY and X channel blocks over it,
 * summed per sample in T and over samples in double (dB likewise over all positions).
 * Threads: the forward splits the N*OH output rows, dX the N*H input rows, dW the taps x
 * channel blocks (each task owns its weights: no reduction across threads). */
#include "common.h"

/* floor and ceiling of a / b for b > 0 */
static inline int64_t dwl_fdiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t dwl_cdiv(int64_t a, int64_t b) { return -dwl_fdiv(-a, b); }

/* [lo, hi] of k in [0, K) with o*s - p + k*d in [0, size) (an empty range: lo > hi) */
static inline void dwl_taps(int64_t o, int64_t s, int64_t p, int64_t d, int64_t size, int64_t K,
                            int64_t *lo, int64_t *hi)
{
    int64_t a = dwl_cdiv(p - o * s, d), b = dwl_fdiv(size - 1 + p - o * s, d);
    *lo = a > 0 ? a : 0;
    *hi = b < K - 1 ? b : K - 1;
}

/* [lo, hi] of o in [0, O) with o*s - p + k*d in [0, size) */
static inline void dwl_outs(int64_t k, int64_t s, int64_t p, int64_t d, int64_t size, int64_t O,
                            int64_t *lo, int64_t *hi)
{
    int64_t a = dwl_cdiv(p - k * d, s), b = dwl_fdiv(size - 1 + p - k * d, s);
    *lo = a > 0 ? a : 0;
    *hi = b < O - 1 ? b : O - 1;
}

/* The taps of input position i along one dim, as a run: tap k0 + t*kstep reads output
 * position o0 + t*ostep, t in [0, count) (count <= 0: none) */
typedef struct {
    int64_t k0, kstep, o0, ostep, count;
} dwl_run;

/* input position i, pad p, stride s, dilation d, K taps, O outputs: o*s - p + k*d = i.
 * 0 when the taps are no arithmetic run this way (stride and dilation both > 1). */
static int dwl_run_of(int64_t i, int64_t s, int64_t p, int64_t d, int64_t K, int64_t O,
                      dwl_run *r)
{
    if (s == 1) { /* o = i + p - k*d */
        int64_t lo = dwl_cdiv(i + p - (O - 1), d), hi = dwl_fdiv(i + p, d);
        lo = lo > 0 ? lo : 0;
        hi = hi < K - 1 ? hi : K - 1;
        *r = (dwl_run){lo, 1, i + p - lo * d, -d, hi - lo + 1};
        return 1;
    }
    if (d == 1) { /* k = m + s*t, o = q0 - t with m = (i + p) mod s */
        int64_t m = (i + p) % s, q0 = (i + p - m) / s;
        int64_t t0 = q0 - (O - 1) > 0 ? q0 - (O - 1) : 0;
        int64_t t1 = dwl_fdiv(K - 1 - m, s);
        t1 = t1 < q0 ? t1 : q0;
        *r = (dwl_run){m + s * t0, s, q0 - t0, -1, t1 - t0 + 1};
        return 1;
    }
    return 0;
}

typedef struct {
    int64_t N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw;
} dwl_geom;

static int dwl_geom_of(const int64_t *g, dwl_geom *q, const char *what)
{
    if (!g) return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "%s: geom is NULL", what);
    q->N = g[0]; q->C = g[1];
    q->H = g[5]; q->W = g[6]; q->KH = g[8]; q->KW = g[9]; q->OH = g[11]; q->OW = g[12];
    q->sh = g[14]; q->sw = g[15]; q->ph = g[17]; q->pw = g[18]; q->dh = g[20]; q->dw = g[21];
    if (g[4] != 1 || g[7] != 1 || g[10] != 1)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "%s: not a 2-D convolution", what);
    if (g[3] != q->C || g[2] != q->C || q->C < 1)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                        "%s: needs group == C == M (depthwise, multiplier 1)", what);
    if (q->N < 0 || q->H < 1 || q->W < 1 || q->KH < 1 || q->KW < 1 || q->OH < 0 || q->OW < 0 ||
        q->sh < 1 || q->sw < 1 || q->dh < 1 || q->dw < 1 || q->ph < 0 || q->pw < 0)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "%s: invalid geometry", what);
    return ORTCPU_OK;
}

/* fork-join only for work of at least this many multiply-adds per thread */
#define DWL_MIN_WORK (1 << 16)

static int64_t dwl_grain(int64_t work_per_item)
{
    int64_t g = DWL_MIN_WORK / (work_per_item > 0 ? work_per_item : 1);
    return g > 0 ? g : 1;
}

#define ORT_TEMPLATE "conv_nhwc.inc"
#include "instantiate.h"
