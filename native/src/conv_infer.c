/* conv_infer.c -- inference-only 2-D convolution for the graph executor: weights packed
 * once (at plan time), then a direct convolution on NCHW tensors with the bias, a
 * residual addend and ReLU applied as each output tile leaves the registers.
 *
 * The convolution is an implicit GEMM: Y[m, p] = sum_k W[m, k] B[k, p] with k = (c, kh,
 * kw). The input of one sample is copied once into a zero-padded, stride-phase-split
 * buffer (plane (a, b) holds padded rows a, a + s_h, ... and columns b, b + s_w, ...;
 * only the phases some kernel offset reads), Hq x Wq per plane, so that tap k of output
 * position (oh, ow) is element off[k] + oh * Wq + ow: a row of outputs reads a contiguous
 * run for every tap. A 1x1 stride-1 unpadded convolution reads X itself (no copy: a GEMM
 * straight on NCHW).
 *
 * Register tile: MR = 6 output channels x NR = 2 vectors of output positions (16 float32
 * / 8 float64), 12 accumulators. Weights are packed per group in panels of MR channels,
 * [K][MR] each (channels past the group's zero). Output positions are blocked so that a
 * block's columns for one slice of at most CI_KC taps, packed [chunk][tap][NR] (a chunk
 * of NR consecutive outputs gathered from one to a few row runs), stay near L2 while the
 * panels stream over them; partial sums of sliced taps wait in a per-task buffer. Every
 * full tile is NR consecutive outputs of Y, stored straight from the registers with the
 * epilogue. Threads split (sample, position block, channel-panel range) tasks; the copy
 * into the padded buffer is split over (sample, channel) first. One parallel region a
 * call.
 *
 * Small maps (a row tile's 16 positions would waste lanes: 7x7 = 49 -> 64) take layout 1
 * (float32): a tile is CI_CW = 16 output channels (2 vectors) x CI_PR = 6 output
 * positions, each position's input broadcast from its own offset, so positions need not
 * be contiguous; weights packed [K][16] per 16-channel panel. Threads split (sample,
 * group, panel, position range); the tile leaves through a small buffer (transposed into
 * NCHW with the epilogue).
 *
 * NaN propagates as in a plain convolution (padding is zeros; dropped columns and
 * channels are never stored); ReLU keeps NaN (v < 0 ? 0 : v). */
#include "common.h"

#include <omp.h>

/* geom[CI_GEOM_LEN]: N, C, H, W, M, group, KH, KW, OH, OW, stride h/w, pad top/left,
 * dilation h/w, layout (0 row tiles, 1 channel tiles) */
enum { G_N, G_C, G_H, G_W, G_M, G_GROUP, G_KH, G_KW, G_OH, G_OW, G_SH, G_SW, G_PT, G_PL,
       G_DH, G_DW, G_LAYOUT, CI_GEOM_LEN };

#define CI_MR 6
/* vector width in bytes of the hot loops: 512-bit at x86-64-v4 (AVX-512 cores with full
 * width units run twice the multiply-adds per instruction), else 256-bit */
#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
#define CI_VB 64
#else
#define CI_VB 32
#endif
/* output channels per group up to which row tiles read their taps in place */
#define CI_IN_PLACE_MAX_M 64
/* channel tiles (layout 1, float32): CI_CW output channels (2 vectors) x CI_PR positions */
#define CI_CW (2 * CI_VB / 4)
#define CI_PR 6
/* bytes of one position block's input columns (K x block elements) kept near L2 */
#define CI_BLOCK_BYTES (160 * 1024)
/* taps per slice: a tile's packed columns (CI_KC x NR) and weights (CI_KC x MR) near L1 */
#define CI_KC 256
/* calls below this many multiply-adds stay on the calling thread */
#define CI_SERIAL_MACS 400000

typedef struct {
    int64_t n, c, h, w, m, group, kh, kw, oh, ow, sh, sw, pt, pl, dh, dw;
    int64_t cg, mg, k;     /* channels per group in / out, K = cg * kh * kw */
    int64_t panels;        /* MR-channel weight panels per group */
    int direct;            /* 1x1, stride 1, no pad: read X itself */
    int cv;                /* layout 1: channel tiles (weights [K][CI_CW] per panel) */
    int nph, npw;          /* phases kept along h / w */
    int phase_h[64], phase_w[64];  /* phase (offset mod stride) -> kept index, -1 */
    int64_t hq, wq;        /* rows / columns of one phase plane */
    int64_t cstride;       /* elements of one channel in the padded buffer */
    int64_t grid;          /* OH * Wq positions */
} ci_geom;

static int ci_geom_read(const int64_t *g, ci_geom *q)
{
    q->n = g[G_N]; q->c = g[G_C]; q->h = g[G_H]; q->w = g[G_W]; q->m = g[G_M];
    q->group = g[G_GROUP]; q->kh = g[G_KH]; q->kw = g[G_KW]; q->oh = g[G_OH];
    q->ow = g[G_OW]; q->sh = g[G_SH]; q->sw = g[G_SW]; q->pt = g[G_PT]; q->pl = g[G_PL];
    q->dh = g[G_DH]; q->dw = g[G_DW];
    if (q->n < 0 || q->c < 1 || q->h < 1 || q->w < 1 || q->m < 1 || q->group < 1 ||
        q->c % q->group || q->m % q->group || q->kh < 1 || q->kw < 1 || q->oh < 1 ||
        q->ow < 1 || q->sh < 1 || q->sw < 1 || q->sh > 64 || q->sw > 64 || q->pt < 0 ||
        q->pl < 0 || q->dh < 1 || q->dw < 1 || g[G_LAYOUT] < 0 || g[G_LAYOUT] > 1)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv_infer: invalid geometry");
    q->cv = (int)g[G_LAYOUT];
    q->cg = q->c / q->group;
    q->mg = q->m / q->group;
    q->k = q->cg * q->kh * q->kw;
    q->panels = q->cv ? (q->mg + CI_CW - 1) / CI_CW : (q->mg + CI_MR - 1) / CI_MR;
    q->direct = q->kh == 1 && q->kw == 1 && q->sh == 1 && q->sw == 1 && q->pt == 0 &&
                q->pl == 0 && q->oh == q->h && q->ow == q->w;
    int64_t shift_h = 0, shift_w = 0;
    for (int i = 0; i < 64; i++) q->phase_h[i] = q->phase_w[i] = -1;
    q->nph = q->npw = 0;
    for (int64_t i = 0; i < q->kh; i++) {
        int64_t o = i * q->dh;
        if (q->phase_h[o % q->sh] < 0) q->phase_h[o % q->sh] = q->nph++;
        if (o / q->sh > shift_h) shift_h = o / q->sh;
    }
    for (int64_t j = 0; j < q->kw; j++) {
        int64_t o = j * q->dw;
        if (q->phase_w[o % q->sw] < 0) q->phase_w[o % q->sw] = q->npw++;
        if (o / q->sw > shift_w) shift_w = o / q->sw;
    }
    if (q->direct) {
        q->hq = q->h;
        q->wq = q->w;
        q->cstride = q->h * q->w;
    } else {
        q->hq = q->oh + shift_h;
        q->wq = q->ow + shift_w;
        q->cstride = (int64_t)q->nph * q->npw * q->hq * q->wq;
    }
    q->grid = q->oh * q->wq;
    return ORTCPU_OK;
}

/* Offset of tap k = (c, i, j) of a group in the padded buffer (or X when direct). */
static inline int64_t ci_tap_offset(const ci_geom *q, int64_t c, int64_t i, int64_t j)
{
    if (q->direct) return c * q->cstride;
    int64_t oh = i * q->dh, ow = j * q->dw;
    int64_t plane = (int64_t)q->phase_h[oh % q->sh] * q->npw + q->phase_w[ow % q->sw];
    return c * q->cstride + plane * q->hq * q->wq + (oh / q->sh) * q->wq + ow / q->sw;
}

int ortcpu_conv_infer_packed_size(const int64_t *geom, int64_t *elements)
{
    ci_geom q = {0};
    int st = ci_geom_read(geom, &q);
    if (st) return st;
    *elements = q.group * q.panels * q.k * (q.cv ? CI_CW : CI_MR);
    return ORTCPU_OK;
}

#define T float
#define TI int32_t
#define SFX f32
#define CI_HAS_CV 1
#include "conv_infer.inc"
#undef T
#undef TI
#undef SFX
#undef CI_HAS_CV

#define T double
#define TI int64_t
#define SFX f64
#define CI_HAS_CV 0
#include "conv_infer.inc"
#undef T
#undef TI
#undef SFX
#undef CI_HAS_CV
