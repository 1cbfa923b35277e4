/* optim.c -- multi-tensor optimizer updates (spec §12): the Adam family
 * (torch AdamW, HF AdamW, torch Adam, ORT's legacy AdamOptimizer) and SGD,
 * float32 and float64 from one source (optim.inc). */
/* Rounding follows torch's for-loop optimizers op by op: fused multiply-adds are
 * explicit (FMA) where torch's kernels fuse, and nothing else is contracted. */
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
