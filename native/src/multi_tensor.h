/* multi_tensor.h -- walking a group of tensors as one concatenated range
 * (optimizers and gradient control). A chunk [b, e) of the concatenation is
 * visited tensor by tensor: fn(k, lo, hi) for each tensor k it overlaps, with
 * [lo, hi) local to tensor k. */
#ifndef ORTCPU_MULTI_TENSOR_H
#define ORTCPU_MULTI_TENSOR_H
#include "common.h"

/* work below this many elements stays on the calling thread */
#define ORT_MT_GRAIN ((int64_t)1 << 15)

typedef struct {
    const int64_t *off; /* ntensors + 1 prefix sums of the sizes */
    int64_t ntensors;
} ort_mt_index;

/* Validate sizes and fill off[0..n]; off must have n + 1 entries.
 * Returns the total element count, or a negative status. */
static inline int64_t ort_mt_offsets(const char *op, const int64_t *sizes, int64_t n,
                                     int64_t *off)
{
    off[0] = 0;
    for (int64_t k = 0; k < n; k++) {
        if (sizes[k] < 0)
            return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "%s: tensor %lld has negative size %lld",
                            op, (long long)k, (long long)sizes[k]);
        off[k + 1] = off[k] + sizes[k];
    }
    return off[n];
}

/* first tensor k with off[k] <= b < off[k+1] (skipping empty tensors) */
static inline int64_t ort_mt_find(const ort_mt_index *ix, int64_t b)
{
    int64_t lo = 0, hi = ix->ntensors - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (ix->off[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    while (lo < ix->ntensors && ix->off[lo + 1] <= b) lo++;
    return lo;
}

/* Iterate the tensors overlapping [b, e): body sees k, lo, hi. */
#define ORT_MT_FOR(ix, b, e, k, lo, hi)                                                      \
    for (int64_t k = ort_mt_find((ix), (b)), lo, hi;                                           \
         k < (ix)->ntensors && (ix)->off[k] < (e) &&                                           \
         ((lo = ((b) > (ix)->off[k] ? (b) : (ix)->off[k]) - (ix)->off[k]),                     \
          (hi = ((e) < (ix)->off[k + 1] ? (e) : (ix)->off[k + 1]) - (ix)->off[k]), 1);          \
         k++)

/* Scratch for the offsets: on the stack for small groups, else the arena. */
#define ORT_MT_STACK 256
typedef struct {
    int64_t stack[ORT_MT_STACK + 1];
    int64_t *off;
} ort_mt_buf;

static inline int64_t *ort_mt_alloc(ort_mt_buf *b, int64_t n)
{
    b->off = n <= ORT_MT_STACK ? b->stack : ort_scratch((size_t)(n + 1) * sizeof(int64_t));
    return b->off;
}

static inline void ort_mt_release(ort_mt_buf *b)
{
    if (b->off && b->off != b->stack) ort_scratch_free(b->off);
    b->off = NULL;
}

#endif
