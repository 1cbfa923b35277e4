/* gelu_avx2.h -- the float32 erf GELU and its slope on 8 lanes in AVX2+FMA intrinsics, for
 * the builds at x86-64-v3 and above (common.h, ISA dispatch; activations.inc calls it).
 *
 * With a = |x| and h(a) = Phi(-a) (the normal CDF's left tail, no cancellation),
 *     gelu(x) = x h          for x <= 0,   x - x h (one fused step) for x > 0;
 * and with s(a) = Phi(-a) - a phi(a) (the slope at -a),
 *     gelu'(x) = s           for x <= 0,   1 - s for x > 0.
 * For a < 4, h and s are degree-7 polynomials in a - c_k on the piece k = floor(2a) (eight
 * pieces of width 1/2, coefficients picked per lane with vpermps): no exp, no division.
 * The tables (gelu_tables.h) come from native/tools/fit_gelu.py, which prints their float32
 * evaluation error: h 1.5e-7 relative, s 1.2e-7 relative to max(|s|, 0.05), so gelu is
 * within ~1.5 ulp of the float64 value on the whole fast range, the left tail included.
 * A vector with any lane at |x| >= 4 (or inf, NaN) reports it and the caller takes the
 * generic exp-based formula for those 8 lanes; pre-activations of a trained network are
 * almost all inside, so that path is rare. */
#ifndef ORTCPU_GELU_AVX2_H
#define ORTCPU_GELU_AVX2_H

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 1
#include <immintrin.h>
#include "gelu_tables.h"
#define ORT_GELU_AVX2 1

#define ORT_GELU_FAST_LIMIT 4.0f /* = ORT_GELU_PIECES * 0.5, the tables' range */

/* the piece's polynomial at v for each lane's piece k */
__attribute__((target("avx2,fma"))) static inline __m256
ort_gelu_poly_avx2(const float (*coef)[ORT_GELU_PIECES], __m256i k, __m256 v)
{
    __m256 p = _mm256_permutevar8x32_ps(_mm256_loadu_ps(coef[ORT_GELU_DEGREE]), k);
    for (int j = ORT_GELU_DEGREE - 1; j >= 0; j--)
        p = _mm256_fmadd_ps(p, v, _mm256_permutevar8x32_ps(_mm256_loadu_ps(coef[j]), k));
    return p;
}

/* piece index and offset of a = |x|; returns 0 unless every lane has |x| < 4 */
__attribute__((target("avx2,fma"))) static inline int
ort_gelu_piece_avx2(__m256 x, __m256i *k, __m256 *v)
{
    __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    int inside = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(ORT_GELU_FAST_LIMIT),
                                                  _CMP_LT_OQ)); /* NaN: false */
    *k = _mm256_cvttps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(2.0f)));
    *v = _mm256_sub_ps(a, _mm256_permutevar8x32_ps(_mm256_loadu_ps(ort_gelu_center), *k));
    return inside == 0xFF;
}

/* gelu(x) into *y; 0 (nothing computed) when a lane is outside the fast range */
__attribute__((target("avx2,fma"))) static inline int ort_gelu_erf8_avx2(__m256 x, __m256 *y)
{
    __m256i k;
    __m256 v;
    if (!ort_gelu_piece_avx2(x, &k, &v)) return 0;
    __m256 h = ort_gelu_poly_avx2(ort_gelu_tail_coef, k, v);
    __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ); /* -0 stays -0 * h */
    *y = _mm256_blendv_ps(_mm256_mul_ps(x, h), _mm256_fnmadd_ps(x, h, x), pos);
    return 1;
}

/* gelu'(x) into *s; 0 (nothing computed) when a lane is outside the fast range */
__attribute__((target("avx2,fma"))) static inline int ort_gelu_erf_slope8_avx2(__m256 x,
                                                                              __m256 *s)
{
    __m256i k;
    __m256 v;
    if (!ort_gelu_piece_avx2(x, &k, &v)) return 0;
    __m256 t = ort_gelu_poly_avx2(ort_gelu_slope_coef, k, v);
    __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ);
    *s = _mm256_blendv_ps(t, _mm256_sub_ps(_mm256_set1_ps(1.0f), t), pos);
    return 1;
}
#endif
#endif
