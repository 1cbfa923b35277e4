/* summary.c -- the number crunching behind TensorBoard summaries (spec §16):
 * histogram statistics and bucketing over many values (multithreaded), and the
 * TFRecord framing (length + masked CRC-32C) of event-file records.
 * Protobuf encoding is not done here: the Python side uses tensorboard's protos. */
#include "common.h"

#include <float.h>
#include <pthread.h>
#include <stdlib.h>

/* ---- order-preserving keys --------------------------------------------------
 * key(a) < key(b)  <=>  a < b  for non-NaN doubles once -0.0 is folded to +0.0:
 * positive values get the sign bit set, negative ones are bit-flipped. The top
 * 16 bits of the key (sign, exponent, 4 mantissa bits) name a cell spanning a
 * ratio of at most 1 + 1/16 between its ends.                                   */
static inline uint64_t order_key(double v)
{
    union { double d; uint64_t u; } b;
    b.d = v + 0.0; /* -0.0 -> +0.0 */
    return (b.u >> 63) ? ~b.u : (b.u | ((uint64_t)1 << 63));
}

#define LUT_SHIFT 48

/* float keys: the same order-preserving map on the 32-bit pattern (cell = top 16
 * bits: sign, exponent, 7 mantissa bits), -0.0 folded to +0.0 */
static inline uint32_t order_key_f32(uint32_t bits)
{
    bits = bits == 0x80000000u ? 0u : bits;
    return bits ^ ((uint32_t)((int32_t)bits >> 31) | 0x80000000u);
}

static inline uint32_t f32_bits(float f)
{
    union { float f; uint32_t u; } b = {f};
    return b.u;
}

/* The smallest float >= e (so that, for a float v, v >= up(e) <=> (double)v >= e). */
static float round_up_f32(double e)
{
    float f = (float)e;
    if ((double)f < e) f = nextafterf(f, INFINITY);
    return f;
}

#define CELLS 65536
/* lut[0..CELLS]: #{edges with double key < c << 48}, then lut[CELLS + 1] = the most
 * edges in one cell; lut[L..L+CELLS+1] (L = CELLS + 2) the same for float keys
 * (c << 16) over the edges rounded up to float; cell_edge[c] = that rounded edge when
 * float cell c holds exactly one, else NaN (compares false). */
int ortcpu_summary_edges_lut(const double *edges, int64_t nedges, int32_t *lut,
                             float *cell_edge)
{
    float *edges_up = NULL;
    if (!edges || !lut || !cell_edge || nedges < 1 || nedges >= INT32_MAX)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "summary_edges_lut: bad edges (n=%lld)",
                        (long long)nedges);
    edges_up = (float *)malloc((size_t)nedges * sizeof(float));
    if (!edges_up) return ort_fail(ORTCPU_E_OUT_OF_MEMORY, "summary_edges_lut");
    for (int64_t i = 0; i < nedges; i++) {
        if (edges[i] != edges[i]) {
            free(edges_up);
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "summary_edges_lut: edge %lld is NaN",
                            (long long)i);
        }
        if (i && !(edges[i - 1] <= edges[i])) {
            free(edges_up);
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                            "summary_edges_lut: edges not sorted at %lld", (long long)i);
        }
        edges_up[i] = round_up_f32(edges[i]);
    }
    for (int pass = 0; pass < 2; pass++) {
        int32_t *t = lut + pass * (CELLS + 2);
        int64_t j = 0;
        int32_t most = 0;
        for (int64_t c = 0; c < CELLS; c++) {
            if (pass == 0) {
                uint64_t lo = (uint64_t)c << LUT_SHIFT;
                while (j < nedges && order_key(edges[j]) < lo) j++;
            } else {
                uint32_t lo = (uint32_t)c << 16;
                while (j < nedges && order_key_f32(f32_bits(edges_up[j])) < lo) j++;
            }
            t[c] = (int32_t)j;
            if (c && t[c] - t[c - 1] > most) most = t[c] - t[c - 1];
        }
        t[CELLS] = (int32_t)nedges;
        if (t[CELLS] - t[CELLS - 1] > most) most = t[CELLS] - t[CELLS - 1];
        t[CELLS + 1] = most;
    }
    const int32_t *t32 = lut + CELLS + 2;
    for (int64_t c = 0; c < CELLS; c++)
        cell_edge[c] = t32[c + 1] - t32[c] == 1 ? edges_up[t32[c]] : NAN;
    free(edges_up);
    return ORTCPU_OK;
}

/* u(x) = #{i : edges[i] <= x} for non-NaN x. */
static inline int64_t upper_index(double x, const double *edges, int64_t nedges,
                                  const int32_t *lut)
{
    int64_t lo = 0, hi = nedges;
    if (lut) {
        uint64_t c = order_key(x) >> LUT_SHIFT;
        lo = lut[c];
        hi = lut[c + 1];
        /* every edge in [lo, hi) shares x's cell; with geometric edges of ratio > 1/16
         * there is at most one: decide it without a branch (a data-dependent branch
         * here mispredicts half the time) */
        int64_t cnt = hi - lo;
        if (cnt <= 1) {
            double e = edges[lo < nedges ? lo : nedges - 1];
            return lo + (int64_t)((cnt == 1) & (e <= x));
        }
        if (cnt <= 4) {
            while (lo < hi && edges[lo] <= x) lo++;
            return lo;
        }
    }
    while (lo < hi) { /* first index in [lo, hi) whose edge is > x */
        int64_t mid = lo + ((hi - lo) >> 1);
        if (x < edges[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* ---- masked CRC-32C (Castagnoli), slicing by 8 ------------------------------- */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

static uint32_t crc32c(const uint8_t *p, int64_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
            crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return c ^ 0xFFFFFFFFu;
}

static uint32_t masked_crc(const uint8_t *p, int64_t n)
{
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

int ortcpu_summary_masked_crc32c(const uint8_t *data, int64_t n, uint32_t *crc)
{
    if ((!data && n) || n < 0 || !crc)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "summary_masked_crc32c: bad buffer");
    pthread_once(&crc_once, crc_init);
    *crc = masked_crc(data, n);
    return ORTCPU_OK;
}

int ortcpu_summary_frame_records(const uint8_t *data, const int64_t *lengths, int64_t count,
                                 uint8_t *out, int64_t out_size)
{
    if (count < 0 || (count && (!data || !lengths || !out)))
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "summary_frame_records: bad buffers");
    int64_t need = 0;
    for (int64_t i = 0; i < count; i++) {
        if (lengths[i] < 0)
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                            "summary_frame_records: negative length at %lld", (long long)i);
        need += lengths[i] + 16;
    }
    if (need > out_size)
        return ort_fail(ORTCPU_E_INDEX_OUT_OF_RANGE,
                        "summary_frame_records: output holds %lld bytes, %lld needed",
                        (long long)out_size, (long long)need);
    pthread_once(&crc_once, crc_init);
    for (int64_t i = 0; i < count; i++) {
        int64_t len = lengths[i];
        put_le(out, (uint64_t)len, 8);
        put_le(out + 8, masked_crc(out, 8), 4);
        memcpy(out + 12, data, (size_t)len);
        put_le(out + 12 + len, masked_crc(data, len), 4);
        data += len;
        out += len + 16;
    }
    return ORTCPU_OK;
}

/* ---- histogram ---------------------------------------------------------------- */
#define T float
#define SFX f32
#define SUMMARY_F32 1
#include "summary.inc"
#undef SUMMARY_F32
#undef T
#undef SFX

#define T double
#define SFX f64
#define SUMMARY_F32 0
#include "summary.inc"
#undef SUMMARY_F32
#undef T
#undef SFX
