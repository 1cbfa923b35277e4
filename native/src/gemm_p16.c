/* gemm_p16.c -- float32 GEMM with a pre-packed constant right-hand operand, for the
 * graph executor's weights at small batch (m of a few rows: the MLP at batch 8; on
 * AVX-512 builds up to the transformer's 1024 tokens, see gemm_p16_max_rows).
 *
 * BLAS repacks B on every call: at m = 8 that is as much memory traffic as the GEMM
 * itself, and OpenBLAS measured ~1.5x slower than a pre-packed GEMM there (MKL's
 * cblas_sgemm_pack/compute no faster than OpenBLAS). Here B is packed once (plan time)
 * into panels of 16 columns, each panel k rows of 16 contiguous floats (zero-padded past
 * n); a 4x16 AVX2 micro-kernel (8 accumulators) then streams each panel once per 4 rows,
 * and the optional bias is added as the tile is stored (AVX-512 builds: an 8x32 zmm tile
 * over two panels instead). Threads split the panels.
 * AVX-512 builds also run the graph executor's float32 convolutions on that tile
 * (conv1x1_p16, conv_p16: the implicit GEMM with output positions as the tile's rows).
 * Built at x86-64-v3 and above only (ortcpu_gemm_p16_available() says so). */
#include "common.h"

#include <omp.h>
#include <string.h>

#define P16 16

int64_t ortcpu_gemm_p16_packed_size(int64_t n, int64_t k)
{
    if (n < 0 || k < 0) return -1;
    return (n + P16 - 1) / P16 * P16 * k;
}

int ortcpu_gemm_p16_pack(int trans_b, int64_t n, int64_t k, const float *b, int64_t ldb,
                         float *packed)
{
    if (n < 0 || k < 0 || (n > 0 && k > 0 && ldb < (trans_b ? k : n)))
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm_p16_pack: bad sizes n=%lld k=%lld "
                        "ldb=%lld", (long long)n, (long long)k, (long long)ldb);
    int64_t panels = (n + P16 - 1) / P16;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = packed + p * P16 * k;
        int64_t j0 = p * P16, w = n - j0 < P16 ? n - j0 : P16;
        for (int64_t kk = 0; kk < k; kk++) {
            float *row = dst + kk * P16;
            for (int64_t j = 0; j < w; j++)
                row[j] = trans_b ? b[(j0 + j) * ldb + kk] : b[kk * ldb + j0 + j];
            for (int64_t j = w; j < P16; j++) row[j] = 0.0f;
        }
    }
    return ORTCPU_OK;
}

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 1
#include <immintrin.h>

#include "transpose512.h"

int ortcpu_gemm_p16_available(void) { return 1; }

/* Zen 5, 1 and 2 threads, against OpenBLAS on its SkylakeX kernels at the MLP's and the
 * transformer's weight shapes (k 256-1024, n 256-1024): the 8x32 zmm tile 1.6-4x as fast
 * at m <= 32, 1.2-1.6x at 64-128, 1.1-1.2x at 256, 0.96-1.12x at 1024; the 4x16 ymm tile
 * (AVX2 builds) ties the BLAS at m = 32 and trails it 15-20% at 128 */
int64_t ortcpu_gemm_p16_max_rows(void) { return ORT_ISA_LEVEL >= 2 ? 1024 : 16; }

/* rows [0, R) of C's panel: C[r, j0:j0+w] = A[r, :] . P + bias[j0:j0+w]. Named
 * accumulators, not an array: GCC kept an array on the stack, storing it every step. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
p16_store(__m256 lo, __m256 hi, const float *restrict bias, float *restrict c, int64_t w)
{
    if (w == P16) {
        if (bias) {
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
        }
        _mm256_storeu_ps(c, lo);
        _mm256_storeu_ps(c + 8, hi);
        return;
    }
    float t[P16];
    _mm256_storeu_ps(t, lo);
    _mm256_storeu_ps(t + 8, hi);
    for (int64_t j = 0; j < w; j++) c[j] = t[j] + (bias ? bias[j] : 0.0f);
}

/* one row: the k steps in 4 interleaved chains (8 accumulators), else the FMA latency
 * bounds it (batch-1 inference) */
__attribute__((target("avx2,fma"))) static void
p16_row(const float *restrict a, const float *restrict p, int64_t k,
        const float *restrict bias, float *restrict c, int64_t w)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0,
           s7 = s0;
    int64_t kk = 0;
    for (; kk + 4 <= k; kk += 4) {
        const float *q = p + kk * P16;
        _mm_prefetch((const char *)(q + 24 * P16), _MM_HINT_T0);
        _mm_prefetch((const char *)(q + 25 * P16), _MM_HINT_T0);
        _mm_prefetch((const char *)(q + 26 * P16), _MM_HINT_T0);
        _mm_prefetch((const char *)(q + 27 * P16), _MM_HINT_T0);
        __m256 a0 = _mm256_broadcast_ss(a + kk), a1 = _mm256_broadcast_ss(a + kk + 1);
        __m256 a2 = _mm256_broadcast_ss(a + kk + 2), a3 = _mm256_broadcast_ss(a + kk + 3);
        s0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(q), s0);
        s1 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(q + 8), s1);
        s2 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(q + 16), s2);
        s3 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(q + 24), s3);
        s4 = _mm256_fmadd_ps(a2, _mm256_loadu_ps(q + 32), s4);
        s5 = _mm256_fmadd_ps(a2, _mm256_loadu_ps(q + 40), s5);
        s6 = _mm256_fmadd_ps(a3, _mm256_loadu_ps(q + 48), s6);
        s7 = _mm256_fmadd_ps(a3, _mm256_loadu_ps(q + 56), s7);
    }
    for (; kk < k; kk++) {
        __m256 av = _mm256_broadcast_ss(a + kk);
        s0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(p + kk * P16), s0);
        s1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(p + kk * P16 + 8), s1);
    }
    p16_store(_mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s4, s6)),
              _mm256_add_ps(_mm256_add_ps(s1, s3), _mm256_add_ps(s5, s7)), bias, c, w);
}

__attribute__((target("avx2,fma"), always_inline)) static inline void
p16_tile(int R, const float *restrict a, int64_t lda, const float *restrict p, int64_t k,
         const float *restrict bias, float *restrict c, int64_t ldc, int64_t w)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00;
    const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    for (int64_t kk = 0; kk < k; kk++) {
        /* one panel row is one cache line: fetch 24 rows ahead (the weight streams from
         * memory at batch sizes this GEMM serves) */
        _mm_prefetch((const char *)(p + (kk + 24) * P16), _MM_HINT_T0);
        __m256 b0 = _mm256_loadu_ps(p + kk * P16), b1 = _mm256_loadu_ps(p + kk * P16 + 8);
        __m256 av = _mm256_broadcast_ss(a0 + kk);
        c00 = _mm256_fmadd_ps(av, b0, c00);
        c01 = _mm256_fmadd_ps(av, b1, c01);
        if (R > 1) {
            av = _mm256_broadcast_ss(a1 + kk);
            c10 = _mm256_fmadd_ps(av, b0, c10);
            c11 = _mm256_fmadd_ps(av, b1, c11);
        }
        if (R > 2) {
            av = _mm256_broadcast_ss(a2 + kk);
            c20 = _mm256_fmadd_ps(av, b0, c20);
            c21 = _mm256_fmadd_ps(av, b1, c21);
        }
        if (R > 3) {
            av = _mm256_broadcast_ss(a3 + kk);
            c30 = _mm256_fmadd_ps(av, b0, c30);
            c31 = _mm256_fmadd_ps(av, b1, c31);
        }
    }
    p16_store(c00, c01, bias, c, w);
    if (R > 1) p16_store(c10, c11, bias, c + ldc, w);
    if (R > 2) p16_store(c20, c21, bias, c + 2 * ldc, w);
    if (R > 3) p16_store(c30, c31, bias, c + 3 * ldc, w);
}

#if ORT_ISA_LEVEL >= 2
/* AVX-512 builds: up to 8 rows x 2 panels (32 columns) a tile, 16 zmm accumulators; one
 * panel row is one zmm and one cache line. A k step is 2 loads, R broadcasts and 2R FMAs,
 * so the FMA units, not the loads, bound it (the 4x16 ymm tile above runs at half the
 * AVX-512 FMA rate). R is a constant in each call (the callers' switches), so the
 * accumulator arrays unroll into registers. */
#define P16_R512 8
/* panel rows (one cache line each) fetched ahead of the tile's loads: a plan's weights
 * come from memory on a graph's first pass over them (more than the L3 holds) */
#ifndef P16_AHEAD
#define P16_AHEAD 96
#endif
/* input floats fetched ahead along a conv tile's rows: a 1x1 or 3x3 tile reads 8
 * consecutive floats from each of its k (channel, tap) rows, k streams too many for the
 * hardware prefetchers when the input comes from memory (squeezenet's 128->16 squeeze on
 * 8x55x55: 1.2 ms cold against 0.56 ms warm) */
#ifndef P16_XAHEAD
#define P16_XAHEAD 64
#endif
/* the same for channel-blocked X (conv1x1_nchw16c), whose 8 positions of a tile are 8
 * lines: two tiles ahead. 8x256x56x56 and 8x512x28x28 chains, 2 threads: without it the
 * blocked layout ran 0.65-0.71x the speed of NCHW, with it 1.05-1.10x */
#ifndef P16_BAHEAD
#define P16_BAHEAD 256
#endif

__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
p16_put512(__m512 v, const float *restrict bias, float *restrict c, int64_t w)
{
    __mmask16 m = w >= P16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias));
    _mm512_mask_storeu_ps(c, m, v);
}

/* C[0:R, 0:w0] from panel p0 and, when p1 is not NULL, C[0:R, 16:16+w1] from p1 */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
p16_tile512(int R, const float *restrict a, int64_t lda, const float *restrict p0,
            const float *restrict p1, int64_t k, const float *restrict bias,
            float *restrict c, int64_t ldc, int64_t w0, int64_t w1)
{
    __m512 c0[P16_R512], c1[P16_R512];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    if (p1) {
        for (int64_t kk = 0; kk < k; kk++) {
            _mm_prefetch((const char *)(p0 + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
            _mm_prefetch((const char *)(p1 + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
            __m512 b0 = _mm512_loadu_ps(p0 + kk * P16), b1 = _mm512_loadu_ps(p1 + kk * P16);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m512 av = _mm512_set1_ps(a[i * lda + kk]);
                c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
                c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
            }
        }
    } else {
        for (int64_t kk = 0; kk < k; kk++) {
            _mm_prefetch((const char *)(p0 + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
            __m512 b0 = _mm512_loadu_ps(p0 + kk * P16);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                c0[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[i * lda + kk]), b0, c0[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        p16_put512(c0[i], bias, c + i * ldc, w0);
        if (p1) p16_put512(c1[i], bias ? bias + P16 : NULL, c + i * ldc + P16, w1);
    }
}

/* panels [p0, p1) two at a time (one left alone when their count is odd); rows in
 * blocks of 8, the panel pair staying in L1/L2 across the blocks; a single row runs the
 * latency-hiding p16_row per panel (batch-1 inference streams the weight from memory) */
__attribute__((target("arch=x86-64-v4"))) static void
p16_panels(int64_t p0, int64_t p1, int64_t m, int64_t n, int64_t k, const float *a,
           int64_t lda, const float *packed, const float *bias, float *c, int64_t ldc)
{
    for (int64_t p = p0; p < p1; p += 2) {
        const float *pa = packed + p * P16 * k, *pb = p + 1 < p1 ? pa + P16 * k : NULL;
        int64_t j0 = p * P16, w0 = n - j0 < P16 ? n - j0 : P16;
        int64_t w1 = pb ? (n - j0 - P16 < P16 ? n - j0 - P16 : P16) : 0;
        const float *bj = bias ? bias + j0 : NULL;
        if (m == 1) {
            p16_row(a, pa, k, bj, c + j0, w0);
            if (pb) p16_row(a, pb, k, bias ? bj + P16 : NULL, c + j0 + P16, w1);
            continue;
        }
        for (int64_t i = 0; i < m; i += P16_R512) {
            const float *ai = a + i * lda;
            float *ci = c + i * ldc + j0;
            switch (m - i < P16_R512 ? m - i : P16_R512) {
            case 8: p16_tile512(8, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            case 7: p16_tile512(7, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            case 6: p16_tile512(6, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            case 5: p16_tile512(5, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            case 4: p16_tile512(4, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            case 3: p16_tile512(3, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            case 2: p16_tile512(2, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            default: p16_tile512(1, ai, lda, pa, pb, k, bj, ci, ldc, w0, w1); break;
            }
        }
    }
}

/* ---- 1x1 convolution on the same tile (conv1x1_p16) --------------------------------
 * Y_s (n channels x p positions) = W . X_s as its transpose Y_s^T = X_s^T . W^T: the
 * tile's rows are 8 consecutive positions, broadcast straight from X_s's channel rows
 * (NCHW: row kk of X_s^T's column block is x[kk * p + i .. i + 8)), its columns two
 * panels of W^T (32 output channels). The tile leaves the registers transposed, 8x8
 * blocks at a time, so Y is written in NCHW as well; bias and (without a residual) ReLU
 * are applied before, the residual addend after the transpose. */

/* channel j's 8 positions (R real, ``rows``) of c1_store's joined registers v, + res,
 * ReLU, into y's channel row j */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
c1_put(const __m512 v[8], int j, __mmask8 rows, const float *restrict res, int relu,
       float *restrict y, int64_t p)
{
    __m512 z = v[(j >> 3) * 4 + (j & 3)];
    __m256 x8 = (j >> 2) & 1 ? _mm512_extractf32x8_ps(z, 1) : _mm512_castps512_ps256(z);
    if (res) {
        x8 = _mm256_add_ps(x8, _mm256_maskz_loadu_ps(rows, res + j * p));
        if (relu) x8 = _mm256_max_ps(_mm256_setzero_ps(), x8); /* NaN kept */
    }
    _mm256_mask_storeu_ps(y + j * p, rows, x8);
}

/* 16 output channels (of which w are real) x 8 positions (R real) from c[0..8) (row r:
 * position r, lanes: channels) into y (channel rows p apart), + res (same layout), ReLU.
 * The transpose runs on whole zmm registers: pairs of rows interleaved (unpack ps, then
 * pd), then each channel's two 4-position halves joined by one two-source permute, so a
 * register holds two channels' 8 positions: 24 shuffles and 8 extracts for the 16
 * channels, where two 8x8 ymm transposes took 48 and 8. Zen 5, 1 thread: squeezenet's
 * 3x3/2 stem (k = 27) 106 -> 141 GFLOPS, 1x1 convolutions at k = 16-64 +1-4% */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
c1_store(__m512 c[8], int R, int64_t w, const float *restrict res, int relu,
         float *restrict y, int64_t p)
{
    __mmask8 rows = (__mmask8)((1u << R) - 1);
    __m512 u[8], v[8];
    ort_tr4_lanes(c, u);
    ort_tr4_lanes(c + 4, u + 4);
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29,
                                         30, 31);
    for (int q = 0; q < 4; q++) {
        v[q] = _mm512_permutex2var_ps(u[q], lo, u[4 + q]);
        v[4 + q] = _mm512_permutex2var_ps(u[q], hi, u[4 + q]);
    }
    if (w == P16) { /* constant indices: v stays in registers */
#pragma GCC unroll 16
        for (int j = 0; j < P16; j++) c1_put(v, j, rows, res, relu, y, p);
    } else {
        for (int j = 0; j < w; j++) c1_put(v, j, rows, res, relu, y, p);
    }
}

/* channel-blocked X: a block's 16 reduction steps read the same lines, so step kk fetches
 * one of the 8 lines `ahead` floats on from its block's (kk & 15 is the channel in the
 * block, reductions run (block, tap, channel)) */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
cb_fetch(const float *xr, int64_t kk, int64_t ahead)
{
    _mm_prefetch((const char *)(xr - (kk & 15) + ahead + (kk & 7) * P16), _MM_HINT_T0);
}

/* rows [0, R) of c (position i: 16 channels of one block) + res, ReLU, into y at i * 16
 * (channel-blocked layout, conv1x1_nchw16c): one full zmm store a row, no transpose */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
cb_store(const __m512 c[8], int R, const float *restrict res, int relu, float *restrict y)
{
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        __m512 v = c[i];
        if (res) {
            v = _mm512_add_ps(v, _mm512_loadu_ps(res + i * P16));
            if (relu) v = _mm512_max_ps(_mm512_setzero_ps(), v); /* NaN kept */
        }
        _mm512_storeu_ps(y + i * P16, v);
    }
}

/* ---- channel-blocked tensors on a wider tile (conv1x1_nchw16c and conv_nchw16c where
 * the output channels are a multiple of 64) ------------------------------------------
 * 6 positions (s floats apart) x 64 output channels (4 panels): 24 accumulators, and a
 * reduction step is 4 panel loads and 6 broadcasts for 24 FMAs, where the 8 x 32 tile
 * takes 10 loads for 16. Written in C here for conv_nchw_to16c (X NCHW: a step's offset
 * from a table); blocked X runs the same tile as cq_asm_R below
 * (onnxruntime's NCHWc kernels use this shape). On blocked X a step's 6 positions are 6
 * lines, which serve the block's 16 steps. Zen 5, interleaved with conv1x1_p16 (NCHW) and
 * the 8 x 32 tile on blocked tensors: +0-23% over NCHW on one thread, +1-17% on two,
 * where the 8 x 32 tile on blocked tensors ran 0.85-1.0x NCHW. */
#define CQ_R 6
/* the longest reduction of cq_tile (NCHW X; resnet50's 14x14 3x3s, 576 KB of panels): a
 * unit streams its 4 panels (256 bytes a step) once per tile, so they must stay in L2
 * (1 MB) beside the rest; longer ones run the 8 x 32 tile, whose reductions run in slices
 * or pair-major (resnet50's 7x7 512 -> 512 3x3, k = 4608: 0.56x of NCHW on cq_tile).
 * Blocked X (cq_run) takes any reduction, in slices. */
#define CQ_MAX_K 2304

/* the length of tile t of a run of len positions cut into ceil(len / CQ_R) tiles of
 * near-equal lengths: no leftover tile of 1-2 positions, whose 4-8 accumulators leave
 * the FMA units waiting on their latency (a 7-wide 3x3 row as 6 + 1: 0.6x of NCHW) */
static inline int cq_len(int64_t len, int64_t t)
{
    int64_t tiles = (len + CQ_R - 1) / CQ_R, base = len / tiles;
    return (int)(base + (t < len % tiles));
}

__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
cq_tile(int R, const float *restrict xb, const int64_t *restrict off, int64_t s,
        const float *restrict pk, int64_t k, const float *restrict bias, const float *res,
        int relu, float *y, int64_t p)
{
    __m512 c[4][CQ_R];
#pragma GCC unroll 6
    for (int i = 0; i < CQ_R; i++)
        c[0][i] = c[1][i] = c[2][i] = c[3][i] = _mm512_setzero_ps();
    const float *p0 = pk, *p1 = pk + P16 * k, *p2 = pk + 2 * P16 * k, *p3 = pk + 3 * P16 * k;
    for (int64_t kk = 0; kk < k; kk++) {
        _mm_prefetch((const char *)(p0 + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
        _mm_prefetch((const char *)(p1 + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
        _mm_prefetch((const char *)(p2 + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
        _mm_prefetch((const char *)(p3 + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
        __m512 b0 = _mm512_loadu_ps(p0 + kk * P16), b1 = _mm512_loadu_ps(p1 + kk * P16);
        __m512 b2 = _mm512_loadu_ps(p2 + kk * P16), b3 = _mm512_loadu_ps(p3 + kk * P16);
        const float *xr = xb + off[kk];
        cb_fetch(xr, kk, 2 * CQ_R * s); /* two tiles on */
#pragma GCC unroll 6
        for (int i = 0; i < R; i++) {
            __m512 av = _mm512_set1_ps(xr[i * s]);
            c[0][i] = _mm512_fmadd_ps(av, b0, c[0][i]);
            c[1][i] = _mm512_fmadd_ps(av, b1, c[1][i]);
            c[2][i] = _mm512_fmadd_ps(av, b2, c[2][i]);
            c[3][i] = _mm512_fmadd_ps(av, b3, c[3][i]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512 bv = bias ? _mm512_loadu_ps(bias + q * P16) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int i = 0; i < R; i++) {
            c[q][i] = _mm512_add_ps(c[q][i], bv);
            if (relu && !res) c[q][i] = _mm512_max_ps(_mm512_setzero_ps(), c[q][i]);
        }
        cb_store(c[q], R, res ? res + q * p * P16 : NULL, relu, y + q * p * P16);
    }
}

/* ---- cq_tile's reduction in assembly ------------------------------------------------
 * For channel-blocked X (reductions in whole 16-step blocks ordered (block, tap, channel),
 * so the 16 steps of a block read X at off[block] + channel): the offset is read once a
 * block and its 16 steps are written out with constant displacements, 24 FMAs, 4 panel
 * loads, R broadcasts, one X prefetch and (CQ_FETCH) 4 panel prefetches a step. GCC's code for the same loop spent ~60
 * instructions on a step (offset table reads, address arithmetic, spills when unrolled),
 * more than the 5-wide front end issues in the FMAs' 12 cycles. Accumulators: zmm(4i+q)
 * for position i and panel q; panels in zmm24-27, broadcasts in zmm28-29. Same sums in
 * the same order as cq_tile (bitwise equal). Intel Ice Lake, alternating with cq_tile in
 * one process, weights cold: resnet50's 3x3s and 1x1s +2-9% on one thread, +3-6% on
 * two (56x56 64 -> 64 3x3: 142 -> 149 GFLOPS of a 161 peak). */
#define CQ_FMA4(bc, a0, a1, a2, a3)                                                       \
    "vfmadd231ps %%zmm24, %%zmm" bc ", %%zmm" a0 "\n\t"                                     \
    "vfmadd231ps %%zmm25, %%zmm" bc ", %%zmm" a1 "\n\t"                                     \
    "vfmadd231ps %%zmm26, %%zmm" bc ", %%zmm" a2 "\n\t"                                     \
    "vfmadd231ps %%zmm27, %%zmm" bc ", %%zmm" a3 "\n\t"
#define CQ_POS_1(d) "vbroadcastss " d "(%[x]), %%zmm28\n\t" CQ_FMA4("28", "0", "1", "2", "3")
#define CQ_POS_2(d) CQ_POS_1(d) "vbroadcastss " d "(%[x],%[s],1), %%zmm29\n\t"           \
    CQ_FMA4("29", "4", "5", "6", "7")
#define CQ_POS_3(d) CQ_POS_2(d) "vbroadcastss " d "(%[x],%[s],2), %%zmm28\n\t"           \
    CQ_FMA4("28", "8", "9", "10", "11")
#define CQ_POS_4(d) CQ_POS_3(d) "vbroadcastss " d "(%[x3]), %%zmm29\n\t"                 \
    CQ_FMA4("29", "12", "13", "14", "15")
#define CQ_POS_5(d) CQ_POS_4(d) "vbroadcastss " d "(%[x],%[s],4), %%zmm28\n\t"           \
    CQ_FMA4("28", "16", "17", "18", "19")
#define CQ_POS_6(d) CQ_POS_5(d) "vbroadcastss " d "(%[x3],%[s],2), %%zmm29\n\t"          \
    CQ_FMA4("29", "20", "21", "22", "23")
/* step ci: the 4 panels' rows (panel q at p0 + q * ks), with FETCH(ci) the same rows
 * P16_AHEAD steps on fetched (CQ_FETCH) or not (CQ_NO_FETCH); one line of X two tiles on
 * (xa) fetched a step, the block's 8 lines twice */
#define CQ_FETCH(ci)                                                                        \
    "prefetcht0 " #ci "*64+64*" CQ_STR(P16_AHEAD) "(%[p0])\n\t"                              \
    "prefetcht0 " #ci "*64+64*" CQ_STR(P16_AHEAD) "(%[p0],%[ks],1)\n\t"                      \
    "prefetcht0 " #ci "*64+64*" CQ_STR(P16_AHEAD) "(%[p0],%[ks],2)\n\t"                      \
    "prefetcht0 " #ci "*64+64*" CQ_STR(P16_AHEAD) "(%[p3])\n\t"
#define CQ_NO_FETCH(ci)
#define CQ_LOADS(ci, FETCH)                                                                 \
    FETCH(ci)                                                                               \
    "prefetcht0 (" #ci "&7)*64(%[xa])\n\t"                                                  \
    "vmovups " #ci "*64(%[p0]), %%zmm24\n\t"                                                 \
    "vmovups " #ci "*64(%[p0],%[ks],1), %%zmm25\n\t"                                         \
    "vmovups " #ci "*64(%[p0],%[ks],2), %%zmm26\n\t"                                         \
    "vmovups " #ci "*64(%[p3]), %%zmm27\n\t"
#define CQ_STR2(v) #v
#define CQ_STR(v) CQ_STR2(v)
#define CQ_STEP(R, ci, F) CQ_LOADS(ci, F) CQ_POS_##R(#ci "*4")
#define CQ_BLOCK(R, F)                                                                      \
    CQ_STEP(R, 0, F) CQ_STEP(R, 1, F) CQ_STEP(R, 2, F) CQ_STEP(R, 3, F) CQ_STEP(R, 4, F)    \
    CQ_STEP(R, 5, F) CQ_STEP(R, 6, F) CQ_STEP(R, 7, F) CQ_STEP(R, 8, F) CQ_STEP(R, 9, F)    \
    CQ_STEP(R, 10, F) CQ_STEP(R, 11, F) CQ_STEP(R, 12, F) CQ_STEP(R, 13, F)                 \
    CQ_STEP(R, 14, F) CQ_STEP(R, 15, F)
#define CQ_ZERO4(a, b, c, d)                                                                \
    "vpxord %%zmm" a ", %%zmm" a ", %%zmm" a "\n\t" "vmovaps %%zmm" a ", %%zmm" b "\n\t"    \
    "vmovaps %%zmm" a ", %%zmm" c "\n\t" "vmovaps %%zmm" a ", %%zmm" d "\n\t"
#define CQ_LOAD4(o, a, b, c, d)                                                             \
    "vmovaps " #o "*256+0(%[acc]), %%zmm" a "\n\t"                                          \
    "vmovaps " #o "*256+64(%[acc]), %%zmm" b "\n\t"                                         \
    "vmovaps " #o "*256+128(%[acc]), %%zmm" c "\n\t"                                        \
    "vmovaps " #o "*256+192(%[acc]), %%zmm" d "\n\t"
#define CQ_STORE4(o, a, b, c, d)                                                            \
    "vmovaps %%zmm" a ", " #o "*256+0(%[acc])\n\t"                                          \
    "vmovaps %%zmm" b ", " #o "*256+64(%[acc])\n\t"                                         \
    "vmovaps %%zmm" c ", " #o "*256+128(%[acc])\n\t"                                        \
    "vmovaps %%zmm" d ", " #o "*256+192(%[acc])\n\t"
/* cq_asm_R: acc[i][q] (16 floats each, 64-byte aligned, all 6 x 4 written) = (k0 > 0:
 * acc[i][q] +) reduction steps [k0, k1) of position i (i < R; X at xb + off[step] +
 * i * s) against panel q (pk + q * 16 * k); k0 < k1 multiples of 16 */
#define CQ_ASM(R, NAME, FETCH)                                                              \
    __attribute__((target("arch=x86-64-v4"))) static void                                   \
    NAME(const float *xb, const int64_t *off, int64_t s, const float *pk, int64_t k,        \
         int64_t k0, int64_t k1, float *acc)                                                \
    {                                                                                       \
        const float *p0 = pk + k0 * P16, *p3 = p0 + 3 * P16 * k, *x, *x3, *xa;             \
        int64_t ks = P16 * k * 4, sb = s * 4, ahead = 2 * CQ_R * s * 4;                    \
        int64_t blocks = (k1 - k0) / P16;                                                   \
        const int64_t *o = off + k0;                                                        \
        __asm__ volatile(                                                                   \
            "testq %[k0], %[k0]\n\t"                                                        \
            "jnz 2f\n\t"                                                                    \
            CQ_ZERO4("0", "1", "2", "3") CQ_ZERO4("4", "5", "6", "7")                       \
            CQ_ZERO4("8", "9", "10", "11") CQ_ZERO4("12", "13", "14", "15")                 \
            CQ_ZERO4("16", "17", "18", "19") CQ_ZERO4("20", "21", "22", "23")               \
            "jmp 1f\n\t"                                                                    \
            "2:\n\t"                                                                        \
            CQ_LOAD4(0, "0", "1", "2", "3") CQ_LOAD4(1, "4", "5", "6", "7")                 \
            CQ_LOAD4(2, "8", "9", "10", "11") CQ_LOAD4(3, "12", "13", "14", "15")           \
            CQ_LOAD4(4, "16", "17", "18", "19") CQ_LOAD4(5, "20", "21", "22", "23")         \
            "1:\n\t"                                                                        \
            "movq (%[off]), %[x]\n\t"                                                       \
            "leaq (%[xb],%[x],4), %[x]\n\t"                                                 \
            "leaq (%[x],%[s],2), %[x3]\n\t"                                                 \
            "addq %[s], %[x3]\n\t"                                                          \
            "leaq (%[x],%[ahead],1), %[xa]\n\t"                                             \
            CQ_BLOCK(R, FETCH)                                                              \
            "addq $1024, %[p0]\n\t"                                                         \
            "addq $1024, %[p3]\n\t"                                                         \
            "addq $128, %[off]\n\t"                                                         \
            "decq %[blocks]\n\t"                                                            \
            "jnz 1b\n\t"                                                                    \
            CQ_STORE4(0, "0", "1", "2", "3") CQ_STORE4(1, "4", "5", "6", "7")               \
            CQ_STORE4(2, "8", "9", "10", "11") CQ_STORE4(3, "12", "13", "14", "15")         \
            CQ_STORE4(4, "16", "17", "18", "19") CQ_STORE4(5, "20", "21", "22", "23")       \
            : [p0] "+r"(p0), [p3] "+r"(p3), [off] "+r"(o), [blocks] "+r"(blocks),           \
              [x] "=&r"(x), [x3] "=&r"(x3), [xa] "=&r"(xa)                                  \
            : [xb] "r"(xb), [s] "r"(sb), [ks] "r"(ks), [ahead] "r"(ahead), [acc] "r"(acc),  \
              [k0] "r"(k0)                                                                  \
            : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",      \
              "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", \
              "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",       \
              "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29");                        \
    }
/* cq_asm_R (fetching) and cq_asm_R_nf (CQ_NO_FETCH) */
#define CQ_ASM_BOTH(R) CQ_ASM(R, cq_asm_##R, CQ_FETCH) CQ_ASM(R, cq_asm_##R##_nf, CQ_NO_FETCH)
CQ_ASM_BOTH(1)
CQ_ASM_BOTH(2)
CQ_ASM_BOTH(3)
CQ_ASM_BOTH(4)
CQ_ASM_BOTH(5)
CQ_ASM_BOTH(6)
typedef void (*cq_asm_fn)(const float *, const int64_t *, int64_t, const float *, int64_t,
                          int64_t, int64_t, float *);
/* [fetch][R] */
static const cq_asm_fn cq_asm[2][CQ_R + 1] = {
    {NULL, cq_asm_1_nf, cq_asm_2_nf, cq_asm_3_nf, cq_asm_4_nf, cq_asm_5_nf, cq_asm_6_nf},
    {NULL, cq_asm_1, cq_asm_2, cq_asm_3, cq_asm_4, cq_asm_5, cq_asm_6}};

/* ---- the reduction in slices ---------------------------------------------------------
 * A tile's panel pair is 128 bytes per reduction step: at k = 512 it is 64 KB, more than
 * L1, and every tile streamed it from L2 again (conv1x1_p16 on one Zen 5 core: 206 GFLOPS
 * at k = 128, 181 at k = 512). conv1x1_p16 therefore runs long reductions in slices of
 * P16_KC steps over a block of P16_TB tiles, the slice of the pair staying in L1 across
 * the block and each tile's partial sums waiting in a small buffer (P16_ACC floats)
 * between slices: 5-6% faster at k = 512 (56x56 and 13x13 maps; interleaved runs, one
 * core). conv_p16's blocks would be one output row (1-7 tiles), where slices measured up
 * to 12% slower (7x7 512 -> 512 3x3), so it reads whole reductions. */
#define P16_KC 128
#define P16_TB 8
#define P16_ACC (P16_R512 * 2 * P16)

/* end of the reduction slice starting at k0: P16_KC steps, the last slice taking a
 * remainder of under half a slice with it (whole reductions up to 1.5 slices) */
static inline int64_t p16_slice_end(int64_t k0, int64_t k)
{
    return k - k0 < P16_KC + P16_KC / 2 ? k : k0 + P16_KC;
}

/* units per thread the work is cut into at least, and claimed in turn: a thread slowed
 * by other work on its core takes fewer of them instead of holding the others up */
#define P16_UNITS_PER_THREAD 8

/* positions per work unit: all p, or, when (sample, panel group) units are too few to
 * share among t threads (64 output channels at batch 1 are 2 pairs), chunks of whole
 * tiles of r positions, so that there are P16_UNITS_PER_THREAD units per thread */
static inline int64_t p16_chunk(int64_t units, int64_t p, int64_t r, int t)
{
    if (t < 2 || units >= P16_UNITS_PER_THREAD * t) return p;
    int64_t want = (P16_UNITS_PER_THREAD * t + units - 1) / units, tiles = (p + r - 1) / r;
    if (want > tiles) want = tiles;
    return (tiles + want - 1) / want * r;
}

/* units claimed at a time out of `units` shared by nt threads */
static inline int64_t p16_grain(int64_t units, int nt)
{
    int64_t g = units / ((int64_t)nt * P16_UNITS_PER_THREAD);
    return g < 1 ? 1 : g;
}

/* the calling thread's next grain [*u0, *u1) of units from the shared counter `next`;
 * 0 once all are claimed. Towards the end a claim shrinks to a quarter of what is left
 * (down to one unit), so the threads finish within about a unit of each other: resnet50
 * b1, 2 threads, alternating with fixed grains in one process, 41.3 -> 40.8 ms (b8,
 * squeezenet and inception_v1 within +-1%) */
static inline int p16_claim(int64_t *next, int64_t grain, int64_t units, int64_t *u0,
                            int64_t *u1)
{
    int64_t left = units - __atomic_load_n(next, __ATOMIC_RELAXED);
    if (left / 4 < grain) grain = left / 4 > 1 ? left / 4 : 1;
    *u0 = __atomic_fetch_add(next, grain, __ATOMIC_RELAXED);
    *u1 = *u0 + grain < units ? *u0 + grain : units;
    return *u0 < units;
}

/* ---- any 2-D convolution of one group on the same tile (conv_p16) --------------------
 * The implicit GEMM Y_s^T = im2col(X_s)^T W^T without the im2col matrix: a tile is 8
 * consecutive output positions of one output row x 32 output channels; for reduction step
 * kk = (channel, tap) its rows broadcast X at off[kk] + i * sw from the row's first input
 * position (X zero-padded once per call where the windows read outside it), so a stride-1
 * tile reads 8 consecutive floats; conv1x1_p16's tiles pass no offsets (off NULL: step kk
 * reads X at kk * kstride). Stored through c1_store; or, ``blocked`` (conv1x1_nchw16c:
 * X, Y and the residual channel-blocked, a position's 16 channels of a block contiguous,
 * so sw = 16 and off[c] = c / 16 * p * 16 + c % 16), as whole rows of 16 channels;
 * ``blocked`` 2: the same without fetching the panels' rows ahead (CG_NO_FETCH). */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
cg_tile(int R, int unit_stride, int blocked, const float *restrict xb,
        const int64_t *restrict off,
        int64_t kstride, int64_t sw, const float *restrict pa, const float *restrict pb,
        int64_t k0, int64_t k1, int64_t k, float *restrict acc, const float *restrict bias,
        const float *res, int relu, float *y, int64_t p, int64_t w0, int64_t w1)
{
    __m512 c0[P16_R512], c1[P16_R512];
    for (int i = 0; i < P16_R512; i++) {
        c0[i] = k0 ? _mm512_loadu_ps(acc + i * 2 * P16) : _mm512_setzero_ps();
        c1[i] = k0 ? _mm512_loadu_ps(acc + i * 2 * P16 + P16) : _mm512_setzero_ps();
    }
    const int64_t s = unit_stride ? 1 : sw;
    for (int64_t kk = k0; kk < k1; kk++) {
        if (blocked != 2) {
            _mm_prefetch((const char *)(pa + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
            if (pb) _mm_prefetch((const char *)(pb + (kk + P16_AHEAD) * P16), _MM_HINT_T0);
        }
        __m512 b0 = _mm512_loadu_ps(pa + kk * P16);
        __m512 b1 = pb ? _mm512_loadu_ps(pb + kk * P16) : b0;
        const float *xr = xb + (off ? off[kk] : kk * kstride);
        if (blocked)
            cb_fetch(xr, kk, P16_BAHEAD);
        else
            _mm_prefetch((const char *)(xr + P16_XAHEAD * s), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 av = _mm512_set1_ps(xr[i * s]);
            c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
            if (pb) c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
        }
    }
    if (k1 < k) { /* a slice of the reduction: the partial sums wait in acc */
        for (int i = 0; i < P16_R512; i++) {
            _mm512_storeu_ps(acc + i * 2 * P16, c0[i]);
            _mm512_storeu_ps(acc + i * 2 * P16 + P16, c1[i]);
        }
        return;
    }
    __mmask16 m0 = (__mmask16)((1u << w0) - 1), m1 = (__mmask16)((1u << w1) - 1);
    __m512 bv0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    __m512 bv1 = bias && pb ? _mm512_maskz_loadu_ps(m1, bias + P16) : _mm512_setzero_ps();
    for (int i = 0; i < P16_R512; i++) {
        c0[i] = _mm512_add_ps(c0[i], bv0);
        c1[i] = _mm512_add_ps(c1[i], bv1);
        if (relu && !res) {
            c0[i] = _mm512_max_ps(_mm512_setzero_ps(), c0[i]);
            c1[i] = _mm512_max_ps(_mm512_setzero_ps(), c1[i]);
        }
    }
    if (blocked) {
        cb_store(c0, R, res, relu, y);
        if (pb) cb_store(c1, R, res ? res + P16 * p : NULL, relu, y + P16 * p);
        return;
    }
    c1_store(c0, R, w0, res, relu, y, p);
    if (pb) c1_store(c1, R, w1, res ? res + P16 * p : NULL, relu, y + P16 * p, p);
}

/* part `part` of `parts` of the lines of [base, base + bytes), fetched towards L2: the
 * weights of the panel pair a thread takes next, spread over the tiles (conv1x1_p16) or
 * output rows (conv_p16) of its current one, since a plan's weights come from memory
 * (more than the L3 holds). In the graph, 2 threads, interleaved with and without in one
 * process, twice: inception_v1 b8 -8 to -10% time, squeezenet b1 -3 to -4%, resnet50
 * and squeezenet b8 within +-2% */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
p16_fetch_part(const float *base, int64_t bytes, int64_t part, int64_t parts)
{
    const char *b = (const char *)base;
    int64_t lines = (bytes + 63) / 64, l0 = lines * part / parts;
    int64_t l1 = lines * (part + 1) / parts;
    for (int64_t l = l0; l < l1; l++) _mm_prefetch(b + l * 64, _MM_HINT_T1);
}

/* p16_fetch_part of the panel pair after pair q (panels q + 2, q + 3 of k rows), if any */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
p16_fetch_next_pair(const float *packed, int64_t q, int64_t panels, int64_t k,
                    int64_t part, int64_t parts)
{
    int64_t left = panels - q - 2;
    if (left > 0)
        p16_fetch_part(packed + (q + 2) * P16 * k,
                       (left < 2 ? left : 2) * P16 * k * (int64_t)sizeof(float), part, parts);
}

/* p16_fetch_part of the 64-channel group after group j0 / 64 (cq_tile's 4 panels of k
 * rows; after the last, the first: the next sample's), for reductions up to
 * CQ_FETCH_MAX_K (a group of 256 KB: two then fit L2 beside the input). In the graph, 2
 * threads, with and without alternating in one process: squeezenet b8 32.9 -> 31.4 ms,
 * resnet50 b1 and b8 -1%, inception_v1 and squeezenet b1 unchanged */
#define CQ_FETCH_MAX_K 1024
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
cq_fetch_next(const float *packed, int64_t j0, int64_t n, int64_t k, int64_t part,
              int64_t parts)
{
    if (k > CQ_FETCH_MAX_K) return;
    int64_t next = j0 + 4 * P16 < n ? j0 + 4 * P16 : 0;
    if (next != j0) p16_fetch_part(packed + next * k, 4 * P16 * k * (int64_t)sizeof(float),
                                   part, parts);
}

/* work units [u0, u1): one sample, one panel pair and one chunk of pc positions each
 * (chunks of a pair consecutive), the larger of sample and pair kept cached while the
 * smaller streams past it (as cg_units): pair major (u / chunks = pair * nb + sample)
 * when a panel pair (2 * 16 * k floats) outweighs a sample (k * p), else sample major */
__attribute__((target("arch=x86-64-v4"))) static void
c1_units(int64_t u0, int64_t u1, int64_t nb, int64_t n, int64_t k, int64_t p, int64_t pc,
         const float *x, int64_t xrow, const int64_t *boff, const float *packed,
         const float *bias, const float *res, int relu, float *y, int64_t ystride, int fetch)
{
    const int64_t pm = boff ? P16 : 1; /* floats from one position to the next */
    int64_t panels = (n + P16 - 1) / P16, pairs = (panels + 1) / 2;
    int64_t chunks = (p + pc - 1) / pc;
    int pair_major = p < 2 * P16;
    /* slices where a sample fills two blocks (56x56 and 13x13: 5-6% faster), or the
     * reduction is longer than two slices: at 7x7 (one block of 6 full tiles and a single
     * position) they measured 4-5% slower on warm weights but 3-5% faster in the graph,
     * where the weights come from memory (resnet50's 2048->512 1x1s, b1 and b8) */
    int sliced = p >= 2 * P16_TB * P16_R512 || k > 2 * P16_KC;
    float accs[P16_TB * P16_ACC] __attribute__((aligned(64)));
    for (int64_t uc = u0; uc < u1; uc++) {
        int64_t u = uc / chunks, i0 = uc % chunks * pc, i1 = i0 + pc < p ? i0 + pc : p;
        int64_t s = pair_major ? u % nb : u / pairs;
        int64_t q = 2 * (pair_major ? u / nb : u % pairs), j0 = q * P16;
        const float *pa = packed + q * P16 * k, *pb = q + 1 < panels ? pa + P16 * k : NULL;
        int64_t w0 = n - j0 < P16 ? n - j0 : P16;
        int64_t w1 = pb ? (n - j0 - P16 < P16 ? n - j0 - P16 : P16) : 0;
        const float *xs = x + s * k * xrow, *rs = res ? res + (s * n + j0) * p : NULL;
        const float *bj = bias ? bias + j0 : NULL;
        float *ys = y + s * ystride + j0 * p;
        int64_t ntiles = (i1 - i0 + P16_R512 - 1) / P16_R512;
        for (int64_t ib = i0; ib < i1; ib += P16_TB * P16_R512) {
            int64_t ie = ib + P16_TB * P16_R512 < i1 ? ib + P16_TB * P16_R512 : i1;
            for (int64_t k0 = 0, k1; k0 < k; k0 = k1) {
                k1 = sliced ? p16_slice_end(k0, k) : k;
                for (int64_t i = ib; i < ie; i += P16_R512) {
                    const float *ri = rs ? rs + i * pm : NULL;
                    float *acc = accs + (i - ib) / P16_R512 * P16_ACC;
                    if (!pair_major && k0 == 0) /* the thread's next unit: next pair */
                        p16_fetch_next_pair(packed, q, panels, k, (i - i0) / P16_R512,
                                            ntiles);
#define C1_CASE(r)                                                                          \
    case r:                                                                                 \
        if (boff && fetch)                                                                  \
            cg_tile(r, 0, 1, xs + i * P16, boff, 0, P16, pa, pb, k0, k1, k, acc, bj, ri,    \
                    relu, ys + i * P16, p, w0, w1);                                         \
        else if (boff)                                                                      \
            cg_tile(r, 0, 2, xs + i * P16, boff, 0, P16, pa, pb, k0, k1, k, acc, bj, ri,    \
                    relu, ys + i * P16, p, w0, w1);                                         \
        else                                                                                \
            cg_tile(r, 1, 0, xs + i, NULL, xrow, 1, pa, pb, k0, k1, k, acc, bj, ri, relu,   \
                    ys + i, p, w0, w1);                                                     \
        break;
                    switch (ie - i < P16_R512 ? ie - i : P16_R512) {
                        C1_CASE(8) C1_CASE(7) C1_CASE(6) C1_CASE(5) C1_CASE(4) C1_CASE(3)
                        C1_CASE(2) default: C1_CASE(1)
                    }
#undef C1_CASE
                }
            }
        }
    }
}

typedef struct {
    int64_t nb, n, k, oh, ow, sh, sw;
    int64_t sample, row; /* padded input: elements per sample, per row */
    int pair_major;
    const float *x;                               /* padded input, [nb][c][plane] */
    const int64_t *off;                           /* [k] offsets of (channel, tap) */
    const float *packed, *bias, *res;
    float *y;
    int64_t ystride; /* elements per sample of y */
    int relu;
    int blocked; /* conv_nchw16c: X, Y and res channel-blocked, positions 16 floats apart */
    int64_t xstep; /* floats from one X position to the next (16 blocked, 1 NCHW) */
    int fetch;     /* blocked tiles fetch their panels' rows ahead (no CG_NO_FETCH) */
    int sliced;    /* cq_run slices every reduction (CG_SLICED) */
    int64_t band;  /* cq_rows: output rows per unit */
} cg_ctx;

/* units [u0, u1): unit u is output row u % oh of one sample and one panel pair, ordered
 * so that the larger of the two stays cached while the smaller streams past it: pair
 * major (u / oh = pair * nb + sample) when a panel pair is larger than a sample's padded
 * input (late layers: few positions, many channels), else sample major */
__attribute__((target("arch=x86-64-v4"))) static void
cg_units(const cg_ctx *g, int64_t u0, int64_t u1)
{
    int64_t n = g->n, k = g->k, p = g->oh * g->ow;
    int64_t panels = (n + P16 - 1) / P16, pairs = (panels + 1) / 2;
    for (int64_t u = u0; u < u1; u++) {
        int64_t oy = u % g->oh, r = u / g->oh;
        int64_t smp = g->pair_major ? r % g->nb : r / pairs;
        int64_t q = 2 * (g->pair_major ? r / g->nb : r % pairs);
        int64_t j0 = q * P16;
        const float *pa = g->packed + q * P16 * k, *pb = q + 1 < panels ? pa + P16 * k : NULL;
        int64_t w0 = n - j0 < P16 ? n - j0 : P16;
        int64_t w1 = pb ? (n - j0 - P16 < P16 ? n - j0 - P16 : P16) : 0;
        const float *bj = g->bias ? g->bias + j0 : NULL;
        const int64_t pm = g->xstep; /* floats from one position to the next */
        const float *xrow = g->x + smp * g->sample + oy * g->sh * g->row;
        int64_t roff = (smp * n + j0) * p + oy * g->ow * pm;
        int64_t yoff = smp * g->ystride + j0 * p + oy * g->ow * pm;
        if (!g->pair_major) p16_fetch_next_pair(g->packed, q, panels, k, oy, g->oh);
        for (int64_t ox = 0; ox < g->ow; ox += P16_R512) {
            const float *xb = xrow + ox * g->sw * pm;
            const float *ri = g->res ? g->res + roff + ox * pm : NULL;
            float *yi = g->y + yoff + ox * pm;
            int R = (int)(g->ow - ox < P16_R512 ? g->ow - ox : P16_R512);
#define CG_CASE(r)                                                                          \
    case r:                                                                                 \
        if (g->blocked && g->fetch)                                                         \
            cg_tile(r, 0, 1, xb, g->off, 0, g->sw * P16, pa, pb, 0, k, k, NULL, bj, ri,     \
                    g->relu, yi, p, w0, w1);                                                \
        else if (g->blocked)                                                                \
            cg_tile(r, 0, 2, xb, g->off, 0, g->sw * P16, pa, pb, 0, k, k, NULL, bj, ri,     \
                    g->relu, yi, p, w0, w1);                                                \
        else if (g->sw == 1)                                                                \
            cg_tile(r, 1, 0, xb, g->off, 0, 1, pa, pb, 0, k, k, NULL, bj, ri, g->relu, yi,  \
                    p, w0, w1);                                                             \
        else                                                                                \
            cg_tile(r, 0, 0, xb, g->off, 0, g->sw, pa, pb, 0, k, k, NULL, bj, ri, g->relu,  \
                    yi, p, w0, w1);                                                         \
        break;
            switch (R) {
                CG_CASE(8) CG_CASE(7) CG_CASE(6) CG_CASE(5) CG_CASE(4) CG_CASE(3) CG_CASE(2)
                default: CG_CASE(1)
            }
#undef CG_CASE
        }
    }
}

/* how cq_run runs its tiles: where they are among the parts of cq_fetch_next's fetch of
 * the next group, and its two measured options */
typedef struct {
    const float *packed;
    int64_t j0, n, part0, parts;
    int fetch;  /* the tiles fetch their panels' rows ahead (cq_asm's FETCH) */
    int sliced; /* every reduction in slices, not only those over CQ_MAX_K */
} cq_how;

#define CQ_KC 64 /* reduction steps of a slice */
#define CQ_TB 8  /* tiles of a block sharing a slice */
/* rows x len positions on cq_asm_R: position (r, i) reads X at xb + r * xr + i * s and
 * writes Y (and res) at y + (r * len + i) * 16, channel blocks p * 16 floats apart; each
 * row in tiles of near-equal lengths (cq_len); k a multiple of 16. Reductions longer than
 * CQ_MAX_K (whose panels outgrow L2), or any with how.sliced, run in slices of CQ_KC
 * steps over blocks of CQ_TB tiles, the slice of the 4 panels (16 KB) staying in L1
 * across the block while the tiles' sums wait in acc (resnet50's 512 -> 512 3x3s,
 * k = 4608, 7x7 out: 92 -> 118 GFLOPS on one Ice Lake core, where the 8 x 32 tile ran
 * them; slices of 32, 48, 96, 144, 288 and 576 steps measured 3-15% slower than 64).
 * Shorter reductions gain or lose 2-16% by slicing, by shape (the 7x7 2048 -> 512 1x1
 * +16%, the 56x56 3x3 -2.5%): the graph executor measures both. A tile's first slice
 * fetches part part0 + (its index) of the next group. */
__attribute__((target("arch=x86-64-v4"))) static void
cq_run(const float *xb, int64_t s, int64_t len, int64_t rows, int64_t xr, const int64_t *off,
       const float *pk, int64_t k, const float *bias, const float *res, int relu, float *y,
       int64_t p, cq_how how)
{
    float acc[CQ_TB][CQ_R * 4 * P16] __attribute__((aligned(64)));
    int64_t per_row = (len + CQ_R - 1) / CQ_R, tiles = rows * per_row;
    int64_t base = len / per_row, extra = len % per_row;
    int sliced = how.sliced || k > CQ_MAX_K, block = sliced ? CQ_TB : 1;
    for (int64_t tb = 0; tb < tiles; tb += block) {
        int64_t te = tb + block < tiles ? tb + block : tiles;
        for (int64_t k0 = 0, k1; k0 < k; k0 = k1) {
            k1 = !sliced || k - k0 < CQ_KC + CQ_KC / 2 ? k : k0 + CQ_KC;
            for (int64_t t = tb; t < te; t++) {
                int64_t r = t / per_row, u = t % per_row;
                int64_t i0 = u * base + (u < extra ? u : extra), R = base + (u < extra);
                if (k0 == 0)
                    cq_fetch_next(how.packed, how.j0, how.n, k, how.part0 + t, how.parts);
                cq_asm[how.fetch][R](xb + r * xr + i0 * s, off, s, pk, k, k0, k1, acc[t - tb]);
            }
        }
        for (int64_t t = tb; t < te; t++) {
            int64_t r = t / per_row, u = t % per_row;
            int64_t i0 = r * len + u * base + (u < extra ? u : extra), R = base + (u < extra);
            for (int q = 0; q < 4; q++) {
                __m512 bv = bias ? _mm512_loadu_ps(bias + q * P16) : _mm512_setzero_ps();
                const float *rq = res ? res + (q * p + i0) * P16 : NULL;
                float *yq = y + (q * p + i0) * P16;
                for (int64_t i = 0; i < R; i++) {
                    __m512 v = _mm512_add_ps(_mm512_load_ps(acc[t - tb] + (i * 4 + q) * P16),
                                             bv);
                    if (rq) v = _mm512_add_ps(v, _mm512_loadu_ps(rq + i * P16));
                    if (relu) v = _mm512_max_ps(_mm512_setzero_ps(), v); /* NaN kept */
                    _mm512_storeu_ps(yq + i * P16, v);
                }
            }
        }
    }
}

/* units [u0, u1) of a convolution with 64-channel groups (cq_run / cq_tile): unit u is a
 * band of g->band output rows (the last may be shorter) of one sample and one group of 4
 * panels (sample major) */
__attribute__((target("arch=x86-64-v4"))) static void
cq_rows(const cg_ctx *g, int64_t u0, int64_t u1)
{
    int64_t n = g->n, k = g->k, p = g->oh * g->ow, quads = n / (4 * P16);
    int64_t bands = (g->oh + g->band - 1) / g->band;
    for (int64_t u = u0; u < u1; u++) {
        int64_t oy = u % bands * g->band, r = u / bands, smp = r / quads;
        int64_t j0 = r % quads * 4 * P16;
        const float *pk = g->packed + j0 * k, *bj = g->bias ? g->bias + j0 : NULL;
        const float *xrow = g->x + smp * g->sample + oy * g->sh * g->row;
        int64_t o = (smp * n + j0) * p + oy * g->ow * P16; /* res: the row's start */
        int64_t yo = smp * g->ystride + j0 * p + oy * g->ow * P16;
        int64_t row_tiles = (g->ow + CQ_R - 1) / CQ_R;
        if (g->blocked) { /* the reduction in whole 16-step blocks: cq_asm_R */
            int64_t rows = g->oh - oy < g->band ? g->oh - oy : g->band;
            cq_how how = {g->packed, j0, n, oy * row_tiles, g->oh * row_tiles, g->fetch,
                          g->sliced};
            cq_run(xrow, g->sw * g->xstep, g->ow, rows, g->sh * g->row, g->off, pk, k, bj,
                   g->res ? g->res + o : NULL, g->relu, g->y + yo, p, how);
            continue;
        }
        /* X NCHW (conv_nchw_to16c's stem): any reduction order, on cq_tile */
        for (int64_t ox = 0, t = 0, R; ox < g->ow; ox += R, t++) {
            R = cq_len(g->ow, t);
            cq_fetch_next(g->packed, j0, n, k, oy * row_tiles + t, g->oh * row_tiles);
            const float *xb = xrow + ox * g->sw * g->xstep;
            const float *ri = g->res ? g->res + o + ox * P16 : NULL;
            float *yi = g->y + yo + ox * P16;
#define CQ_ROW(r)                                                                           \
    case r:                                                                                 \
        cq_tile(r, xb, g->off, g->sw * g->xstep, pk, k, bj, ri, g->relu, yi, p);            \
        break;
            switch (R) {
                CQ_ROW(6) CQ_ROW(5) CQ_ROW(4) CQ_ROW(3) CQ_ROW(2) default: CQ_ROW(1)
            }
#undef CQ_ROW
        }
    }
}

/* conv_p16 (layout 0), conv_nchw16c (CG_XB | CG_YB: X [nb][c/16][H][W][16], padded the
 * same way per 16-channel plane, the reduction ordered (channel block, tap, channel) so a
 * block's 16 steps read the same lines; Y and res [nb][m/16][OH*OW][16]) or
 * conv_nchw_to16c (CG_YB: X NCHW as conv_p16's, Y blocked; 64-channel groups only) */
#define CG_XB 1
#define CG_YB 2
#define CG_NO_FETCH 4 /* blocked tiles without their panel prefetches (CONV16C_NO_FETCH) */
#define CG_SLICED 8   /* cq_run's reductions all in slices (ORTCPU_CONV16C_SLICED) */

/* the blocked entry points' flags: (ReLU, cg_run / c1_run layout bits), or -1 with the
 * error set */
static int c16_flags(int flags, const char *fn, int *relu)
{
    if (flags & ~(ORTCPU_CONV16C_RELU | ORTCPU_CONV16C_NO_FETCH | ORTCPU_CONV16C_SLICED))
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn, flags), -1;
    *relu = (flags & ORTCPU_CONV16C_RELU) != 0;
    return CG_XB | CG_YB | (flags & ORTCPU_CONV16C_NO_FETCH ? CG_NO_FETCH : 0) |
           (flags & ORTCPU_CONV16C_SLICED ? CG_SLICED : 0);
}
static int cg_run(const float *x, const float *packed, const float *bias, const float *res,
                  int relu, float *y, int64_t ystride, const int64_t *geom, int nthreads,
                  int layout)
{
    int blocked = (layout & CG_XB) != 0; /* X (and then Y) blocked */
    int64_t nb = geom[0], c = geom[1], h = geom[2], w = geom[3], m = geom[4];
    int64_t kh = geom[6], kw = geom[7], oh = geom[8], ow = geom[9], sh = geom[10];
    int64_t sw = geom[11], pt = geom[12], pl = geom[13], dh = geom[14], dw = geom[15];
    if (nb < 0 || c < 1 || h < 1 || w < 1 || m < 0 || geom[5] != 1 || kh < 1 || kw < 1 ||
        oh < 0 || ow < 0 || sh < 1 || sw < 1 || pt < 0 || pl < 0 || dh < 1 || dw < 1)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv_p16: unsupported geometry (one "
                        "group, pads >= 0, strides and dilations >= 1)");
    if (ystride == 0) ystride = m * oh * ow;
    if (ystride < m * oh * ow)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv_p16: ystride %lld is less than a "
                        "sample's %lld elements", (long long)ystride, (long long)(m * oh * ow));
    if (nb == 0 || m == 0 || oh == 0 || ow == 0) return ORTCPU_OK;
    /* the padded plane covers every window; the input sits at (pt, pl) in it */
    int64_t PH = (oh - 1) * sh + (kh - 1) * dh + 1, PW = (ow - 1) * sw + (kw - 1) * dw + 1;
    if (PH < pt + h) PH = pt + h;
    if (PW < pl + w) PW = pl + w;
    int64_t k = c * kh * kw, plane = PH * PW, cb = blocked ? P16 : 1;
    int copy = pt || pl || PH != h || PW != w;
    size_t xbytes = copy ? (size_t)(nb * c * plane) * sizeof(float) : 0;
    int64_t *off = ort_scratch((size_t)k * sizeof(int64_t));
    float *xp = copy ? ort_scratch(xbytes) : NULL;
    if (!off || (copy && !xp)) {
        ort_scratch_free(off);
        ort_scratch_free(xp);
        return ort_fail(ORTCPU_E_OUT_OF_MEMORY, "conv_p16: scratch");
    }
    if (blocked)
        for (int64_t b = 0, kk = 0; b < c / P16; b++)
            for (int64_t ky = 0; ky < kh; ky++)
                for (int64_t kx = 0; kx < kw; kx++)
                    for (int64_t ci = 0; ci < P16; ci++)
                        off[kk++] = (b * plane + ky * dh * PW + kx * dw) * P16 + ci;
    else
        for (int64_t ci = 0, kk = 0; ci < c; ci++)
            for (int64_t ky = 0; ky < kh; ky++)
                for (int64_t kx = 0; kx < kw; kx++)
                    off[kk++] = ci * plane + ky * dh * PW + kx * dw;
    /* whole 64-channel groups of blocked Y: the 6 x 64 tile, a unit one group's output
     * row, or where blocked X takes its reductions in slices (k > CQ_MAX_K or CG_SLICED:
     * cq_run's blocks of CQ_TB tiles) a band of rows of up to CQ_TB tiles */
    int quad = (layout & CG_YB) && m % (4 * P16) == 0 && (blocked || k <= CQ_MAX_K);
    int64_t row_tiles = (ow + CQ_R - 1) / CQ_R;
    int sliced = blocked && (k > CQ_MAX_K || (layout & CG_SLICED));
    int64_t band = sliced && row_tiles < CQ_TB ? CQ_TB / row_tiles : 1;
    if ((layout & CG_YB) && !blocked && !quad) {
        ort_scratch_free(off);
        ort_scratch_free(xp);
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv_nchw_to16c: output channels must "
                        "be a multiple of 64 and c*kh*kw at most %d, got %lld and %lld",
                        CQ_MAX_K, (long long)m, (long long)k);
    }
    int64_t pairs = ((m + P16 - 1) / P16 + 1) / 2;
    int64_t units = nb * (quad ? m / (4 * P16) * ((oh + band - 1) / band) : pairs * oh);
    int t = nthreads < 1 ? 1 : nthreads;
    if (2.0 * (double)nb * (double)m * (double)k * (double)(oh * ow) < 1e6 || units < 2 * t ||
        omp_in_parallel())
        t = 1;
    int64_t next = 0; /* the next unclaimed unit */
    cg_ctx g = {nb, m, k, oh, ow, sh, sw, c * plane, PW * cb, 2 * P16 * k > c * plane,
                copy ? xp : x, off, packed, bias, res, y, ystride, relu, blocked, cb,
                !(layout & CG_NO_FETCH), sliced, band};
#pragma omp parallel num_threads(t) if (t > 1)
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        if (copy) { /* each thread pads its share of the planes (of cb channels each) */
            int64_t planes = nb * c / cb, per = (planes + nt - 1) / nt, p0 = id * per;
            int64_t p1 = p0 + per < planes ? p0 + per : planes;
            const size_t f = sizeof(float) * (size_t)cb;
            for (int64_t pi = p0; pi < p1; pi++) {
                float *d = xp + pi * plane * cb;
                const float *sx = x + pi * h * w * cb;
                memset(d, 0, (size_t)(pt * PW) * f);
                for (int64_t r = 0; r < h; r++) {
                    float *dr = d + (pt + r) * PW * cb;
                    memset(dr, 0, (size_t)pl * f);
                    memcpy(dr + pl * cb, sx + r * w * cb, (size_t)w * f);
                    memset(dr + (pl + w) * cb, 0, (size_t)(PW - pl - w) * f);
                }
                memset(d + (pt + h) * PW * cb, 0, (size_t)((PH - pt - h) * PW) * f);
            }
#pragma omp barrier
        }
        int64_t grain = p16_grain(units, nt);
        for (int64_t u0, u1; p16_claim(&next, grain, units, &u0, &u1);) {
            if (quad)
                cq_rows(&g, u0, u1);
            else
                cg_units(&g, u0, u1);
        }
    }
    ort_scratch_free(xp);
    ort_scratch_free(off);
    return ORTCPU_OK;
}

int ortcpu_conv_p16(const float *x, const float *packed, const float *bias, const float *res,
                    int relu, float *y, int64_t ystride, const int64_t *geom, int nthreads)
{
    return cg_run(x, packed, bias, res, relu, y, ystride, geom, nthreads, 0);
}

int ortcpu_conv_nchw16c(const float *x, const float *packed, const float *bias,
                        const float *res, int flags, float *y, int64_t ystride,
                        const int64_t *geom, int nthreads)
{
    if (geom[1] % P16 || geom[4] % P16)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv_nchw16c: channels must be "
                        "multiples of 16, got %lld -> %lld", (long long)geom[1],
                        (long long)geom[4]);
    int relu, layout = c16_flags(flags, "conv_nchw16c", &relu);
    if (layout < 0) return ORTCPU_E_INVALID_ARGUMENT;
    return cg_run(x, packed, bias, res, relu, y, ystride, geom, nthreads, layout);
}

int ortcpu_conv_nchw_to16c(const float *x, const float *packed, const float *bias,
                           const float *res, int relu, float *y, int64_t ystride,
                           const int64_t *geom, int nthreads)
{
    return cg_run(x, packed, bias, res, relu, y, ystride, geom, nthreads, CG_YB);
}

int ortcpu_conv_p16_available(void) { return 1; }

/* reduction length and output channels from which conv1x1_p16 aligns X's rows (see
 * there) */
#define C1_ALIGN_MIN_K 128
#define C1_ALIGN_MIN_N 512

/* one plane of X [H][W] (positions cb floats: 1, or a channel block's 16) read at strides
 * (sh, sw) into dst [OH][OW] (sub: H, W, sh, sw); torch's copy_ of the strided view took
 * 68 us of resnet50's 0.54 ms 256->512 56->28 shortcut, on one thread */
__attribute__((target("arch=x86-64-v4"))) static void
c1_subsample(const float *restrict src, const int64_t *sub, int64_t cb, float *restrict dst)
{
    int64_t h = sub[0], w = sub[1], sh = sub[2], sw = sub[3];
    int64_t oh = (h - 1) / sh + 1, ow = (w - 1) / sw + 1;
    for (int64_t oy = 0; oy < oh; oy++) {
        const float *sr = src + oy * sh * w * cb;
        float *dr = dst + oy * ow * cb;
        if (cb > 1)
            for (int64_t ox = 0; ox < ow; ox++)
                memcpy(dr + ox * cb, sr + ox * sw * cb, (size_t)cb * sizeof(float));
        else if (sw == 2) /* resnet's shortcuts: a constant stride the compiler vectorizes */
            for (int64_t ox = 0; ox < ow; ox++) dr[ox] = sr[2 * ox];
        else
            for (int64_t ox = 0; ox < ow; ox++) dr[ox] = sr[ox * sw];
    }
}

/* units [u0, u1) of conv1x1_nchw16c on cq_tile: unit u is one sample, one group of 4
 * panels and one chunk of pc positions (u / chunks = sample * quads + quad) */
__attribute__((target("arch=x86-64-v4"))) static void
cq_units(int64_t u0, int64_t u1, int64_t quads, int64_t chunks, int64_t pc, int64_t n,
         int64_t k, int64_t p, const float *x, const int64_t *off, const float *packed,
         const float *bias, const float *res, int relu, float *y, int64_t ystride, int layout)
{
    for (int64_t uc = u0; uc < u1; uc++) {
        int64_t u = uc / chunks, i0 = uc % chunks * pc, i1 = i0 + pc < p ? i0 + pc : p;
        int64_t smp = u / quads, j0 = u % quads * 4 * P16;
        const float *pk = packed + j0 * k, *xs = x + smp * k * p;
        const float *rb = res ? res + (smp * n + j0) * p : NULL;
        const float *bj = bias ? bias + j0 : NULL;
        float *yb = y + smp * ystride + j0 * p;
        int64_t tiles = (pc + CQ_R - 1) / CQ_R; /* a whole chunk's */
        cq_how how = {packed, j0, n, uc % chunks * tiles, chunks * tiles,
                      !(layout & CG_NO_FETCH), (layout & CG_SLICED) != 0};
        cq_run(xs + i0 * P16, P16, i1 - i0, 1, 0, off, pk, k, bj, rb ? rb + i0 * P16 : NULL,
               relu, yb + i0 * P16, p, how);
    }
}

/* conv1x1_p16 / conv1x1s_p16: sub NULL, or {H, W, stride h, stride w} of a strided 1x1
 * whose X is read subsampled (p = OH * OW); conv1x1_nchw16c: layout CG_XB (X and Y
 * blocked; n and k multiples of 16), with CG_NO_FETCH and CG_SLICED as cg_run's */
static int c1_run(int64_t nb, int64_t n, int64_t k, int64_t p, const float *x,
                  const int64_t *sub, int layout, const float *packed, const float *bias,
                  const float *res, int relu, float *y, int64_t ystride, int nthreads)
{
    int blocked = (layout & CG_XB) != 0;
    if (nb < 0 || n < 0 || k < 0 || p < 0)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv1x1_p16: bad sizes nb=%lld n=%lld "
                        "k=%lld p=%lld", (long long)nb, (long long)n, (long long)k,
                        (long long)p);
    if (ystride == 0) ystride = n * p;
    if (ystride < n * p)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv1x1_p16: ystride %lld is less than a "
                        "sample's %lld elements", (long long)ystride, (long long)(n * p));
    if (nb == 0 || n == 0 || p == 0) return ORTCPU_OK;
    /* blocked with whole 64-channel groups: cq_run, a unit one group's chunk */
    int quad = blocked && n % (4 * P16) == 0; /* cq_run slices any reduction */
    int64_t pairs = ((n + P16 - 1) / P16 + 1) / 2;
    int64_t units = nb * (quad ? n / (4 * P16) : pairs);
    int t = nthreads < 1 ? 1 : nthreads;
    if (2.0 * (double)nb * (double)n * (double)k * (double)p < 1e6 || omp_in_parallel())
        t = 1;
    int64_t pc = p16_chunk(units, p, quad ? CQ_R : P16_R512, t), next = 0;
    int64_t chunks = (p + pc - 1) / pc;
    units *= chunks;
    if (units < 2) t = 1;
    /* X's channel rows copied 64-byte aligned first when p is not a multiple of 8, the
     * reduction is long and X is read by many panel pairs: a tile's 8 positions then never
     * straddle two cache lines (squeezenet's 13x13 512 -> 1000 on one Zen 5 core: 196 ->
     * 215 GFLOPS); with few output channels the copy costs more than it saves (its 55x55
     * 128 -> 16 at batch 8: 0.34 -> 0.88 ms) */
    int64_t xrow = p;
    float *xa = NULL;
    int aligned = !blocked && p % 8 && k >= C1_ALIGN_MIN_K && n >= C1_ALIGN_MIN_N;
    if (aligned || sub) { /* a strided 1x1 reads its subsampled X from the same copy */
        xrow = aligned ? (p + 15) / 16 * 16 : p;
        xa = ort_scratch((size_t)(nb * k * xrow) * sizeof(float));
        if (!xa) return ort_fail(ORTCPU_E_OUT_OF_MEMORY, "conv1x1_p16: scratch");
    }
    int64_t *boff = NULL; /* blocked: where input channel c starts, from a position */
    if (blocked) {
        boff = ort_scratch((size_t)k * sizeof(int64_t));
        if (!boff) {
            ort_scratch_free(xa);
            return ort_fail(ORTCPU_E_OUT_OF_MEMORY, "conv1x1_nchw16c: scratch");
        }
        for (int64_t c = 0; c < k; c++) boff[c] = c / P16 * p * P16 + c % P16;
    }
#pragma omp parallel num_threads(t) if (t > 1)
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        if (xa) { /* planes of one channel, or blocked of 16 (xrow = p there) */
            int64_t cb = blocked ? P16 : 1, rows = nb * k / cb;
            int64_t rper = (rows + nt - 1) / nt, r0 = id * rper;
            int64_t r1 = r0 + rper < rows ? r0 + rper : rows;
            for (int64_t r = r0; r < r1; r++) {
                if (sub)
                    c1_subsample(x + r * sub[0] * sub[1] * cb, sub, cb, xa + r * xrow * cb);
                else
                    memcpy(xa + r * xrow, x + r * p, (size_t)p * sizeof(float));
            }
#pragma omp barrier
        }
        int64_t grain = p16_grain(units, nt);
        for (int64_t u0, u1; p16_claim(&next, grain, units, &u0, &u1);) {
            if (quad)
                cq_units(u0, u1, n / (4 * P16), chunks, pc, n, k, p, xa ? xa : x, boff,
                         packed, bias, res, relu, y, ystride, layout);
            else
                c1_units(u0, u1, nb, n, k, p, pc, xa ? xa : x, xrow, boff, packed, bias, res,
                         relu, y, ystride, !(layout & CG_NO_FETCH));
        }
    }
    ort_scratch_free(xa);
    ort_scratch_free(boff);
    return ORTCPU_OK;
}

int ortcpu_conv1x1_p16(int64_t nb, int64_t n, int64_t k, int64_t p, const float *x,
                       const float *packed, const float *bias, const float *res, int relu,
                       float *y, int64_t ystride, int nthreads)
{
    return c1_run(nb, n, k, p, x, NULL, 0, packed, bias, res, relu, y, ystride, nthreads);
}

int ortcpu_conv1x1_nchw16c(int64_t nb, int64_t n, int64_t k, int64_t p, const float *x,
                           const float *packed, const float *bias, const float *res,
                           int flags, float *y, int64_t ystride, int nthreads)
{
    if (n % P16 || k % P16)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv1x1_nchw16c: channels must be "
                        "multiples of 16, got %lld -> %lld", (long long)k, (long long)n);
    int relu, layout = c16_flags(flags, "conv1x1_nchw16c", &relu);
    if (layout < 0) return ORTCPU_E_INVALID_ARGUMENT;
    return c1_run(nb, n, k, p, x, NULL, layout, packed, bias, res, relu, y, ystride,
                  nthreads);
}

static int c1s_run(int64_t nb, int64_t n, int64_t k, int64_t h, int64_t w, int64_t sh,
                   int64_t sw, const float *x, int layout, const float *packed,
                   const float *bias, const float *res, int relu, float *y, int64_t ystride,
                   int nthreads)
{
    if (h < 1 || w < 1 || sh < 1 || sw < 1)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv1x1s_p16: bad map %lldx%lld or "
                        "strides %lld, %lld", (long long)h, (long long)w, (long long)sh,
                        (long long)sw);
    const int64_t sub[4] = {h, w, sh, sw};
    int64_t p = ((h - 1) / sh + 1) * ((w - 1) / sw + 1);
    return c1_run(nb, n, k, p, x, sub, layout, packed, bias, res, relu, y, ystride,
                  nthreads);
}

int ortcpu_conv1x1s_p16(int64_t nb, int64_t n, int64_t k, int64_t h, int64_t w, int64_t sh,
                        int64_t sw, const float *x, const float *packed, const float *bias,
                        const float *res, int relu, float *y, int64_t ystride, int nthreads)
{
    return c1s_run(nb, n, k, h, w, sh, sw, x, 0, packed, bias, res, relu, y, ystride,
                   nthreads);
}

int ortcpu_conv1x1s_nchw16c(int64_t nb, int64_t n, int64_t k, int64_t h, int64_t w,
                            int64_t sh, int64_t sw, const float *x, const float *packed,
                            const float *bias, const float *res, int flags, float *y,
                            int64_t ystride, int nthreads)
{
    if (n % P16 || k % P16)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv1x1s_nchw16c: channels must be "
                        "multiples of 16, got %lld -> %lld", (long long)k, (long long)n);
    int relu, layout = c16_flags(flags, "conv1x1s_nchw16c", &relu);
    if (layout < 0) return ORTCPU_E_INVALID_ARGUMENT;
    return c1s_run(nb, n, k, h, w, sh, sw, x, layout, packed, bias, res, relu, y, ystride,
                   nthreads);
}

/* threads split the panels in pairs, so each thread's tiles are two panels wide */
#define P16_SPLIT 2
#else
#define P16_SPLIT 1

__attribute__((target("avx2,fma"))) static void
p16_panels(int64_t p0, int64_t p1, int64_t m, int64_t n, int64_t k, const float *a,
           int64_t lda, const float *packed, const float *bias, float *c, int64_t ldc)
{
    for (int64_t p = p0; p < p1; p++) {
        const float *pp = packed + p * P16 * k;
        int64_t j0 = p * P16, w = n - j0 < P16 ? n - j0 : P16;
        const float *bj = bias ? bias + j0 : NULL;
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) p16_tile(4, a + i * lda, lda, pp, k, bj, c + i * ldc + j0, ldc, w);
        switch (m - i) {
        case 3: p16_tile(3, a + i * lda, lda, pp, k, bj, c + i * ldc + j0, ldc, w); break;
        case 2: p16_tile(2, a + i * lda, lda, pp, k, bj, c + i * ldc + j0, ldc, w); break;
        case 1: p16_row(a + i * lda, pp, k, bj, c + i * ldc + j0, w); break;
        default: break;
        }
    }
}

#endif

int ortcpu_gemm_p16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *packed, const float *bias, float *c, int64_t ldc,
                    int nthreads)
{
    if (m < 0 || n < 0 || k < 0 || (m > 0 && k > 0 && lda < k) || (m > 0 && n > 0 && ldc < n))
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm_p16: bad sizes m=%lld n=%lld "
                        "k=%lld lda=%lld ldc=%lld", (long long)m, (long long)n, (long long)k,
                        (long long)lda, (long long)ldc);
    if (m == 0 || n == 0) return ORTCPU_OK;
    int64_t panels = (n + P16 - 1) / P16;
    int t = nthreads < 1 ? 1 : nthreads;
    double flops = 2.0 * (double)m * (double)n * (double)k;
    if (flops < 1e6 || panels < 2 * t || omp_in_parallel()) t = 1;
    if (t == 1) {
        p16_panels(0, panels, m, n, k, a, lda, packed, bias, c, ldc);
        return ORTCPU_OK;
    }
#pragma omp parallel num_threads(t)
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t units = (panels + P16_SPLIT - 1) / P16_SPLIT, per = (units + nt - 1) / nt;
        int64_t s = id * per * P16_SPLIT, e = s + per * P16_SPLIT < panels ? s + per * P16_SPLIT
                                                                            : panels;
        if (s < e) p16_panels(s, e, m, n, k, a, lda, packed, bias, c, ldc);
    }
    return ORTCPU_OK;
}

#else

int ortcpu_gemm_p16_available(void) { return 0; }

int64_t ortcpu_gemm_p16_max_rows(void) { return 0; }

int ortcpu_gemm_p16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *packed, const float *bias, float *c, int64_t ldc,
                    int nthreads)
{
    (void)m; (void)n; (void)k; (void)a; (void)lda; (void)packed; (void)bias; (void)c;
    (void)ldc; (void)nthreads;
    return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                    "gemm_p16: not in this build (x86-64-v3 and above only)");
}

#endif

#if !(defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2)
/* the convolutions on the AVX-512 tile exist in x86-64-v4 builds only */
int ortcpu_conv_p16(const float *x, const float *packed, const float *bias, const float *res,
                    int relu, float *y, int64_t ystride, const int64_t *geom, int nthreads)
{
    (void)x; (void)packed; (void)bias; (void)res; (void)relu; (void)y; (void)ystride;
    (void)geom; (void)nthreads;
    return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv_p16: not in this build (x86-64-v4 only)");
}

int ortcpu_conv_nchw16c(const float *x, const float *packed, const float *bias,
                        const float *res, int flags, float *y, int64_t ystride,
                        const int64_t *geom, int nthreads)
{
    (void)x; (void)packed; (void)bias; (void)res; (void)flags; (void)y; (void)ystride; (void)geom;
    (void)nthreads;
    return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                    "conv_nchw16c: not in this build (x86-64-v4 only)");
}

int ortcpu_conv_nchw_to16c(const float *x, const float *packed, const float *bias,
                           const float *res, int relu, float *y, int64_t ystride,
                           const int64_t *geom, int nthreads)
{
    return ortcpu_conv_nchw16c(x, packed, bias, res, relu, y, ystride, geom, nthreads);
}

int ortcpu_conv_p16_available(void) { return 0; }

int ortcpu_conv1x1_p16(int64_t nb, int64_t n, int64_t k, int64_t p, const float *x,
                       const float *packed, const float *bias, const float *res, int relu,
                       float *y, int64_t ystride, int nthreads)
{
    (void)nb; (void)n; (void)k; (void)p; (void)x; (void)packed; (void)bias; (void)res;
    (void)relu; (void)y; (void)ystride; (void)nthreads;
    return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                    "conv1x1_p16: not in this build (x86-64-v4 only)");
}

int ortcpu_conv1x1_nchw16c(int64_t nb, int64_t n, int64_t k, int64_t p, const float *x,
                           const float *packed, const float *bias, const float *res,
                           int flags, float *y, int64_t ystride, int nthreads)
{
    (void)nb; (void)n; (void)k; (void)p; (void)x; (void)packed; (void)bias; (void)res;
    (void)flags; (void)y; (void)ystride; (void)nthreads;
    return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                    "conv1x1_nchw16c: not in this build (x86-64-v4 only)");
}

int ortcpu_conv1x1s_nchw16c(int64_t nb, int64_t n, int64_t k, int64_t h, int64_t w,
                            int64_t sh, int64_t sw, const float *x, const float *packed,
                            const float *bias, const float *res, int flags, float *y,
                            int64_t ystride, int nthreads)
{
    return ortcpu_conv1x1s_p16(nb, n, k, h, w, sh, sw, x, packed, bias, res, flags, y, ystride,
                               nthreads); /* "not in this build" */
}

int ortcpu_conv1x1s_p16(int64_t nb, int64_t n, int64_t k, int64_t h, int64_t w, int64_t sh,
                        int64_t sw, const float *x, const float *packed, const float *bias,
                        const float *res, int relu, float *y, int64_t ystride, int nthreads)
{
    (void)nb; (void)n; (void)k; (void)h; (void)w; (void)sh; (void)sw; (void)x; (void)packed;
    (void)bias; (void)res; (void)relu; (void)y; (void)ystride; (void)nthreads;
    return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                    "conv1x1s_p16: not in this build (x86-64-v4 only)");
}
#endif
