/* quant.c -- FakeQuant / FakeQuantGrad (spec §14): per-tensor fake quantization
 * with round-half-to-even and a straight-through gradient mask. */
#include "common.h"

#define ORT_TEMPLATE "quant.inc"
#include "instantiate.h"
