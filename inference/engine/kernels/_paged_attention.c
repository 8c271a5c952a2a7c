/* Decode attention over a paged KV pool, reading each row's keys and values where they lie (paged_attention.py).
 *
 * One query position per row, straight from the q/k/v projection. For each (row, kv head): RoPE on its query heads
 * and its key, the key and value stored into the pool at the row's new position, then the scores of the query heads
 * against every position the row holds, a softmax, and the weighted sum of the values, reading every key and value
 * once and writing nothing but the new position and the output. torch has no such kernel on the CPU: without it a
 * step first copies each row's blocks into one buffer, then attends over the copy (three passes over the KV instead
 * of one), and the rotation and the store are a dozen small torch ops per layer, each costing more in dispatch than
 * its arithmetic at decode sizes.
 *
 * Layouts (all contiguous): qkv [B, H + 2 Hkv, D] float32 (query heads in kv-head-major order, G = H / Hkv per kv
 * head, then the keys, then the values); cos and sin_signed [B, D] float32, each row's RoPE angles in the Hugging
 * Face layout (sin_signed's first half negated, transformer.py); write_rows [B * Hkv] int64, the pool row (of D)
 * each new (row, kv head) key and value goes to; out [B, Hkv, G, D] float32; each pool [Hkv, pool_blocks,
 * block_size, D] in float32, float16 or bfloat16; table [B, table_width] int64 block ids; lengths [B] int64, the
 * positions [0, length) each row attends to, the new one included.
 *
 * The (row, kv head) pairs are walked kv head by kv head, each head's rows in turn: a head's keys (and values) lie
 * in one region of its pool, and a row's blocks mostly follow the previous row's (a prompt's blocks are taken in
 * order), so the walk reads a few long runs of memory instead of a short run per pair (docs/performance.md). They
 * are shared out, with the GIL released, in chunks on the matmul kernels' elastic pool
 * (_pool_run.h; the `_matmul` extension owns it), so the step's matmuls and its attention use the same few threads
 * and a preempted one holds back only its chunk (docs/performance.md); a chunk has its own scratch area. A pair
 * writes and reads only its own row's keys and values, so no thread waits on another. Where `_matmul` was not
 * built, the pairs go to OpenMP threads instead: the extension links libgomp.so.1 by that name, which torch has
 * already loaded (the wrapper imports torch first), so those are torch's own intra-op threads (docs/kv-cache.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_attend_avx2.h"
#include "_fast_exp.h"
#include "_pool_run.h"

enum { KV_FLOAT32 = 0, KV_FLOAT16 = 1, KV_BFLOAT16 = 2 };

typedef struct {
    float *out;
    const float *qkv;
    const float *cos;
    const float *sin_signed;
    const int64_t *write_rows;
    void *keys;
    void *values;
    const int64_t *table;
    const int64_t *lengths;
    int64_t rows, kv_heads, group, dim, block_size, pool_blocks, table_width;
    float scale;
    int kv_dtype;
} Work;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* 16-bit rows to float32: bfloat16 is the high half of a float32; float16 through F16C where the CPU has it. */
static void bf16_to_f32(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t wide = (uint32_t)src[i] << 16;
        memcpy(dst + i, &wide, sizeof wide);
    }
}

static void f16_to_f32_portable(const uint16_t *src, float *dst, int64_t n) {
    const _Float16 *halves = (const _Float16 *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)halves[i];
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    f16_to_f32_portable(src + i, dst + i, n - i);
}
#endif

static void (*f16_to_f32)(const uint16_t *, float *, int64_t) = f16_to_f32_portable;

/* float32 rows to float16, rounding to nearest even as torch converts. Without F16C's instruction (the default
 * target), GCC converts each value in a library call: a few nanoseconds each, thousands per layer and step, which
 * made a float16 pool's step slower than a float32 one's (docs/performance.md). */
static void f32_to_f16_portable(const float *src, uint16_t *dst, int64_t n) {
    _Float16 *halves = (_Float16 *)dst;
    for (int64_t i = 0; i < n; i++) halves[i] = (_Float16)src[i];
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,f16c"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    f32_to_f16_portable(src + i, dst + i, n - i);
}
#endif

static void (*f32_to_f16)(const float *, uint16_t *, int64_t) = f32_to_f16_portable;

/* A block's `held` positions as float32 rows: the pool itself for a float32 pool, else widened into `scratch`. */
static inline const float *block_rows(const void *pool, int kv_dtype, int64_t offset, int64_t n, float *scratch) {
    if (kv_dtype == KV_FLOAT32) return (const float *)pool + offset;
    if (kv_dtype == KV_FLOAT16) f16_to_f32((const uint16_t *)pool + offset, scratch, n);
    else bf16_to_f32((const uint16_t *)pool + offset, scratch, n);
    return scratch;
}

/* float32 to bfloat16 rounding to nearest even, as torch converts (NaN kept quiet). */
static inline uint16_t f32_to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* n float32 values into the pool at `offset` (elements), in the pool's dtype. */
static inline void store_row(void *pool, int kv_dtype, int64_t offset, const float *src, int64_t n) {
    if (kv_dtype == KV_FLOAT32) memcpy((float *)pool + offset, src, sizeof(float) * (size_t)n);
    else if (kv_dtype == KV_FLOAT16) f32_to_f16(src, (uint16_t *)pool + offset, n);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)pool)[offset + i] = f32_to_bf16(src[i]);
}

/* RoPE in the Hugging Face layout: dimension i is paired with i + dim/2, out = x * cos + roll(x, dim/2) * sin_signed
 * (transformer.py's rotate_half, one head). */
MULTIVERSION
static void rotate(const float *x, const float *cos, const float *sin_signed, int64_t dim, float *out) {
    const int64_t half = dim / 2;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) out[i] = x[i] * cos[i] + x[i + half] * sin_signed[i];
#pragma omp simd
    for (int64_t i = half; i < dim; i++) out[i] = x[i] * cos[i] + x[i - half] * sin_signed[i];
}

/* Asks for the next block while this one is read: a block spans pages of its own, and the hardware prefetcher,
 * which stops at page boundaries, would start each block with a miss to memory. */
static inline void prefetch_block(const void *pool, int64_t offset, int64_t bytes, int64_t element) {
    const char *at = (const char *)pool + offset * element;
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(at + o);
}

/* scores[t] = scale * q . k_t for the block's rows, four rows at a time (independent sums hide the FMA latency). */
MULTIVERSION
static void block_scores(const float *q, const float *k, int64_t held, int64_t dim, float scale, float *scores) {
    int64_t t = 0;
    for (; t + 4 <= held; t += 4) {
        const float *k0 = k + t * dim, *k1 = k0 + dim, *k2 = k1 + dim, *k3 = k2 + dim;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t d = 0; d < dim; d++) {
            s0 += q[d] * k0[d];
            s1 += q[d] * k1[d];
            s2 += q[d] * k2[d];
            s3 += q[d] * k3[d];
        }
        scores[t] = s0 * scale, scores[t + 1] = s1 * scale, scores[t + 2] = s2 * scale, scores[t + 3] = s3 * scale;
    }
    for (; t < held; t++) {
        const float *kt = k + t * dim;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < dim; d++) s += q[d] * kt[d];
        scores[t] = s * scale;
    }
}

/* out += sum_t weights[t] * v_t over the block's rows, four rows per pass over `out`. */
MULTIVERSION
static void block_accumulate(const float *weights, const float *v, int64_t held, int64_t dim, float *out) {
    int64_t t = 0;
    for (; t + 4 <= held; t += 4) {
        const float *v0 = v + t * dim, *v1 = v0 + dim, *v2 = v1 + dim, *v3 = v2 + dim;
        const float w0 = weights[t], w1 = weights[t + 1], w2 = weights[t + 2], w3 = weights[t + 3];
#pragma omp simd
        for (int64_t d = 0; d < dim; d++) out[d] += w0 * v0[d] + w1 * v1[d] + w2 * v2[d] + w3 * v3[d];
    }
    for (; t < held; t++) {
        const float *vt = v + t * dim, wt = weights[t];
#pragma omp simd
        for (int64_t d = 0; d < dim; d++) out[d] += wt * vt[d];
    }
}

/* The (row, kv head) pair (b * kv_heads + h: how write_rows and out are laid out) at step i of the walk. */
static inline int64_t walk_pair(const Work *w, int64_t i) { return (i % w->rows) * w->kv_heads + i / w->rows; }

/* Where the keys of a (row, kv head) pair's first block start, in elements. */
static inline int64_t first_key_block(const Work *w, int64_t pair) {
    const int64_t b = pair / w->kv_heads, h = pair % w->kv_heads;
    return (h * w->pool_blocks + w->table[b * w->table_width]) * w->block_size * w->dim;
}

MULTIVERSION
static void softmax(float *s, int64_t length) {
    float top = -INFINITY, total = 0.0f;
#pragma omp simd reduction(max : top)
    for (int64_t p = 0; p < length; p++) top = s[p] > top ? s[p] : top;
#pragma omp simd reduction(+ : total)
    for (int64_t p = 0; p < length; p++) {
        s[p] = fast_exp(s[p] - top);
        total += s[p];
    }
    const float inv = 1.0f / total;
#pragma omp simd
    for (int64_t p = 0; p < length; p++) s[p] *= inv;
}

/* A pair's query heads rotated into `q` [G, D], its key rotated and stored, its value stored. */
static void rotate_and_store(const Work *w, int64_t pair, float *q, float *key) {
    const int64_t dim = w->dim, group = w->group, b = pair / w->kv_heads, h = pair % w->kv_heads;
    const int64_t heads = w->kv_heads * group;
    const float *row = w->qkv + b * (heads + 2 * w->kv_heads) * dim;
    const float *cos = w->cos + b * dim, *sin_signed = w->sin_signed + b * dim;
    for (int64_t g = 0; g < group; g++) rotate(row + (h * group + g) * dim, cos, sin_signed, dim, q + g * dim);
    const int64_t at = w->write_rows[pair] * dim;
    rotate(row + (heads + h) * dim, cos, sin_signed, dim, key);
    store_row(w->keys, w->kv_dtype, at, key, dim);
    store_row(w->values, w->kv_dtype, at, row + (heads + w->kv_heads + h) * dim, dim);
}

/* How far ahead (in eight-position pieces of the stream it reads) the vector path asks for keys and values, and the
 * cache level it asks them into: L2 (docs/performance.md: asking for the whole next block into L1 at each block's
 * start left the kernel waiting on memory). */
#define PIECES_AHEAD 8
#define PIECE_LOCALITY 2

/* Where the vector path's prefetching has got to in the stream it reads from a chunk's first pair on: a pair's keys
 * piece by piece (positions [j * block_size + t, + 8) of kv head h of row b), then its values, then the next
 * pair's keys, and so on. Moved on one piece per piece read, it stays PIECES_AHEAD ahead without a division.
 * `step` is the pair's step of the walk. */
typedef struct {
    int64_t step, b, h, j, t, length;
    int values;
} Ahead;

static inline void ahead_start(const Work *w, Ahead *a, int64_t step) {
    *a = (Ahead){step, step % w->rows, step / w->rows, 0, 0, w->lengths[step % w->rows], 0};
}

/* Asks for the piece under `a` (nothing from step `last` of the walk on) and moves it on by one piece. */
static inline void ahead_fetch(const Work *w, Ahead *a, int64_t last, int64_t element) {
    if (a->step >= last) return;
    const int64_t bs = w->block_size, n = bs - a->t < 8 ? bs - a->t : 8;
    const char *pool = a->values ? (const char *)w->values : (const char *)w->keys;
    const int64_t block = w->table[a->b * w->table_width + a->j];
    const int64_t at = ((a->h * w->pool_blocks + block) * bs + a->t) * w->dim * element;
    for (int64_t o = 0; o < n * w->dim * element; o += 64) __builtin_prefetch(pool + at + o, 0, PIECE_LOCALITY);
    a->t += 8;
    if (a->t < bs && a->j * bs + a->t < a->length) return;
    a->t = 0;
    if (++a->j * bs < a->length) return;
    a->j = 0;
    if (!a->values) {
        a->values = 1;
        return;
    }
    a->values = 0;
    if (++a->step >= last) return;
    if (++a->b == w->rows) a->b = 0, a->h++;
    a->length = w->lengths[a->b];
}

/* Floats of a row of scores per query head: its positions, and room for the vector path's last piece of eight past
 * them. */
static inline int64_t score_stride(int64_t length) { return (length + 15) / 8 * 8; }

#ifdef ATTEND_AVX2
/* Whether this CPU runs _attend_avx2.h (set at import). */
static int vector_attend = 0;

/* One pair through _attend_avx2.h: its keys in eight-position pieces into `scores` [G, score_stride], the softmax,
 * then its values in the same pieces, asking for a piece `ahead` of them (up to step `last` of the walk) as each is
 * read.
 * `totals` has room for G floats. */
ATTEND_INLINE void attend_pair_vector(const Work *w, int64_t pair, int64_t last, Ahead *ahead, float *q,
                                      float *scores, float *totals, const int kv_dtype) {
    const int64_t dim = w->dim, group = w->group, bs = w->block_size, b = pair / w->kv_heads;
    const int64_t h = pair % w->kv_heads, length = w->lengths[b], element = kv_dtype == KV_FLOAT32 ? 4 : 2;
    const int64_t head_base = h * w->pool_blocks * bs, stride = score_stride(length);
    const int64_t *blocks = w->table + b * w->table_width;
    float *out = w->out + pair * group * dim;
    for (int64_t i = 0; i < group * dim; i++) q[i] *= w->scale;
    for (int64_t start = 0, j = 0; start < length; start += bs, j++) {
        const int64_t held = length - start < bs ? length - start : bs, base = (head_base + blocks[j] * bs) * dim;
        for (int64_t t = 0; t < held; t += 8) {
            ahead_fetch(w, ahead, last, element);
            float *at_scores = scores + start + t;
            if (held - t >= 8) scores8(w->keys, kv_dtype, base + t * dim, 8, q, group, dim, at_scores, stride);
            else scores8(w->keys, kv_dtype, base + t * dim, (int)(held - t), q, group, dim, at_scores, stride);
        }
    }
    for (int64_t g = 0; g < group; g++) totals[g] = exp_weights(scores + g * stride, length);
    memset(out, 0, sizeof(float) * (size_t)(group * dim));
    for (int64_t start = 0, j = 0; start < length; start += bs, j++) {
        const int64_t held = length - start < bs ? length - start : bs, base = (head_base + blocks[j] * bs) * dim;
        for (int64_t t = 0; t < held; t += 8) {
            ahead_fetch(w, ahead, last, element);
            const float *weights = scores + start + t;
            if (held - t >= 8) accumulate8(w->values, kv_dtype, base + t * dim, 8, weights, group, dim, out, stride);
            else accumulate8(w->values, kv_dtype, base + t * dim, (int)(held - t), weights, group, dim, out, stride);
        }
    }
    for (int64_t g = 0; g < group; g++) {
        const float inv = 1.0f / totals[g];
        for (int64_t i = 0; i < dim; i++) out[g * dim + i] *= inv;
    }
}

#define ATTEND_PAIR(NAME, KV_DTYPE)                                                                                 \
    __attribute__((target(ATTEND_AVX2_TARGET))) static void NAME(const Work *w, int64_t pair, int64_t last, float *q, \
                                                                 Ahead *ahead, float *scores, float *totals) {        \
        attend_pair_vector(w, pair, last, ahead, q, scores, totals, KV_DTYPE);                                        \
    }
ATTEND_PAIR(attend_pair_float32, KV_FLOAT32)
ATTEND_PAIR(attend_pair_float16, KV_FLOAT16)
ATTEND_PAIR(attend_pair_bfloat16, KV_BFLOAT16)
#endif

/* Steps [first, last) of the walk. `scores` has room for score_stride(the longest row's length) floats per query
 * head, `rows` for one block as float32, `q` for the pair's rotated query heads and one rotated key. */
static void attend(const Work *w, int64_t first, int64_t last, float *scores, float *rows, float *q) {
    const int64_t dim = w->dim, group = w->group, bs = w->block_size;
    const int64_t element = w->kv_dtype == KV_FLOAT32 ? 4 : 2, block_bytes = bs * dim * element;
#ifdef ATTEND_AVX2
    Ahead ahead;
    if (vector_attend && dim % 8 == 0 && first < last) {
        ahead_start(w, &ahead, first);
        for (int i = 0; i < PIECES_AHEAD; i++) ahead_fetch(w, &ahead, last, element);
    }
#endif
    for (int64_t step = first; step < last; step++) {
        const int64_t pair = walk_pair(w, step), b = pair / w->kv_heads, h = pair % w->kv_heads, length = w->lengths[b];
        rotate_and_store(w, pair, q, q + group * dim);
#ifdef ATTEND_AVX2
        if (vector_attend && dim % 8 == 0) { /* the room for a widened block holds the heads' sums */
            if (w->kv_dtype == KV_FLOAT32) attend_pair_float32(w, pair, last, q, &ahead, scores, rows);
            else if (w->kv_dtype == KV_FLOAT16) attend_pair_float16(w, pair, last, q, &ahead, scores, rows);
            else attend_pair_bfloat16(w, pair, last, q, &ahead, scores, rows);
            continue;
        }
#endif
        float *out = w->out + pair * group * dim;
        const int64_t *blocks = w->table + b * w->table_width;
        const int64_t head_base = h * w->pool_blocks * bs;
        /* positions are walked block by block: p = start + t, t < held */
        for (int64_t start = 0, j = 0; start < length; start += bs, j++) {
            const int64_t held = length - start < bs ? length - start : bs;
            if (start + bs < length)
                prefetch_block(w->keys, (head_base + blocks[j + 1] * bs) * dim, block_bytes, element);
            else /* the values' first block, read next */
                prefetch_block(w->values, (head_base + blocks[0] * bs) * dim, block_bytes, element);
            const float *k = block_rows(w->keys, w->kv_dtype, (head_base + blocks[j] * bs) * dim, held * dim, rows);
            for (int64_t g = 0; g < group; g++)
                block_scores(q + g * dim, k, held, dim, w->scale, scores + g * length + start);
        }
        for (int64_t g = 0; g < group; g++) {
            softmax(scores + g * length, length);
            memset(out + g * dim, 0, sizeof(float) * dim);
        }
        for (int64_t start = 0, j = 0; start < length; start += bs, j++) {
            const int64_t held = length - start < bs ? length - start : bs;
            if (start + bs < length)
                prefetch_block(w->values, (head_base + blocks[j + 1] * bs) * dim, block_bytes, element);
            else if (step + 1 < last) /* the next pair's first key block */
                prefetch_block(w->keys, first_key_block(w, walk_pair(w, step + 1)), block_bytes, element);
            const float *v = block_rows(w->values, w->kv_dtype, (head_base + blocks[j] * bs) * dim, held * dim, rows);
            for (int64_t g = 0; g < group; g++)
                block_accumulate(scores + g * length + start, v, held, dim, out + g * dim);
        }
    }
}

/* Floats of scratch for one block widened to float32, which the AVX2 path uses for its query heads' sums instead. */
static int64_t block_room(const Work *w) {
    return w->block_size * w->dim > w->group ? w->block_size * w->dim : w->group;
}

/* The matmul extension's elastic pool (_pool_run.h), when it is there; else OpenMP's threads. */
static PoolRun pool_run = NULL;

typedef struct {
    const Work *w;
    int64_t pairs_per_chunk, scratch;
    float *scores; /* a scratch area per chunk */
} AttendChunks;

static void attend_chunk(void *ctx, int64_t c) {
    const AttendChunks *a = ctx;
    const int64_t pairs = a->w->rows * a->w->kv_heads, first = c * a->pairs_per_chunk;
    const int64_t last = first + a->pairs_per_chunk < pairs ? first + a->pairs_per_chunk : pairs;
    int64_t longest = 0;
    for (int64_t b = 0; b < a->w->rows; b++) longest = a->w->lengths[b] > longest ? a->w->lengths[b] : longest;
    float *mine = a->scores + c * a->scratch, *rows = mine + a->w->group * score_stride(longest);
    attend(a->w, first, last, mine, rows, rows + block_room(a->w));
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_ssize_t out, qkv, cos, sin_signed, write_rows, keys, values, table, lengths;
    Work w;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnLLLLLLLfi", &out, &qkv, &cos, &sin_signed, &write_rows, &keys, &values,
                          &table, &lengths, &w.rows, &w.kv_heads, &w.group, &w.dim, &w.block_size, &w.pool_blocks,
                          &w.table_width, &w.scale, &w.kv_dtype))
        return NULL;
    w.out = (float *)out;
    w.qkv = (const float *)qkv;
    w.cos = (const float *)cos;
    w.sin_signed = (const float *)sin_signed;
    w.write_rows = (const int64_t *)write_rows;
    w.keys = (void *)keys;
    w.values = (void *)values;
    w.table = (const int64_t *)table;
    w.lengths = (const int64_t *)lengths;
    int64_t longest = 0;
    for (int64_t b = 0; b < w.rows; b++) longest = w.lengths[b] > longest ? w.lengths[b] : longest;
    const int64_t pairs = w.rows * w.kv_heads;
    const int64_t scratch = w.group * score_stride(longest) + block_room(&w) + (w.group + 1) * w.dim;
    if (pool_run != NULL) { /* the matmul kernels' elastic pool: chunks of pairs, a scratch area each */
        AttendChunks chunks = {&w, pairs / 16 > 1 ? pairs / 16 : 1, scratch, NULL};
        const int64_t count = (pairs + chunks.pairs_per_chunk - 1) / chunks.pairs_per_chunk;
        chunks.scores = malloc(sizeof(float) * (size_t)(scratch * count));
        if (chunks.scores == NULL) return PyErr_NoMemory();
        Py_BEGIN_ALLOW_THREADS;
        pool_run(attend_chunk, &chunks, count, pairs > 1);
        Py_END_ALLOW_THREADS;
        free(chunks.scores);
        Py_RETURN_NONE;
    }
    const int threads = pairs < omp_get_max_threads() ? (int)pairs : omp_get_max_threads();
    float *scores = malloc(sizeof(float) * (size_t)(scratch * (threads > 0 ? threads : 1)));
    if (scores == NULL) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS;
#pragma omp parallel num_threads(threads)
    {
        /* contiguous shares, so each thread's prefetch of its next pair stays its own */
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        float *mine = scores + t * scratch, *rows = mine + w.group * score_stride(longest);
        attend(&w, pairs * t / n, pairs * (t + 1) / n, mine, rows, rows + block_room(&w));
    }
    Py_END_ALLOW_THREADS;
    free(scores);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(out, qkv, cos, sin_signed, write_rows, keys, values, table, lengths, rows, kv_heads, group, dim, "
     "block_size, pool_blocks, table_width, scale, kv_dtype): one decode step's RoPE, KV store and attention over "
     "the paged pool (pointers as ints)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_paged_attention", NULL, -1, methods};

PyMODINIT_FUNC PyInit__paged_attention(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        f16_to_f32 = f16_to_f32_f16c;
        f32_to_f16 = f32_to_f16_f16c;
    }
#endif
#ifdef ATTEND_AVX2
    vector_attend = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    pool_run = (PoolRun)PyCapsule_Import(POOL_RUN_CAPSULE, 0);
    if (pool_run == NULL) PyErr_Clear(); /* built without it: OpenMP's threads */
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* the pool dtypes' codes, by torch's names: the wrapper reads them here, so they are written once */
    PyObject *codes = Py_BuildValue("{s:i,s:i,s:i}", "float32", KV_FLOAT32, "float16", KV_FLOAT16, "bfloat16",
                                    KV_BFLOAT16);
    if (codes == NULL || PyModule_AddObject(m, "KV_DTYPES", codes) < 0) {
        Py_XDECREF(codes);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
