/* gemm_backend.c -- which BLAS runs a GEMM: binding torch's MKL at load time, the
 * ORTCPU_GEMM setting, and `auto`'s per-shape-class decision by measurement (gemm.h). */
#define _GNU_SOURCE /* RTLD_NOLOAD */
#include "common.h"
#include "gemm.h"

#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

static ort_mkl_api mkl_api;
static int gemm_setting = ORTCPU_GEMM_AUTO;

const ort_mkl_api *ort_mkl(void) { return &mkl_api; }

int ortcpu_gemm_bind_mkl(const char *library_path)
{
    if (!library_path || !*library_path)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm_bind_mkl: empty library path");
    /* only a library the process has already loaded (torch's): never a second copy */
    void *h = dlopen(library_path, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return ort_fail(ORTCPU_E_INVALID_ARGUMENT, "gemm_bind_mkl: %s is not loaded",
                            library_path);
    ort_mkl_api api;
    api.sgemm = (ort_fgemm_f32)dlsym(h, "sgemm_");
    api.dgemm = (ort_fgemm_f64)dlsym(h, "dgemm_");
    /* the C interface: the lower-case name is the Fortran one (int by reference) */
    api.set_threads_local = (int (*)(int))dlsym(h, "MKL_Set_Num_Threads_Local");
    api.pack_size = (ort_pack_size_fn)dlsym(h, "cblas_sgemm_pack_get_size");
    api.pack = (ort_pack_fn)dlsym(h, "cblas_sgemm_pack");
    api.compute = (ort_pack_compute_fn)dlsym(h, "cblas_sgemm_compute");
    /* a library exporting sgemm_ without MKL's thread control is some other BLAS */
    if (!api.sgemm || !api.dgemm || !api.set_threads_local) {
        dlclose(h);
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                        "gemm_bind_mkl: %s lacks sgemm_/dgemm_/MKL_Set_Num_Threads_Local",
                        library_path);
    }
    if (!api.pack_size || !api.pack || !api.compute) api.pack_size = NULL, api.pack = NULL,
                                                     api.compute = NULL;
    mkl_api = api; /* the handle stays open: the pointers live as long as the library */
    return ORTCPU_OK;
}

int ortcpu_gemm_mkl_available(void)
{
    return (mkl_api.sgemm ? 1 : 0) | (mkl_api.compute ? 2 : 0);
}

int ortcpu_gemm_set_backend(int backend)
{
    if (backend < ORTCPU_GEMM_AUTO || backend > ORTCPU_GEMM_MKL_THREADED)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                        "gemm_set_backend: backend %d is not 0 (auto), 1 (openblas), 2 (mkl), "
                        "3 (mkl_threaded)", backend);
    if (backend >= ORTCPU_GEMM_MKL && !mkl_api.sgemm)
        return ort_fail(ORTCPU_E_INVALID_ARGUMENT,
                        "gemm_set_backend: MKL is not bound (torch build without MKL?)");
    gemm_setting = backend;
    return ORTCPU_OK;
}

int ortcpu_gemm_get_backend(void) { return gemm_setting; }

/* ---- auto: one decision per shape class ---------------------------------------- */

static int bucket(int64_t v)
{
    int b = 0;
    while (b < 31 && ((int64_t)1 << b) < v) b++;
    return b; /* ceil(log2 v): 1 -> 0, 2 -> 1, 3..4 -> 2, ... */
}

#define CLASS_THREADED_SHIFT 17 /* the class key's "threaded" bit */

uint32_t ort_gemm_class(int is_f64, int packed, int trans_a, int trans_b, int64_t m,
                        int64_t n, int64_t k, int threaded)
{
    return (uint32_t)bucket(m) | (uint32_t)bucket(n) << 5 | (uint32_t)bucket(k) << 10 |
           (uint32_t)(trans_a != 0) << 15 | (uint32_t)(trans_b != 0) << 16 |
           (uint32_t)(threaded != 0) << CLASS_THREADED_SHIFT | (uint32_t)(packed != 0) << 18 |
           (uint32_t)(is_f64 != 0) << 19;
}

#define CLASS_SLOTS 1024 /* open addressing; a model touches tens of classes */
enum { SLOT_MEASURING = 255 }; /* not a backend (ORT_BE_*) */
static pthread_mutex_t class_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t class_key[CLASS_SLOTS]; /* key + 1; 0 is empty */
static uint8_t class_choice[CLASS_SLOTS];

/* slot of `cls`, -1 if absent (or the table is full); with `inserted`, an absent class
 * is inserted as being measured and *inserted set */
static int class_slot(uint32_t cls, int *inserted)
{
    uint32_t h = (cls * 2654435761u) >> 22; /* top 10 bits */
    for (int i = 0; i < CLASS_SLOTS; i++) {
        int s = (int)((h + (uint32_t)i) & (CLASS_SLOTS - 1));
        if (class_key[s] == cls + 1) return s;
        if (class_key[s] == 0) {
            if (!inserted) return -1;
            class_key[s] = cls + 1;
            class_choice[s] = SLOT_MEASURING;
            *inserted = 1;
            return s;
        }
    }
    return -1;
}

void ortcpu_gemm_auto_reset(void)
{
    pthread_mutex_lock(&class_lock);
    memset(class_key, 0, sizeof class_key);
    memset(class_choice, 0, sizeof class_choice);
    pthread_mutex_unlock(&class_lock);
}

static int mkl_has(int packed, int is_f64)
{
    if (packed) return mkl_api.compute != NULL && !is_f64;
    return is_f64 ? mkl_api.dgemm != NULL : mkl_api.sgemm != NULL;
}

/* the "mkl" / "mkl_threaded" settings: MKL's own threads only for a threaded, unpacked
 * class under "mkl_threaded" */
static int forced_mkl(uint32_t cls, int packed)
{
    int threaded = (cls >> CLASS_THREADED_SHIFT) & 1;
    return gemm_setting == ORTCPU_GEMM_MKL_THREADED && threaded && !packed ? ORT_BE_MKL_MT
                                                                          : ORT_BE_MKL;
}

int ort_gemm_backend_known(uint32_t cls, int packed, int is_f64)
{
    if (!mkl_has(packed, is_f64) || gemm_setting == ORTCPU_GEMM_OPENBLAS) return ORT_BE_OPENBLAS;
    if (gemm_setting >= ORTCPU_GEMM_MKL) return forced_mkl(cls, packed);
    pthread_mutex_lock(&class_lock);
    int s = class_slot(cls, NULL), c = s < 0 ? 0 : class_choice[s];
    pthread_mutex_unlock(&class_lock);
    return c == SLOT_MEASURING ? 0 : c;
}

/* the calling thread's CPU time (single-threaded trials: time other processes take
 * from the core is not counted), else wall time */
static double now_seconds(int thread_cpu)
{
    struct timespec ts;
    clock_gettime(thread_cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of TRIAL_ROUNDS alternating rounds per backend; each round repeats a small GEMM
 * up to ~TRIAL_FLOPS so the clock resolves it. Under load (other processes on the cores)
 * the minimum is the least disturbed draw; single-threaded classes are timed in the
 * thread's CPU time, which preemption does not inflate. A threaded, unpacked class also tries MKL
 * on its own threads (one packed copy shared by the threads, against one per slab): on
 * an AMD EPYC it measured 0.89-1.06x the slabs' time at the transformer's 2048-row
 * shapes, on an Intel Xeon (Ice Lake) 0.77x at BERT's 512x512x128 (367 vs 476 us). */
#define TRIAL_ROUNDS 3
#define TRIAL_FLOPS 4e6
static int measure(double flops, int threaded, int packed, ort_gemm_trial_fn trial, void *ctx)
{
    int reps = flops >= TRIAL_FLOPS ? 1 : (int)(TRIAL_FLOPS / (flops > 1 ? flops : 1));
    if (reps > 64) reps = 64;
    int last = threaded && !packed ? ORT_BE_MKL_MT : ORT_BE_MKL;
    double best[ORT_BE_MKL_MT + 1] = {1e300, 1e300, 1e300, 1e300};
    for (int be = ORT_BE_OPENBLAS; be <= last; be++) /* warm: first-touch of scratch, */
        trial(ctx, be);                               /* MKL's buffers and threads */
    for (int r = 0; r < TRIAL_ROUNDS; r++)
        for (int be = ORT_BE_OPENBLAS; be <= last; be++) {
            double t0 = now_seconds(!threaded);
            for (int i = 0; i < reps; i++) trial(ctx, be);
            double dt = now_seconds(!threaded) - t0;
            if (dt < best[be]) best[be] = dt;
        }
    int choice = ORT_BE_OPENBLAS;
    for (int be = ORT_BE_MKL; be <= last; be++)
        if (best[be] < best[choice]) choice = be;
    return choice;
}

int ort_gemm_backend_for(uint32_t cls, int packed, int is_f64, double flops,
                         ort_gemm_trial_fn trial, void *ctx)
{
    if (!mkl_has(packed, is_f64) || gemm_setting == ORTCPU_GEMM_OPENBLAS) return ORT_BE_OPENBLAS;
    if (gemm_setting >= ORTCPU_GEMM_MKL) return forced_mkl(cls, packed);
    pthread_mutex_lock(&class_lock);
    int mine = 0;
    int s = class_slot(cls, &mine), c = s < 0 ? ORT_BE_OPENBLAS : class_choice[s];
    pthread_mutex_unlock(&class_lock);
    /* another thread is timing this class: OpenBLAS meanwhile */
    if (!mine) return c == SLOT_MEASURING ? ORT_BE_OPENBLAS : c;
    int threaded = (cls >> CLASS_THREADED_SHIFT) & 1;
    int be = trial ? measure(flops, threaded, packed, trial, ctx) : ORT_BE_OPENBLAS;
    pthread_mutex_lock(&class_lock);
    class_choice[s] = (uint8_t)be;
    pthread_mutex_unlock(&class_lock);
    return be;
}

int ortcpu_gemm_auto_choice(int is_f64, int packed, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, int threaded)
{
    return ort_gemm_backend_known(ort_gemm_class(is_f64, packed, trans_a, trans_b, m, n, k,
                                                 threaded), packed, is_f64);
}
