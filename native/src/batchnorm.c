/* batchnorm.c -- batch normalization: training forward, inference, backward,
 * float32 and float64 from one source (batchnorm.inc). */
#include "common.h"
#include "blocksum.h"
#include "stream.h"

#include <omp.h>

/* fn over units [0, n) in `chunks` even contiguous ranges, one per thread (no rounding
 * to cache lines as in ort_parallel_for: a unit here is a whole channel) */
static void bn_run_units(int64_t n, int chunks, ort_range_fn fn, void *ctx)
{
    if (chunks <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
#pragma omp parallel num_threads(chunks)
    {
        int i = omp_get_thread_num(), nt = omp_get_num_threads();
        fn(ctx, n * i / nt, n * (i + 1) / nt, i);
    }
}

#define ORT_TEMPLATE "batchnorm.inc"
#include "instantiate.h"
