/* lrn.c -- ONNX LRN (local response normalization across channels) on float32 NCHW, the
 * graph executor's kernel: y = x / (bias + alpha / size * sum of x^2 over the channel
 * window [c - floor((size-1)/2), c + ceil((size-1)/2)])^beta, in one pass over x.
 * Work units are (sample, run of LRN_CHUNK positions): for each channel the window's rows
 * of the run are still in L1/L2 from the previous channels, and every inner loop runs
 * over consecutive positions (vectorized). beta = 0.75 (AlexNet, GoogLeNet) takes
 * s^-3/4 = 1 / (sqrt(s) * sqrt(sqrt(s))), correctly rounded square roots and a division
 * instead of powf. */
#include "common.h"

#include <math.h>
#include <omp.h>

#define LRN_CHUNK 64

ORT_SIMD_CLONES static void lrn_run(const float *restrict x, float *restrict y, int64_t c,
                                    int64_t p, int64_t len, int64_t lo, int64_t hi, float a,
                                    float beta, float bias)
{
    float s[LRN_CHUNK];
    for (int64_t ci = 0; ci < c; ci++) {
        int64_t j0 = ci - lo < 0 ? 0 : ci - lo, j1 = ci + hi + 1 > c ? c : ci + hi + 1;
        for (int64_t i = 0; i < len; i++) s[i] = 0.0f;
        for (int64_t j = j0; j < j1; j++) {
            const float *xr = x + j * p;
            for (int64_t i = 0; i < len; i++) s[i] += xr[i] * xr[i];
        }
        const float *xr = x + ci * p;
        float *yr = y + ci * p;
        if (beta == 0.75f) {
            for (int64_t i = 0; i < len; i++) {
                float q = sqrtf(bias + a * s[i]);
                yr[i] = xr[i] / (q * sqrtf(q));
            }
        } else {
            for (int64_t i = 0; i < len; i++) yr[i] = xr[i] * powf(bias + a * s[i], -beta);
        }
    }
}

int ortcpu_lrn_f32(const float *x, float *y, int64_t n, int64_t c, int64_t p, int64_t size,
                   float alpha, float beta, float bias, int nthreads)
{
    if (n < 0 || c < 0 || p < 0 || size < 1)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "lrn: bad sizes n=%lld c=%lld p=%lld "
                        "size=%lld", (long long)n, (long long)c, (long long)p,
                        (long long)size);
    if (n == 0 || c == 0 || p == 0) return ORTCPU_OK;
    int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
    int64_t runs = (p + LRN_CHUNK - 1) / LRN_CHUNK, units = n * runs;
    float a = alpha / (float)size;
    int t = nthreads < 1 ? 1 : nthreads;
    if ((double)n * (double)c * (double)p < 32768.0 || units < 2 * t || omp_in_parallel())
        t = 1;
#pragma omp parallel for num_threads(t) schedule(static) if (t > 1)
    for (int64_t u = 0; u < units; u++) {
        int64_t s = u / runs, i0 = (u % runs) * LRN_CHUNK;
        int64_t len = p - i0 < LRN_CHUNK ? p - i0 : LRN_CHUNK;
        lrn_run(x + s * c * p + i0, y + s * c * p + i0, c, p, len, lo, hi, a, beta, bias);
    }
    return ORTCPU_OK;
}
