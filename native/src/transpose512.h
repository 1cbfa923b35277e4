/* transpose512.h -- the step that AVX-512 register transposes share (gemm_p16.c's c1_store,
 * layout16.c's 16 x 16 tiles): four registers a, b, c, d, each read as four 128-bit lanes
 * of 4 floats, transposed lane by lane, so that out[j] lane L holds element j of lane L of
 * a, b, c, d in that order. Include after <immintrin.h>, in x86-64-v4 code only. */
#ifndef ORTCPU_TRANSPOSE512_H
#define ORTCPU_TRANSPOSE512_H

__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
ort_tr4_lanes(const __m512 in[4], __m512 out[4])
{
    __m512d ab0 = _mm512_castps_pd(_mm512_unpacklo_ps(in[0], in[1])); /* a0 b0 a1 b1 */
    __m512d ab2 = _mm512_castps_pd(_mm512_unpackhi_ps(in[0], in[1])); /* a2 b2 a3 b3 */
    __m512d cd0 = _mm512_castps_pd(_mm512_unpacklo_ps(in[2], in[3]));
    __m512d cd2 = _mm512_castps_pd(_mm512_unpackhi_ps(in[2], in[3]));
    out[0] = _mm512_castpd_ps(_mm512_unpacklo_pd(ab0, cd0));
    out[1] = _mm512_castpd_ps(_mm512_unpackhi_pd(ab0, cd0));
    out[2] = _mm512_castpd_ps(_mm512_unpacklo_pd(ab2, cd2));
    out[3] = _mm512_castpd_ps(_mm512_unpackhi_pd(ab2, cd2));
}

#endif
