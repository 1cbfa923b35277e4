/* optim.c -- multi-tensor optimizer updates (spec §12): the Adam family
 * (torch AdamW, HF AdamW, torch Adam, ORT's legacy AdamOptimizer) and SGD,
 * float32 and float64 from one source (optim.inc). */
#include "multi_tensor.h"

#define T float
#define SFX f32
#define SQRT sqrtf
#include "optim.inc"
#undef T
#undef SFX
#undef SQRT

#define T double
#define SFX f64
#define SQRT sqrt
#include "optim.inc"
#undef T
#undef SFX
#undef SQRT
