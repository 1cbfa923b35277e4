/* common.h -- internal helpers shared by every kernel family:
 * status reporting, the parallel-for, type-generic naming, vector math. */
#ifndef ORTCPU_COMMON_H
#define ORTCPU_COMMON_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ortcpu.h"

/* Record a message for the calling thread and return `status`. */
int ort_fail(int status, const char *fmt, ...);

/* Run fn(ctx, begin, end, chunk) over [0, n) split into contiguous chunks,
 * at most `nthreads` of them and none smaller than `grain` (so small work
 * stays on the calling thread and never wakes the OpenMP pool). */
typedef void (*ort_range_fn)(void *ctx, int64_t begin, int64_t end, int chunk);
int ort_num_chunks(int64_t n, int64_t grain, int nthreads);
void ort_parallel_for(int64_t n, int64_t grain, int nthreads, ort_range_fn fn, void *ctx);

/* Scratch memory, from the arena. */
void *ort_scratch(size_t nbytes);
void ort_scratch_free(void *p);

/* Type-generic names: FN(gelu_chunk) -> gelu_chunk_f32 when SFX is f32. */
#define ORT_CAT_(a, b) a##b
#define ORT_CAT(a, b) ORT_CAT_(a, b)
#define FN(name) ORT_CAT(name, ORT_CAT(_, SFX))

/* ISA dispatch: the library is compiled once per x86-64 level (build.py passes
 * ORT_ISA_LEVEL: 0 baseline, 1 x86-64-v3 = AVX2+FMA, 2 x86-64-v4 = AVX-512) and
 * ortcpu_torch._native.loader imports the best build the CPU runs, capped by ORTCPU_ISA.
 * ORT_SIMD_CLONES (on the static inner loop function, not on the OpenMP entry) compiles
 * a hot loop for the build's level; everything else stays baseline code, so results
 * outside the hot loops do not depend on the build. (GCC's target_clones picked the
 * level in ifunc resolvers that run while the library is relocated: no way to cap it.)
 * Code with its own SIMD paths tests ORT_ISA_LEVEL at compile time, never
 * __builtin_cpu_supports, which would bypass the cap. */
#ifndef ORT_ISA_LEVEL
#define ORT_ISA_LEVEL 0
#endif
#if defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL >= 2
#define ORT_SIMD_CLONES __attribute__((target("arch=x86-64-v4")))
#elif defined(__x86_64__) && defined(__GNUC__) && ORT_ISA_LEVEL == 1
#define ORT_SIMD_CLONES __attribute__((target("arch=x86-64-v3")))
#else
#define ORT_SIMD_CLONES
#endif

/* ---- float32 vector math ------------------------------------------------
 * Branch-free so loops calling them vectorize; NaN propagates through every
 * function (comparisons with NaN are false, so clamps keep it). */

static inline float ort_bits_to_f32(int32_t i)
{
    union { int32_t i; float f; } u = {i}; /* a union, not memcpy: GCC vectorizes it */
    return u.f;
}

/* The integer nearest v (ties to even) for |v| < 2^22, as a float: adding and removing
 * 1.5 * 2^23 rounds in the float unit, so loops stay vectorized in the baseline (SSE2)
 * build too, where floorf/rintf are libm calls (about 40x slower GELU). */
static inline float ort_round_small_f32(float v)
{
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

/* e^r by Taylor to degree 7, for |r| <= ln2/2 (truncation < 6e-9 relative). */
static inline float ort_exp_taylor7_f32(float r)
{
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    return p * r + 1.0f;
}

/* Range reduction x = n ln2 + r, |r| <= ln2/2, and e^r by Taylor to degree 7
 * (truncation < 6e-9 relative); n is returned as a float. */
static inline float ort_exp_reduced_f32(float x, float *n_out)
{
    float n = ort_round_small_f32(x * 1.44269504088896341f);
    float r = x - n * 0.693145751953125f;      /* ln2 split in two parts */
    r = r - n * 1.428606765330187045e-06f;
    *n_out = n;
    return ort_exp_taylor7_f32(r);
}

/* e^x; < 1 ulp on the polynomial, overflow -> inf, gradual underflow -> 0. */
static inline float ort_exp_f32(float x)
{
    float xc = x < -104.0f ? -104.0f : (x > 88.8f ? 88.8f : x);
    xc = xc == xc ? xc : 0.0f;             /* keep NaN out of the int conversion */
    float n;
    float p = ort_exp_reduced_f32(xc, &n);
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1, n2 = ni - n1;    /* two factors: denormal results stay right */
    float s1 = ort_bits_to_f32((n1 + 127) << 23), s2 = ort_bits_to_f32((n2 + 127) << 23);
    float res = p * s1 * s2;
    return x != x ? x : res;
}

/* erfc(w) * exp(w^2) for w in [0, 10.5] as a polynomial in t = 1/(1 + w/2),
 * fitted (relative error ~3e-7 in float32) for this project. */
static inline float ort_erfcx_poly_f32(float t)
{
    float p = 0.02633065916597843f;
    p = p * t - 0.20179250836372375f;
    p = p * t + 0.6204137802124023f;
    p = p * t - 0.9374228715896606f;
    p = p * t + 0.6574864983558655f;
    p = p * t - 0.23586750030517578f;
    p = p * t + 0.27887749671936035f;
    p = p * t + 0.22507719695568085f;
    p = p * t + 0.28502026200294495f;
    p = p * t + 0.28186947107315063f;
    p = p * t + 7.548652320110705e-06f;
    return p;
}

/* e^a for a <= 0 or NaN (softmax's x - max), gradual underflow as ort_exp_f32 (two
 * scale factors), but no overflow clamp and no NaN selects: a NaN runs through the
 * polynomial into the result. */
static inline float ort_exp_nonpos_scaled_f32(float a)
{
    float n;
    float p = ort_exp_reduced_f32(a < -104.0f ? -104.0f : a, &n);
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1, n2 = ni - n1;
    return p * ort_bits_to_f32((n1 + 127) << 23) * ort_bits_to_f32((n2 + 127) << 23);
}

/* e^(-x^2/2) for |x| <= 13: x^2 is exact in double and the range reduction is done
 * there, so the large argument (up to 84.5) loses nothing to rounding (in float32 its
 * rounding alone is ~x^2 * 3e-8 relative: 30 ulp at |x| = 10); e^r in float32. */
static inline float ort_exp_neg_half_sq_f32(float x)
{
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: rounds to an integer */
    double q = -0.5 * (double)x * (double)x;
    double n = (q * 1.4426950408889634 + magic) - magic;
    float p = ort_exp_taylor7_f32((float)(q - n * 0.6931471805599453));
    return p * ort_bits_to_f32(((int32_t)n + 127) << 23);
}

/* Standard normal CDF Phi(x) and pdf phi(x) with one exp:
 * Phi(x) = erfc(-x/sqrt2)/2, accurate in the left tail (relative), where
 * 1 + erf(.) would cancel. Beyond |x| = 13 float32 Phi is 0 or 1 and phi
 * underflows: those limits are returned exactly. NaN gives NaN. */
static inline void ort_normal_cdf_pdf_f32(float x, float *cdf, float *pdf)
{
    float xc = x < -13.0f ? -13.0f : (x > 13.0f ? 13.0f : x);
    xc = xc == xc ? xc : 0.0f;                 /* NaN: keep it out of the int conversion */
    float w = fabsf(xc) * 0.70710678118654752f;
    float e = ort_exp_neg_half_sq_f32(xc);
    float t = 1.0f / (1.0f + 0.5f * w);
    float half_erfc = 0.5f * e * ort_erfcx_poly_f32(t);
    float c = xc > 0.0f ? 1.0f - half_erfc : half_erfc;
    int tail = x < -13.0f;
    *cdf = x != x ? x : (tail ? 0.0f : c);
    *pdf = (tail | (x > 13.0f)) ? 0.0f : e * 0.39894228040143268f;
}

static inline void ort_normal_cdf_pdf_f64(double x, double *cdf, double *pdf)
{
    *cdf = 0.5 * erfc(-x * 0.70710678118654752440);
    *pdf = exp(-0.5 * x * x) * 0.39894228040143267794;
}

/* Logistic sigma(z) = 1/(1+e^-z) and its complement 1 - sigma(z) = sigma(-z),
 * both without cancellation. */
static inline void ort_sigmoid_pair_f32(float z, float *s, float *one_minus_s)
{
    float e = ort_exp_f32(-z);
    float sv = 1.0f / (1.0f + e);
    *s = sv;
    *one_minus_s = e > 1e30f ? 1.0f : e * sv;
}

static inline void ort_sigmoid_pair_f64(double z, double *s, double *one_minus_s)
{
    double e = exp(-z);
    double sv = 1.0 / (1.0 + e);
    *s = sv;
    *one_minus_s = e > 1e300 ? 1.0 : e * sv;
}

/* tanh(v) for |v| < 0.3: the odd Taylor polynomial through v^11 (truncation < 2e-9),
 * used where the exp-based formulas cancel. */
static inline float ort_tanh_small_f32(float v)
{
    float v2 = v * v;
    float p = -1382.0f / 155925.0f;
    p = p * v2 + 62.0f / 2835.0f;
    p = p * v2 - 17.0f / 315.0f;
    p = p * v2 + 2.0f / 15.0f;
    p = p * v2 - 1.0f / 3.0f;
    return v + v * v2 * p;
}

/* tanh(v) = sign(v) (1 - 2 sigma(-2|v|)); below |v| = 0.3 the odd Taylor
 * polynomial, where 1 - 2 sigma cancels. */
static inline float ort_tanh_f32(float v)
{
    float a = fabsf(v), s, oms;
    ort_sigmoid_pair_f32(2.0f * a, &s, &oms);
    float big = 1.0f - 2.0f * oms;
    float small = ort_tanh_small_f32(v);
    float r = a < 0.3f ? small : (v < 0.0f ? -big : big);
    return v != v ? v : r;
}

static inline double ort_tanh_f64(double v) { return tanh(v); }
static inline double ort_exp_f64(double x) { return exp(x); }
static inline double ort_exp_nonpos_scaled_f64(double x) { return exp(x); }

#endif
