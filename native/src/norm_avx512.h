/* norm_avx512.h -- the float32 LayerNorm / RMSNorm rows in AVX-512 intrinsics, for the
 * x86-64-v4 build (common.h, ISA dispatch). norm.inc's generic rows keep their
 * reductions in 32-lane arrays that GCC leaves in memory and totals with 32 scalar
 * double adds: ~150 cycles per reduction, as much as the arithmetic of a 256-wide row.
 *
 * Same statistics as the generic rows: sums in float lanes (two 16-lane vectors) over
 * blocks of 512 elements, each block's lanes widened and added in double, the row total
 * in double; the forward takes the mean first and then the squared deviations from it
 * (no cancellation for a large mean). Tails are masked, never read or written past n.
 *
 * Backward of one row (mode 0 LayerNorm, mode 1 RMSNorm with m = 0), g = dy * scale,
 * xc = x - m, mg = mean(g), mgx = mean(g * xc):
 *     dx = inv * (g - mg - xc * inv^2 * mgx) = g * inv - xc * (inv^3 * mgx) - inv * mg
 * pass 1 sums g and g * xc and adds dy * xc * inv and dy into the dscale / dbias
 * partial sums; pass 2 writes dx with one multiply and two FMAs per vector. */
#ifndef ORTCPU_NORM_AVX512_H
#define ORTCPU_NORM_AVX512_H

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
#include <immintrin.h>
#define ORT_NORM_AVX512 1
#define LN_TGT __attribute__((target("arch=x86-64-v4")))
#define LN_BLK 512 /* elements per float-lane block (16 per lane) */

LN_TGT static inline __mmask16 ln_mask(int64_t r) { return (__mmask16)((1u << r) - 1u); }

/* acc + the 16 lanes of v in double */
LN_TGT static inline __m512d ln_widen(__m512d acc, __m512 v)
{
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    return _mm512_add_pd(acc, _mm512_add_pd(lo, hi));
}

/* The rows x + r * n (r < nr <= 4) at once: sums of x - m[r] (sq = 0) or (x - m[r])^2
 * (sq = 1) into out[r], in float lanes per LN_BLK block, each block's lanes widened into
 * double. Four rows are four independent chains, so a short row's reduction latency
 * (~100 cycles: adds, widening, the horizontal sum) overlaps three others instead of
 * stalling on its own; the last rows of a range take nr < 4. */
LN_TGT static inline void ln_sum_rows_avx512(const float *x, int64_t n, int nr, const float *m,
                                             int sq, double *out)
{
    __m512 vm[4];
    __m512d d[4];
    for (int r = 0; r < nr; r++) {
        vm[r] = _mm512_set1_ps(m[r]);
        d[r] = _mm512_setzero_pd();
    }
    int64_t i = 0;
#define LN_TERM(v) (sq ? _mm512_mul_ps((v), (v)) : (v))
    while (n - i >= 16) {
        int64_t end = n - i > LN_BLK ? i + LN_BLK : n;
        __m512 a[4];
        for (int r = 0; r < nr; r++) a[r] = _mm512_setzero_ps();
        for (; i + 16 <= end; i += 16)
            for (int r = 0; r < nr; r++) {
                __m512 v = _mm512_sub_ps(_mm512_loadu_ps(x + r * n + i), vm[r]);
                a[r] = _mm512_add_ps(a[r], LN_TERM(v));
            }
        for (int r = 0; r < nr; r++) d[r] = ln_widen(d[r], a[r]);
    }
    if (i < n) {
        __mmask16 k = ln_mask(n - i);
        for (int r = 0; r < nr; r++) {
            __m512 v = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + r * n + i), vm[r]);
            d[r] = ln_widen(d[r], LN_TERM(v));
        }
    }
#undef LN_TERM
    for (int r = 0; r < nr; r++) out[r] = _mm512_reduce_add_pd(d[r]);
}

/* y = (x - m) * it * scale + bias on one row; x, y are (n,), scale / bias (n,) or NULL */
LN_TGT static void ln_fwd_out_avx512(const float *restrict x, const float *restrict scale,
                                     const float *restrict bias, float *restrict y, int64_t n,
                                     float m, float it)
{
    const __m512 vm = _mm512_set1_ps(m), vi = _mm512_set1_ps(it);
    int64_t i = 0;
    __mmask16 k = 0xFFFF;
    /* one vector of y from index i under mask k */
#define LN_Y(LOADX, LOADP, STORE)                                                        \
    do {                                                                                \
        __m512 xh = _mm512_mul_ps(_mm512_sub_ps(LOADX(x), vm), vi);                     \
        if (scale && bias)                                                              \
            xh = _mm512_fmadd_ps(xh, LOADP(scale), LOADP(bias));                        \
        else if (scale)                                                                 \
            xh = _mm512_mul_ps(xh, LOADP(scale));                                       \
        else if (bias)                                                                  \
            xh = _mm512_add_ps(xh, LOADP(bias));                                        \
        STORE(y, xh);                                                                   \
    } while (0)
#define LN_LD(p) _mm512_loadu_ps((p) + i)
#define LN_ST(p, v) _mm512_storeu_ps((p) + i, (v))
#define LN_LDM(p) _mm512_maskz_loadu_ps(k, (p) + i)
#define LN_STM(p, v) _mm512_mask_storeu_ps((p) + i, k, (v))
    for (; i + 16 <= n; i += 16) LN_Y(LN_LD, LN_LD, LN_ST);
    if (i < n) {
        k = ln_mask(n - i);
        LN_Y(LN_LDM, LN_LDM, LN_STM);
    }
#undef LN_Y
}

static inline float ln_inv_std(double ss, int64_t n, double eps)
{
    return (float)(1.0 / sqrt(ss / (double)n + eps));
}

/* rows [b, e) of a [rows, n] x into y; mean / inv are per row (mean NULL or unused for
 * RMSNorm, either may be NULL) */
LN_TGT static void ln_fwd_rows_avx512(const float *x, const float *scale, const float *bias,
                                      float *y, float *mean, float *inv, int64_t b, int64_t e,
                                      int64_t n, double eps, int simplified)
{
    for (int64_t r = b; r < e; r += 4) {
        const float *xr = x + r * n;
        int nr = e - r < 4 ? (int)(e - r) : 4;
        float m[4] = {0, 0, 0, 0};
        double s[4];
        if (!simplified) {
            ln_sum_rows_avx512(xr, n, nr, m, 0, s);
            for (int j = 0; j < nr; j++) m[j] = (float)(s[j] / (double)n);
        }
        ln_sum_rows_avx512(xr, n, nr, m, 1, s);
        for (int j = 0; j < nr; j++) {
            float it = ln_inv_std(s[j], n, eps);
            ln_fwd_out_avx512(xr + j * n, scale, bias, y + (r + j) * n, n, m[j], it);
            if (mean && !simplified) mean[r + j] = m[j];
            if (inv) inv[r + j] = it;
        }
    }
}

/* One backward row, mode 0 (m = the row's mean) or 1 (RMSNorm: m = 0, no mean term).
 * acc_s / acc_b (float, n) accumulate dy * xhat and dy, or are NULL. */
LN_TGT static void ln_bwd_row_avx512(const float *restrict dy, const float *restrict x,
                                     const float *restrict scale, float m, float inv,
                                     float *restrict dx, float *restrict acc_s,
                                     float *restrict acc_b, int64_t n, int mode)
{
    const __m512 vm = _mm512_set1_ps(m), vi = _mm512_set1_ps(inv);
    __m512d dg = _mm512_setzero_pd(), dgx = _mm512_setzero_pd();
    int64_t i = 0;
    __mmask16 k = 0xFFFF;
    /* pass 1 on one vector: g, xc; the dscale / dbias partial sums */
#define LN_P1(LOAD, STORE)                                                               \
    __m512 d_ = LOAD(dy);                                                               \
    __m512 g_ = scale ? _mm512_mul_ps(d_, LOAD(scale)) : d_;                            \
    __m512 xc_ = _mm512_sub_ps(LOAD(x), vm);                                            \
    if (acc_s) STORE(acc_s, _mm512_fmadd_ps(d_, _mm512_mul_ps(xc_, vi), LOAD(acc_s)));  \
    if (acc_b) STORE(acc_b, _mm512_add_ps(d_, LOAD(acc_b)))
    while (n - i >= 16) {
        int64_t end = n - i > LN_BLK ? i + LN_BLK : n;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
        for (; i + 32 <= end; i += 32) {
            {
                LN_P1(LN_LD, LN_ST);
                a0 = _mm512_add_ps(a0, g_);
                b0 = _mm512_fmadd_ps(g_, xc_, b0);
            }
            i += 16;
            {
                LN_P1(LN_LD, LN_ST);
                a1 = _mm512_add_ps(a1, g_);
                b1 = _mm512_fmadd_ps(g_, xc_, b1);
            }
            i -= 16;
        }
        if (i + 16 <= end) {
            LN_P1(LN_LD, LN_ST);
            a0 = _mm512_add_ps(a0, g_);
            b0 = _mm512_fmadd_ps(g_, xc_, b0);
            i += 16;
        }
        dg = ln_widen(dg, _mm512_add_ps(a0, a1));
        dgx = ln_widen(dgx, _mm512_add_ps(b0, b1));
    }
    if (i < n) {
        k = ln_mask(n - i);
        LN_P1(LN_LDM, LN_STM);
        /* masked-off lanes: d_ = g_ = 0, so they add nothing */
        dg = ln_widen(dg, g_);
        dgx = ln_widen(dgx, _mm512_mul_ps(g_, xc_));
    }
#undef LN_P1
    double di = inv;
    double mg = mode == 1 ? 0.0 : _mm512_reduce_add_pd(dg) / (double)n;
    double mgx = _mm512_reduce_add_pd(dgx) / (double)n;
    const __m512 vk = _mm512_set1_ps((float)(di * di * di * mgx));
    const __m512 vc = _mm512_set1_ps((float)(-di * mg));
#define LN_P2(LOAD, STORE)                                                               \
    do {                                                                                \
        __m512 g_ = scale ? _mm512_mul_ps(LOAD(dy), LOAD(scale)) : LOAD(dy);            \
        __m512 xc_ = _mm512_sub_ps(LOAD(x), vm);                                        \
        STORE(dx, _mm512_fmadd_ps(g_, vi, _mm512_fnmadd_ps(xc_, vk, vc)));              \
    } while (0)
    k = 0xFFFF;
    for (i = 0; i + 16 <= n; i += 16) LN_P2(LN_LD, LN_ST);
    if (i < n) {
        k = ln_mask(n - i);
        LN_P2(LN_LDM, LN_STM);
    }
#undef LN_P2
#undef LN_LD
#undef LN_ST
#undef LN_LDM
#undef LN_STM
}

#endif
#endif
