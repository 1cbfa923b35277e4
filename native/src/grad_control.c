/* grad_control.c -- gradient control over groups of tensors (spec §10.2, §10.3, §13):
 * norms (ReduceAllL2, clipping), scaling (Scale, InplaceClipGradNorm,
 * MixedPrecisionScale), accumulation, zeroing, finiteness checks;
 * float32 and float64 from one source (grad_control.inc). */
#include "multi_tensor.h"

#define ORT_TEMPLATE "grad_control.inc"
#include "instantiate.h"
