/* batchnorm.c -- batch normalization: training forward, inference, backward,
 * float32 and float64 from one source (batchnorm.inc). */
#include "common.h"
#include "blocksum.h"
#include "stream.h"

#define ORT_TEMPLATE "batchnorm.inc"
#include "instantiate.h"
