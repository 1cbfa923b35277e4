/* pool.c -- MaxPool (+Indices), MaxPoolGrad, AveragePool, AveragePoolGrad (spec §6.2, §6.3)
 * for 1/2/3-D, and GlobalAveragePool / GlobalMaxPool with their gradients.
 * 1-D and 2-D run as 3-D with leading spatial sizes of 1. Work is split over
 * (sample, channel) planes; every plane is independent.
 *
 * Geometry (int64 geom[22]): planes (N*C), in[3], k[3], out[3], stride[3], pad_begin[3],
 * pad_end[3], dil[3]. Indices are flat offsets into the whole input (ORT's MaxPool
 * Indices with storage_order 0); a window holding no input element yields -inf and
 * index -1, which MaxPoolGrad skips. NaN in a window propagates (as in torch). */
#include "common.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t planes;
    int64_t in[3], k[3], out[3], s[3], pb[3], pe[3], d[3];
    int64_t isz, osz;
} pool_geom;

static int pool_geom_read(const int64_t *g, pool_geom *q)
{
    q->planes = g[0];
    if (q->planes < 0) return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "pool: planes < 0");
    for (int i = 0; i < 3; i++) {
        q->in[i] = g[1 + i]; q->k[i] = g[4 + i]; q->out[i] = g[7 + i]; q->s[i] = g[10 + i];
        q->pb[i] = g[13 + i]; q->pe[i] = g[16 + i]; q->d[i] = g[19 + i];
        if (q->in[i] < 0 || q->k[i] < 1 || q->out[i] < 0 || q->s[i] < 1 || q->d[i] < 1 ||
            q->pb[i] < 0 || q->pe[i] < 0)
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "pool: invalid geometry on axis %d", i);
    }
    q->isz = q->in[0] * q->in[1] * q->in[2];
    q->osz = q->out[0] * q->out[1] * q->out[2];
    return ORTCPU_OK;
}

/* window [lo, hi) along one axis for output o, clipped to the input (dilation 1) */
static inline void pool_window(const pool_geom *q, int a, int64_t o, int64_t *lo, int64_t *hi,
                               int64_t *padded_len)
{
    int64_t s = o * q->s[a] - q->pb[a];
    int64_t e = s + q->k[a];
    int64_t ep = e < q->in[a] + q->pe[a] ? e : q->in[a] + q->pe[a];
    *padded_len = ep - s;
    *lo = s < 0 ? 0 : s;
    *hi = e < q->in[a] ? e : q->in[a];
}

/* taps [k0, k1) of a window starting at `start` (dilation `dil`, `k` taps) that fall in
 * [0, n) */
static inline void pool_taps(int64_t start, int64_t dil, int64_t k, int64_t n, int64_t *k0,
                             int64_t *k1)
{
    int64_t a = start >= 0 ? 0 : (-start + dil - 1) / dil;
    int64_t b = n - start > 0 ? (n - start + dil - 1) / dil : 0;
    *k0 = a;
    *k1 = b < k ? b : k;
    if (*k1 < *k0) *k1 = *k0;
}

/* the geometry of the 1-byte-code max pool (pool.inc): 1-D or 2-D, dilation 1, at most
 * 256 taps, pads smaller than the kernel (every window then holds an input element) */
static int pool_is_code(const pool_geom *q)
{
    return q->in[0] == 1 && q->k[0] == 1 && q->s[0] == 1 && q->pb[0] == 0 &&
           q->out[0] == 1 && q->d[1] == 1 && q->d[2] == 1 && q->k[1] * q->k[2] <= 256 &&
           q->pb[1] < q->k[1] && q->pb[2] < q->k[2] && q->pe[1] < q->k[1] &&
           q->pe[2] < q->k[2] && q->out[1] >= 1 && q->out[2] >= 1 &&
           (q->out[1] - 1) * q->s[1] - q->pb[1] < q->in[1] &&
           (q->out[2] - 1) * q->s[2] - q->pb[2] < q->in[2];
}

static int pool_is_2x2(const pool_geom *q)
{
    return q->k[0] == 1 && q->s[0] == 1 && q->pb[0] == 0 && q->k[1] == 2 && q->k[2] == 2 &&
           q->s[1] == 2 && q->s[2] == 2 && q->pb[1] == 0 && q->pb[2] == 0 && q->d[1] == 1 &&
           q->d[2] == 1 && q->out[1] * 2 <= q->in[1] && q->out[2] * 2 <= q->in[2] &&
           q->out[0] == q->in[0];
}

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 1
#include <immintrin.h>
#define MP2_W4_AVX2 1
/* 2x2 / stride-2 max pool of rows of 4 windows (8x8 planes: a row pair is 16 consecutive
 * floats), the comparisons of mp2_row_fwd (pool.inc) on vectors: the even and odd columns
 * of both rows deinterleaved into two registers, the horizontal pair chosen, then the
 * vertical one; the same values and codes (ties: the first; NaN wins). 64x32x8x8:
 * 34 us against 300 us for the scalar loop (1 thread, measured). */
__attribute__((target("avx2,fma"))) static void mp2_rows_w4_avx2(const float *restrict x,
                                                                float *restrict y,
                                                                uint8_t *restrict code,
                                                                int64_t rows)
{
    const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256i one = _mm256_set1_epi32(1);
    const __m128i two = _mm_set1_epi32(2);
    for (int64_t r = 0; r < rows; r++) {
        __m256 a = _mm256_loadu_ps(x + r * 16), b = _mm256_loadu_ps(x + r * 16 + 8);
        __m256 pa = _mm256_permutevar8x32_ps(a, perm), pb = _mm256_permutevar8x32_ps(b, perm);
        __m256 ev = _mm256_permute2f128_ps(pa, pb, 0x20); /* a0 a2 a4 a6 b0 b2 b4 b6 */
        __m256 od = _mm256_permute2f128_ps(pa, pb, 0x31); /* a1 a3 a5 a7 b1 b3 b5 b7 */
        /* s: !(ev != ev || ev >= od), i.e. take the odd column */
        __m256 s = _mm256_and_ps(_mm256_cmp_ps(ev, ev, _CMP_ORD_Q),
                                 _mm256_cmp_ps(ev, od, _CMP_NGE_UQ));
        __m256 m = _mm256_blendv_ps(ev, od, s);
        __m128 x0 = _mm256_castps256_ps128(m), x1 = _mm256_extractf128_ps(m, 1);
        __m128 t = _mm_and_ps(_mm_cmpord_ps(x0, x0), _mm_cmpnge_ps(x0, x1));
        _mm_storeu_ps(y + r * 4, _mm_blendv_ps(x0, x1, t));
        __m256i si = _mm256_and_si256(_mm256_castps_si256(s), one);
        __m128i s0 = _mm256_castsi256_si128(si);
        __m128i s1 = _mm_add_epi32(_mm256_extracti128_si256(si, 1), two);
        __m128i c = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(s0), _mm_castsi128_ps(s1), t));
        c = _mm_packus_epi16(_mm_packs_epi32(c, c), c);
        int32_t v = _mm_cvtsi128_si32(c);
        memcpy(code + r * 4, &v, 4);
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
#define MP_K3S2_AVX512 1
/* lanes where a (NaN propagating: a NaN in either wins, as MP_MAX) */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline __m512
mp_nanmax512(__m512 a, __m512 b)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

/* max of the window rows r[0..n) at columns [c, c + 16) of a row of iw floats (c may be
 * negative: left padding); columns outside the row read -inf (masked loads: no access
 * outside it) */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline __m512
mp_rows16(const float *const *r, int n, int64_t c, int64_t iw)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    int64_t lo = c < 0 ? -c : 0, hi = iw - c > 16 ? 16 : iw - c;
    if (hi <= lo) return ninf;
    __mmask16 m = (__mmask16)((0xFFFFu >> (16 - (hi - lo))) << lo);
    if (lo) { /* padded columns on the left: the row's first floats expanded into lanes
               * lo.. (no address before the row is formed) */
        __m512 v = _mm512_mask_expandloadu_ps(ninf, m, r[0]);
        for (int i = 1; i < n; i++)
            v = mp_nanmax512(v, _mm512_mask_expandloadu_ps(ninf, m, r[i]));
        return v;
    }
    __m512 v = _mm512_mask_loadu_ps(ninf, m, r[0] + c);
    for (int i = 1; i < n; i++) v = mp_nanmax512(v, _mm512_mask_loadu_ps(ninf, m, r[i] + c));
    return v;
}

/* y[j .. j + 16) = v, clipped to the row's ow outputs */
__attribute__((target("arch=x86-64-v4"), always_inline)) static inline void
mp_store16(float *y, int64_t j, int64_t ow, __m512 v)
{
    int64_t left = ow - j;
    _mm512_mask_storeu_ps(y + j, left >= 16 ? (__mmask16)0xFFFF
                                            : (__mmask16)((1u << left) - 1), v);
}

/* One output row of a 3x3 / stride-1 max pool (dilation 1) without Indices: y[j] = the
 * max of rows r[0..n) over input columns [j - pb, j - pb + 3), 16 outputs a step from the
 * column maxima of 18 consecutive columns shifted by lane rotations (inception's pools). */
__attribute__((target("arch=x86-64-v4"))) static void
mp_k3s1_row(const float *const *r, int n, int64_t iw, int64_t pb, float *restrict y,
            int64_t ow)
{
    for (int64_t j = 0; j < ow; j += 16) {
        int64_t c = j - pb;
        __m512 a = mp_rows16(r, n, c, iw), b = mp_rows16(r, n, c + 16, iw);
        __m512 v1 = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(b),
                                                            _mm512_castps_si512(a), 1));
        __m512 v2 = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(b),
                                                            _mm512_castps_si512(a), 2));
        __m512 v = mp_nanmax512(mp_nanmax512(a, v1), v2);
        mp_store16(y, j, ow, v);
    }
}

/* One output row of a 3x3 / stride-2 max pool (dilation 1) without Indices: y[j] = the
 * max of rows r[0..n) over input columns [2j - pb, 2j - pb + 3), 16 outputs a step: the
 * column maxima of 33 consecutive input columns, then the even, odd and next-even columns
 * deinterleaved by permutes. pool.inc's per-row loops over short rows cost ~20 cycles an
 * output on small planes (squeezenet's 27x27: 3x ORT's time at 1 thread, measured). */
__attribute__((target("arch=x86-64-v4"))) static void
mp_k3s2_row(const float *const *r, int n, int64_t iw, int64_t pb, float *restrict y,
            int64_t ow)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                         28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512i e2 = _mm512_add_epi32(ev, _mm512_set1_epi32(2)); /* lane 15: col 32 */
    for (int64_t j = 0; j < ow; j += 16) {
        int64_t c = 2 * j - pb;
        __m512 a = mp_rows16(r, n, c, iw), b = mp_rows16(r, n, c + 16, iw);
        __m512 t = mp_rows16(r, n, c + 32, iw);
        __m512 v = mp_nanmax512(_mm512_permutex2var_ps(a, ev, b),
                                _mm512_permutex2var_ps(a, od, b));
        __m512 w = _mm512_permutex2var_ps(a, e2, b); /* lane 15 reads b[0]: replaced */
        w = _mm512_mask_broadcastss_ps(w, (__mmask16)0x8000, _mm512_castps512_ps128(t));
        v = mp_nanmax512(v, w);
        mp_store16(y, j, ow, v);
    }
}
#endif

/* Vector width of pool.inc's 2x2 rows (mp2v_*): the build's ISA level. */
#if ORT_ISA_LEVEL >= 2
#define MP2V_BYTES 64
#elif ORT_ISA_LEVEL == 1
#define MP2V_BYTES 32
#else
#define MP2V_BYTES 16
#endif

#define T float
#define TI int32_t /* an integer of T's size */
#define SFX f32
#define ACC double
#include "pool.inc"
#undef T
#undef TI
#undef SFX
#undef ACC

#define T double
#define TI int64_t
#define SFX f64
#define ACC double
#include "pool.inc"
#undef T
#undef TI
#undef SFX
#undef ACC

/* ---- channel-blocked float32 pools (pool_nchw16c) ------------------------------------ */

#define PB16 16 /* channels in a block: one position is 16 consecutive floats */

typedef struct {
    const float *x;
    float *y;
    const pool_geom *q;
    int max, include_pad;
} pool16_ctx;

/* out (16 channels) = the max (NaN propagating, as MP_MAX) or the average (summed in
 * double, divided by dv) of the window [lo, hi) of one blocked plane's positions */
#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
__attribute__((target("arch=x86-64-v4"))) static void
pool16_window(const float *x, const pool_geom *q, const int64_t *lo, const int64_t *hi,
              int max, float *out, double dv)
{
    const int64_t iH = q->in[1], iW = q->in[2];
    if (max) {
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int64_t id = lo[0]; id < hi[0]; id++)
            for (int64_t ih = lo[1]; ih < hi[1]; ih++) {
                const float *r = x + ((id * iH + ih) * iW + lo[2]) * PB16;
                for (int64_t iw = 0; iw < hi[2] - lo[2]; iw++)
                    m = mp_nanmax512(m, _mm512_loadu_ps(r + iw * PB16));
            }
        _mm512_storeu_ps(out, m);
        return;
    }
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t id = lo[0]; id < hi[0]; id++)
        for (int64_t ih = lo[1]; ih < hi[1]; ih++) {
            const float *r = x + (id * iH + ih) * iW * PB16;
            for (int64_t iw = lo[2]; iw < hi[2]; iw++) {
                __m512 v = _mm512_loadu_ps(r + iw * PB16);
                s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
                s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
            }
        }
    if (!(dv > 0)) { /* no input element in the window */
        _mm512_storeu_ps(out, _mm512_set1_ps(NAN));
        return;
    }
    __m512d d = _mm512_set1_pd(dv);
    __m256 a = _mm512_cvtpd_ps(_mm512_div_pd(s0, d)), b = _mm512_cvtpd_ps(_mm512_div_pd(s1, d));
    _mm512_storeu_ps(out, _mm512_insertf32x8(_mm512_castps256_ps512(a), b, 1));
}

/* max pools: outputs [o0, o1) of one output row (to y, 16 floats each), every window whole
 * along the row (no clipping: the row's clipped edges go through pool16_window), rows [lo[1],
 * hi[1]) of slices [lo[0], hi[0]); the per-position window arithmetic and call left out
 * (resnet50's 3x3/2 pool of 64x112x112 on one Intel Xeon core, warm: 0.38 -> 0.19 ms) */
__attribute__((target("arch=x86-64-v4"))) static void
pool16_max_inner(const float *x, const pool_geom *q, const int64_t *lo, const int64_t *hi,
                 int64_t o0, int64_t o1, float *y)
{
    const int64_t iH = q->in[1], iW = q->in[2], kw = q->k[2], sw = q->s[2] * PB16;
    for (int64_t id = lo[0]; id < hi[0]; id++)
        for (int64_t ih = lo[1]; ih < hi[1]; ih++) {
            const float *r = x + ((id * iH + ih) * iW + o0 * q->s[2] - q->pb[2]) * PB16;
            const int first = id == lo[0] && ih == lo[1];
            float *o = y + o0 * PB16;
            if (kw == 3) {
                for (int64_t ow = o0; ow < o1; ow++, r += sw, o += PB16) {
                    __m512 m = mp_nanmax512(_mm512_loadu_ps(r), _mm512_loadu_ps(r + PB16));
                    m = mp_nanmax512(m, _mm512_loadu_ps(r + 2 * PB16));
                    _mm512_storeu_ps(o, first ? m : mp_nanmax512(_mm512_loadu_ps(o), m));
                }
                continue;
            }
            for (int64_t ow = o0; ow < o1; ow++, r += sw, o += PB16) {
                __m512 m = first ? _mm512_set1_ps(-INFINITY) : _mm512_loadu_ps(o);
                for (int64_t iw = 0; iw < kw; iw++)
                    m = mp_nanmax512(m, _mm512_loadu_ps(r + iw * PB16));
                _mm512_storeu_ps(o, m);
            }
        }
}
#else
static void pool16_window(const float *x, const pool_geom *q, const int64_t *lo,
                          const int64_t *hi, int max, float *out, double dv)
{
    const int64_t iH = q->in[1], iW = q->in[2];
    float m[PB16];
    double s[PB16] = {0};
    for (int l = 0; l < PB16; l++) m[l] = -INFINITY;
    for (int64_t id = lo[0]; id < hi[0]; id++)
        for (int64_t ih = lo[1]; ih < hi[1]; ih++)
            for (int64_t iw = lo[2]; iw < hi[2]; iw++) {
                const float *v = x + ((id * iH + ih) * iW + iw) * PB16;
                for (int l = 0; l < PB16; l++) {
                    m[l] = v[l] > m[l] || v[l] != v[l] ? v[l] : m[l];
                    s[l] += (double)v[l];
                }
            }
    for (int l = 0; l < PB16; l++) out[l] = max ? m[l] : (float)(dv > 0 ? s[l] / dv : NAN);
}
#endif

/* output rows [r0, r1): row r is (plane, od, oh) in row-major order. Inputs beyond
 * MP_AHEAD_BYTES come from L3 or memory: each row fetches the input rows its stride moves
 * past, two output rows ahead (into the next plane at a plane's end); squeezenet b8's
 * 3x3/2 pool of 8x128x55x55 in the graph, 2 threads: 0.61 -> 0.48 ms */
static void pool16_rows(void *ctx, int64_t r0, int64_t r1, int chunk)
{
    (void)chunk;
    const pool16_ctx *c = ctx;
    const pool_geom *q = c->q;
    const int64_t oD = q->out[0], oH = q->out[1], oW = q->out[2];
    const int64_t rowb = q->in[2] * PB16 * (int64_t)sizeof(float); /* an input row */
    const char *end = (const char *)(c->x + q->planes * q->isz * PB16);
    int ahead = (double)q->planes * (double)q->isz * PB16 * sizeof(float) > MP_AHEAD_BYTES;
    for (int64_t r = r0; r < r1; r++) {
        int64_t oh = r % oH, od = r / oH % oD, p = r / (oH * oD);
        const float *x = c->x + p * q->isz * PB16;
        float *y = c->y + (p * q->osz + (od * oH + oh) * oW) * PB16;
        int64_t lo[3], hi[3], pl[3];
        pool_window(q, 0, od, &lo[0], &hi[0], &pl[0]);
        pool_window(q, 1, oh, &lo[1], &hi[1], &pl[1]);
        if (ahead) {
            const char *a0 = (const char *)(x + (lo[0] * q->in[1] + hi[1]) * q->in[2] * PB16) +
                             q->s[1] * rowb;
            const char *a1 = a0 + q->s[1] * rowb;
            for (const char *a = a0; a < a1 && a < end; a += 64) __builtin_prefetch(a);
        }
        /* outputs [o0, o1): windows whole along the row */
        int64_t o0 = 0, o1 = 0;
#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
        if (c->max && hi[0] > lo[0] && hi[1] > lo[1] && q->in[2] >= q->k[2]) {
            o0 = (q->pb[2] + q->s[2] - 1) / q->s[2];
            o1 = (q->in[2] + q->pb[2] - q->k[2]) / q->s[2] + 1;
            if (o1 > oW) o1 = oW;
            if (o1 < o0) o1 = o0;
            pool16_max_inner(x, q, lo, hi, o0, o1, y);
        }
#endif
        for (int64_t ow = 0; ow < oW; ow++) {
            if (ow >= o0 && ow < o1) continue; /* done above */
            pool_window(q, 2, ow, &lo[2], &hi[2], &pl[2]);
            double dv = c->max ? 0 : avg_divisor_f32(q, c->include_pad, 0, lo, hi, pl);
            pool16_window(x, q, lo, hi, c->max, y + ow * PB16, dv);
        }
    }
}

int ortcpu_pool_nchw16c_f32(const float *x, float *y, const int64_t *geom, int max,
                            int include_pad, int nthreads)
{
    pool_geom q;
    int st = pool_geom_read(geom, &q);
    if (st) return st;
    for (int a = 0; a < 3; a++)
        if (q.d[a] != 1)
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "pool_nchw16c: dilation %lld on axis "
                            "%d (only 1)", (long long)q.d[a], a);
    if (include_pad < 0 || include_pad > 2)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "pool_nchw16c: include_pad %d", include_pad);
    pool16_ctx c = {x, y, &q, max != 0, include_pad};
    int64_t rows = q.planes * q.out[0] * q.out[1];
    int64_t work = q.out[2] * q.k[0] * q.k[1] * q.k[2] * PB16 + 1; /* per row */
    ort_parallel_for(rows, 65536 / work + 1, nthreads, pool16_rows, &c);
    return ORTCPU_OK;
}
