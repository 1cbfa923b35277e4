/* optim.c -- multi-tensor optimizer updates (spec §12): the Adam family
 * (torch AdamW, HF AdamW, torch Adam, ORT's legacy AdamOptimizer) and SGD,
 * float32 and float64 from one source (optim.inc). */
/* Rounding follows torch's for-loop optimizers op by op: fused multiply-adds are
 * explicit (FMA) where torch's kernels fuse, and nothing else is contracted. One
 * exception: AdamW/Adam multiply sqrt(v) by 1/sqrt(1-b2^t) where torch divides (one
 * division less per element; <= 1 ulp in the denominator, measured 9% less compute).
 * torch's float32 sqrt is itself not correctly rounded, so bitwise parity with its
 * Adam family is out of reach anyway; SGD is bit-for-bit. */
#pragma GCC optimize("fp-contract=off")
#include "multi_tensor.h"

#define T float
#define SFX f32
#define SQRT sqrtf
#define FMA __builtin_fmaf
#include "optim.inc"
#undef T
#undef SFX
#undef SQRT
#undef FMA

#define T double
#define SFX f64
#define SQRT sqrt
#define FMA __builtin_fma
#include "optim.inc"
#undef T
#undef SFX
#undef SQRT
#undef FMA

int ortcpu_count_steps(float *const *steps, int64_t n, double *values)
{
    if (n < 0 || (n > 0 && (!steps || !values)))
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "count_steps: bad arrays");
    for (int64_t i = 0; i < n; i++) {
        if (!steps[i]) return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "count_steps: NULL counter");
        *steps[i] += 1.0f;
        values[i] = *steps[i];
    }
    return ORTCPU_OK;
}
