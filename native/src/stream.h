/* stream.h -- non-temporal (streaming) stores for outputs larger than the caches.
 *
 * An ordinary store first reads the destination line into the cache (read-for-
 * ownership) and then writes it back: an output that cannot stay cached costs two trips
 * to DRAM, and the stores waiting on those reads back up the store buffer. A streaming
 * store writes whole lines past the caches in one trip. Worth it only when the working
 * set is larger than the last-level cache; below that the next op reads the output from
 * cache, so kernels ask ort_stream_worthwhile() first.
 *
 * Kernels write an output row through ORT_WRITE_OUT, which computes it chunk by chunk
 * into an L1 buffer and ort_stream_out()s each chunk; a thread calls ort_stream_fence()
 * after its last one. */
#ifndef ORTCPU_STREAM_H
#define ORTCPU_STREAM_H
#include <stddef.h>
#include <stdint.h>

#define ORT_STREAM_CHUNK 1024

/* dst[0:nbytes) = src[0:nbytes), full 64-byte lines of dst with streaming stores (the
 * widest the CPU has: 64-byte stores write a line at once, 16-byte ones are much slower
 * on AMD Zen), the unaligned head and tail with ordinary ones. */
void ort_stream_out(void *dst, const void *src, size_t nbytes);

/* Write n elements of type T to dst: WRITE is a statement that stores len_ elements at
 * out_, for the elements i0_ .. i0_ + len_ of the row. With stream == 0 it runs once,
 * straight into dst; otherwise once per ORT_STREAM_CHUNK elements into an L1 buffer
 * that is then streamed to dst + i0_. */
#define ORT_WRITE_OUT(T, stream, dst, n, WRITE)                                         \
    do {                                                                                \
        int64_t n_ = (n);                                                               \
        if (!(stream)) {                                                                \
            const int64_t i0_ = 0, len_ = n_;                                           \
            T *out_ = (dst);                                                            \
            WRITE;                                                                      \
        } else {                                                                        \
            T buf_[ORT_STREAM_CHUNK];                                                   \
            for (int64_t i0_ = 0; i0_ < n_; i0_ += ORT_STREAM_CHUNK) {                  \
                const int64_t len_ = n_ - i0_ < ORT_STREAM_CHUNK ? n_ - i0_ : ORT_STREAM_CHUNK; \
                T *out_ = buf_;                                                         \
                WRITE;                                                                  \
                ort_stream_out((dst) + i0_, buf_, (size_t)len_ * sizeof(T));            \
            }                                                                           \
        }                                                                               \
    } while (0)

/* Order this thread's streaming stores before what follows (they are weakly ordered). */
void ort_stream_fence(void);

/* Whether a kernel touching `bytes` (inputs + outputs) should stream its outputs:
 * at or above ortcpu_get_stream_threshold() they cannot stay cached anyway. */
int ort_stream_worthwhile(size_t bytes);

#endif
