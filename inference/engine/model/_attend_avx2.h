/* One (row, kv head) pair's attention in a single pass over its keys and values, eight positions at a time in AVX2
 * registers (_paged_attention.c uses it where the CPU has AVX2, FMA and F16C and the head dimension is a multiple of
 * eight).
 *
 * The portable path walks the keys, then the values, one position at a time with a sum across lanes per position,
 * and is bound by those instructions rather than by memory (docs/performance.md). Here eight positions' dot products
 * are summed across lanes together (two horizontal adds and a cross-lane add give one vector of eight scores), the
 * softmax is the online one (a running maximum and sum, the output rescaled when the maximum grows), and the
 * weighted values are added while the piece is still in cache: one read of every key and value, a fraction of the
 * instructions. 16-bit pools are widened as they are loaded. The sums run in another order than the portable
 * path's, so the two differ in the last bits (tests/engine/test_paged_attention.py compares each with torch).
 */
#pragma once
#include <math.h>
#include <stdint.h>

#include "_fast_exp.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define ATTEND_AVX2 1
#include <immintrin.h>
#define ATTEND_AVX2_TARGET "avx2,fma,f16c"
#define ATTEND_INLINE __attribute__((target(ATTEND_AVX2_TARGET), always_inline)) static inline

/* Eight values of a pool at `offset` (elements) as float32, whatever the pool's dtype (a constant where inlined). */
ATTEND_INLINE __m256 load8(const void *pool, int kv_dtype, int64_t offset) {
    if (kv_dtype == 0) return _mm256_loadu_ps((const float *)pool + offset);
    const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)pool + offset));
    if (kv_dtype == 1) return _mm256_cvtph_ps(half);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* Lane t of the result is the sum of d[t]'s eight lanes. */
ATTEND_INLINE __m256 sum_lanes_8(const __m256 d[8]) {
    const __m256 x0 = _mm256_hadd_ps(d[0], d[1]), x1 = _mm256_hadd_ps(d[2], d[3]);
    const __m256 x2 = _mm256_hadd_ps(d[4], d[5]), x3 = _mm256_hadd_ps(d[6], d[7]);
    const __m256 y0 = _mm256_hadd_ps(x0, x1), y1 = _mm256_hadd_ps(x2, x3); /* per 128-bit half: four positions */
    return _mm256_add_ps(_mm256_permute2f128_ps(y0, y1, 0x20), _mm256_permute2f128_ps(y0, y1, 0x31));
}

ATTEND_INLINE float max_lanes_8(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

ATTEND_INLINE float add_lanes_8(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* A query head's running maximum and sum of exp(score - maximum); its output row holds the unnormalized weighted sum
 * of the values until the pair's last position. */
typedef struct {
    float top, total;
} Online;

/* Positions [0, n) (n <= 8) of the keys and values at `at` (elements into each pool) for the G query heads `q`
 * [G, D] (already scaled), folded into `state` and `out` [G, D]. Inlined with n a constant for full pieces, so the
 * eight partial dot products stay in registers. */
ATTEND_INLINE void attend8(const void *keys, const void *values, int kv_dtype, int64_t at, int n, const float *q,
                           int64_t group, int64_t dim, Online *state, float *out) {
    const __m256 held = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps((float)n), _CMP_LT_OQ);
    for (int64_t g = 0; g < group; g++) {
        const float *qg = q + g * dim;
        __m256 d[8];
        for (int t = 0; t < 8; t++) d[t] = _mm256_setzero_ps();
        for (int64_t c = 0; c < dim; c += 8) {
            const __m256 qc = _mm256_loadu_ps(qg + c);
            for (int t = 0; t < n; t++) d[t] = _mm256_fmadd_ps(qc, load8(keys, kv_dtype, at + t * dim + c), d[t]);
        }
        const __m256 scores = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sum_lanes_8(d), held);
        const float top = fmaxf(state[g].top, max_lanes_8(scores));
        const float rescale = state[g].total > 0.0f ? expf(state[g].top - top) : 0.0f;
        const __m256 p = _mm256_and_ps(held, fast_exp8(_mm256_sub_ps(scores, _mm256_set1_ps(top))));
        state[g].total = state[g].total * rescale + add_lanes_8(p);
        state[g].top = top;
        float weights[8];
        _mm256_storeu_ps(weights, p);
        float *og = out + g * dim;
        for (int64_t c = 0; c < dim; c += 8) {
            __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(og + c), _mm256_set1_ps(rescale));
            for (int t = 0; t < n; t++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[t]), load8(values, kv_dtype, at + t * dim + c), acc);
            _mm256_storeu_ps(og + c, acc);
        }
    }
}

#endif
