/* conv.c -- Conv forward and ConvGrad (spec §6.1) for 1/2/3-D, lowered to OpenBLAS GEMMs
 * through im2col / col2im. 1-D and 2-D run as 3-D with leading spatial sizes of 1.
 *
 * Geometry (int64 geom[22]): N, C, M, group, in[3] (D,H,W), k[3], out[3], stride[3],
 * pad_begin[3], dil[3]. Layouts: x [N,C,in], w [M,C/group,k], y [N,M,out].
 *
 * Threads: one OpenMP thread per slice of the batch, each with its own column buffer and
 * single-threaded OpenBLAS GEMMs (gemm.h); a batch smaller than the thread count runs the
 * samples in turn with each GEMM split over the threads instead. */
#include "common.h"
#include "gemm.h"

#include <omp.h>
#include <stdlib.h>

#include <cblas.h>

typedef struct {
    int64_t n, c, m, group;
    int64_t in[3], k[3], out[3], s[3], p[3], d[3];
    int64_t cg, mg;      /* channels per group in / out */
    int64_t isz, osz;    /* spatial sizes */
    int64_t ksz;         /* kernel volume */
    int64_t ck;          /* cg * ksz: rows of the column matrix */
    int pointwise;       /* 1x1x1 kernel, stride 1, no pad: the column matrix is x itself */
} conv_geom;

static int conv_geom_read(const int64_t *g, conv_geom *q)
{
    q->n = g[0]; q->c = g[1]; q->m = g[2]; q->group = g[3];
    for (int i = 0; i < 3; i++) {
        q->in[i] = g[4 + i]; q->k[i] = g[7 + i]; q->out[i] = g[10 + i];
        q->s[i] = g[13 + i]; q->p[i] = g[16 + i]; q->d[i] = g[19 + i];
        if (q->in[i] < 0 || q->k[i] < 1 || q->out[i] < 0 || q->s[i] < 1 || q->d[i] < 1)
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv: invalid geometry on axis %d", i);
        /* the last window must start inside the padded input: out is consistent */
        if (q->out[i] > 0 && (q->out[i] - 1) * q->s[i] - q->p[i] + (q->k[i] - 1) * q->d[i] < 0)
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv: window outside input on axis %d", i);
    }
    if (q->n < 0 || q->c < 1 || q->m < 1 || q->group < 1 || q->c % q->group || q->m % q->group)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv: invalid N/C/M/group");
    q->cg = q->c / q->group;
    q->mg = q->m / q->group;
    q->isz = q->in[0] * q->in[1] * q->in[2];
    q->osz = q->out[0] * q->out[1] * q->out[2];
    q->ksz = q->k[0] * q->k[1] * q->k[2];
    q->ck = q->cg * q->ksz;
    q->pointwise = q->ksz == 1 && q->s[0] == 1 && q->s[1] == 1 && q->s[2] == 1 &&
                   q->p[0] == 0 && q->p[1] == 0 && q->p[2] == 0 && q->out[0] == q->in[0] &&
                   q->out[1] == q->in[1] && q->out[2] == q->in[2];
    return ORTCPU_OK;
}

/* Valid output range [lo, hi) along one axis for kernel offset `off` = kk*d - p:
 * positions o with 0 <= o*s + off < in. */
static inline void conv_valid_range(int64_t off, int64_t s, int64_t in, int64_t out,
                                    int64_t *lo, int64_t *hi)
{
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = in - off <= 0 ? 0 : (in - off + s - 1) / s;
    if (b > out) b = out;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

#define T float
#define SFX f32
#define BLAS_GEMM scipy_cblas_sgemm
#define ACC double
#include "conv.inc"
#undef T
#undef SFX
#undef BLAS_GEMM
#undef ACC

#define T double
#define SFX f64
#define BLAS_GEMM scipy_cblas_dgemm
#define ACC double
#include "conv.inc"
#undef T
#undef SFX
#undef BLAS_GEMM
#undef ACC
