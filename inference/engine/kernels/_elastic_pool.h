/* An elastic thread pool for the C kernels: a call's work is cut into chunks that the calling thread and whichever
 * helper threads are running claim one at a time, and the call returns as soon as every chunk is done, whether or
 * not a helper ever woke up for it.
 *
 * Why not OpenMP, as torch's own ops: an OpenMP region cuts its work in equal shares up front and ends at a barrier
 * every thread must reach. On a host whose cores are shared with the serving edge and its clients (or with other
 * guests of a VM), one thread preempted for a moment stalls the region, and the spinning of the others at the
 * barrier is what a hypervisor deschedules first. Serving one stream of the 85M Q4_0 model on two cores, a decode
 * step that takes ~2.7 ms alone took 7-8 ms with OpenMP's two threads, worse than one thread (docs/performance.md).
 * Here a preempted helper costs at most the chunk it holds: the calling thread goes on claiming the rest.
 *
 * One job at a time, under `job_lock`: the GIL is released around a call, and a worker's loop steps its models on
 * one thread while a load with `compile` warms its decode step up on another, so two threads may call at once; the
 * second waits for the first's job to end (docs/performance.md measures the lock on a decode step). A call too small
 * to share runs on its calling thread and touches nothing of the pool. A job is published as a claim word, generation << 32 | next chunk; a helper claims with a compare-and-swap on it,
 * so a helper that still holds an older generation can never claim a chunk of a newer job. Jobs alternate between
 * two slots by generation, so a job's description is never rewritten while a helper may still read it. Helpers spin
 * for a short while after a job (the next kernel of a step follows within microseconds), then sleep on a futex.
 */
#pragma once
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "_pool_run.h"
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#include <sched.h>
#endif

#define POOL_MAX_THREADS 256
#define POOL_SPIN_NS 100000 /* how long a helper keeps spinning after a job before it sleeps */

typedef struct {
    ChunkFn fn;
    void *ctx;
    int64_t total;
} PoolJob;

static struct {
    _Atomic uint64_t claim;      /* generation << 32 | next chunk to claim */
    _Atomic int64_t done;        /* chunks the helpers finished in the current job */
    _Atomic uint32_t generation; /* bumped per job; the word sleeping helpers wait on */
    _Atomic int sleepers;
    PoolJob jobs[2]; /* by generation parity */
    _Atomic int threads; /* the calling thread included */
    int helpers;         /* started so far (under job_lock) */
    pthread_mutex_t job_lock;
} pool = {.threads = 1, .job_lock = PTHREAD_MUTEX_INITIALIZER};

static inline void pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t pool_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void pool_sleep_while(uint32_t generation) {
#if defined(__linux__)
    syscall(SYS_futex, &pool.generation, FUTEX_WAIT_PRIVATE, generation, NULL, NULL, 0);
#else
    while (atomic_load(&pool.generation) == generation) sched_yield();
#endif
}

static void pool_wake_all(void) {
#if defined(__linux__)
    syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
}

/* Claims and runs chunks of job `generation` until none is left; the number run. A helper (`count`) adds each
 * chunk to `done` as it finishes it, so that the caller never waits on more than the one chunk a helper holds. */
static int64_t pool_work(uint32_t generation, int count) {
    const PoolJob *job = &pool.jobs[generation & 1];
    int64_t ran = 0;
    uint64_t word = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(word >> 32) != generation) return ran;
        const int64_t chunk = (int64_t)(word & 0xffffffffu);
        if (chunk >= job->total) return ran;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &word, word + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* word now holds the current value */
        job->fn(job->ctx, chunk);
        ran++;
        if (count) atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        word = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

static void *pool_helper(void *unused) {
    (void)unused;
    uint32_t seen = atomic_load(&pool.generation);
    for (;;) {
        uint32_t generation;
        int64_t spin_start = pool_now_ns();
        int spins = 0;
        while ((generation = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            pool_relax();
            if (++spins % 64 != 0 || pool_now_ns() - spin_start < POOL_SPIN_NS) continue;
            atomic_fetch_add(&pool.sleepers, 1);
            if (atomic_load(&pool.generation) == seen) pool_sleep_while(seen);
            atomic_fetch_sub(&pool.sleepers, 1);
            spin_start = pool_now_ns();
        }
        seen = generation;
        pool_work(generation, 1);
    }
    return NULL;
}

/* Runs fn(ctx, c) for every c in [0, total), on the calling thread and the pool's helpers; returns when all ran.
 * `parallel` 0 keeps the call on the calling thread (work too small to share). */
static void pool_run(ChunkFn fn, void *ctx, int64_t total, int parallel) {
    const int threads = atomic_load(&pool.threads);
    if (!parallel || threads <= 1 || total <= 1) {
        for (int64_t c = 0; c < total; c++) fn(ctx, c);
        return;
    }
    pthread_mutex_lock(&pool.job_lock);
    while (pool.helpers < threads - 1) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, pool_helper, NULL) != 0) break; /* fewer helpers: still correct */
        pthread_detach(thread);
        pool.helpers++;
    }
    const uint32_t generation = atomic_load(&pool.generation) + 1;
    pool.jobs[generation & 1] = (PoolJob){fn, ctx, total};
    atomic_store(&pool.done, 0);
    atomic_store_explicit(&pool.claim, (uint64_t)generation << 32, memory_order_release);
    atomic_store(&pool.generation, generation);
    if (atomic_load(&pool.sleepers) > 0) pool_wake_all();
    const int64_t mine = pool_work(generation, 0);
    while (atomic_load_explicit(&pool.done, memory_order_acquire) + mine < total) pool_relax();
    pthread_mutex_unlock(&pool.job_lock);
}

/* How many threads (the calling one included) the kernels share their work among; helpers start on first use. */
static void pool_set_threads(int threads) {
    atomic_store(&pool.threads, threads < 1 ? 1 : threads > POOL_MAX_THREADS ? POOL_MAX_THREADS : threads);
}
