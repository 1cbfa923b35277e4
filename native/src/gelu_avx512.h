/* gelu_avx512.h -- gelu_avx2.h's float32 erf GELU and slope on 16 lanes, for the builds at
 * x86-64-v4: the same pieces, tables and operations in the same order (so the same bits),
 * with the coefficients picked per lane by vpermps over 16 lanes. On an Intel Xeon (Ice
 * Lake) the 8-lane forward ran 25-30% behind torch's AVX-512 GELU. */
#ifndef ORTCPU_GELU_AVX512_H
#define ORTCPU_GELU_AVX512_H

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
#include <immintrin.h>
#include "gelu_avx2.h" /* the tables and ORT_GELU_FAST_LIMIT */
#define ORT_GELU_AVX512 1

#define ORT_GELU512_TARGET __attribute__((target("avx512f,avx512dq,avx512vl,fma")))

/* a table row of ORT_GELU_PIECES (8) floats in the low lanes; k < 8 only reads those */
ORT_GELU512_TARGET static inline __m512 ort_gelu_row512(const float *row)
{
    return _mm512_castps256_ps512(_mm256_loadu_ps(row));
}

ORT_GELU512_TARGET static inline __m512 ort_gelu_poly512(const float (*coef)[ORT_GELU_PIECES],
                                                         __m512i k, __m512 v)
{
    __m512 p = _mm512_permutexvar_ps(k, ort_gelu_row512(coef[ORT_GELU_DEGREE]));
    for (int j = ORT_GELU_DEGREE - 1; j >= 0; j--)
        p = _mm512_fmadd_ps(p, v, _mm512_permutexvar_ps(k, ort_gelu_row512(coef[j])));
    return p;
}

/* piece index and offset of a = |x|; returns 0 unless every lane has |x| < 4 */
ORT_GELU512_TARGET static inline int ort_gelu_piece512(__m512 x, __m512i *k, __m512 *v)
{
    __m512 a = _mm512_abs_ps(x);
    __mmask16 inside = _mm512_cmp_ps_mask(a, _mm512_set1_ps(ORT_GELU_FAST_LIMIT),
                                          _CMP_LT_OQ); /* NaN: false */
    *k = _mm512_cvttps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(2.0f)));
    *v = _mm512_sub_ps(a, _mm512_permutexvar_ps(*k, ort_gelu_row512(ort_gelu_center)));
    return inside == 0xFFFF;
}

/* gelu(x) into *y; 0 (nothing computed) when a lane is outside the fast range */
ORT_GELU512_TARGET static inline int ort_gelu_erf16(__m512 x, __m512 *y)
{
    __m512i k;
    __m512 v;
    if (!ort_gelu_piece512(x, &k, &v)) return 0;
    __m512 h = ort_gelu_poly512(ort_gelu_tail_coef, k, v);
    __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    *y = _mm512_mask_blend_ps(pos, _mm512_mul_ps(x, h), _mm512_fnmadd_ps(x, h, x));
    return 1;
}

/* gelu'(x) into *s; 0 (nothing computed) when a lane is outside the fast range */
ORT_GELU512_TARGET static inline int ort_gelu_erf_slope16(__m512 x, __m512 *s)
{
    __m512i k;
    __m512 v;
    if (!ort_gelu_piece512(x, &k, &v)) return 0;
    __m512 t = ort_gelu_poly512(ort_gelu_slope_coef, k, v);
    __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    *s = _mm512_mask_blend_ps(pos, t, _mm512_sub_ps(_mm512_set1_ps(1.0f), t));
    return 1;
}
#endif
#endif
