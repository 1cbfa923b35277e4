/* attention_train.c -- fused kernels of ORTModule's training-graph rewrites
 * (ortcpu_torch/graph/training_fusions.py), float32 and float64 (attention_train.inc). */
#include "common.h"

#define ORT_TEMPLATE "attention_train.inc"
#include "instantiate.h"
