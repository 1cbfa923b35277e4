/* common.c -- status messages, the parallel-for, the caching arena,
 * the bandwidth probe, streaming stores. */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include "common.h"
#include "stream.h"

#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif


/* ---- status ----------------------------------------------------------- */

static __thread char last_error[512];

int ort_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *ortcpu_last_error(void) { return last_error; }

int ortcpu_isa_level(void) { return ORT_ISA_LEVEL; }

int ortcpu_cpu_isa_level(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return 2;
    if (__builtin_cpu_supports("x86-64-v3")) return 1;
#endif
    return 0;
}

const char *ortcpu_status_name(int status)
{
    switch (status) {
    case ORTCPU_OK: return "OK";
    case ORTCPU_E_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case ORTCPU_E_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case ORTCPU_E_INDEX_OUT_OF_RANGE: return "INDEX_OUT_OF_RANGE";
    case ORTCPU_E_INTERNAL: return "INTERNAL";
    default: return "UNKNOWN";
    }
}

/* ---- parallel for ------------------------------------------------------- */

int ort_num_chunks(int64_t n, int64_t grain, int nthreads)
{
    if (n <= 0) return 0;
    if (grain < 1) grain = 1;
    int64_t by_size = (n + grain - 1) / grain;
    int64_t k = nthreads < 1 ? 1 : nthreads;
    return (int)(by_size < k ? by_size : k);
}

void ort_parallel_for(int64_t n, int64_t grain, int nthreads, ort_range_fn fn, void *ctx)
{
    int chunks = ort_num_chunks(n, grain, nthreads);
    if (chunks <= 0) return;
    if (chunks == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* contiguous chunks, boundaries rounded to 16 elements (whole cache lines) */
    int64_t per = ((n + chunks - 1) / chunks + 15) & ~(int64_t)15;
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
    for (int c = 0; c < chunks; c++) {
        int64_t b = (int64_t)c * per, e = b + per < n ? b + per : n;
        if (b < e) fn(ctx, b, e, c);
    }
}

/* ---- arena ----------------------------------------------------------------
 * Blocks are rounded up to size classes (quarter steps between powers of two)
 * and kept on per-class free lists when released, so big tensors reuse pages
 * that are already mapped and touched instead of page-faulting fresh ones. */

#define ARENA_HEADER 64
#define ARENA_BINS 256

/* 4K aliasing: a load whose address matches an earlier, still-pending store in its low 12
 * bits waits for it (the core compares those bits first). torch's large tensors start 64
 * bytes into a page, and every arena block's data started 64 bytes after its input's,
 * so a kernel streaming x into y stalled on its loads (1 thread, AMD Zen 4: LayerNorm
 * 2048x128 forward 87 vs 79 us, backward 110 vs 95 us, with y 1 KB instead of 64 bytes
 * after x modulo 4 KB). Each allocation therefore starts its data at a page offset of
 * 64 + k KB, k cycling through 1..ARENA_SLOTS: 1-3 KB away from a torch tensor and from
 * the arena block handed out just before. The data's block is found from the pointer
 * stored just before the data. */
#define ARENA_SLOTS 3
#define ARENA_PAD (4096 + 64) /* bytes past the header that the page offset may take */

/* Under AddressSanitizer (make test-sanitize) a block's class padding beyond the bytes
 * asked for, and a whole cached block, are poisoned: an overrun or a use after free
 * inside the arena is reported as if each tensor had its own malloc. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

typedef struct block {
    size_t bytes;          /* class size, excluding the header */
    int bin;
    struct block *next;    /* free-list link while cached */
} block_t;

static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static block_t *arena_free[ARENA_BINS];
static size_t arena_in_use, arena_cached, arena_peak;
static size_t arena_limit = (size_t)4 << 30;
static int64_t arena_hits, arena_misses;
static unsigned arena_turn; /* allocations so far (under arena_lock): picks the slot */

static int arena_class(size_t nbytes, size_t *class_bytes)
{
    if (nbytes <= 4096) {
        *class_bytes = 4096;
        return 0;
    }
    int e = 63 - __builtin_clzll((unsigned long long)(nbytes - 1)); /* 2^e < n <= 2^(e+1) */
    size_t step = (size_t)1 << (e - 2);
    size_t q = (nbytes + step - 1) / step;                          /* 5..8 */
    *class_bytes = q * step;
    return 1 + (e - 12) * 4 + (int)(q - 5);
}

void *ortcpu_arena_alloc(size_t nbytes)
{
    size_t bytes;
    int bin = arena_class(nbytes, &bytes);
    if (bin >= ARENA_BINS) return NULL;
    block_t *blk = NULL;
    pthread_mutex_lock(&arena_lock);
    const uintptr_t slot = 64 + 1024 * (1 + arena_turn++ % ARENA_SLOTS);
    if (arena_free[bin]) {
        blk = arena_free[bin];
        arena_free[bin] = blk->next;
        arena_cached -= bytes;
        arena_hits++;
    } else {
        arena_misses++;
    }
    if (blk) {
        arena_in_use += bytes;
        if (arena_in_use > arena_peak) arena_peak = arena_in_use;
    }
    pthread_mutex_unlock(&arena_lock);
    if (!blk) {
        void *mem = NULL;
        if (posix_memalign(&mem, ARENA_HEADER, bytes + ARENA_HEADER + ARENA_PAD) != 0)
            return NULL;
        blk = mem;
        blk->bytes = bytes;
        blk->bin = bin;
        pthread_mutex_lock(&arena_lock);
        arena_in_use += bytes;
        if (arena_in_use > arena_peak) arena_peak = arena_in_use;
        pthread_mutex_unlock(&arena_lock);
    }
    char *data = (char *)blk + ARENA_HEADER;
    size_t off = (size_t)((slot - (uintptr_t)data % 4096 + 4096) % 4096);
    if (off < sizeof(block_t *)) off += 4096;
    char *user = data + off;
    ARENA_POISON(data, off - sizeof(block_t *));
    ARENA_UNPOISON(user - sizeof(block_t *), sizeof(block_t *) + nbytes);
    ((block_t **)user)[-1] = blk;
    ARENA_POISON(user + nbytes, bytes + ARENA_PAD - off - nbytes);
    return user;
}

void ortcpu_arena_free(void *ptr)
{
    if (!ptr) return;
    block_t *blk = ((block_t **)ptr)[-1];
    int keep;
    pthread_mutex_lock(&arena_lock);
    arena_in_use -= blk->bytes;
    keep = arena_cached + blk->bytes <= arena_limit;
    if (keep) {
        ARENA_POISON((char *)blk + ARENA_HEADER, blk->bytes + ARENA_PAD);
        blk->next = arena_free[blk->bin];
        arena_free[blk->bin] = blk;
        arena_cached += blk->bytes;
    }
    pthread_mutex_unlock(&arena_lock);
    if (!keep) {
        ARENA_UNPOISON((char *)blk + ARENA_HEADER, blk->bytes + ARENA_PAD);
        free(blk);
    }
}

void ortcpu_arena_empty_cache(void)
{
    block_t *all = NULL;
    pthread_mutex_lock(&arena_lock);
    for (int b = 0; b < ARENA_BINS; b++) {
        while (arena_free[b]) {
            block_t *blk = arena_free[b];
            arena_free[b] = blk->next;
            blk->next = all;
            all = blk;
        }
    }
    arena_cached = 0;
    pthread_mutex_unlock(&arena_lock);
    int released = all != NULL;
    while (all) {
        block_t *next = all->next;
        ARENA_UNPOISON((char *)all + ARENA_HEADER, all->bytes + ARENA_PAD);
        free(all);
        all = next;
    }
#if defined(__GLIBC__)
    /* glibc keeps freed heap chunks (its mmap threshold grows past our block sizes after
     * the first frees) mapped: hand their pages back, so the cache really is emptied */
    if (released) malloc_trim(0);
#endif
}

void ortcpu_arena_set_limit(size_t max_cached_bytes)
{
    pthread_mutex_lock(&arena_lock);
    arena_limit = max_cached_bytes;
    pthread_mutex_unlock(&arena_lock);
    if (arena_cached > max_cached_bytes) ortcpu_arena_empty_cache();
}

void ortcpu_arena_stats(int64_t stats[6])
{
    pthread_mutex_lock(&arena_lock);
    stats[0] = (int64_t)arena_in_use;
    stats[1] = (int64_t)arena_cached;
    stats[2] = arena_hits;
    stats[3] = arena_misses;
    stats[4] = (int64_t)arena_peak;
    stats[5] = (int64_t)arena_limit;
    pthread_mutex_unlock(&arena_lock);
}

void *ort_scratch(size_t nbytes) { return ortcpu_arena_alloc(nbytes); }
void ort_scratch_free(void *p) { ortcpu_arena_free(p); }

/* ---- bandwidth probe -------------------------------------------------------- */

typedef struct { const float *src; float *dst; } copy_ctx;

static void copy_range(void *vctx, int64_t b, int64_t e, int chunk)
{
    (void)chunk;
    copy_ctx *c = vctx;
    memcpy(c->dst + b, c->src + b, (size_t)(e - b) * sizeof(float));
}

int ortcpu_stream_copy_f32(const float *src, float *dst, int64_t n, int nthreads)
{
    if (n < 0) return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "stream_copy: n must be >= 0");
    copy_ctx c = {src, dst};
    ort_parallel_for(n, 1 << 16, nthreads, copy_range, &c);
    return ORTCPU_OK;
}

/* ---- streaming stores (stream.h) ---------------------------------------------- */

static size_t stream_default_threshold(void)
{
    const char *env = getenv("ORTCPU_STREAM_BYTES");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (*end == '\0') return (size_t)v;
    }
    /* sysconf's L3 size is the whole package's on some hosts (384 MB on this EPYC
     * guest, whose cores share 32 MB); sysfs gives the slice cpu0 shares. */
    size_t llc = (size_t)32 << 20;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        unsigned long kb;
        if (fscanf(f, "%luK", &kb) == 1 && kb > 0) llc = (size_t)kb << 10;
        fclose(f);
    }
    return llc;
}

typedef void (*stream_lines_fn)(char *dst, const char *src, size_t lines);

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ORT_STREAM_X86 1

/* the widest store of this build's ISA level (the loader picked the build) */
#if ORT_ISA_LEVEL >= 2
__attribute__((target("avx512f"))) static void stream_lines_x86(char *dst, const char *src,
                                                                size_t lines)
{
    for (size_t k = 0; k < lines; k++)
        _mm512_stream_si512((__m512i *)(dst + 64 * k), _mm512_loadu_si512(src + 64 * k));
}
#elif ORT_ISA_LEVEL == 1
__attribute__((target("avx"))) static void stream_lines_x86(char *dst, const char *src,
                                                            size_t lines)
{
    for (size_t k = 0; k < 2 * lines; k++)
        _mm256_stream_si256((__m256i *)(dst + 32 * k),
                            _mm256_loadu_si256((const __m256i *)(src + 32 * k)));
}
#else
static void stream_lines_x86(char *dst, const char *src, size_t lines)
{
    for (size_t k = 0; k < 4 * lines; k++)
        _mm_stream_si128((__m128i *)(dst + 16 * k), _mm_loadu_si128((const __m128i *)(src + 16 * k)));
}
#endif
#endif

static pthread_once_t stream_once = PTHREAD_ONCE_INIT;
static size_t stream_threshold;
static stream_lines_fn stream_lines;

static void stream_init(void)
{
    stream_threshold = stream_default_threshold();
#ifdef ORT_STREAM_X86
    stream_lines = stream_lines_x86;
#else
    stream_lines = NULL;
#endif
}

void ortcpu_set_stream_threshold(size_t bytes)
{
    pthread_once(&stream_once, stream_init);
    stream_threshold = bytes;
}

size_t ortcpu_get_stream_threshold(void)
{
    pthread_once(&stream_once, stream_init);
    return stream_threshold;
}

int ort_stream_worthwhile(size_t bytes)
{
    pthread_once(&stream_once, stream_init);
    return stream_lines && stream_threshold > 0 && bytes >= stream_threshold;
}

void ort_stream_out(void *dst, const void *src, size_t nbytes)
{
    pthread_once(&stream_once, stream_init);
    char *d = dst;
    const char *s = src;
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    if (!stream_lines || head >= nbytes) {
        memcpy(d, s, nbytes);
        return;
    }
    memcpy(d, s, head);
    size_t lines = (nbytes - head) / 64;
    stream_lines(d + head, s + head, lines);
    size_t done = head + 64 * lines;
    memcpy(d + done, s + done, nbytes - done);
}

void ort_stream_fence(void)
{
#ifdef ORT_STREAM_X86
    _mm_sfence();
#endif
}
