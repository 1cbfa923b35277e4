/* activations.c -- GELU family, pointwise activations and softmax,
 * float32 and float64 from one source (activations.inc, softmax.inc). */
#include "common.h"
#include "blocksum.h"
#include "softmax_avx2.h"
#include "gelu_avx2.h"
#include "gelu_avx512.h"

#define ORT_TEMPLATE "activations.inc"
#define ORT_TEMPLATE2 "softmax.inc"
#include "instantiate.h"
