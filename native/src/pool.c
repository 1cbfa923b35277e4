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

#define T float
#define SFX f32
#define ACC double
#include "pool.inc"
#undef T
#undef SFX
#undef ACC

#define T double
#define SFX f64
#define ACC double
#include "pool.inc"
#undef T
#undef SFX
#undef ACC
