/* ortcpu.h -- the whole C API of ortcpu_torch's native kernels.
 *
 * Conventions (see DESIGN.md):
 *  - every entry point returns an int status: ORTCPU_OK (0) or a negative code;
 *    ortcpu_last_error() then holds a message for the calling thread;
 *  - inputs are raw pointers plus int64 sizes, outputs are preallocated by the caller;
 *  - each kernel exists as _f32 and _f64, generated from one source;
 *  - `nthreads` is the number of threads the call may use (>= 1).
 *
 * This file is also read by cffi: keep it to plain declarations
 * (the builder drops preprocessor lines).
 */
#ifndef ORTCPU_H
#define ORTCPU_H
#include <stdint.h>
#include <stddef.h>

/* ---- status ------------------------------------------------------------ */
enum {
    ORTCPU_OK = 0,
    ORTCPU_E_INVALID_ARGUMENT = -1,
    ORTCPU_E_OUT_OF_MEMORY = -2,
    ORTCPU_E_INDEX_OUT_OF_RANGE = -3,
    ORTCPU_E_INTERNAL = -4
};
const char *ortcpu_status_name(int status);
const char *ortcpu_last_error(void);

/* ---- ISA level of this build ----------------------------------------------
 * The library is built once per x86-64 level and the loader picks one (ORTCPU_ISA caps
 * it): 0 = baseline x86-64 (SSE2), 1 = x86-64-v3 (AVX2 + FMA), 2 = x86-64-v4 (AVX-512).
 * ortcpu_cpu_isa_level: the highest level this CPU (and OS) supports. */
int ortcpu_isa_level(void);
int ortcpu_cpu_isa_level(void);

/* ---- arena: caching allocator of already-touched blocks ------------------ */
void *ortcpu_arena_alloc(size_t nbytes);
void ortcpu_arena_free(void *ptr);
void ortcpu_arena_empty_cache(void);
void ortcpu_arena_set_limit(size_t max_cached_bytes);
/* stats: [0] bytes in use, [1] bytes cached, [2] cache hits, [3] cache misses,
 *        [4] peak bytes in use, [5] cache limit */
void ortcpu_arena_stats(int64_t stats[6]);

/* ---- streaming stores ----------------------------------------------------
 * Memory-bound kernels whose working set (inputs + outputs) is at least this many
 * bytes write their outputs with non-temporal stores, past the caches. Default: the
 * last-level cache size (sysfs), or ORTCPU_STREAM_BYTES; 0 turns streaming off. */
void ortcpu_set_stream_threshold(size_t bytes);
size_t ortcpu_get_stream_threshold(void);

/* ---- memory bandwidth probe (benchmarks): dst[i] = src[i] ---------------- */
int ortcpu_stream_copy_f32(const float *src, float *dst, int64_t n, int nthreads);

/* ---- activations (spec §2, §17.1) ----------------------------------------
 * GELU family on a [rows, cols] view; `bias` (length cols) may be NULL.
 * approximate: 0 = exact (erf), 1 = tanh (FastGelu).
 * Backward: dx from dy and the forward input x (plus bias);
 * dbias (length cols, may be NULL) receives sum over rows of dx.        */
int ortcpu_gelu_forward_f32(const float *x, const float *bias, float *y,
                            int64_t rows, int64_t cols, int approximate, int nthreads);
int ortcpu_gelu_forward_f64(const double *x, const double *bias, double *y,
                            int64_t rows, int64_t cols, int approximate, int nthreads);
int ortcpu_gelu_backward_f32(const float *dy, const float *x, const float *bias,
                             float *dx, float *dbias, int64_t rows, int64_t cols,
                             int approximate, int nthreads);
int ortcpu_gelu_backward_f64(const double *dy, const double *x, const double *bias,
                             double *dx, double *dbias, int64_t rows, int64_t cols,
                             int approximate, int nthreads);

/* Pointwise ops selected by `op` (ORTCPU_ACT_*); `alpha` is used by
 * QuickGelu (alpha in sigmoid(alpha*x)) and LeakyRelu (negative slope).
 * Backward input `xy` is the forward input for RELU and QUICK_GELU and the
 * forward output for SIGMOID, TANH and LEAKY_RELU (ORT's convention).    */
enum {
    ORTCPU_ACT_RELU = 0,
    ORTCPU_ACT_SIGMOID = 1,
    ORTCPU_ACT_TANH = 2,
    ORTCPU_ACT_QUICK_GELU = 3,
    ORTCPU_ACT_LEAKY_RELU = 4
};
int ortcpu_act_forward_f32(int op, const float *x, float *y, int64_t n, double alpha,
                           int nthreads);
int ortcpu_act_forward_f64(int op, const double *x, double *y, int64_t n, double alpha,
                           int nthreads);
int ortcpu_act_backward_f32(int op, const float *dy, const float *xy, float *dx, int64_t n,
                            double alpha, int nthreads);
int ortcpu_act_backward_f64(int op, const double *dy, const double *xy, double *dx,
                            int64_t n, double alpha, int nthreads);

/* Piecewise-linear ops selected by `op` (ORTCPU_HARD_*), parameters a and b:
 *   HARD_SIGMOID  y = clamp(a*x + b, 0, 1)             (ONNX HardSigmoid alpha, beta)
 *   HARD_SWISH    y = x * clamp(a*x + b, 0, 1), a > 0  (ONNX HardSwish: 1/6, 1/2)
 *   HARDTANH      y = clamp(x, a, b), a <= b           (torch hardtanh / relu6: 0, 6)
 * The kinks are found in x space (x0 = -b/a, x1 = (1-b)/a, in double), so the flat
 * pieces are exact and the slopes follow torch's convention at the kinks: HARD_SIGMOID
 * and HARDTANH pass the slope only strictly inside (x0, x1) / (a, b); HARD_SWISH's
 * slope is 0 up to x0, 2a*x + b inside, 1 from x1 on. NaN propagates forward; backward
 * at NaN is what torch's vectorized kernels give (HARD_SIGMOID and HARDTANH 0, HARD_SWISH
 * NaN; torch's scalar tail loop differs). Backward takes the forward input x (for
 * HARDTANH the output works as well: same mask).                                    */
enum {
    ORTCPU_HARD_SIGMOID = 0,
    ORTCPU_HARD_SWISH = 1,
    ORTCPU_HARDTANH = 2
};
int ortcpu_hard_act_forward_f32(int op, const float *x, float *y, int64_t n, double a,
                                double b, int nthreads);
int ortcpu_hard_act_forward_f64(int op, const double *x, double *y, int64_t n, double a,
                                double b, int nthreads);
int ortcpu_hard_act_backward_f32(int op, const float *dy, const float *x, float *dx,
                                 int64_t n, double a, double b, int nthreads);
int ortcpu_hard_act_backward_f64(int op, const double *dy, const double *x, double *dx,
                                 int64_t n, double a, double b, int nthreads);

/* ---- softmax (spec §3) ----------------------------------------------------
 * The tensor is viewed as [outer, dim, inner]; the reduction runs over dim.
 * log_ = 0: softmax, 1: log-softmax.
 * Backward takes the forward *output* y:
 *   softmax:     dx = y * (dy - sum(dy * y))
 *   log-softmax: dx = dy - exp(y) * sum(dy)                               */
int ortcpu_softmax_forward_f32(const float *x, float *y, int64_t outer, int64_t dim,
                               int64_t inner, int log_, int nthreads);
int ortcpu_softmax_forward_f64(const double *x, double *y, int64_t outer, int64_t dim,
                               int64_t inner, int log_, int nthreads);
int ortcpu_softmax_backward_f32(const float *dy, const float *y, float *dx, int64_t outer,
                                int64_t dim, int64_t inner, int log_, int nthreads);
int ortcpu_softmax_backward_f64(const double *dy, const double *y, double *dx,
                                int64_t outer, int64_t dim, int64_t inner, int log_,
                                int nthreads);

/* ---- masked scaled softmax (ORTModule training fusion) ----------------------
 * x, y, dy, dx: [rows, n], softmax over n. y = softmax(v) with v[i] = fill where
 * mask[i] == masked_when, else x[i] * scale; mask (NULL: none) is [mask_rows, n] and row
 * r reads mask row r % mask_rows. Backward takes y: dx = scale * y * (dy - sum(dy * y)),
 * 0 at masked positions. */
int ortcpu_masked_softmax_forward_f32(const float *x, const uint8_t *mask, float *y,
                                      int64_t rows, int64_t n, int64_t mask_rows,
                                      double scale, double fill, int masked_when,
                                      int nthreads);
int ortcpu_masked_softmax_forward_f64(const double *x, const uint8_t *mask, double *y,
                                      int64_t rows, int64_t n, int64_t mask_rows,
                                      double scale, double fill, int masked_when,
                                      int nthreads);
int ortcpu_masked_softmax_backward_f32(const float *dy, const float *y, const uint8_t *mask,
                                       float *dx, int64_t rows, int64_t n, int64_t mask_rows,
                                       double scale, int masked_when, int nthreads);
int ortcpu_masked_softmax_backward_f64(const double *dy, const double *y, const uint8_t *mask,
                                       double *dx, int64_t rows, int64_t n, int64_t mask_rows,
                                       double scale, int masked_when, int nthreads);

/* ---- tensor ops (spec §9, §10.1) -------------------------------------------
 * strided_copy: dst[i] = src[i] over an N-d index space `shape`, strides in
 * elements (may be negative), any element size (Slice, SliceGrad, Split, Concat).
 * check_indices: every idx in [-dim, dim), else INDEX_OUT_OF_RANGE and *bad_pos.
 * gather_rows: x [outer, dim, inner], idx [n] (negative wraps) -> y [outer, n, inner].
 * scatter_add_rows: dx [outer, dim, inner] = 0, then dx[o, idx[j], :] += dy[o, j, :];
 *   indices are all checked before anything is written.
 * sum_axis: x [outer, dim, inner] -> y [outer, inner].                       */
int ortcpu_strided_copy(const void *src, void *dst, int ndim, const int64_t *shape,
                        const int64_t *src_strides, const int64_t *dst_strides,
                        int64_t elem_size, int nthreads);
int ortcpu_check_indices(const int64_t *idx, int64_t n, int64_t dim, int64_t *bad_pos);
int ortcpu_gather_rows_f32(const float *x, const int64_t *idx, float *y, int64_t outer,
                           int64_t dim, int64_t n, int64_t inner, int nthreads);
int ortcpu_gather_rows_f64(const double *x, const int64_t *idx, double *y, int64_t outer,
                           int64_t dim, int64_t n, int64_t inner, int nthreads);
int ortcpu_scatter_add_rows_f32(const float *dy, const int64_t *idx, float *dx, int64_t outer,
                                int64_t dim, int64_t n, int64_t inner, int nthreads);
int ortcpu_scatter_add_rows_f64(const double *dy, const int64_t *idx, double *dx,
                                int64_t outer, int64_t dim, int64_t n, int64_t inner,
                                int nthreads);
int ortcpu_sum_axis_f32(const float *x, float *y, int64_t outer, int64_t dim, int64_t inner,
                        int nthreads);
int ortcpu_sum_axis_f64(const double *x, double *y, int64_t outer, int64_t dim, int64_t inner,
                        int nthreads);

/* ---- fake quantization (spec §14) ---------------------------------------------
 * q = trunc(nearbyint(x/scale) + zero_point); y = (clamp(q, qmin, qmax) - zp)*scale;
 * mask = qmin <= q <= qmax (bytes 0/1). Grad: dx = mask ? dy : 0.               */
int ortcpu_fake_quant_f32(const float *x, float *y, uint8_t *mask, int64_t n, double scale,
                          double zero_point, int64_t quant_min, int64_t quant_max,
                          int nthreads);
int ortcpu_fake_quant_f64(const double *x, double *y, uint8_t *mask, int64_t n, double scale,
                          double zero_point, int64_t quant_min, int64_t quant_max,
                          int nthreads);
int ortcpu_fake_quant_grad_f32(const float *dy, const uint8_t *mask, float *dx, int64_t n,
                               int nthreads);
int ortcpu_fake_quant_grad_f64(const double *dy, const uint8_t *mask, double *dx, int64_t n,
                               int nthreads);

/* ---- RNN (spec §8): one direction per call, ORT layouts without the direction
 * axis. LSTM: W [4H,I], R [4H,H], bias [8H] (may be NULL), peep [3H] (NULL), gate
 * order [i,o,f,c]; outputs HAll/CAll [S,B,H], iofc [S,B,4H]. GRU: W [3H,I],
 * R [3H,H], bias [6H], order [z,r,h]; outputs HAll [S,B,H], ZRH [S,B,3H].
 * gate_order = 1 takes torch's gate orders instead (LSTM [i,f,g,o], GRU [r,z,n]) for
 * W, R, the biases, iofc/ZRH and the gradients; peepholes stay (Pi, Po, Pf).
 * h0/c0 [B,H] may be NULL (zeros); reverse = 1 runs time backwards.
 * Backward: dhall/dhfinal/dcfinal may be NULL (zero); every output may be NULL. */
int ortcpu_lstm_forward_f32(const float *x, const float *w, const float *r, const float *bias,
                            const float *peep, const float *h0, const float *c0, float *hall,
                            float *call, float *iofc, int64_t S, int64_t B, int64_t I,
                            int64_t H, int reverse, int gate_order, int nthreads);
int ortcpu_lstm_forward_f64(const double *x, const double *w, const double *r,
                            const double *bias, const double *peep, const double *h0,
                            const double *c0, double *hall, double *call, double *iofc,
                            int64_t S, int64_t B, int64_t I, int64_t H, int reverse,
                            int gate_order, int nthreads);
int ortcpu_lstm_backward_f32(const float *x, const float *w, const float *r, const float *peep,
                             const float *h0, const float *c0, const float *hall,
                             const float *call, const float *iofc, const float *dhall,
                             const float *dhfinal, const float *dcfinal, float *dx, float *dw,
                             float *dr, float *db, float *dh0, float *dc0, float *dp,
                             int64_t S, int64_t B, int64_t I, int64_t H, int reverse,
                             int gate_order, int nthreads);
int ortcpu_lstm_backward_f64(const double *x, const double *w, const double *r,
                             const double *peep, const double *h0, const double *c0,
                             const double *hall, const double *call, const double *iofc,
                             const double *dhall, const double *dhfinal, const double *dcfinal,
                             double *dx, double *dw, double *dr, double *db, double *dh0,
                             double *dc0, double *dp, int64_t S, int64_t B, int64_t I,
                             int64_t H, int reverse, int gate_order, int nthreads);
int ortcpu_gru_forward_f32(const float *x, const float *w, const float *r, const float *bias,
                           const float *h0, float *hall, float *zrh, int64_t S, int64_t B,
                           int64_t I, int64_t H, int linear_before_reset, int reverse,
                           int gate_order, int nthreads);
int ortcpu_gru_forward_f64(const double *x, const double *w, const double *r,
                           const double *bias, const double *h0, double *hall, double *zrh,
                           int64_t S, int64_t B, int64_t I, int64_t H,
                           int linear_before_reset, int reverse, int gate_order, int nthreads);
int ortcpu_gru_backward_f32(const float *x, const float *w, const float *r, const float *bias,
                            const float *h0, const float *hall, const float *zrh,
                            const float *dhall, const float *dhfinal, float *dx, float *dw,
                            float *dr, float *db, float *dh0, int64_t S, int64_t B, int64_t I,
                            int64_t H, int linear_before_reset, int reverse, int gate_order, int nthreads);
int ortcpu_gru_backward_f64(const double *x, const double *w, const double *r,
                            const double *bias, const double *h0, const double *hall,
                            const double *zrh, const double *dhall, const double *dhfinal,
                            double *dx, double *dw, double *dr, double *db, double *dh0,
                            int64_t S, int64_t B, int64_t I, int64_t H,
                            int linear_before_reset, int reverse, int gate_order, int nthreads);

/* ---- optimizers (spec §12) -------------------------------------------------
 * Multi-tensor: one call updates a whole parameter group, given as arrays of
 * `ntensors` pointers and element counts (`sizes`). Work is split over the
 * concatenated element range, so threads share the group across and within
 * tensors; every tensor is read and written in one pass. Updates are in place.
 * Gradients are multiplied by `grad_scale` as they are read (fused clipping;
 * pass 1.0 otherwise) and negated when `maximize`.
 *
 * Adam family, `mode` (ORTCPU_ADAM_*); bc1 = 1 - beta1^t, bc2 = 1 - beta2^t
 * (1 when bias correction is off):
 *  TORCH  (torch.optim.AdamW, ORT adam_mode 0): w *= 1 - lr*wd; m = lerp(m, g, 1-b1);
 *         v = b2*v + (1-b2)*g*g; w -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
 *  HF     (ORT adam_mode 1): m, v as above; w -= lr*sqrt(bc2)/bc1 * m/(sqrt(v)+eps);
 *         w -= lr*wd*w
 *  L2     (torch.optim.Adam): g += wd*w, then TORCH without the decoupled decay
 *  In TORCH and L2 modes `step_size` (lr/bc1) and `decay` (1 - lr*wd) are given by the
 *  caller, already rounded as it wants them (torch rounds them to float32 for a tensor lr).
 *  LEGACY (ORT AdamOptimizer): d = -lr*((m/bc1)/(sqrt(v/bc2)+eps) + wd*w); w += d;
 *         delta (may be NULL) receives d
 * `vmax` (may be NULL: no amsgrad) keeps max(vmax, v), used in place of v.   */
enum {
    ORTCPU_ADAM_TORCH = 0,
    ORTCPU_ADAM_HF = 1,
    ORTCPU_ADAM_L2 = 2,
    ORTCPU_ADAM_LEGACY = 3
};
int ortcpu_adam_multi_f32(float *const *w, const float *const *g, float *const *m,
                          float *const *v, float *const *vmax, float *const *delta,
                          const int64_t *sizes, int64_t ntensors, double lr, double beta1,
                          double beta2, double eps, double weight_decay, double bc1,
                          double bc2, double step_size, double decay, int mode,
                          int maximize, double grad_scale, int nthreads);
int ortcpu_adam_multi_f64(double *const *w, const double *const *g, double *const *m,
                          double *const *v, double *const *vmax, double *const *delta,
                          const int64_t *sizes, int64_t ntensors, double lr, double beta1,
                          double beta2, double eps, double weight_decay, double bc1,
                          double bc2, double step_size, double decay, int mode,
                          int maximize, double grad_scale, int nthreads);

/* SGD (torch.optim.SGD; ORT SGDOptimizerV2 / SGDOptimizer with momentum 0):
 *   g = ±g*grad_scale + wd*w;
 *   momentum > 0: buf = init[i] ? g : momentum*buf + (1-dampening)*g;
 *                 g = nesterov ? g + momentum*buf : buf
 *   d = -lr*g;  w += d;  delta (may be NULL, may alias g) receives d.
 * `buf` and `init` may be NULL when momentum == 0.                          */
int ortcpu_sgd_multi_f32(float *const *w, const float *const *g, float *const *buf,
                         float *const *delta, const uint8_t *init, const int64_t *sizes,
                         int64_t ntensors, double lr, double momentum, double dampening,
                         double weight_decay, int nesterov, int maximize, double grad_scale,
                         int nthreads);
int ortcpu_sgd_multi_f64(double *const *w, const double *const *g, double *const *buf,
                         double *const *delta, const uint8_t *init, const int64_t *sizes,
                         int64_t ntensors, double lr, double momentum, double dampening,
                         double weight_decay, int nesterov, int maximize, double grad_scale,
                         int nthreads);

/* Optimizer step counters (torch keeps one float32 0-d tensor per parameter):
 * *steps[i] += 1 and values[i] = the new count, for n counters in one call.       */
int ortcpu_count_steps(float *const *steps, int64_t n, double *values);

/* ---- gradient control (spec §10.2, §10.3, §13) -------------------------------
 * Multi-tensor like the optimizers.
 * norm: out[0] = sum |x|^p over every element of every tensor (p = 2: sum of
 *   squares, p = 1: sum of |x|), accumulated in double; p = INFINITY: max |x|.
 *   NaN anywhere gives NaN. No root is taken.
 * scale: y[i] = x[i] * factor (y may alias x).
 * axpy: y[i] += alpha * x[i].
 * copy: y[i] = x[i].  zero: x[i] = 0.
 * all_finite: *out = 1 when no element is inf (check_inf) or NaN (check_nan).  */
int ortcpu_norm_multi_f32(const float *const *x, const int64_t *sizes, int64_t ntensors,
                          double p, double *out, int nthreads);
int ortcpu_norm_multi_f64(const double *const *x, const int64_t *sizes, int64_t ntensors,
                          double p, double *out, int nthreads);
int ortcpu_scale_multi_f32(const float *const *x, float *const *y, const int64_t *sizes,
                           int64_t ntensors, double factor, int nthreads);
int ortcpu_scale_multi_f64(const double *const *x, double *const *y, const int64_t *sizes,
                           int64_t ntensors, double factor, int nthreads);
int ortcpu_axpy_multi_f32(const float *const *x, float *const *y, const int64_t *sizes,
                          int64_t ntensors, double alpha, int nthreads);
int ortcpu_axpy_multi_f64(const double *const *x, double *const *y, const int64_t *sizes,
                          int64_t ntensors, double alpha, int nthreads);
int ortcpu_copy_multi_f32(const float *const *x, float *const *y, const int64_t *sizes,
                          int64_t ntensors, int nthreads);
int ortcpu_copy_multi_f64(const double *const *x, double *const *y, const int64_t *sizes,
                          int64_t ntensors, int nthreads);
int ortcpu_zero_multi_f32(float *const *x, const int64_t *sizes, int64_t ntensors,
                          int nthreads);
int ortcpu_zero_multi_f64(double *const *x, const int64_t *sizes, int64_t ntensors,
                          int nthreads);
int ortcpu_all_finite_multi_f32(const float *const *x, const int64_t *sizes, int64_t ntensors,
                                int check_inf, int check_nan, int *out, int nthreads);
int ortcpu_all_finite_multi_f64(const double *const *x, const int64_t *sizes,
                                int64_t ntensors, int check_inf, int check_nan, int *out,
                                int nthreads);
/* ---- normalization: LayerNorm / RMSNorm (spec §4) ---------------------------
 * Rows of a [rows, cols] view are normalised. scale/bias (length cols) may be NULL
 * (1 / 0). simplified = 1: RMSNorm (no mean, no bias). mean / inv_std (length rows)
 * may be NULL; in RMS mode mean is not written.
 * Backward modes: 0 LayerNorm from X; 1 RMSNorm from X (mean unused, no dbias);
 * 2 invertible LayerNorm from the forward output Y (xhat = (Y - bias) / scale).
 * dscale/dbias (length cols) may be NULL.                                    */
int ortcpu_layernorm_forward_f32(const float *x, const float *scale, const float *bias,
                                 float *y, float *mean, float *inv_std, int64_t rows,
                                 int64_t cols, double eps, int simplified, int nthreads);
int ortcpu_layernorm_forward_f64(const double *x, const double *scale, const double *bias,
                                 double *y, double *mean, double *inv_std, int64_t rows,
                                 int64_t cols, double eps, int simplified, int nthreads);
int ortcpu_layernorm_backward_f32(const float *dy, const float *xy, const float *scale,
                                  const float *bias, const float *mean, const float *inv_std,
                                  float *dx, float *dscale, float *dbias, int64_t rows,
                                  int64_t cols, int mode, int nthreads);
int ortcpu_layernorm_backward_f64(const double *dy, const double *xy, const double *scale,
                                  const double *bias, const double *mean,
                                  const double *inv_std, double *dx, double *dscale,
                                  double *dbias, int64_t rows, int64_t cols, int mode,
                                  int nthreads);

/* ---- batch normalization (spec §5) -------------------------------------------
 * X is viewed as [n, c, s] (s = product of spatial dims, 1 for [N, C]).
 * forward_train: per-channel batch mean / biased variance, then
 *   y = (x - mean) * inv_std * scale + bias, inv_std = 1/sqrt(var + eps);
 *   writes mean, var (biased; may be NULL) and inv_std (length c; may be NULL).
 *   scale/bias may be NULL. run_mean / run_var (may be NULL): updated in place with
 *   torch's rule, run = (1 - momentum) run + momentum batch, the batch variance times
 *   var_factor (n/(n-1) for torch's unbiased running variance).
 * apply: y = x * a[c] + b[c] (inference, or any per-channel affine map).
 * backward: training = 1 uses batch statistics (mean = saved mean,
 *   inv_std = saved inverse std); training = 0 treats them as constants
 *   (dx = dy * scale * inv_std). dscale/dbias may be NULL.                   */
int ortcpu_batchnorm_forward_train_f32(const float *x, const float *scale, const float *bias,
                                       float *y, float *mean, float *var, float *inv_std,
                                       float *run_mean, float *run_var, int64_t n, int64_t c,
                                       int64_t s, double eps, double momentum,
                                       double var_factor, int nthreads);
int ortcpu_batchnorm_forward_train_f64(const double *x, const double *scale,
                                       const double *bias, double *y, double *mean,
                                       double *var, double *inv_std, double *run_mean,
                                       double *run_var, int64_t n, int64_t c, int64_t s,
                                       double eps, double momentum, double var_factor,
                                       int nthreads);
int ortcpu_batchnorm_apply_f32(const float *x, const float *a, const float *b, float *y,
                               int64_t n, int64_t c, int64_t s, int nthreads);
int ortcpu_batchnorm_apply_f64(const double *x, const double *a, const double *b, double *y,
                               int64_t n, int64_t c, int64_t s, int nthreads);
int ortcpu_batchnorm_backward_f32(const float *dy, const float *x, const float *scale,
                                  const float *mean, const float *inv_std, float *dx,
                                  float *dscale, float *dbias, int64_t n, int64_t c,
                                  int64_t s, int training, int nthreads);
int ortcpu_batchnorm_backward_f64(const double *dy, const double *x, const double *scale,
                                  const double *mean, const double *inv_std, double *dx,
                                  double *dscale, double *dbias, int64_t n, int64_t c,
                                  int64_t s, int training, int nthreads);

/* ---- softmax cross-entropy losses (spec §11) ----------------------------------
 * Logits x are viewed as [n, c, d] (classes on the middle axis; d = 1 for [N, C]);
 * a sample is one (n, d) pair, index i = n*d + j.
 * Sparse labels (int64, length n*d, value in [0, c) or == ignore_index), or dense
 * labels (same layout as x, `dense` != NULL; label must then be NULL).
 * weight: per-class [c] or NULL; sample_weight: per-sample [n*d] or NULL.
 * smoothing: label smoothing eps (torch's definition), 0 for ORT.
 * forward: per-sample loss (may be NULL), log_prob (may be NULL), lse = max + log(sum
 *   exp) per sample (may be NULL); totals[0] = sum of losses, totals[1] = sum of the
 *   weights of non-ignored samples (their count without weights).
 * backward: d = (exp(src - shift) * sum(target) - target) * g, shift per sample (NULL: src is log_prob);
 *   g = dy_scale * (dy ? dy[i] : 1) * weight; ignored samples get 0; add (may be NULL) is
 *   added elementwise. A label out of range fails with INDEX_OUT_OF_RANGE naming it.  */
int ortcpu_sce_forward_f32(const float *x, const int64_t *label, const float *dense,
                           const float *weight, const float *sample_weight, float *loss,
                           float *log_prob, float *lse, double *totals, int64_t n, int64_t c,
                           int64_t d, int64_t ignore_index, double smoothing, int nthreads);
int ortcpu_sce_forward_f64(const double *x, const int64_t *label, const double *dense,
                           const double *weight, const double *sample_weight, double *loss,
                           double *log_prob, double *lse, double *totals, int64_t n,
                           int64_t c, int64_t d, int64_t ignore_index, double smoothing,
                           int nthreads);
int ortcpu_sce_backward_f32(const float *src, const float *shift, const int64_t *label,
                            const float *dense, const float *weight,
                            const float *sample_weight, const float *dy, double dy_scale,
                            const float *add, float *dx, int64_t n, int64_t c, int64_t d,
                            int64_t ignore_index, double smoothing, int nthreads);
int ortcpu_sce_backward_f64(const double *src, const double *shift, const int64_t *label,
                            const double *dense, const double *weight,
                            const double *sample_weight, const double *dy, double dy_scale,
                            const double *add, double *dx, int64_t n, int64_t c, int64_t d,
                            int64_t ignore_index, double smoothing, int nthreads);

/* forward_grad: the forward plus d(loss)/d(x) for an upstream gradient of 1 on the sum
 * (mean != 0: on the mean over the weights of the non-ignored samples) written to dx in
 * the same pass (log_prob not available); totals as forward. */
int ortcpu_sce_forward_grad_f32(const float *x, const int64_t *label, const float *dense,
                                const float *weight, const float *sample_weight, float *loss,
                                float *lse, float *dx, double *totals, int64_t n, int64_t c,
                                int64_t d, int64_t ignore_index, double smoothing, int mean,
                                int nthreads);
int ortcpu_sce_forward_grad_f64(const double *x, const int64_t *label, const double *dense,
                                const double *weight, const double *sample_weight,
                                double *loss, double *lse, double *dx, double *totals,
                                int64_t n, int64_t c, int64_t d, int64_t ignore_index,
                                double smoothing, int mean, int nthreads);

/* ---- dropout (spec §7) ----------------------------------------------------------
 * forward: mask[i] = u_i >= ratio with u_i in [0, 1) from a counter-based hash of
 * (seed, i) (24-bit resolution; independent of the thread count), y = mask ? x/(1-ratio)
 * : 0 (ratio 1: all zero). mask (bool bytes) may be NULL.
 * backward: dx = mask ? dy * scale : 0; mask NULL means all kept.              */
int ortcpu_dropout_forward_f32(const float *x, float *y, uint8_t *mask, int64_t n,
                               double ratio, uint64_t seed, int nthreads);
int ortcpu_dropout_forward_f64(const double *x, double *y, uint8_t *mask, int64_t n,
                               double ratio, uint64_t seed, int nthreads);
int ortcpu_dropout_backward_f32(const float *dy, const uint8_t *mask, float *dx, int64_t n,
                                double scale, int nthreads);
int ortcpu_dropout_backward_f64(const double *dy, const uint8_t *mask, double *dx, int64_t n,
                                double scale, int nthreads);

/* ---- summaries (spec §16): histogram statistics and bucketing, event framing ----
 * Bucketing counts, for every value x, u(x) = #{i : edges[i] <= x} (an upper_bound on
 * the sorted `edges`, length nedges >= 1, no NaN). `lut` (ORTCPU_SUMMARY_LUT_SIZE int32)
 * and `cell_edge` (ORTCPU_SUMMARY_CELLS floats), both filled by ortcpu_summary_edges_lut for the same
 * edges, make that a table look-up (branch-free when no table cell holds more than one
 * edge, as for TensorFlow's/ORT's 1.1-ratio edges); lut = NULL means a binary search.
 * mode ORTCPU_HIST_ORT:   non-finite values are skipped; counts has nedges + 1 entries,
 *                         counts[min(u(x), nedges - 1)] += 1 (a value equal to the
 *                         last edge is counted under it; ORT 1.19.2 indexes past its
 *                         counts and aborts for any value >= 9.92e19); stats over the
 *                         finite values with min = +DBL_MAX, max = -DBL_MAX initially,
 *                         summed in order within a chunk (one thread: ORT's sums).
 * mode ORTCPU_HIST_NUMPY: numpy.histogram(x, bins=edges): counts has nedges - 1 entries,
 *                         bin u(x) - 1 for edges[0] <= x < edges[-1], the last bin
 *                         closed; values outside (and NaN) are not counted; stats over
 *                         all values (NaN/inf propagate, as numpy's min/max/sum do).
 * stats = [min, max, num, sum, sum_squares], accumulated in double.                  */
enum { ORTCPU_HIST_ORT = 0, ORTCPU_HIST_NUMPY = 1, ORTCPU_SUMMARY_LUT_SIZE = 131076,
       ORTCPU_SUMMARY_CELLS = 65536 };
int ortcpu_summary_edges_lut(const double *edges, int64_t nedges, int32_t *lut,
                             float *cell_edge);
int ortcpu_summary_histogram_f32(const float *x, int64_t n, const double *edges,
                                 int64_t nedges, const int32_t *lut, const float *cell_edge,
                                 int mode, double *counts, double *stats, int nthreads);
int ortcpu_summary_histogram_f64(const double *x, int64_t n, const double *edges,
                                 int64_t nedges, const int32_t *lut, const float *cell_edge,
                                 int mode, double *counts, double *stats, int nthreads);
/* TFRecord framing of `count` records stored back to back in `data` (lengths[i]
 * bytes each): out (sum(lengths) + 16*count bytes) receives, per record,
 * uint64 length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the
 * data (little-endian).                                                         */
int ortcpu_summary_frame_records(const uint8_t *data, const int64_t *lengths, int64_t count,
                                 uint8_t *out, int64_t out_size);
/* masked CRC-32C of n bytes into *crc (for readers and tests) */
int ortcpu_summary_masked_crc32c(const uint8_t *data, int64_t n, uint32_t *crc);

/* ---- BLAS (OpenBLAS or MKL, see "GEMM backend"): C = alpha*op(A)*op(B) + beta*C,
 * row-major, on the calling thread; trans_a/trans_b are 0 or 1.                  */
int ortcpu_gemm_f32(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc);
int ortcpu_gemm_f64(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                    const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                    double *c, int64_t ldc);

/* ---- convolution (spec §6.1), conv.c --------------------------------------
 * geom[23]: N, C, M, group, in[3], kernel[3], out[3], strides[3], pads_begin[3],
 * dilations[3] (1-D/2-D as 3-D with leading sizes 1), algorithm (0 auto, 1 im2col,
 * 2 Winograd F(2x2,3x3), 3 F(4x4,3x3): 2-D 3x3, stride 1, dilation 1, group 1 only;
 * 4 small-map im2col: 2-D, stride 1, dilation 1, pads >= 0, padded plane <= 1024;
 * 5 depthwise: group == C > 1, M a multiple of C, 1-D/2-D, pads >= 0; auto picks it
 * there for stride 1, kernels of 5x5 and up, or outputs of 14x14 and more;
 * 6 packed: the small-map geometry, forward and dx on a packed-weight register-tile
 * GEMM, auto there for weights of at most 128 KB per group).
 * x [N,C,in], w [M,C/group,kernel], b [M] or NULL, y [N,M,out]. Backward: any of dx,
 * dw, db may be NULL. ortcpu_conv_path: the algorithm (1..6) the forward of geom runs
 * for elements of elem_size bytes (4 or 8), or a negative status (tests, benchmarks). */
int ortcpu_conv_path(const int64_t *geom, int elem_size);
int ortcpu_conv_forward_f32(const float *x, const float *w, const float *b, float *y,
                            const int64_t *geom, int nthreads);
int ortcpu_conv_forward_f64(const double *x, const double *w, const double *b, double *y,
                            const int64_t *geom, int nthreads);
int ortcpu_conv_backward_f32(const float *dy, const float *x, const float *w, float *dx,
                             float *dw, float *db, const int64_t *geom, int nthreads);
int ortcpu_conv_backward_f64(const double *dy, const double *x, const double *w, double *dx,
                             double *dw, double *db, const int64_t *geom, int nthreads);

/* ---- depthwise 2-D convolution on channels-last memory, conv_nhwc.c -----------------
 * x [N, H, W, C], w [KH, KW, C] (tap-major), b [C] or NULL, y [N, OH, OW, C]; geom as
 * above (2-D, group == C == M). Backward: dx, dw, db may each be NULL (not computed). */
int ortcpu_dw_nhwc_forward_f32(const float *x, const float *w, const float *b, float *y,
                               const int64_t *geom, int nthreads);
int ortcpu_dw_nhwc_forward_f64(const double *x, const double *w, const double *b, double *y,
                               const int64_t *geom, int nthreads);
int ortcpu_dw_nhwc_backward_f32(const float *dy, const float *x, const float *w, float *dx,
                                float *dw, float *db, const int64_t *geom, int nthreads);
int ortcpu_dw_nhwc_backward_f64(const double *dy, const double *x, const double *w, double *dx,
                                double *dw, double *db, const int64_t *geom, int nthreads);

/* ---- inference convolution (graph executor), conv_infer.c ----------------------
 * 2-D only (1-D as H = 1). geom[17]: N, C, H, W, M, group, KH, KW, OH, OW, stride h/w,
 * pad top/left (>= 0; the end pads follow from OH/OW), dilation h/w, layout (0 row
 * tiles, 1 channel tiles for small maps: float32 only). The weights
 * w [M, C/group, KH, KW] are packed once (conv_infer_pack) into conv_infer_packed_size
 * elements; then y [N,M,OH,OW] = relu?(conv(x, w) + b + res), b [M] and res (y's shape)
 * may be NULL. flags: bit 0 ReLU; bit 1 packs every chunk's input columns (else full
 * chunks within an output row, or of a 1x1 stride-1 X, are read in place when a group
 * has at most 64 output channels; tests). */
int ortcpu_conv_infer_packed_size(const int64_t *geom, int64_t *elements);
int ortcpu_conv_infer_pack_f32(const float *w, const int64_t *geom, float *packed);
int ortcpu_conv_infer_pack_f64(const double *w, const int64_t *geom, double *packed);
int ortcpu_conv_infer_f32(const float *x, const float *packed, const float *b,
                          const float *res, float *y, const int64_t *geom, int flags,
                          int nthreads);
int ortcpu_conv_infer_f64(const double *x, const double *packed, const double *b,
                          const double *res, double *y, const int64_t *geom, int flags,
                          int nthreads);

/* ---- pooling (spec §6.2, §6.3), pool.c --------------------------------------
 * geom[22]: planes (N*C), in[3], kernel[3], out[3], strides[3], pads_begin[3],
 * pads_end[3], dilations[3]. idx (may be NULL): flat offsets into the whole input.
 * divisor > 0 overrides the average's window count; count_include_pad 1 counts the window
 * clipped to the padded input (torch), 2 the whole kernel (ORT). Global: op 0 avg, 1 max. */
int ortcpu_maxpool_forward_f32(const float *x, float *y, int64_t *idx, const int64_t *geom,
                               int nthreads);
int ortcpu_maxpool_forward_f64(const double *x, double *y, int64_t *idx, const int64_t *geom,
                               int nthreads);
int ortcpu_maxpool_backward_f32(const float *dy, const int64_t *idx, float *dx, int64_t ny,
                                int64_t nx, int64_t planes, int nthreads);
int ortcpu_maxpool_backward_f64(const double *dy, const int64_t *idx, double *dx, int64_t ny,
                                int64_t nx, int64_t planes, int nthreads);
/* 2x2 stride-2 unpadded max pool keeping a 1-byte argmax code (row*2+col) per window
 * instead of Indices; the backward writes all of dx (ops front end fast path). */
int ortcpu_maxpool2x2_forward_f32(const float *x, float *y, uint8_t *code, const int64_t *geom,
                                  int nthreads);
int ortcpu_maxpool2x2_forward_f64(const double *x, double *y, uint8_t *code,
                                  const int64_t *geom, int nthreads);
int ortcpu_maxpool2x2_backward_f32(const float *dy, const uint8_t *code, float *dx,
                                   const int64_t *geom, int nthreads);
int ortcpu_maxpool2x2_backward_f64(const double *dy, const uint8_t *code, double *dx,
                                   const int64_t *geom, int nthreads);
/* GELU (approximate 0 = erf, 1 = tanh) then a 2x2 stride-2 max pool over x [planes, h, w]
 * (h, w >= 2; floor): y and the 1-byte code (row*2 + col, maxpool2x2's rule) are
 * [planes, h/2, w/2]; the backward writes all of dx: dy * gelu'(x) at each code, else 0
 * (native/src/gelu_pool.inc; graph training fusions). */
int ortcpu_gelu_maxpool2x2_forward_f32(const float *x, float *y, uint8_t *code, int64_t planes,
                                       int64_t h, int64_t w, int approximate, int nthreads);
int ortcpu_gelu_maxpool2x2_forward_f64(const double *x, double *y, uint8_t *code,
                                       int64_t planes, int64_t h, int64_t w, int approximate,
                                       int nthreads);
int ortcpu_gelu_maxpool2x2_backward_f32(const float *dy, const float *x, const uint8_t *code,
                                        float *dx, int64_t planes, int64_t h, int64_t w,
                                        int approximate, int nthreads);
int ortcpu_gelu_maxpool2x2_backward_f64(const double *dy, const double *x, const uint8_t *code,
                                        double *dx, int64_t planes, int64_t h, int64_t w,
                                        int approximate, int nthreads);
/* 1-D / 2-D max pool with a 1-byte argmax code per window (kh * kW + kw), dilation 1, at
 * most 256 taps, pads smaller than the kernel; backward writes all of dx. */
int ortcpu_maxpool_code_forward_f32(const float *x, float *y, uint8_t *code,
                                    const int64_t *geom, int nthreads);
int ortcpu_maxpool_code_forward_f64(const double *x, double *y, uint8_t *code,
                                    const int64_t *geom, int nthreads);
int ortcpu_maxpool_code_backward_f32(const float *dy, const uint8_t *code, float *dx,
                                     const int64_t *geom, int nthreads);
int ortcpu_maxpool_code_backward_f64(const double *dy, const uint8_t *code, double *dx,
                                     const int64_t *geom, int nthreads);
int ortcpu_avgpool_forward_f32(const float *x, float *y, const int64_t *geom,
                               int count_include_pad, int64_t divisor, int nthreads);
int ortcpu_avgpool_forward_f64(const double *x, double *y, const int64_t *geom,
                               int count_include_pad, int64_t divisor, int nthreads);
int ortcpu_avgpool_backward_f32(const float *dy, float *dx, const int64_t *geom,
                                int count_include_pad, int64_t divisor, int nthreads);
int ortcpu_avgpool_backward_f64(const double *dy, double *dx, const int64_t *geom,
                                int count_include_pad, int64_t divisor, int nthreads);
/* pool_nchw16c: MaxPool (max != 0; NaN propagates, a window without input elements
 * yields -inf) or AveragePool (include_pad as avgpool_forward's count_include_pad:
 * 0 the window's input elements, 1 the padded window within the end pads, 2 the whole
 * kernel) on channel-blocked float32 X [planes][in...][16] -> Y [planes][out...][16],
 * planes = N * C/16 in geom (the pool geometry above), dilation 1: the graph executor's
 * pools between channel-blocked Convs. */
int ortcpu_pool_nchw16c_f32(const float *x, float *y, const int64_t *geom, int max,
                            int include_pad, int nthreads);
int ortcpu_global_pool_forward_f32(const float *x, float *y, int64_t planes, int64_t size,
                                   int op, int nthreads);
int ortcpu_global_pool_forward_f64(const double *x, double *y, int64_t planes, int64_t size,
                                   int op, int nthreads);
int ortcpu_global_pool_backward_f32(const float *dy, const float *x, float *dx,
                                    int64_t planes, int64_t size, int op, int nthreads);
int ortcpu_global_pool_backward_f64(const double *dy, const double *x, double *dx,
                                    int64_t planes, int64_t size, int op, int nthreads);

/* ---- GEMM backend, gemm_backend.c ---------------------------------------------
 * Every GEMM of the library runs on OpenBLAS or on the MKL BLAS of torch's x86 wheel
 * (libtorch_cpu.so: sgemm_, dgemm_, cblas_sgemm_pack/compute), see native/src/gemm.h.
 * bind_mkl: look the MKL entry points up in an already-loaded library (no new load);
 * fails, leaving OpenBLAS only, if it is not loaded or lacks them. mkl_available: bit 0
 * plain GEMM, bit 1 packed float32 GEMM. set_backend: auto times both backends on the
 * first GEMM of each shape class and keeps the faster. auto_choice: auto's decision for a
 * class (ORTCPU_GEMM_OPENBLAS / _MKL; 0 not decided yet); auto_reset forgets them all. set_backend: any of the four
 * (MKL_THREADED: MKL, multi-threaded GEMMs on its own threads). */
enum { ORTCPU_GEMM_AUTO = 0, ORTCPU_GEMM_OPENBLAS = 1, ORTCPU_GEMM_MKL = 2,
       ORTCPU_GEMM_MKL_THREADED = 3 };
int ortcpu_gemm_bind_mkl(const char *library_path);
int ortcpu_gemm_mkl_available(void);
int ortcpu_gemm_set_backend(int backend);
int ortcpu_gemm_get_backend(void);
int ortcpu_gemm_auto_choice(int is_f64, int packed, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, int threaded);
void ortcpu_gemm_auto_reset(void);

/* ---- MatMul / Gemm, gemm.c ----------------------------------------------------
 * Threads: OpenBLAS is pinned to 1 thread at load (ortcpu_blas_set_num_threads); its
 * parallel GEMM = OpenMP threads each running single-threaded OpenBLAS on a slab; MKL runs
 * with nthreads on the same OpenMP pool.
 * gemm_mt: as ortcpu_gemm_* with nthreads. matmul: c[i] (m x n) = a[a_off[i]] (m x k)
 * . b[b_off[i]] (k x n), offsets in elements, checked against a_len / b_len.      */
void ortcpu_blas_set_num_threads(int n);
int ortcpu_blas_get_num_threads(void);
int ortcpu_gemm_mt_f32(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc, int nthreads);
int ortcpu_gemm_mt_f64(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const double *a, int64_t lda, const double *b,
                       int64_t ldb, double beta, double *c, int64_t ldc, int nthreads);
int ortcpu_matmul_f32(const float *a, const float *b, float *c, int64_t batch,
                      const int64_t *a_off, const int64_t *b_off, int64_t m, int64_t n,
                      int64_t k, int64_t a_len, int64_t b_len, int nthreads);
int ortcpu_matmul_f64(const double *a, const double *b, double *c, int64_t batch,
                      const int64_t *a_off, const int64_t *b_off, int64_t m, int64_t n,
                      int64_t k, int64_t a_len, int64_t b_len, int nthreads);
/* bmm: c[i] (m x n) = op(a[i]) . op(b[i]) over `batch` consecutive contiguous matrices;
 * a[i] is stored m x k (k x m when trans_a), b[i] k x n (n x k when trans_b). */
int ortcpu_bmm_f32(int trans_a, int trans_b, const float *a, const float *b, float *c,
                   int64_t batch, int64_t m, int64_t n, int64_t k, int nthreads);
int ortcpu_bmm_f64(int trans_a, int trans_b, const double *a, const double *b, double *c,
                   int64_t batch, int64_t m, int64_t n, int64_t k, int nthreads);
/* gemm_p16 (gemm_p16.c): float32 C (m x n, row stride ldc) = A (m x k) . B + bias, B a
 * constant packed once by gemm_p16_pack (B stored k x n, or n x k when trans_b) into
 * gemm_p16_packed_size(n, k) floats; bias (n) may be NULL. The small-batch weight GEMM of
 * the graph executor; only in x86-64-v3+ builds (gemm_p16_available(); elsewhere gemm_p16
 * fails cleanly). gemm_p16_max_rows(): the m up to which this build's tile measured faster
 * than the BLAS (0 where gemm_p16 is not built). */
int ortcpu_gemm_p16_available(void);
int64_t ortcpu_gemm_p16_max_rows(void);
int64_t ortcpu_gemm_p16_packed_size(int64_t n, int64_t k);
int ortcpu_gemm_p16_pack(int trans_b, int64_t n, int64_t k, const float *b, int64_t ldb,
                         float *packed);
int ortcpu_gemm_p16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *packed, const float *bias, float *c, int64_t ldc,
                    int nthreads);
/* conv_p16 (gemm_p16.c): float32 2-D convolution of one group in NCHW, any kernel, strides,
 * dilations and pads >= 0, on gemm_p16's AVX-512 tile as the implicit GEMM
 * Y^T = im2col(X)^T W^T (no im2col matrix; X zero-padded into scratch where windows reach
 * outside it), + bias (M, may be NULL) + res (Y's layout, may be NULL), then ReLU when
 * relu. geom: conv_infer's first 16 entries (N, C, H, W, M, group (must be 1), KH, KW,
 * OH, OW, stride h/w, pad top/left, dilation h/w); W [M][C*KH*KW] packed by
 * gemm_p16_pack(1, M, C*KH*KW, W, C*KH*KW, ...).
 * conv1x1_p16: the 1x1 stride-1 unpadded case over the flattened positions, X [nb][k][p]
 * (k input channels, p = H*W) -> Y [nb][n][p], W [n][k] packed likewise; conv1x1s_p16
 * the strided one, X [nb][k][H][W] read at strides (sh, sw) -> Y [nb][n][OH*OW].
 * ystride: elements from one sample of Y to the next (0: M*OH*OW, Y contiguous; larger:
 * Y is a channel slice of a wider tensor, a Concat's buffer); res is always contiguous.
 * Both only in x86-64-v4 builds (conv_p16_available(); elsewhere they fail cleanly). */
int ortcpu_conv_p16_available(void);
int ortcpu_conv_p16(const float *x, const float *packed, const float *bias, const float *res,
                    int relu, float *y, int64_t ystride, const int64_t *geom, int nthreads);
int ortcpu_conv1x1_p16(int64_t nb, int64_t n, int64_t k, int64_t p, const float *x,
                       const float *packed, const float *bias, const float *res, int relu,
                       float *y, int64_t ystride, int nthreads);
int ortcpu_conv1x1s_p16(int64_t nb, int64_t n, int64_t k, int64_t h, int64_t w, int64_t sh,
                        int64_t sw, const float *x, const float *packed, const float *bias,
                        const float *res, int relu, float *y, int64_t ystride, int nthreads);
/* conv1x1_nchw16c: the 1x1 convolution of conv1x1_p16 on channel-blocked tensors (the
 * layout onnxruntime's NCHWc kernels keep between layers): X [nb][k/16][p][16] ->
 * Y [nb][n/16][p][16], res in Y's layout, n and k multiples of 16, W packed as for
 * conv1x1_p16; ystride as conv1x1_p16's. The graph executor's blocked regions run their
 * Convs on these kernels (graph/ops_blocked.py); benchmarks/nchw16c.py measures chains of
 * both layouts. Output channels in groups of 64 run a 6-position x 64-channel tile. flags (here and in conv1x1s_nchw16c, conv_nchw16c): ORTCPU_CONV16C_RELU
 * applies ReLU; ORTCPU_CONV16C_NO_FETCH leaves the weight rows to the hardware
 * prefetchers instead of fetching them ahead (both tiles); ORTCPU_CONV16C_SLICED runs every
 * reduction of the 6 x 64 tile in slices over blocks of tiles (without it only those
 * over 2304 steps). Which is faster depends on the CPU and the shape: the graph executor
 * measures them. */
enum { ORTCPU_CONV16C_RELU = 1, ORTCPU_CONV16C_NO_FETCH = 2, ORTCPU_CONV16C_SLICED = 4 };
int ortcpu_conv1x1_nchw16c(int64_t nb, int64_t n, int64_t k, int64_t p, const float *x,
                           const float *packed, const float *bias, const float *res,
                           int flags, float *y, int64_t ystride, int nthreads);
/* conv1x1s_nchw16c: conv1x1s_p16 on channel-blocked tensors (X [nb][k/16][h*w][16] read
 * subsampled at the strides into a scratch copy, then conv1x1_nchw16c's kernel). */
int ortcpu_conv1x1s_nchw16c(int64_t nb, int64_t n, int64_t k, int64_t h, int64_t w,
                            int64_t sh, int64_t sw, const float *x, const float *packed,
                            const float *bias, const float *res, int flags, float *y,
                            int64_t ystride, int nthreads);
/* conv_nchw16c: conv_p16 on channel-blocked tensors, X [nb][c/16][H][W][16] ->
 * Y [nb][m/16][OH][OW][16] (res likewise), c and m multiples of 16; W packed as for
 * conv_p16 but with its reduction ordered (channel block, ky, kx, channel in block):
 * W [m][c/16][16][kh][kw] permuted to [m][c/16][kh][kw][16]; ystride as conv_p16's (see
 * conv1x1_nchw16c; the same two tiles, by the same rule). */
int ortcpu_conv_nchw16c(const float *x, const float *packed, const float *bias,
                        const float *res, int flags, float *y, int64_t ystride,
                        const int64_t *geom, int nthreads);
/* to_nchw16c / from_nchw16c (layout16.c): float32 X [n][c][p] -> Y [n][cp/16][p][16] and
 * back, cp >= c a multiple of 16 (channels c.. cp written as zeros, not read back): the
 * graph executor's reorders at the edges of its channel-blocked regions. */
int ortcpu_to_nchw16c_f32(const float *x, float *y, int64_t n, int64_t c, int64_t cp,
                          int64_t p, int nthreads);
int ortcpu_from_nchw16c_f32(const float *x, float *y, int64_t n, int64_t c, int64_t cp,
                            int64_t p, int nthreads);
/* conv_nchw_to16c: conv_p16's X (NCHW, any channel count) into a channel-blocked Y
 * [nb][m/16][OH*OW][16] (res likewise) on the 6 x 64 tile: m a multiple of 64 and
 * c*kh*kw at most 2304, W packed as for conv_p16 (a network's stem: 3 channels in, its
 * output kept blocked). */
int ortcpu_conv_nchw_to16c(const float *x, const float *packed, const float *bias,
                           const float *res, int relu, float *y, int64_t ystride,
                           const int64_t *geom, int nthreads);
/* lrn (lrn.c): ONNX LRN across channels on float32 NCHW x [n][c][p] (p = the spatial
 * size) into y (not x): y = x / (bias + alpha / size * sum of x^2 over the channel window
 * [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to [0, c))^beta. */
int ortcpu_lrn_f32(const float *x, float *y, int64_t n, int64_t c, int64_t p, int64_t size,
                   float alpha, float beta, float bias, int nthreads);
/* bmm_strided: for the batch entries (i0 < batch0, i1 < batch1), C_i (m x n, row stride
 * ldc) = alpha * op(A_i) . op(B_i), each operand a strided matrix (row stride lda / ldb;
 * stored k x m / n x k when transposed) at i0*s[0] + i1*s[1] elements from its base, s
 * being sa / sb / sc (2 each): the batched MatMul reads transposed, sliced or head-split
 * operands in place. Input batch strides may be 0 (one matrix for every entry); output
 * matrices may lie apart or interleave row by row (sc[1] >= n, (batch1-1)*sc[1] + n <= ldc:
 * the heads of a [.., m, heads, n] buffer), never overlap. */
int ortcpu_bmm_strided_f32(int trans_a, int trans_b, int64_t batch0, int64_t batch1,
                           int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, const int64_t *sa, const float *b, int64_t ldb,
                           const int64_t *sb, float *c, int64_t ldc, const int64_t *sc,
                           int nthreads);
int ortcpu_bmm_strided_f64(int trans_a, int trans_b, int64_t batch0, int64_t batch1,
                           int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                           int64_t lda, const int64_t *sa, const double *b, int64_t ldb,
                           const int64_t *sb, double *c, int64_t ldc, const int64_t *sc,
                           int nthreads);

#endif
