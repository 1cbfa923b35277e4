/* loss.c -- softmax cross-entropy losses (sparse and dense labels, class and sample
 * weights, ignore_index, label smoothing), forward and backward (loss.inc). */
#include "common.h"
#include "blocksum.h"

#define T float
#define SFX f32
#include "loss.inc"
#undef T
#undef SFX

#define T double
#define SFX f64
#include "loss.inc"
#undef T
#undef SFX
