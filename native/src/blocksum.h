/* blocksum.h -- fast, accurate row reductions for the norm / batchnorm / loss families.
 *
 * A plain `omp simd reduction(+: double s)` over float data is one dependency chain of
 * 4-wide double adds (latency-bound: ~1 element per cycle). These macros keep 32
 * independent lanes in T (4 AVX2 vectors of floats), and flush them into the double
 * result every 1024 elements, so float32 rows are still summed in double, 32 terms at
 * a time. EXPR may use the index variable `i`. */
#ifndef ORTCPU_BLOCKSUM_H
#define ORTCPU_BLOCKSUM_H

#define ORT_BS_LANES 32
#define ORT_BS_BLOCK 1024

/* Sum of the 32 lanes in double as a tree (vertical adds, then 8 -> 1): a serial
 * loop over the lanes is a ~130-cycle dependency chain, longer than summing a
 * 768-element row. */
#define ORT_BS_DEFINE_LANE_TOTAL(T, NAME)                                               \
    static inline double NAME(const T *a)                                               \
    {                                                                                   \
        double h[8];                                                                    \
        for (int k = 0; k < 8; k++)                                                     \
            h[k] = ((double)a[k] + (double)a[k + 8]) + ((double)a[k + 16] + (double)a[k + 24]); \
        return ((h[0] + h[1]) + (h[2] + h[3])) + ((h[4] + h[5]) + (h[6] + h[7]));       \
    }
ORT_BS_DEFINE_LANE_TOTAL(float, ort_bs_lane_total_f32)
ORT_BS_DEFINE_LANE_TOTAL(double, ort_bs_lane_total_f64)
#define ORT_BS_LANE_TOTAL(a)                                                            \
    _Generic((a)[0], float: ort_bs_lane_total_f32, double: ort_bs_lane_total_f64)(a)

/* s0 += sum EXPR0(i), s1 += sum EXPR1(i) for i in [0, n); s0, s1 are doubles */
#define ORT_BLOCK_SUM2(T, n, s0, EXPR0, s1, EXPR1)                                      \
    do {                                                                                \
        int64_t n_ = (n), i0_ = 0;                                                      \
        while (i0_ < n_) {                                                              \
            int64_t blk_ = n_ - i0_ < ORT_BS_BLOCK ? n_ - i0_ : ORT_BS_BLOCK;           \
            int64_t full_ = blk_ - blk_ % ORT_BS_LANES;                                 \
            T a0_[ORT_BS_LANES], a1_[ORT_BS_LANES];                                     \
            for (int j_ = 0; j_ < ORT_BS_LANES; j_++) a0_[j_] = a1_[j_] = 0;            \
            for (int64_t k_ = 0; k_ < full_; k_ += ORT_BS_LANES) {                      \
                _Pragma("omp simd")                                                     \
                for (int j_ = 0; j_ < ORT_BS_LANES; j_++) {                             \
                    int64_t i = i0_ + k_ + j_;                                          \
                    a0_[j_] += (EXPR0);                                                 \
                    a1_[j_] += (EXPR1);                                                 \
                }                                                                       \
            }                                                                           \
            double t0_ = ORT_BS_LANE_TOTAL(a0_), t1_ = ORT_BS_LANE_TOTAL(a1_);          \
            for (int64_t i = i0_ + full_; i < i0_ + blk_; i++) {                        \
                t0_ += (EXPR0);                                                         \
                t1_ += (EXPR1);                                                         \
            }                                                                           \
            (s0) += t0_;                                                                \
            (s1) += t1_;                                                                \
            i0_ += blk_;                                                                \
        }                                                                               \
    } while (0)

#define ORT_BLOCK_SUM(T, n, s0, EXPR0)                                                  \
    do {                                                                                \
        int64_t n_ = (n), i0_ = 0;                                                      \
        while (i0_ < n_) {                                                              \
            int64_t blk_ = n_ - i0_ < ORT_BS_BLOCK ? n_ - i0_ : ORT_BS_BLOCK;           \
            int64_t full_ = blk_ - blk_ % ORT_BS_LANES;                                 \
            T a0_[ORT_BS_LANES];                                                        \
            for (int j_ = 0; j_ < ORT_BS_LANES; j_++) a0_[j_] = 0;                      \
            for (int64_t k_ = 0; k_ < full_; k_ += ORT_BS_LANES) {                      \
                _Pragma("omp simd")                                                     \
                for (int j_ = 0; j_ < ORT_BS_LANES; j_++) {                             \
                    int64_t i = i0_ + k_ + j_;                                          \
                    a0_[j_] += (EXPR0);                                                 \
                }                                                                       \
            }                                                                           \
            double t0_ = ORT_BS_LANE_TOTAL(a0_);                                        \
            for (int64_t i = i0_ + full_; i < i0_ + blk_; i++) t0_ += (EXPR0);          \
            (s0) += t0_;                                                                \
            i0_ += blk_;                                                                \
        }                                                                               \
    } while (0)

/* m = max over [0, n) of x[i] with NaN propagation (NaN if any element is NaN) */
#define ORT_ROW_MAX(T, n, x, m)                                                         \
    do {                                                                                \
        int64_t n_ = (n), full_ = n_ - n_ % ORT_BS_LANES;                               \
        T a_[ORT_BS_LANES];                                                             \
        int nan_[ORT_BS_LANES];                                                         \
        for (int j_ = 0; j_ < ORT_BS_LANES; j_++) {                                     \
            a_[j_] = -INFINITY;                                                         \
            nan_[j_] = 0;                                                               \
        }                                                                               \
        for (int64_t k_ = 0; k_ < full_; k_ += ORT_BS_LANES) {                          \
            _Pragma("omp simd")                                                         \
            for (int j_ = 0; j_ < ORT_BS_LANES; j_++) {                                 \
                T v_ = (x)[k_ + j_];                                                    \
                a_[j_] = v_ > a_[j_] ? v_ : a_[j_];                                     \
                nan_[j_] |= v_ != v_;                                                   \
            }                                                                           \
        }                                                                               \
        T r_ = -INFINITY;                                                               \
        int any_ = 0;                                                                   \
        _Pragma("omp simd reduction(max : r_) reduction(| : any_)")                     \
        for (int j_ = 0; j_ < ORT_BS_LANES; j_++) {                                     \
            r_ = a_[j_] > r_ ? a_[j_] : r_;                                             \
            any_ |= nan_[j_];                                                           \
        }                                                                               \
        for (int64_t i_ = full_; i_ < n_; i_++) {                                       \
            T v_ = (x)[i_];                                                             \
            r_ = v_ > r_ ? v_ : r_;                                                     \
            any_ |= v_ != v_;                                                           \
        }                                                                               \
        (m) = any_ ? (T)NAN : r_;                                                       \
    } while (0)

#endif
