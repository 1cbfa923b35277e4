/* tensor.c -- data movement for the tensor-manipulation ops (spec §9, §10.1):
 * gather / scatter-add of rows with checked indices, an N-d strided copy
 * (Slice, SliceGrad, Split, Concat), sums over one axis (ReduceSumTraining). */
#include "common.h"

/* ---- N-d strided copy (any element size) --------------------------------
 * dst[d_off(i)] = src[s_off(i)] for every multi-index i of `shape`;
 * strides are in elements and may be negative (Slice with negative steps). */

typedef struct {
    const char *src;
    char *dst;
    int ndim;
    const int64_t *shape, *ss, *ds;
    int64_t esz, inner;   /* inner = shape[ndim-1] */
} scopy_ctx;

static void scopy_rows(void *vctx, int64_t b, int64_t e, int chunk)
{
    (void)chunk;
    scopy_ctx *c = vctx;
    int nd = c->ndim;
    int64_t esz = c->esz, inner = c->inner;
    int64_t sstep = c->ss[nd - 1] * esz, dstep = c->ds[nd - 1] * esz;
    for (int64_t r = b; r < e; r++) {
        /* decompose the row index r over shape[0..nd-2] */
        int64_t rem = r, so = 0, dof = 0;
        for (int k = nd - 2; k >= 0; k--) {
            int64_t ik = rem % c->shape[k];
            rem /= c->shape[k];
            so += ik * c->ss[k];
            dof += ik * c->ds[k];
        }
        const char *s = c->src + so * esz;
        char *d = c->dst + dof * esz;
        if (sstep == esz && dstep == esz) {
            memcpy(d, s, (size_t)(inner * esz));
        } else if (esz == 4) {
            for (int64_t j = 0; j < inner; j++)
                memcpy(d + j * dstep, s + j * sstep, 4);
        } else if (esz == 8) {
            for (int64_t j = 0; j < inner; j++)
                memcpy(d + j * dstep, s + j * sstep, 8);
        } else {
            for (int64_t j = 0; j < inner; j++)
                memcpy(d + j * dstep, s + j * sstep, (size_t)esz);
        }
    }
}

int ortcpu_strided_copy(const void *src, void *dst, int ndim, const int64_t *shape,
                        const int64_t *src_strides, const int64_t *dst_strides,
                        int64_t elem_size, int nthreads)
{
    if (ndim < 0 || elem_size <= 0)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "strided_copy: bad ndim/elem_size");
    int64_t n = 1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 0) return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "strided_copy: shape < 0");
        n *= shape[k];
    }
    if (n == 0) return ORTCPU_OK;
    if (ndim == 0) {
        memcpy(dst, src, (size_t)elem_size);
        return ORTCPU_OK;
    }
    scopy_ctx c = {src, dst, ndim, shape, src_strides, dst_strides, elem_size, shape[ndim - 1]};
    int64_t rows = n / c.inner;
    int64_t grain = (1 << 15) / (c.inner * elem_size) + 1;
    ort_parallel_for(rows, grain, nthreads, scopy_rows, &c);
    return ORTCPU_OK;
}

/* Check every index is in [-dim, dim); the first bad one is reported. */
int ortcpu_check_indices(const int64_t *idx, int64_t n, int64_t dim, int64_t *bad_pos)
{
    for (int64_t j = 0; j < n; j++) {
        if (idx[j] < -dim || idx[j] >= dim) {
            *bad_pos = j;
            return ort_fail(ORTCPU_E_INDEX_OUT_OF_RANGE,
                            "index %lld at position %lld is out of range [%lld, %lld]",
                            (long long)idx[j], (long long)j, (long long)-dim,
                            (long long)(dim - 1));
        }
    }
    *bad_pos = -1;
    return ORTCPU_OK;
}

#define ORT_TEMPLATE "tensor.inc"
#include "instantiate.h"
