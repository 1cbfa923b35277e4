/* layout16.c -- float32 reorders between NCHW [n][c][p] and the channel-blocked layout
 * [n][cp/16][p][16] (NCHW16c) that the graph executor keeps between its blocked Convs
 * (p = the spatial size; cp >= c a multiple of 16, the channels beyond c zeros). Both
 * directions are 16 x 16 transposes of (16 channels) x (16 positions) tiles; torch's
 * copy_ of the transposed view ran at 3-13 GB/s on [1, 64, 112, 112] and [8, 128, 55, 55]
 * (2 threads, measured). */
#include "common.h"

#include <omp.h>

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
#include <immintrin.h>

#include "transpose512.h"

/* dst column j (dst + j * dstride) = src's column j: the 16 x 16 tile of rows
 * src + i * sstride transposed in registers (each group of four rows lane by lane, then
 * 128-bit lanes gathered from the four groups) */
__attribute__((target("arch=x86-64-v4"))) static void
tr16(const float *src, int64_t sstride, float *dst, int64_t dstride)
{
    __m512 t[16], r[16];
    for (int i = 0; i < 16; i++) t[i] = _mm512_loadu_ps(src + i * sstride);
    for (int i = 0; i < 16; i += 4) /* r[i + j], lane L: column 4L + j of rows i..i+3 */
        ort_tr4_lanes(t + i, r + i);
    for (int j = 0; j < 4; j++) { /* column 4L + j: lane L of the four row groups */
        __m512 lo01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);  /* L0 L2 of groups 0, 1 */
        __m512 hi01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);  /* L1 L3 */
        __m512 lo23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        __m512 hi23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
        _mm512_storeu_ps(dst + j * dstride, _mm512_shuffle_f32x4(lo01, lo23, 0x88));
        _mm512_storeu_ps(dst + (8 + j) * dstride, _mm512_shuffle_f32x4(lo01, lo23, 0xDD));
        _mm512_storeu_ps(dst + (4 + j) * dstride, _mm512_shuffle_f32x4(hi01, hi23, 0x88));
        _mm512_storeu_ps(dst + (12 + j) * dstride, _mm512_shuffle_f32x4(hi01, hi23, 0xDD));
    }
}
#define TR16_VECTOR 1
#endif

/* one 16-channel group of one sample: nchw [cg][p] <-> blocked [p][16], cg <= 16 channels
 * (the last group of a count that is not a multiple of 16: the blocked side's other lanes
 * are zeros, or not read) */
static void reorder_group(const float *restrict src, float *restrict dst, int64_t p, int cg,
                          int to_blocked)
{
    int64_t i = 0;
#ifdef TR16_VECTOR
    for (; cg == 16 && i + 16 <= p; i += 16) {
        if (to_blocked)
            tr16(src + i, p, dst + i * 16, 16);
        else
            tr16(src + i * 16, 16, dst + i, p);
    }
#endif
    for (; i < p; i++)
        for (int c = 0; c < 16; c++) {
            if (to_blocked)
                dst[i * 16 + c] = c < cg ? src[c * p + i] : 0.0f;
            else if (c < cg)
                dst[c * p + i] = src[i * 16 + c];
        }
}

static int reorder16(const float *x, float *y, int64_t n, int64_t c, int64_t cp, int64_t p,
                     int to_blocked, int nthreads)
{
    if (n < 0 || c < 0 || p < 0 || cp % 16 || cp < c)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "reorder nchw16c: bad sizes n=%lld "
                        "c=%lld padded to %lld (a multiple of 16, at least c) p=%lld",
                        (long long)n, (long long)c, (long long)cp, (long long)p);
    int64_t blocks = cp / 16, groups = n * blocks;
    if (groups == 0 || p == 0) return ORTCPU_OK;
    int chunks = ort_num_chunks(groups, 32768 / (16 * p + 1) + 1, nthreads);
#pragma omp parallel for num_threads(chunks) schedule(static) if (chunks > 1)
    for (int64_t g = 0; g < groups; g++) {
        int64_t s = g / blocks, b = g % blocks;
        int64_t cg = c - b * 16 < 16 ? (c - b * 16 > 0 ? c - b * 16 : 0) : 16;
        int64_t at_nchw = (s * c + b * 16) * p, at_blk = g * 16 * p;
        if (to_blocked)
            reorder_group(x + at_nchw, y + at_blk, p, (int)cg, 1);
        else if (cg)
            reorder_group(x + at_blk, y + at_nchw, p, (int)cg, 0);
    }
    return ORTCPU_OK;
}

int ortcpu_to_nchw16c_f32(const float *x, float *y, int64_t n, int64_t c, int64_t cp,
                          int64_t p, int nthreads)
{
    return reorder16(x, y, n, c, cp, p, 1, nthreads);
}

int ortcpu_from_nchw16c_f32(const float *x, float *y, int64_t n, int64_t c, int64_t cp,
                            int64_t p, int nthreads)
{
    return reorder16(x, y, n, c, cp, p, 0, nthreads);
}
