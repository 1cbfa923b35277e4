/* loss.c -- softmax cross-entropy losses (sparse and dense labels, class and sample
 * weights, ignore_index, label smoothing), forward and backward (loss.inc). */
#include "common.h"
#include "blocksum.h"

/* e^x for softmax arguments (x - max or x - lse, so x <= ~0): one scale factor, no
 * gradual underflow (results below 1.2e-38 come out as ~1.2e-38, far below anything a
 * probability sum or gradient can see); NaN propagates through the polynomial. */
static inline float sce_exp_f32(float x)
{
    float xc = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
    float n = ort_round_small_f32(xc * 1.44269504088896341f);
    float r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    /* degree-5 polynomial fitted (relative error) to e^r on |r| <= ln2/2 for this
     * project: 1.6e-7 relative in float32 arithmetic */
    float p = 0.00829031f;
    p = p * r + 0.04189793f;
    p = p * r + 0.16667636f;
    p = p * r + 0.4999915f;
    p = p * r + 0.9999997f;
    p = p * r + 1.0f;
    int32_t ni = (int32_t)(n == n ? n : 0.0f);
    return p * ort_bits_to_f32((ni + 127) << 23);
}

static inline double sce_exp_f64(double x) { return exp(x); }

#define ORT_TEMPLATE "loss.inc"
#include "instantiate.h"
