/* conv.c -- Conv forward and ConvGrad (spec §6.1) for 1/2/3-D on OpenBLAS GEMMs.
 * 1-D and 2-D run as 3-D with leading spatial sizes of 1.
 *
 * Geometry (int64 geom[23]): N, C, M, group, in[3] (D,H,W), k[3], out[3], stride[3],
 * pad_begin[3], dil[3], algorithm (CONV_ALGO_*: 0 auto, 1 im2col, 2 Winograd F(2x2,3x3),
 * 3 Winograd F(4x4,3x3), 4 small-map im2col, 5 depthwise, 6 packed, 7 direct: the forward
 * of few-channel first layers on conv_infer.c's kernel, conv_direct_use). Layouts: x [N,C,in],
 * w [M,C/group,k], y [N,M,out].
 *
 * Three lowerings:
 * - Depthwise (conv_dw.inc) for 2-D (and 1-D) convolutions with group == C and M a
 *   multiple of C, pads >= 0, any kernel, stride and dilation: a direct loop per channel
 *   plane over a zero-padded, stride-phase-split copy in register tiles, instead of C
 *   one-row GEMMs; measured against the grouped im2col path at MobileNetV3 / ConvNeXt
 *   shapes (benchmarks/conv_depthwise.py), auto picks it where it pays (conv_dw_pays).
 * - Winograd (conv_wino.inc) for 2-D 3x3 kernels with stride 1, dilation 1, group 1 and
 *   any (asymmetric) padding: (r+2)^2 GEMMs per block of r x r output tiles instead of
 *   one im2col GEMM, 2.25x (F(2x2)) or 4x (F(4x4)) fewer multiply-adds. dX is the same
 *   forward convolution of dY with the kernel rotated by 180 degrees, channels swapped
 *   and pads 2 - p; dW comes from dU_xi += (A dY A^T)_xi . (B^T x B)_xi^T over the same
 *   tiles, dW = G^T dU G. Auto picks Winograd when C >= 8, M >= 4 and there are at least
 *   max(C, M) 2x2 tiles (measured per shape against im2col: 1.2-2.4x faster there; a 1-
 *   or 3-channel first layer and few tiles against many channels lose), and F(4x4) among
 *   the two unless its 4x4 tiles hang far over the edge (see conv_wino_tile). float32 error
 *   vs a float64 reference (max|err|/max|ref|): F(2x2) <= 7e-7 like im2col and oneDNN,
 *   F(4x4) <= 1.1e-5. Forced with algorithm 2 / 3 (tests compare all paths).
 * - im2col / col2im + one GEMM per group for everything else, over one sample or, when
 *   the output map is small (< 1024 positions), over several samples' column matrices
 *   side by side (conv_batch in conv.inc: 2-14% faster on 4x4..8x8 maps, measured).
 *   On such small maps (2-D, dilation 1, pads >= 0, any stride) im2col and col2im go through
 *   a zero-padded copy of each channel plane (conv_small_map_fits; algorithm 4 forces it):
 *   N8 32->64 on 4x4, 1 thread, forward 121 -> 71 us, backward 222 -> 147 us; 8x8 maps
 *   1.2-1.6x (measured on the AVX2 EPYC).
 * - Packed (conv_pk.inc), on the small-map geometry with small weights (conv_pk_use;
 *   algorithm 6 forces it): forward and dX per sample (or per 2-4 samples side by side
 *   where one sample's map would leave the last column tile mostly empty: pk_batch) as
 *   our own register-tile GEMM (6 rows x 2 ymm; 8 rows x 2 zmm on AVX-512 builds)
 *   against the weights (W or W^T) packed once per call, instead of the batched BLAS
 *   GEMM; dW / dB stay on the small-map im2col path, whose batch of column matrices is
 *   capped to stay in L2 (CONV_BATCH_L2), with dW as dot products instead of the BLAS
 *   GEMM on AVX-512 builds where the column matrix is narrow (conv_dw_dot).
 *   Winograd's per-position GEMMs of the forward and dX run on the same register tile on
 *   AVX-512 builds (wino_use_pk).
 *
 * Threads: im2col gives one OpenMP thread per slice of the batch, each with its own
 * column buffer and single-threaded OpenBLAS GEMMs (gemm.h); a batch smaller than the
 * thread count runs the samples in turn with each GEMM split over the threads instead.
 * Winograd splits the blocks of tiles (numbered over all images, so one image can span
 * threads) evenly over the threads, each with its own V/M scratch (~512 KB, near L2;
 * at least 64 tiles) and single-threaded GEMMs; dW sums per-thread dU partials at the
 * end. The kernel transforms (U = G g G^T, dW = G^T dU G) split over the threads too:
 * serial, they were 2.5 of the 5.8 ms of a 256->256 F(4x4) forward on 7x7. Problems under ~2 MFLOP stay on the calling thread either way. */
#include "common.h"
#include "gemm.h"

#include <omp.h>
#include <stdlib.h>

#ifndef WINO_BLOCK_BYTES
#define WINO_BLOCK_BYTES (512 * 1024)
#endif

typedef struct {
    int64_t n, c, m, group;
    int64_t in[3], k[3], out[3], s[3], p[3], d[3];
    int64_t cg, mg;      /* channels per group in / out */
    int64_t isz, osz;    /* spatial sizes */
    int64_t ksz;         /* kernel volume */
    int64_t ck;          /* cg * ksz: rows of the column matrix */
    int pointwise;       /* 1x1x1 kernel, stride 1, no pad: the column matrix is x itself */
    int small_map;       /* im2col/col2im through a zero-padded plane (conv_small_map_fits) */
    int64_t ph, pw;      /* that plane's rows and columns */
    int algo;            /* CONV_ALGO_*: geom[22] */
} conv_geom;

enum { CONV_ALGO_AUTO = 0, CONV_ALGO_IM2COL = 1, CONV_ALGO_WINOGRAD2 = 2, CONV_ALGO_WINOGRAD4 = 3,
       CONV_ALGO_SMALL_MAP = 4, CONV_ALGO_DEPTHWISE = 5, CONV_ALGO_PACKED = 6,
       CONV_ALGO_DIRECT = 7 };

/* Output maps below this many positions batch several samples into one im2col GEMM
 * (conv_batch in conv.inc) and take the small-map column path where it fits. */
#define CONV_BATCH_COLS 1024
/* Small-map path: 2-D, dilation 1, pads >= 0, any stride, the padded plane at most this
 * many elements (it lives on the stack). On small maps the generic im2col spends most of
 * its time in 3-8 element row copies (strided gathers for stride 2) with per-row
 * clipping; through a padded copy of each channel every row is one fixed-length move or
 * gather (measured: see conv.inc). The plane holds what the windows read, rows
 * (out - 1) * s + k per side: input beyond it (negative end pads, strides that skip the
 * last rows) is never read. */
#define CONV_SMALL_PLANE 4096
/* Stack buffer of the small-map im2col / col2im (conv.inc): several channels' planes. */
#define CONV_SMALL_BUF 8192
static int conv_small_map_fits(const conv_geom *q)
{
    if (q->in[0] != 1 || q->k[0] != 1 || q->out[0] != 1 || q->p[0] != 0 || q->pointwise)
        return 0;
    for (int i = 1; i < 3; i++)
        if (q->d[i] != 1 || q->p[i] < 0)
            return 0;
    return ((q->out[1] - 1) * q->s[1] + q->k[1]) * ((q->out[2] - 1) * q->s[2] + q->k[2]) <=
           CONV_SMALL_PLANE;
}

/* Direct forward (conv_infer.c's row tiles, the weights packed per call): a 2-D
 * convolution with begin pads >= 0 and strides <= 64 (what that kernel takes). */
static int conv_direct_fits(const conv_geom *q)
{
    return q->in[0] == 1 && q->k[0] == 1 && q->out[0] == 1 && q->p[0] == 0 &&
           q->p[1] >= 0 && q->p[2] >= 0 && q->s[1] <= 64 && q->s[2] <= 64;
}

static int conv_geom_read(const int64_t *g, conv_geom *q)
{
    if (g[22] < CONV_ALGO_AUTO || g[22] > CONV_ALGO_DIRECT)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv: algorithm %lld not in 0..7",
                        (long long)g[22]);
    q->algo = (int)g[22];
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
    q->ph = (q->out[1] - 1) * q->s[1] + q->k[1];
    q->pw = (q->out[2] - 1) * q->s[2] + q->k[2];
    if (q->algo == CONV_ALGO_DIRECT && !conv_direct_fits(q))
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv: the direct path needs a 2-D "
                        "convolution with pads >= 0 and strides <= 64");
    int fits = conv_small_map_fits(q);
    if ((q->algo == CONV_ALGO_SMALL_MAP || q->algo == CONV_ALGO_PACKED) && !fits)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv: the small-map and packed paths "
                        "need a 2-D convolution with dilation 1, pads >= 0 and a padded plane "
                        "((out - 1) * stride + kernel per side) of at most %d elements",
                        CONV_SMALL_PLANE);
    q->small_map = q->algo == CONV_ALGO_SMALL_MAP || q->algo == CONV_ALGO_PACKED ||
                   (q->algo == CONV_ALGO_AUTO && fits && q->osz < CONV_BATCH_COLS);
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

/* ---- packed small-map path (conv_pk.inc) ---- */

/* Auto takes the packed path on small maps (where the small-map im2col path would run)
 * when one group's weights are at most this many bytes: they stay in L2 beside a
 * sample's column matrix while every sample streams them (the kernel does not block K).
 * Measured against small-map, 1 thread CPU time, N64, on a loaded AVX2 EPYC (noisy):
 * forward 1->32 on 8x8 1.4-1.5x, 32->64 on 4x4 1.1-1.5x, 1->32 on 28x28 1.07x; dX of
 * 32->64 on 4x4 1.1-1.7x; whole fwd + bwd (min of 60 interleaved calls, dW unchanged)
 * 1->32 on 8x8 1.29x, on 28x28 1.27x, 32->64 on 4x4 0.96-1.0x (benchmarks/conv_small). */
#define CONV_PK_WEIGHT_BYTES (128 * 1024)
static int conv_pk_use(const conv_geom *q, size_t esz)
{
    if (q->algo == CONV_ALGO_PACKED) return 1;
    return q->algo == CONV_ALGO_AUTO && q->small_map &&
           (size_t)(q->mg * q->ck) * esz <= CONV_PK_WEIGHT_BYTES;
}

/* dW of the packed path as dot products along the output positions (pk_dot_nt in
 * conv_pk.inc) instead of the BLAS GEMM dY . col^T, on AVX-512 builds where col has at
 * most CONV_DOT_CK rows (kernel taps x channels): there the GEMM's n is narrower than the
 * BLAS's tiles. Measured (1 thread, CPU time, N64, dW + dB, AVX-512 EPYC): 1->32 on 28x28
 * (9 rows) 1.47 -> 0.94 ms (0.45 ms with 4 x 3 tiles and dB summed at the build's width;
 * torch 0.47), 3->16 on 28x28 (27) 1.6-1.7x; 16->32 on 8x8 (144) 1.0x and
 * 32->64 (288) 0.1-0.6x, which keep the BLAS; on the AVX2 build (16 registers: the tile
 * spills) 0.55x. Maps of CONV_DOT_SAMPLE positions and up take one sample at a time
 * (28x28: 1.25x -> 1.56x faster than the BLAS), smaller ones the batched column block
 * (8x8: 1.12x; one sample of 64 positions, 0.55x). */
#define CONV_DOT_CK 32
#define CONV_DOT_SAMPLE 512
static int conv_dw_dot(const conv_geom *q, size_t esz)
{
    return ORT_ISA_LEVEL >= 2 && q->ck <= CONV_DOT_CK && conv_pk_use(q, esz);
}

/* ---- depthwise (conv_dw.inc) ---- */

/* Depthwise: one input channel per group (group == C > 1), M = C * multiplier, 2-D or
 * 1-D (no depth axis), pads >= 0 (the end pads follow from the output size). */
static int conv_dw_fits(const conv_geom *q)
{
    return q->group == q->c && q->c > 1 && q->m % q->c == 0 && q->in[0] == 1 &&
           q->k[0] == 1 && q->out[0] == 1 && q->p[0] == 0 && q->s[0] == 1 && q->d[0] == 1 &&
           q->p[1] >= 0 && q->p[2] >= 0;
}

/* How conv_dw.inc computes dX (see there). */
enum { DW_DX_SCATTER = 0, DW_DX_CORR = 1, DW_DX_PHASES = 2 };

/* Where the depthwise kernel beats grouped im2col (benchmarks/conv_depthwise.py, 1 thread
 * CPU time, N8, forward + backward): stride 1 everywhere (3x3 C16/C48 on 56/28 maps
 * 1.2-1.4x; 5x5 and 7x7 on 28..4 maps 2-4.7x); stride 2 with 5x5+ kernels (4x4 outputs
 * 1.05x, 14x14 2.7x) or outputs of 14x14 and more (3x3: 28x28 1.15x, 16x16 1.2x; on 8x8
 * and 4x4 outputs 0.9x / 0.55x: the per-phase set-up does not pay there). */
static int conv_dw_pays(const conv_geom *q)
{
    return (q->s[1] == 1 && q->s[2] == 1) || q->k[1] * q->k[2] >= 25 || q->osz >= 196;
}

/* Whether this convolution runs on the depthwise kernel: forced, or where it fits and
 * pays. */
static int conv_dw_use(const conv_geom *q)
{
    return q->algo == CONV_ALGO_DEPTHWISE ||
           (q->algo == CONV_ALGO_AUTO && conv_dw_fits(q) && conv_dw_pays(q));
}

/* ---- Winograd F(2x2, 3x3) / F(4x4, 3x3) geometry (conv_wino.inc) ---- */

/* The geometry Winograd handles: 2-D, 3x3 kernel, stride 1, dilation 1, one group; any
 * (asymmetric, even negative-end) padding. */
static int conv_wino_fits(const conv_geom *q)
{
    return q->group == 1 && q->k[0] == 1 && q->k[1] == 3 && q->k[2] == 3 && q->in[0] == 1 &&
           q->out[0] == 1 && q->p[0] == 0 && q->s[0] == 1 && q->s[1] == 1 && q->s[2] == 1 &&
           q->d[0] == 1 && q->d[1] == 1 && q->d[2] == 1;
}

/* Where Winograd pays (measured per shape against im2col, 1 thread, forward + backward):
 * at least 8 input and 4 output channels (1-3 input channels, a network's first layer:
 * im2col's single GEMM is 1.5-4x faster; 4 in -> 16 out on 14x14: 0.86x), and at least
 * as many 2x2 output tiles as channels on either side (few tiles against many channels,
 * e.g. N4 256->256 on 7x7, leave the GEMMs too narrow: ~1.0x). */
#define WINO_MIN_C 8
#define WINO_MIN_M 4
/* Output maps of at most WINO_MIN_OSZ positions (4x4) go to the small-map im2col path
 * instead: digits' N64 32->64 on 4x4, forward + backward, 1 thread: small-map 2.9 ms,
 * F(2x2) 3.6-4.4, F(4x4) 3.0, torch 3.4; N8 32->64 on 4x4: 0.27 / 0.37-0.5 / 0.3 ms
 * (on 8x8 maps Winograd stays ahead: N16 32->32 1.2 ms against 1.4). */
#define WINO_MIN_OSZ 16
static int conv_wino_pays(const conv_geom *q)
{
    int64_t tiles = q->n * ((q->out[1] + 1) / 2) * ((q->out[2] + 1) / 2);
    return q->c >= WINO_MIN_C && q->m >= WINO_MIN_M && tiles >= q->c && tiles >= q->m &&
           q->out[1] * q->out[2] > WINO_MIN_OSZ;
}

/* Tile size of the Winograd path for this convolution (0: im2col): 2 for F(2x2,3x3),
 * 4 for F(4x4,3x3); forced by the algorithm, or chosen where it fits and pays. */
static int conv_wino_tile(const conv_geom *q)
{
    if (q->algo == CONV_ALGO_IM2COL || q->algo == CONV_ALGO_SMALL_MAP ||
        q->algo == CONV_ALGO_PACKED || !conv_wino_fits(q))
        return 0;
    if (q->algo == CONV_ALGO_WINOGRAD2) return 2;
    if (q->algo == CONV_ALGO_WINOGRAD4) return 4;
    if (!conv_wino_pays(q)) return 0;
    /* F(4x4) when its GEMM work, 36 per 4x4 tile, is at most 0.85x F(2x2)'s, 16 per 2x2
     * tile, and it still has as many tiles as channels: 1.1-1.5x faster than F(2x2) on
     * output sides 7, 9, 10, 12, 14, 28 (measured); F(2x2) where 4x4 tiles hang over the
     * edge (5x5, 6x6: 1.15x faster than F(4x4)), for tiny outputs, and for few images
     * against many channels (N8 256->256 on 14x14: 1.15x). */
    int64_t oh = q->out[1], ow = q->out[2];
    int64_t t2 = ((oh + 1) / 2) * ((ow + 1) / 2), t4 = ((oh + 3) / 4) * ((ow + 3) / 4);
    int64_t tiles4 = q->n * t4;
    if (36.0 * (double)t4 <= 0.85 * 16.0 * (double)t2 && tiles4 >= q->c && tiles4 >= q->m)
        return 4;
    return 2;
}

/* One Winograd convolution: x [n, c, ih, iw] -> y [n, m, oh, ow], y[o] = sum x[o + k - p]
 * (x zero outside the image), covered by r x r output tiles (r = 2: F(2x2,3x3), r = 4:
 * F(4x4,3x3)), th x tw per image, each reading a (r+2) x (r+2) input patch; nx = (r+2)^2
 * transformed positions. */
typedef struct {
    int64_t n, c, m, ih, iw, oh, ow, ph, pw;
    int64_t th, tw, ntiles;
    int r, pch, nx;
} wino_geom;

static void wino_geom_init(wino_geom *g, int r, int64_t n, int64_t c, int64_t m, int64_t ih,
                           int64_t iw, int64_t oh, int64_t ow, int64_t ph, int64_t pw)
{
    g->n = n; g->c = c; g->m = m; g->ih = ih; g->iw = iw; g->oh = oh; g->ow = ow;
    g->ph = ph; g->pw = pw;
    g->r = r;
    g->pch = r + 2;
    g->nx = g->pch * g->pch;
    g->th = (oh + r - 1) / r;
    g->tw = (ow + r - 1) / r;
    g->ntiles = n * g->th * g->tw;
}

/* Tiles per block (>= 64, a multiple of 16), chosen so the block's transformed input and
 * output, nx * (c + m) * tb elements, stay near L2 (measured), and the number of blocks
 * is a multiple of the thread count. */
static int64_t wino_block(const wino_geom *g, size_t esz, int t, int64_t *nblocks)
{
    int64_t tb = (int64_t)(WINO_BLOCK_BYTES / ((size_t)g->nx * (size_t)(g->c + g->m) * esz));
    if (tb < 64) tb = 64;
    if (tb > 512) tb = 512;
    int64_t nb = (g->ntiles + tb - 1) / tb;
    nb = (nb + t - 1) / t * t;
    tb = (g->ntiles + nb - 1) / nb;
    tb = (tb + 15) / 16 * 16;
    *nblocks = (g->ntiles + tb - 1) / tb;
    return tb;
}

/* Plane stride of V / M: a multiple of 4 KB would put all nx streams of a transform in
 * one L1 set (measured: F(4x4) input transform 5x slower); 16 elements more spread them. */
static inline int64_t wino_plane(int64_t ch, int64_t ld)
{
    return ch * ld + 16;
}

/* Winograd's per-position GEMMs (M = output channels, K = input channels, N = tiles of a
 * block) on the packed path's register tile (pk_gemm, the transformed kernel packed once
 * per call) on AVX-512 builds, where the tile is 16 lanes wide against the BLAS's
 * Haswell kernels (OPENBLAS_CORETYPE; MKL measured no faster): forward and dX 1.1-1.5x
 * faster over N64 32->64 on 14x14 / 8x8, N16 64->64 on 28x28, N8 128->128 on 14x14, N8
 * 64->128 on 56x56 (1 thread, CPU time, AVX-512 EPYC). On the AVX2 build the BLAS stays
 * (the 6x16 tile measured 0.8-1.0x there). The dW GEMMs (dM . V^T, long K) keep the
 * BLAS: transposing V for the tile cost what it saved (0.93-1.10x). */
static int wino_use_pk(void)
{
    return ORT_ISA_LEVEL >= 2;
}

/* ---- im2col / col2im of tiny planes (float, AVX-512 builds) ----
 * Where a channel's input plane and its output map have at most 16 positions (digits'
 * 4x4 maps), a column row, the plane as kernel tap (kh, kw) sees it, is one vector: the
 * plane loaded once, permuted by the tap's gather table and zeroed where the window falls
 * in the padding (vpermps + a mask), one store; col2im sums each tap's row permuted back.
 * The small-map path's padded plane took 1/3 of the packed forward's time there and 1/5
 * of its backward (perf, N64 32->64 on 4x4): its 16-byte row moves read plane rows that
 * partially overlap the stores just made, which store forwarding cannot serve. */
#define CONV_TINY 16
#define CONV_TINY_TAPS 49
#if ORT_ISA_LEVEL >= 2
typedef float conv_tv __attribute__((vector_size(4 * CONV_TINY)));
typedef int32_t conv_ti __attribute__((vector_size(4 * CONV_TINY)));

typedef struct {
    conv_ti fwd[CONV_TINY_TAPS], keep[CONV_TINY_TAPS]; /* output j <- plane fwd[j] */
    conv_ti bwd[CONV_TINY_TAPS], used[CONV_TINY_TAPS]; /* plane i <- output bwd[i] */
} conv_tiny_tables;

static int conv_tiny_fits(const conv_geom *q)
{
    return q->in[0] == 1 && q->k[0] == 1 && q->isz <= CONV_TINY && q->osz <= CONV_TINY &&
           q->k[1] * q->k[2] <= CONV_TINY_TAPS;
}

ORT_SIMD_CLONES
static void conv_tiny_build(const conv_geom *q, conv_tiny_tables *t)
{
    memset(t, 0, sizeof(*t));
    const int64_t oW = q->out[2], iH = q->in[1], iW = q->in[2];
    for (int64_t tap = 0; tap < q->k[1] * q->k[2]; tap++) {
        int64_t kh = tap / q->k[2], kw = tap % q->k[2];
        for (int64_t j = 0; j < q->osz; j++) {
            int64_t ih = j / oW * q->s[1] + kh * q->d[1] - q->p[1];
            int64_t iw = j % oW * q->s[2] + kw * q->d[2] - q->p[2];
            if (ih < 0 || ih >= iH || iw < 0 || iw >= iW) continue;
            int64_t i = ih * iW + iw;
            t->fwd[tap][j] = (int32_t)i;
            t->keep[tap][j] = -1;
            t->bwd[tap][i] = (int32_t)j;
            t->used[tap][i] = -1;
        }
    }
}

/* The calling thread's tables for q's geometry, rebuilt when the geometry changes (a
 * per-sample im2col call would otherwise rebuild them every time). */
ORT_SIMD_CLONES
static const conv_tiny_tables *conv_tiny_get(const conv_geom *q)
{
    static __thread conv_tiny_tables tables;
    static __thread int64_t key[12];
    static __thread int built;
    const int64_t k[12] = {q->in[1], q->in[2], q->out[1], q->out[2], q->k[1], q->k[2],
                           q->s[1],  q->s[2],  q->p[1],   q->p[2],   q->d[1], q->d[2]};
    if (!built || memcmp(k, key, sizeof(k)) != 0) {
        conv_tiny_build(q, &tables);
        memcpy(key, k, sizeof(k));
        built = 1;
    }
    return &tables;
}

ORT_SIMD_CLONES
static inline conv_tv conv_tiny_load(const float *src, int64_t n)
{
    conv_tv v = {0};
    memcpy(&v, src, (size_t)n * sizeof(float));
    return v;
}

ORT_SIMD_CLONES
static inline void conv_tiny_store(float *dst, conv_tv v, int64_t n)
{
    if (n == CONV_TINY) {
        memcpy(dst, &v, sizeof(v));
    } else {
        float t[CONV_TINY];
        memcpy(t, &v, sizeof(v));
        memcpy(dst, t, (size_t)n * sizeof(float));
    }
}

/* col rows (ld apart, osz used) of the q->cg channel planes at x, as im2col_small. */
ORT_SIMD_CLONES
static void conv_tiny_im2col(const float *x, float *col, int64_t ld, const conv_geom *q)
{
    const conv_tiny_tables *t = conv_tiny_get(q);
    const int64_t taps = q->k[1] * q->k[2];
    for (int64_t c = 0; c < q->cg; c++) {
        conv_tv xv = conv_tiny_load(x + c * q->isz, q->isz);
        for (int64_t tap = 0; tap < taps; tap++, col += ld) {
            conv_tv v = (conv_tv)((conv_ti)__builtin_shuffle(xv, t->fwd[tap]) & t->keep[tap]);
            conv_tiny_store(col, v, q->osz);
        }
    }
}

/* dx [cg, isz] += col2im(col), as col2im_small. */
ORT_SIMD_CLONES
static void conv_tiny_col2im(const float *col, int64_t ld, float *dx, const conv_geom *q)
{
    const conv_tiny_tables *t = conv_tiny_get(q);
    const int64_t taps = q->k[1] * q->k[2];
    for (int64_t c = 0; c < q->cg; c++) {
        conv_tv acc = conv_tiny_load(dx + c * q->isz, q->isz);
        for (int64_t tap = 0; tap < taps; tap++, col += ld) {
            conv_tv v = conv_tiny_load(col, q->osz);
            acc += (conv_tv)((conv_ti)__builtin_shuffle(v, t->bwd[tap]) & t->used[tap]);
        }
        conv_tiny_store(dx + c * q->isz, acc, q->isz);
    }
}
#define CONV_TINY_USE(q, esz) ((esz) == sizeof(float) && conv_tiny_fits(q))
#else
#define CONV_TINY_USE(q, esz) 0
#define conv_tiny_im2col(x, col, ld, q) ((void)0)
#define conv_tiny_col2im(col, ld, dx, q) ((void)0)
#endif

/* Auto runs the forward as the direct convolution of the graph executor's inference
 * kernel (conv_infer.c: the input copied once into a padded plane per sample, register
 * tiles of 6 output channels x 2 vectors of positions reading each tap in place, no
 * column matrix) for first layers: at most CONV_DIRECT_MAX_CG input channels per group,
 * no depthwise split. Measured against the training lowerings (1 thread, CPU time,
 * median, the packing included, AVX-512 EPYC): N64 1->32 3x3 on 28x28 1.89 -> 0.72 ms
 * (packed path), N64 3->32 3x3 on 32x32 2.47 -> 1.80 (im2col), N8 3->64 7x7 stride 2 on
 * 224x224 45.4 -> 23.4 (im2col), N64 1->32 on 8x8 0.112 -> 0.101, N64 3->16 5x5 on 28x28
 * 2.75 -> 2.67; with 8 input channels (N64 8->16 on 28x28) Winograd F(4x4) stays faster
 * (2.59 against 2.92). dX and dW keep the training lowerings (algorithm 7 forces it for
 * the forward only). */
#define CONV_DIRECT_MAX_CG 3
static int conv_direct_use(const conv_geom *q)
{
    if (q->algo == CONV_ALGO_DIRECT) return 1;
    return q->algo == CONV_ALGO_AUTO && q->cg <= CONV_DIRECT_MAX_CG && !q->pointwise &&
           conv_direct_fits(q);
}

/* conv_infer's geometry of q (layout 0: row tiles). */
static void conv_direct_geom(const conv_geom *q, int64_t *g)
{
    const int64_t v[17] = {q->n,      q->c,      q->in[1],  q->in[2], q->m,    q->group,
                           q->k[1],   q->k[2],   q->out[1], q->out[2], q->s[1], q->s[2],
                           q->p[1],   q->p[2],   q->d[1],   q->d[2],  0};
    memcpy(g, v, sizeof(v));
}

/* Which lowering the forward of geom runs (CONV_ALGO_*, never AUTO): the dispatch order
 * of ortcpu_conv_forward_*. */
int ortcpu_conv_path(const int64_t *geom, int elem_size)
{
    conv_geom q;
    int st = conv_geom_read(geom, &q);
    if (st) return st;
    if (elem_size != 4 && elem_size != 8)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "conv_path: elem_size must be 4 or 8");
    if (conv_dw_use(&q)) return CONV_ALGO_DEPTHWISE;
    if (conv_direct_use(&q)) return CONV_ALGO_DIRECT;
    int wr = conv_wino_tile(&q);
    if (wr) return wr == 2 ? CONV_ALGO_WINOGRAD2 : CONV_ALGO_WINOGRAD4;
    if (conv_pk_use(&q, (size_t)elem_size)) return CONV_ALGO_PACKED;
    return q.small_map ? CONV_ALGO_SMALL_MAP : CONV_ALGO_IM2COL;
}

/* ---- Winograd F(4x4, 3x3) gathers of float maps (x86-64-v3 and v4 builds) ----
 * A tile row's patch row (6 columns per tile, 4 apart), a dY tile row (4 columns per tile)
 * and an output row (the other way round) are strided copies that runs of a few tiles
 * leave scalar: a 14x14 map has runs of 4 tiles, and the gathers and the scatter took 1/4
 * of the Winograd convolution's perf samples at N64 32->64, more than its GEMMs. Four
 * tiles at a time: on AVX-512 builds one masked load of the row (zeros outside [0, w)),
 * one permute per patch column and one 4-lane store; on AVX2 builds a 4x4 transpose of
 * four 4-lane loads (a patch row's columns 4 and 5 are the first two of the transpose one
 * load further on). perf samples of the three, fwd + dX + dW on that conv, Zen 4, vs the
 * scalar loops: -30% (AVX-512), -17% (the AVX2 code; -22% in the AVX2 build). */
#if ORT_ISA_LEVEL >= 1
#include <immintrin.h>
#endif
#if ORT_ISA_LEVEL >= 2
/* row[col + i] for i < n (n <= 16), zero where col + i lies outside [0, w) */
ORT_SIMD_CLONES
static inline __m512 wino4_load(const float *row, int64_t w, int64_t col, int n)
{
    int64_t lo = col < 0 ? -col : 0, hi = w - col < n ? w - col : n;
    if (hi <= lo) return _mm512_setzero_ps();
    __mmask16 m = (__mmask16)((((uint32_t)1 << hi) - 1) & ~(((uint32_t)1 << lo) - 1));
    return _mm512_maskz_loadu_ps(m, row + col); /* masked-off lanes are not read */
}

/* d[q * dl + j] = src[c0 + 4 j + q] (zero outside [0, w)), q < 6, j < cnt */
ORT_SIMD_CLONES
static void wino4_row_f32(const float *restrict src, int64_t w, int64_t c0, int64_t cnt,
                          float *restrict d, int64_t dl)
{
    for (int64_t j = 0; j < cnt; j += 4) {
        int64_t col = c0 + 4 * j;
        __mmask8 keep = (__mmask8)((1u << (cnt - j < 4 ? cnt - j : 4)) - 1);
        __m512 a = wino4_load(src, w, col, 16), b = wino4_load(src, w, col + 16, 2);
        for (int q = 0; q < 6; q++) {
            __m512i idx = _mm512_setr_epi32(q, 4 + q, 8 + q, 12 + q, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0);
            __m512 v = _mm512_permutex2var_ps(a, idx, b);
            _mm_mask_storeu_ps(d + q * dl + j, keep, _mm512_castps512_ps128(v));
        }
    }
}

/* dst[b * rl + j] = p[4 j + b] where 4 j + b < ncol, else zero; b < 4, j < cnt */
ORT_SIMD_CLONES
static void wino4_dy_row_f32(const float *restrict p, int64_t ncol, int64_t cnt,
                             float *restrict dst, int64_t rl)
{
    for (int64_t j = 0; j < cnt; j += 4) {
        __mmask8 keep = (__mmask8)((1u << (cnt - j < 4 ? cnt - j : 4)) - 1);
        __m512 a = wino4_load(p, ncol, 4 * j, 16);
        for (int b = 0; b < 4; b++) {
            __m512i idx = _mm512_setr_epi32(b, 4 + b, 8 + b, 12 + b, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0);
            __m512 v = _mm512_permutexvar_ps(idx, a);
            _mm_mask_storeu_ps(dst + b * rl + j, keep, _mm512_castps512_ps128(v));
        }
    }
}

/* dst[c] = src[(c % 4) * rl + c / 4] for c < ncol: the output row of the tiles whose
 * A^T M A rows are at src (4 rows, rl apart), 4 tiles (16 columns) per store */
ORT_SIMD_CLONES
static void wino4_out_row_f32(const float *restrict src, int64_t rl, int64_t ncol,
                              float *restrict dst)
{
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11,
                                          15);
    for (int64_t j = 0; 4 * j < ncol; j += 4) {
        int64_t left = ncol - 4 * j, tiles = (left + 3) / 4;
        __mmask8 lanes = (__mmask8)((1u << (tiles < 4 ? tiles : 4)) - 1);
        __m512 v = _mm512_castps128_ps512(_mm_maskz_loadu_ps(lanes, src + j));
        v = _mm512_insertf32x4(v, _mm_maskz_loadu_ps(lanes, src + rl + j), 1);
        v = _mm512_insertf32x4(v, _mm_maskz_loadu_ps(lanes, src + 2 * rl + j), 2);
        v = _mm512_insertf32x4(v, _mm_maskz_loadu_ps(lanes, src + 3 * rl + j), 3);
        v = _mm512_permutexvar_ps(idx, v);
        if (left >= 16) _mm512_storeu_ps(dst + 4 * j, v);
        else _mm512_mask_storeu_ps(dst + 4 * j, (__mmask16)((1u << left) - 1), v);
    }
}
#elif ORT_ISA_LEVEL == 1

/* row[col + i], i < 4, zero where col + i lies outside [0, w) */
ORT_SIMD_CLONES
static inline __m128 wino4_load(const float *row, int64_t w, int64_t col)
{
    if (col >= 0 && col + 4 <= w) return _mm_loadu_ps(row + col);
    if (col >= w || col <= -4) return _mm_setzero_ps();
    /* a masked load (masked-off lanes are not read): a copy through a stack array stalls
     * on store forwarding, and these are a third of a 14x14 map's loads */
    __m128i i = _mm_add_epi32(_mm_set1_epi32((int)col), _mm_setr_epi32(0, 1, 2, 3));
    __m128i in = _mm_and_si128(_mm_cmpgt_epi32(i, _mm_set1_epi32(-1)),
                               _mm_cmpgt_epi32(_mm_set1_epi32((int)w), i));
    return _mm_maskload_ps(row + col, in);
}

/* dst[i] = v[i], i < n (n <= 4) */
ORT_SIMD_CLONES
static inline void wino4_store(float *dst, __m128 v, int64_t n)
{
    if (n >= 4) {
        _mm_storeu_ps(dst, v);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, v);
    for (int64_t i = 0; i < n; i++) dst[i] = t[i];
}

/* d[q * dl + j] = src[c0 + 4 j + q] (zero outside [0, w)), q < 6, j < cnt */
ORT_SIMD_CLONES
static void wino4_row_f32(const float *restrict src, int64_t w, int64_t c0, int64_t cnt,
                          float *restrict d, int64_t dl)
{
    for (int64_t j = 0; j < cnt; j += 4) {
        int64_t col = c0 + 4 * j, n = cnt - j;
        __m128 l0 = wino4_load(src, w, col), l1 = wino4_load(src, w, col + 4);
        __m128 l2 = wino4_load(src, w, col + 8), l3 = wino4_load(src, w, col + 12);
        __m128 l4 = wino4_load(src, w, col + 16);
        __m128 e1 = l1, e2 = l2, e3 = l3, e4 = l4;
        _MM_TRANSPOSE4_PS(l0, l1, l2, l3); /* l_q = columns q of the four tiles */
        _MM_TRANSPOSE4_PS(e1, e2, e3, e4); /* e1, e2: columns 4 and 5 */
        wino4_store(d + j, l0, n);
        wino4_store(d + dl + j, l1, n);
        wino4_store(d + 2 * dl + j, l2, n);
        wino4_store(d + 3 * dl + j, l3, n);
        wino4_store(d + 4 * dl + j, e1, n);
        wino4_store(d + 5 * dl + j, e2, n);
    }
}

/* dst[b * rl + j] = p[4 j + b] where 4 j + b < ncol, else zero; b < 4, j < cnt */
ORT_SIMD_CLONES
static void wino4_dy_row_f32(const float *restrict p, int64_t ncol, int64_t cnt,
                             float *restrict dst, int64_t rl)
{
    for (int64_t j = 0; j < cnt; j += 4) {
        int64_t n = cnt - j;
        __m128 l0 = wino4_load(p, ncol, 4 * j), l1 = wino4_load(p, ncol, 4 * j + 4);
        __m128 l2 = wino4_load(p, ncol, 4 * j + 8), l3 = wino4_load(p, ncol, 4 * j + 12);
        _MM_TRANSPOSE4_PS(l0, l1, l2, l3);
        wino4_store(dst + j, l0, n);
        wino4_store(dst + rl + j, l1, n);
        wino4_store(dst + 2 * rl + j, l2, n);
        wino4_store(dst + 3 * rl + j, l3, n);
    }
}

/* dst[c] = src[(c % 4) * rl + c / 4] for c < ncol: the output row of the tiles whose
 * A^T M A rows are at src (4 rows, rl apart) */
ORT_SIMD_CLONES
static void wino4_out_row_f32(const float *restrict src, int64_t rl, int64_t ncol,
                              float *restrict dst)
{
    int64_t tiles = (ncol + 3) / 4;
    for (int64_t j = 0; j < tiles; j += 4) {
        __m128 r0 = wino4_load(src, tiles, j), r1 = wino4_load(src + rl, tiles, j);
        __m128 r2 = wino4_load(src + 2 * rl, tiles, j);
        __m128 r3 = wino4_load(src + 3 * rl, tiles, j);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3); /* r_i = the 4 columns of tile j + i */
        int64_t c = 4 * j;
        wino4_store(dst + c, r0, ncol - c);
        if (ncol > c + 4) wino4_store(dst + c + 4, r1, ncol - c - 4);
        if (ncol > c + 8) wino4_store(dst + c + 8, r2, ncol - c - 8);
        if (ncol > c + 12) wino4_store(dst + c + 12, r3, ncol - c - 12);
    }
}
#endif
#if ORT_ISA_LEVEL >= 1
#define WINO_VEC 1
#else
#define WINO_VEC 0
#endif

#define T float
#define SFX f32
#define ACC double
#include "conv_pk.inc"
#include "conv_wino.inc"
#include "conv_dw.inc"
#include "conv.inc"
#undef T
#undef SFX
#undef ACC

#undef WINO_VEC
#define WINO_VEC 0 /* the copies above are float-only */
#define T double
#define SFX f64
#define ACC double
#include "conv_pk.inc"
#include "conv_wino.inc"
#include "conv_dw.inc"
#include "conv.inc"
#undef T
#undef SFX
#undef ACC
