/* norm.c -- LayerNorm and RMSNorm (SimplifiedLayerNormalization), forward and
 * backward, float32 and float64 from one source (norm.inc). */
#include "common.h"
#include "blocksum.h"
#include "norm_simd.h"

#define ORT_TEMPLATE "norm.inc"
#include "instantiate.h"
