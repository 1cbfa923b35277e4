/* activations.c -- GELU family, pointwise activations and softmax,
 * float32 and float64 from one source (activations.inc, softmax.inc). */
#include "common.h"

#define T float
#define SFX f32
#include "activations.inc"
#include "softmax.inc"
#undef T
#undef SFX

#define T double
#define SFX f64
#include "activations.inc"
#include "softmax.inc"
#undef T
#undef SFX
