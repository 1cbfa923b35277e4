/* norm.c -- LayerNorm and RMSNorm (SimplifiedLayerNormalization), forward and
 * backward, float32 and float64 from one source (norm.inc). */
#include "common.h"
#include "blocksum.h"

#define T float
#define SFX f32
#include "norm.inc"
#undef T
#undef SFX

#define T double
#define SFX f64
#include "norm.inc"
#undef T
#undef SFX
