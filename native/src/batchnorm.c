/* batchnorm.c -- batch normalization: training forward, inference, backward,
 * float32 and float64 from one source (batchnorm.inc). */
#include "common.h"
#include "blocksum.h"

#define T float
#define SFX f32
#include "batchnorm.inc"
#undef T
#undef SFX

#define T double
#define SFX f64
#include "batchnorm.inc"
#undef T
#undef SFX
