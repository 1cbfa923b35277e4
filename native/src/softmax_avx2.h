/* softmax_avx2.h -- the float32 softmax / log-softmax row in AVX2+FMA intrinsics, for the
 * builds at x86-64-v3 and above (common.h, ISA dispatch). softmax.inc's generic row keeps
 * its reductions in "omp simd" lane arrays that GCC leaves in memory, and pays ~200 cycles
 * of per-row reduction overhead: too much for attention rows of 128.
 *
 * Same arithmetic as the generic row: max (NaN ignored here: a NaN element makes its own
 * e NaN, so the sum, and with it the whole row, is NaN, as the generic row makes it), then
 * e = exp(x - max) stored (softmax) or not (log-softmax) and summed in 32 float lanes
 * flushed into double every 1024 elements, then one scale (or subtract) pass. The exp
 * (below) is cheaper than the scalar tail's ort_exp_nonpos_scaled_f32 and within ~1 ulp
 * of it. */
#ifndef ORTCPU_SOFTMAX_AVX2_H
#define ORTCPU_SOFTMAX_AVX2_H

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 1
#include <immintrin.h>
#define ORT_SOFTMAX_AVX2 1

/* The reduction and polynomial both exps below share: returns e^r, with *t the rounding
 * sum a * log2(e) + 1.5 * 2^23, whose low mantissa bits hold n (n = *t - 1.5 * 2^23). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256
ort_exp_poly_avx2(__m256 a, __m256 *t_out)
{
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 t = _mm256_fmadd_ps(a, _mm256_set1_ps(1.44269504088896341f), magic);
    __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), a);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(0.008290313184261322f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.04189793020486832f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.1666763573884964f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.4999915063381195f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.9999997019767761f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    *t_out = t;
    return p;
}

/* e^a for a <= 0 or NaN. a = n ln2 + r, |r| <= ln2/2; e^r by a degree-5 polynomial fitted
 * for this project (relative-error weighted least squares on Chebyshev nodes, p(0) = 1;
 * max relative error 1.7e-7 evaluated in float32, about 1.4 ulp); 2^n from the bits of
 * the rounding sum, one scale factor. Vectors with lanes in [-104, -87) (where 2^n is
 * not a normal float) take ort_exp_nonpos_scaled_f32's two-factor scaling, so results
 * underflow gradually to the denormals as everywhere else. A NaN a runs through into the result. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256
ort_exp_nonpos_scaled_avx2(__m256 a)
{
    /* lanes below -104 (a masked score's -inf among them) are exactly 0: e^-104 is below
     * half the smallest denormal, and the two-factor scaling rounds them to 0 too. They
     * are zeroed by mask rather than computed: on Intel every multiply that produces (or
     * reads) a denormal or underflows takes a ~150-cycle microcode assist, which made a
     * causal-masked attention softmax 6x slower than an unmasked one (AMD has no such
     * penalty). A NaN a compares false and runs through into the result. */
    const __m256 dead = _mm256_cmp_ps(a, _mm256_set1_ps(-104.0f), _CMP_LT_OQ);
    const __m256 low = _mm256_cmp_ps(a, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    if (!_mm256_movemask_ps(_mm256_andnot_ps(dead, low))) {
        /* every lane is >= -87 (the normal-range exp) or dead */
        __m256 t, p = ort_exp_poly_avx2(_mm256_max_ps(_mm256_set1_ps(-87.0f), a), &t);
        /* t's bits are those of 1.5 * 2^23 plus n: the exponent field is n + 127 */
        __m256i e = _mm256_slli_epi32(
            _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000 - 127)), 23);
        return _mm256_andnot_ps(dead, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
    }
    a = _mm256_max_ps(_mm256_set1_ps(-104.0f), a); /* constant first: a NaN a stays */
    __m256 t, p = ort_exp_poly_avx2(a, &t);
    __m256 n = _mm256_sub_ps(t, _mm256_set1_ps(12582912.0f));
    __m256i ni = _mm256_cvttps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_andnot_ps(dead, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
}

__attribute__((target("avx2,fma"))) static inline double ort_sum8_pd(__m256 v)
{
    __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                              _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* sum over i < n of a[i] * b[i]: 32 float lanes (four vectors, so the adds do not wait
 * on each other) flushed into double every 1024 elements, the scheme of the softmax sum;
 * the softmax backward rows' sum(dY * Y). An "omp simd reduction" into a double instead
 * converts every product to double (half the vector width) and pays a long per-row
 * reduction: 128-wide attention rows ran slower than torch's backward. */
__attribute__((target("avx2,fma"))) static inline double
ort_dot_f32_avx2(const float *restrict a, const float *restrict b, int64_t n)
{
    double s = 0;
    for (int64_t blk = 0; blk < n; blk += 1024) {
        int64_t e = blk + 1024 < n ? blk + 1024 : n, j = blk;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; j + 32 <= e; j += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 16), _mm256_loadu_ps(b + j + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 24), _mm256_loadu_ps(b + j + 24), a3);
        }
        for (; j + 8 <= e; j += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), a0);
        s += ort_sum8_pd(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; j < e; j++) s += (double)(a[j] * b[j]);
    }
    return s;
}

/* e^a for a in [-87, 0] or NaN (the caller has checked the range for the whole row):
 * ort_exp_nonpos_scaled_avx2 without the clamp and the per-vector underflow test. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256
ort_exp_nonpos_inrange_avx2(__m256 a)
{
    __m256 t, p = ort_exp_poly_avx2(a, &t);
    /* t's low mantissa bits hold n (two's complement): shifted by 23 they are n << 23,
     * the magic's own bits shift out */
    __m256i e = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(t), 23),
                                 _mm256_set1_epi32(127 << 23));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e)); /* a NaN p stays NaN */
}

/* sum of e = exp(x - m) over the row, e stored into y unless log_; `inrange` (the row's
 * max - min <= 87, known before) takes the exp without underflow handling. x and y may be
 * the same row (every element is read before it is written; the pointers are not
 * restrict): the masked attention softmax runs the row in place. */
__attribute__((target("avx2,fma"), always_inline)) static inline double
ort_softmax_sumexp_avx2(const float *x, float *y, int64_t n, float m,
                        int log_, int inrange)
{
    const __m256 vm = _mm256_set1_ps(m);
    double s = 0;
    for (int64_t b = 0; b < n; b += 1024) {
        int64_t e = b + 1024 < n ? b + 1024 : n, j = b;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define SM_STEP(acc, off)                                                                \
    do {                                                                                 \
        __m256 d_ = _mm256_sub_ps(_mm256_loadu_ps(x + j + (off)), vm);                   \
        __m256 e_ = inrange ? ort_exp_nonpos_inrange_avx2(d_)                            \
                            : ort_exp_nonpos_scaled_avx2(d_);                            \
        if (!log_) _mm256_storeu_ps(y + j + (off), e_);                                 \
        acc = _mm256_add_ps(acc, e_);                                                    \
    } while (0)
        for (; j + 32 <= e; j += 32) {
            SM_STEP(a0, 0);
            SM_STEP(a1, 8);
            SM_STEP(a2, 16);
            SM_STEP(a3, 24);
        }
        for (; j + 8 <= e; j += 8) SM_STEP(a0, 0);
#undef SM_STEP
        s += ort_sum8_pd(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; j < e; j++) {
            float ev = ort_exp_nonpos_scaled_f32(x[j] - m);
            if (!log_) y[j] = ev;
            s += ev;
        }
    }
    return s;
}

__attribute__((target("avx2,fma"))) static void
ort_softmax_row_f32_avx2(const float *x, float *y, int64_t n, int log_)
{
    int64_t i = 0;
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m256 l0 = _mm256_set1_ps(INFINITY), l1 = l0;
    for (; i + 32 <= n; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        m0 = _mm256_max_ps(m0, v0);
        m1 = _mm256_max_ps(m1, v1);
        m2 = _mm256_max_ps(m2, v2);
        m3 = _mm256_max_ps(m3, v3);
        l0 = _mm256_min_ps(l0, _mm256_min_ps(v0, v1));
        l1 = _mm256_min_ps(l1, _mm256_min_ps(v2, v3));
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        m0 = _mm256_max_ps(m0, v);
        l0 = _mm256_min_ps(l0, v);
    }
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    l0 = _mm256_min_ps(l0, l1);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    __m128 g = _mm_min_ps(_mm256_castps256_ps128(l0), _mm256_extractf128_ps(l0, 1));
    g = _mm_min_ps(g, _mm_movehl_ps(g, g));
    g = _mm_min_ss(g, _mm_shuffle_ps(g, g, 1));
    float m = _mm_cvtss_f32(h), lo = _mm_cvtss_f32(g);
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        lo = x[i] < lo ? x[i] : lo;
    }
    /* no exp underflows (and none of m, lo is inf or NaN, so the test is false then) */
    int inrange = m - lo <= 87.0f;
    double s = inrange ? ort_softmax_sumexp_avx2(x, y, n, m, log_, 1)
                       : ort_softmax_sumexp_avx2(x, y, n, m, log_, 0);

    i = 0;
    const __m256 vm = _mm256_set1_ps(m);
    if (log_) {
        const __m256 lse = _mm256_set1_ps((float)log(s));
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), lse));
        for (; i < n; i++) y[i] = (x[i] - m) - (float)log(s);
    } else {
        const float inv = (float)(1.0 / s);
        const __m256 vinv = _mm256_set1_ps(inv);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vinv));
        for (; i < n; i++) y[i] *= inv;
    }
}
#endif
#endif
