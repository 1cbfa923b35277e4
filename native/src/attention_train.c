/* attention_train.c -- fused kernels of ORTModule's training-graph rewrites
 * (ortcpu_torch/graph/training_fusions.py), float32 and float64 (attention_train.inc). */
#include "common.h"
#include "softmax_avx2.h" /* the float32 softmax row and dot */

#define ORT_TEMPLATE "attention_train.inc"
#include "instantiate.h"
