/* dropout.c -- Dropout forward (counter-based random mask) and backward,
 * float32 and float64 from one source (dropout.inc). */
#include "common.h"

/* A 32-bit integer hash (xor-shift-multiply, "lowbias32" constants): bijective, good
 * avalanche, and vectorizable (32-bit multiplies). Two rounds keyed by the seed give
 * the uniform for element i; the high half of i enters through a per-block key. */
static inline uint32_t drop_mix32(uint32_t v)
{
    v ^= v >> 16;
    v *= 0x7feb352dU;
    v ^= v >> 15;
    v *= 0x846ca68bU;
    v ^= v >> 16;
    return v;
}

static inline uint32_t drop_block_key(uint64_t seed, uint32_t hi)
{
    return (uint32_t)(seed >> 32) ^ drop_mix32(hi * 0x9e3779b9U + 0x632be5abU);
}

/* keep iff the top 24 bits of the hash, as u in [0, 1), are >= ratio */
static inline uint32_t drop_threshold(double ratio)
{
    double t = ceil(ratio * 16777216.0);
    return t <= 0 ? 0u : (t >= 16777216.0 ? 16777216u : (uint32_t)t);
}

#define ORT_TEMPLATE "dropout.inc"
#include "instantiate.h"
