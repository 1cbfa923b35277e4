/* norm_simd.h -- the float32 LayerNorm / RMSNorm rows in intrinsics, for the x86-64-v3
 * (AVX2+FMA) and x86-64-v4 (AVX-512) builds (common.h, ISA dispatch). norm.inc's generic
 * rows keep their reductions in 32-lane arrays that GCC leaves in memory and totals with
 * 32 scalar double adds: ~150 cycles per reduction, as much as the arithmetic of a
 * 256-wide row.
 *
 * The rows are written once (below) over a 16-float vector `lnv`: one zmm register in the
 * AVX-512 build, two ymm registers (lanes 0-7, 8-15) in the AVX2 one. Each operation acts
 * lane by lane and the double widening and the horizontal sum follow the same tree in
 * both, so the two builds give bit-identical rows (tests/test_norm.py checks it); the
 * AVX2 pair also gives each sum two independent ymm chains, which its latency needs.
 *
 * Same statistics as the generic rows: sums in float lanes over blocks of LN_BLK elements
 * (32 terms per lane), each block's lanes widened and added in double, the row total in
 * double; the forward takes the mean first and then the squared deviations from it (no
 * cancellation for a large mean). Tails are masked, never read or written past n.
 *
 * Backward of one row (mode 0 LayerNorm, mode 1 RMSNorm with m = 0), g = dy * scale,
 * xc = x - m, mg = mean(g), mgx = mean(g * xc):
 *     dx = inv * (g - mg - xc * inv^2 * mgx) = g * inv - xc * (inv^3 * mgx) - inv * mg
 * pass 1 sums g and g * xc and adds dy * xc * inv and dy into the dscale / dbias
 * partial sums; pass 2 writes dx with one multiply and two FMAs per vector. */
#ifndef ORTCPU_NORM_SIMD_H
#define ORTCPU_NORM_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 1
#include <immintrin.h>
#define ORT_NORM_SIMD 1
#define LN_W 16          /* floats per lnv */
#define LN_BLK (32 * LN_W) /* elements per float-lane block */

#if ORT_ISA_LEVEL >= 2
/* ---- lnv: one AVX-512 register ---- */
#define LN_TGT __attribute__((target("arch=x86-64-v4")))
#define LN_OP LN_TGT __attribute__((always_inline)) static inline
typedef __m512 lnv;   /* 16 floats */
typedef __m512d lnvd; /* 8 doubles: lane j sums float lanes j and j + 8 */
typedef __mmask16 lnk;

LN_OP lnk lnk_first(int64_t r) { return (__mmask16)((1u << r) - 1u); } /* lanes < r */
LN_OP lnv lnv_set1(float a) { return _mm512_set1_ps(a); }
LN_OP lnv lnv_zero(void) { return _mm512_setzero_ps(); }
LN_OP lnvd lnvd_zero(void) { return _mm512_setzero_pd(); }
LN_OP lnv lnv_load(const float *p) { return _mm512_loadu_ps(p); }
LN_OP void lnv_store(float *p, lnv v) { _mm512_storeu_ps(p, v); }
/* lanes off k: 0, not read */
LN_OP lnv lnv_loadz(lnk k, const float *p) { return _mm512_maskz_loadu_ps(k, p); }
/* lanes off k: not written */
LN_OP void lnv_store_k(float *p, lnk k, lnv v) { _mm512_mask_storeu_ps(p, k, v); }
LN_OP lnv lnv_add(lnv a, lnv b) { return _mm512_add_ps(a, b); }
LN_OP lnv lnv_sub(lnv a, lnv b) { return _mm512_sub_ps(a, b); }
LN_OP lnv lnv_mul(lnv a, lnv b) { return _mm512_mul_ps(a, b); }
LN_OP lnv lnv_fmadd(lnv a, lnv b, lnv c) { return _mm512_fmadd_ps(a, b, c); }  /* a*b + c */
LN_OP lnv lnv_fnmadd(lnv a, lnv b, lnv c) { return _mm512_fnmadd_ps(a, b, c); } /* c - a*b */
/* a - b in the lanes on k, 0 in the others */
LN_OP lnv lnv_subz(lnk k, lnv a, lnv b) { return _mm512_maskz_sub_ps(k, a, b); }

/* acc + the 16 lanes of v in double */
LN_OP lnvd lnvd_widen_add(lnvd acc, lnv v)
{
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    return _mm512_add_pd(acc, _mm512_add_pd(lo, hi));
}

/* (lanes 4-7 + lanes 0-3), then the upper pair + the lower, then the two */
LN_OP double lnvd_sum(lnvd v) { return _mm512_reduce_add_pd(v); }

#else
/* ---- lnv: two AVX2 registers, lanes 0-7 in lo, 8-15 in hi ---- */
#define LN_TGT __attribute__((target("arch=x86-64-v3")))
#define LN_OP LN_TGT __attribute__((always_inline)) static inline
typedef struct { __m256 lo, hi; } lnv;
typedef struct { __m256d lo, hi; } lnvd; /* lanes 0-3, 4-7 of the AVX-512 lnvd */
typedef struct { __m256i lo, hi; } lnk;  /* all-ones lanes are on */

LN_OP lnk lnk_first(int64_t r)
{
    __m256i vr = _mm256_set1_epi32((int)r);
    return (lnk){_mm256_cmpgt_epi32(vr, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                 _mm256_cmpgt_epi32(vr, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15))};
}
LN_OP lnv lnv_set1(float a) { return (lnv){_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
LN_OP lnv lnv_zero(void) { return (lnv){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
LN_OP lnvd lnvd_zero(void) { return (lnvd){_mm256_setzero_pd(), _mm256_setzero_pd()}; }
LN_OP lnv lnv_load(const float *p) { return (lnv){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
LN_OP void lnv_store(float *p, lnv v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
/* lanes off k: 0, not read (a masked-off lane of vmaskmovps does not fault) */
LN_OP lnv lnv_loadz(lnk k, const float *p)
{
    return (lnv){_mm256_maskload_ps(p, k.lo), _mm256_maskload_ps(p + 8, k.hi)};
}
/* lanes off k: not written */
LN_OP void lnv_store_k(float *p, lnk k, lnv v)
{
    _mm256_maskstore_ps(p, k.lo, v.lo);
    _mm256_maskstore_ps(p + 8, k.hi, v.hi);
}
#define LN_LANEWISE2(name, op)                                                             \
    LN_OP lnv name(lnv a, lnv b) { return (lnv){op(a.lo, b.lo), op(a.hi, b.hi)}; }
LN_LANEWISE2(lnv_add, _mm256_add_ps)
LN_LANEWISE2(lnv_sub, _mm256_sub_ps)
LN_LANEWISE2(lnv_mul, _mm256_mul_ps)
#undef LN_LANEWISE2
LN_OP lnv lnv_fmadd(lnv a, lnv b, lnv c) /* a*b + c */
{
    return (lnv){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
LN_OP lnv lnv_fnmadd(lnv a, lnv b, lnv c) /* c - a*b */
{
    return (lnv){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
/* a - b in the lanes on k, 0 in the others */
LN_OP lnv lnv_subz(lnk k, lnv a, lnv b)
{
    return (lnv){_mm256_and_ps(_mm256_castsi256_ps(k.lo), _mm256_sub_ps(a.lo, b.lo)),
                 _mm256_and_ps(_mm256_castsi256_ps(k.hi), _mm256_sub_ps(a.hi, b.hi))};
}

/* acc + the 16 lanes of v in double: double lane j gets float lanes j and j + 8, as in
 * the AVX-512 build */
LN_OP lnvd lnvd_widen_add(lnvd acc, lnv v)
{
    __m256d l0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v.lo));   /* lanes 0-3 */
    __m256d h0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v.hi));   /* lanes 8-11 */
    __m256d l1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v.lo, 1)); /* lanes 4-7 */
    __m256d h1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v.hi, 1)); /* lanes 12-15 */
    return (lnvd){_mm256_add_pd(acc.lo, _mm256_add_pd(l0, h0)),
                  _mm256_add_pd(acc.hi, _mm256_add_pd(l1, h1))};
}

/* the tree of _mm512_reduce_add_pd: (lanes 4-7 + lanes 0-3), then the upper pair + the
 * lower, then the two */
LN_OP double lnvd_sum(lnvd v)
{
    __m256d q = _mm256_add_pd(v.hi, v.lo);
    __m128d h = _mm_add_pd(_mm256_extractf128_pd(q, 1), _mm256_castpd256_pd128(q));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}
#endif

/* ---- the rows, once for both builds ---- */

/* The rows x + r * n (r < nr <= 4) at once: sums of x - m[r] (sq = 0) or (x - m[r])^2
 * (sq = 1) into out[r], in float lanes per LN_BLK block, each block's lanes widened into
 * double. Four rows are four independent chains, so a short row's reduction latency
 * (~100 cycles: adds, widening, the horizontal sum) overlaps three others instead of
 * stalling on its own; the last rows of a range take nr < 4. Inlined with a constant nr
 * (ln_sum_rows_simd): with a variable one GCC keeps a test per row and bookkeeping flags
 * in the inner loop. pf (sq = 1 only, or NULL): the next four rows, prefetched into L2
 * line by line. Four rows read at once are four short streams that the hardware
 * prefetcher does not run ahead of, as it does along the rows one at a time: without
 * it, 2048 x 768 rows from memory took 1.2-1.6x as long as one row at a time (AVX2 build,
 * AMD Zen 4), with it 1.0-1.1x; rows in cache take as long with or without it. */
LN_TGT __attribute__((always_inline)) static inline void
ln_sum_rows_nr(const float *x, int64_t n, int nr, const float *m, int sq, double *out,
               const float *pf)
{
    lnv vm[4];
    lnvd d[4];
    for (int r = 0; r < nr; r++) {
        vm[r] = lnv_set1(m[r]);
        d[r] = lnvd_zero();
    }
    int64_t i = 0;
#define LN_TERM(v) (sq ? lnv_mul((v), (v)) : (v))
    while (n - i >= LN_W) {
        int64_t end = n - i > LN_BLK ? i + LN_BLK : n;
        lnv a[4];
        for (int r = 0; r < nr; r++) a[r] = lnv_zero();
        for (; i + LN_W <= end; i += LN_W)
            for (int r = 0; r < nr; r++) {
                if (sq && pf) _mm_prefetch((const char *)(pf + r * n + i), _MM_HINT_T1);
                lnv v = lnv_sub(lnv_load(x + r * n + i), vm[r]);
                a[r] = lnv_add(a[r], LN_TERM(v));
            }
        for (int r = 0; r < nr; r++) d[r] = lnvd_widen_add(d[r], a[r]);
    }
    if (i < n) {
        lnk k = lnk_first(n - i);
        for (int r = 0; r < nr; r++) {
            lnv v = lnv_subz(k, lnv_loadz(k, x + r * n + i), vm[r]);
            d[r] = lnvd_widen_add(d[r], LN_TERM(v));
        }
    }
#undef LN_TERM
    for (int r = 0; r < nr; r++) out[r] = lnvd_sum(d[r]);
}

LN_TGT static void ln_sum_rows_simd(const float *x, int64_t n, int nr, const float *m, int sq,
                                    double *out, const float *pf)
{
    switch (nr) {
    case 1: ln_sum_rows_nr(x, n, 1, m, sq, out, NULL); break;
    case 2: ln_sum_rows_nr(x, n, 2, m, sq, out, NULL); break;
    case 3: ln_sum_rows_nr(x, n, 3, m, sq, out, NULL); break;
    default:
        if (pf) ln_sum_rows_nr(x, n, 4, m, sq, out, pf);
        else ln_sum_rows_nr(x, n, 4, m, sq, out, NULL);
        break;
    }
}

/* y = (x - m) * it * scale + bias on one row; x, y are (n,), scale / bias (n,) or NULL */
LN_TGT static void ln_fwd_out_simd(const float *restrict x, const float *restrict scale,
                                   const float *restrict bias, float *restrict y, int64_t n,
                                   float m, float it)
{
    const lnv vm = lnv_set1(m), vi = lnv_set1(it);
    int64_t i = 0;
    /* one vector of y from index i; LOAD / STORE are full or under the tail's mask k */
#define LN_Y(LOAD, STORE)                                                                \
    do {                                                                                \
        lnv xh = lnv_mul(lnv_sub(LOAD(x), vm), vi);                                     \
        if (scale && bias)                                                              \
            xh = lnv_fmadd(xh, LOAD(scale), LOAD(bias));                                \
        else if (scale)                                                                 \
            xh = lnv_mul(xh, LOAD(scale));                                              \
        else if (bias)                                                                  \
            xh = lnv_add(xh, LOAD(bias));                                               \
        STORE(y, xh);                                                                   \
    } while (0)
#define LN_LD(p) lnv_load((p) + i)
#define LN_ST(p, v) lnv_store((p) + i, (v))
#define LN_LDK(p) lnv_loadz(k, (p) + i)
#define LN_STK(p, v) lnv_store_k((p) + i, k, (v))
    for (; i + LN_W <= n; i += LN_W) LN_Y(LN_LD, LN_ST);
    if (i < n) {
        lnk k = lnk_first(n - i);
        LN_Y(LN_LDK, LN_STK);
    }
#undef LN_Y
}

static inline float ln_inv_std(double ss, int64_t n, double eps)
{
    return (float)(1.0 / sqrt(ss / (double)n + eps));
}

/* rows [b, e) of a [rows, n] x into y; mean / inv are per row (mean NULL or unused for
 * RMSNorm, either may be NULL) */
LN_TGT static void ln_fwd_rows_simd(const float *x, const float *scale, const float *bias,
                                    float *y, float *mean, float *inv, int64_t b, int64_t e,
                                    int64_t n, double eps, int simplified)
{
    for (int64_t r = b; r < e; r += 4) {
        const float *xr = x + r * n;
        int nr = e - r < 4 ? (int)(e - r) : 4;
        float m[4] = {0, 0, 0, 0};
        double s[4];
        /* the next group's rows, fetched into L2 during this group's last pass over x */
        const float *pf = r + 8 <= e ? xr + 4 * n : NULL;
        if (!simplified) {
            ln_sum_rows_simd(xr, n, nr, m, 0, s, NULL);
            for (int j = 0; j < nr; j++) m[j] = (float)(s[j] / (double)n);
        }
        ln_sum_rows_simd(xr, n, nr, m, 1, s, pf);
        /* the rows' divide-sqrt-divide chains (~50 cycles each) side by side, before the
         * output passes: interleaved with them, each short row's pass waited for its own */
        float it[4];
        for (int j = 0; j < nr; j++) it[j] = ln_inv_std(s[j], n, eps);
        for (int j = 0; j < nr; j++) {
            ln_fwd_out_simd(xr + j * n, scale, bias, y + (r + j) * n, n, m[j], it[j]);
            if (mean && !simplified) mean[r + j] = m[j];
            if (inv) inv[r + j] = it[j];
        }
    }
}

/* One backward row, mode 0 (m = the row's mean) or 1 (RMSNorm: m = 0, no mean term).
 * acc_s / acc_b (float, n) accumulate dy * xhat and dy, or are NULL. */
LN_TGT static void ln_bwd_row_simd(const float *restrict dy, const float *restrict x,
                                   const float *restrict scale, float m, float inv,
                                   float *restrict dx, float *restrict acc_s,
                                   float *restrict acc_b, int64_t n, int mode)
{
    const lnv vm = lnv_set1(m), vi = lnv_set1(inv);
    lnvd dg = lnvd_zero(), dgx = lnvd_zero();
    int64_t i = 0;
    /* pass 1 on one vector: g, xc; the dscale / dbias partial sums */
#define LN_P1(LOAD, STORE)                                                               \
    lnv d_ = LOAD(dy);                                                                  \
    lnv g_ = scale ? lnv_mul(d_, LOAD(scale)) : d_;                                     \
    lnv xc_ = lnv_sub(LOAD(x), vm);                                                     \
    if (acc_s) STORE(acc_s, lnv_fmadd(d_, lnv_mul(xc_, vi), LOAD(acc_s)));              \
    if (acc_b) STORE(acc_b, lnv_add(d_, LOAD(acc_b)))
    while (n - i >= LN_W) {
        int64_t end = n - i > LN_BLK ? i + LN_BLK : n;
        lnv a0 = lnv_zero(), a1 = lnv_zero();
        lnv b0 = lnv_zero(), b1 = lnv_zero();
        for (; i + 2 * LN_W <= end; i += 2 * LN_W) {
            {
                LN_P1(LN_LD, LN_ST);
                a0 = lnv_add(a0, g_);
                b0 = lnv_fmadd(g_, xc_, b0);
            }
            i += LN_W;
            {
                LN_P1(LN_LD, LN_ST);
                a1 = lnv_add(a1, g_);
                b1 = lnv_fmadd(g_, xc_, b1);
            }
            i -= LN_W;
        }
        if (i + LN_W <= end) {
            LN_P1(LN_LD, LN_ST);
            a0 = lnv_add(a0, g_);
            b0 = lnv_fmadd(g_, xc_, b0);
            i += LN_W;
        }
        dg = lnvd_widen_add(dg, lnv_add(a0, a1));
        dgx = lnvd_widen_add(dgx, lnv_add(b0, b1));
    }
    if (i < n) {
        lnk k = lnk_first(n - i);
        LN_P1(LN_LDK, LN_STK);
        /* masked-off lanes: d_ = g_ = 0, so they add nothing */
        dg = lnvd_widen_add(dg, g_);
        dgx = lnvd_widen_add(dgx, lnv_mul(g_, xc_));
    }
#undef LN_P1
    double di = inv;
    double mg = mode == 1 ? 0.0 : lnvd_sum(dg) / (double)n;
    double mgx = lnvd_sum(dgx) / (double)n;
    const lnv vk = lnv_set1((float)(di * di * di * mgx));
    const lnv vc = lnv_set1((float)(-di * mg));
#define LN_P2(LOAD, STORE)                                                               \
    do {                                                                                \
        lnv g_ = scale ? lnv_mul(LOAD(dy), LOAD(scale)) : LOAD(dy);                     \
        lnv xc_ = lnv_sub(LOAD(x), vm);                                                 \
        STORE(dx, lnv_fmadd(g_, vi, lnv_fnmadd(xc_, vk, vc)));                          \
    } while (0)
    for (i = 0; i + LN_W <= n; i += LN_W) LN_P2(LN_LD, LN_ST);
    if (i < n) {
        lnk k = lnk_first(n - i);
        LN_P2(LN_LDK, LN_STK);
    }
#undef LN_P2
#undef LN_LD
#undef LN_ST
#undef LN_LDK
#undef LN_STK
}

#endif
#endif
