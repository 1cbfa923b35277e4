/* quant.c -- FakeQuant / FakeQuantGrad (spec §14): per-tensor fake quantization
 * with round-half-to-even and a straight-through gradient mask. */
#include "common.h"

#define T float
#define SFX f32
#include "quant.inc"
#undef T
#undef SFX

#define T double
#define SFX f64
#include "quant.inc"
#undef T
#undef SFX
