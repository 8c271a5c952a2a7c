/* One (row, kv head) pair's attention, eight positions at a time in AVX2 registers (_paged_attention.c uses it where
 * the CPU has AVX2, FMA and F16C and the head dimension is a multiple of eight).
 *
 * The portable path walks the keys, then the values, one position at a time with a sum across lanes per position,
 * and is bound by those instructions rather than by memory (docs/performance.md). Here eight positions' dot products
 * are summed across lanes together (two horizontal adds and a cross-lane add give one vector of eight scores) into
 * the pair's row of scores; the softmax runs over that row eight lanes at a time; then the values are read once and
 * added with their weights. An online softmax (a running maximum per eight positions, keys and values read side by
 * side) did the same reads with more work per piece: a maximum and a sum across lanes and a rescale of the output
 * each time, which for small heads cost more than the products (docs/performance.md). 16-bit pools are widened as
 * they are loaded. The sums run in another order than the portable path's, so the two differ in the last bits
 * (tests/engine/test_paged_attention.py compares each with torch).
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

/* Scores of the G query heads `q` [G, D] (already scaled) against positions [0, n) (n <= 8) of the keys at `at`
 * (elements into the pool): eight floats at scores + g * stride for head g, zeros past n. Inlined with n a constant
 * for full pieces, so the eight partial dot products stay in registers. */
ATTEND_INLINE void scores8(const void *keys, int kv_dtype, int64_t at, int n, const float *q, int64_t group,
                           int64_t dim, float *scores, int64_t stride) {
    for (int64_t g = 0; g < group; g++) {
        const float *qg = q + g * dim;
        __m256 d[8];
        for (int t = 0; t < 8; t++) d[t] = _mm256_setzero_ps();
        for (int64_t c = 0; c < dim; c += 8) {
            const __m256 qc = _mm256_loadu_ps(qg + c);
            for (int t = 0; t < n; t++) d[t] = _mm256_fmadd_ps(qc, load8(keys, kv_dtype, at + t * dim + c), d[t]);
        }
        _mm256_storeu_ps(scores + g * stride, sum_lanes_8(d));
    }
}

/* s[0, length) -> exp(s - max(s)), eight lanes at a time (s has room up to the next multiple of eight); returns
 * their sum. The lanes past `length` come out as exp(-87) (fast_exp8's clamp): too small to change a sum of at least
 * one (the maximum's own term), and never read as weights. */
ATTEND_INLINE float exp_weights(float *s, int64_t length) {
    const int64_t padded = (length + 7) / 8 * 8;
    for (int64_t p = length; p < padded; p++) s[p] = -INFINITY;
    __m256 top = _mm256_set1_ps(-INFINITY);
    for (int64_t p = 0; p < padded; p += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + p));
    top = _mm256_set1_ps(max_lanes_8(top));
    __m256 total = _mm256_setzero_ps();
    for (int64_t p = 0; p < padded; p += 8) {
        const __m256 e = fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + p), top));
        _mm256_storeu_ps(s + p, e);
        total = _mm256_add_ps(total, e);
    }
    return add_lanes_8(total);
}

/* out[G, D] += the G heads' weights (at weights + g * stride) times positions [0, n) (n <= 8) of the values at
 * `at`: four output vectors at a time, or two chains over the positions, so the multiply-adds do not wait on each
 * other. */
ATTEND_INLINE void accumulate8(const void *values, int kv_dtype, int64_t at, int n, const float *weights,
                               int64_t group, int64_t dim, float *out, int64_t stride) {
    for (int64_t g = 0; g < group; g++) {
        const float *wg = weights + g * stride;
        float *og = out + g * dim;
        int64_t c = 0;
        for (; c + 32 <= dim; c += 32) {
            __m256 a0 = _mm256_loadu_ps(og + c), a1 = _mm256_loadu_ps(og + c + 8);
            __m256 a2 = _mm256_loadu_ps(og + c + 16), a3 = _mm256_loadu_ps(og + c + 24);
            for (int t = 0; t < n; t++) {
                const __m256 wt = _mm256_set1_ps(wg[t]);
                const int64_t v = at + t * dim + c;
                a0 = _mm256_fmadd_ps(wt, load8(values, kv_dtype, v), a0);
                a1 = _mm256_fmadd_ps(wt, load8(values, kv_dtype, v + 8), a1);
                a2 = _mm256_fmadd_ps(wt, load8(values, kv_dtype, v + 16), a2);
                a3 = _mm256_fmadd_ps(wt, load8(values, kv_dtype, v + 24), a3);
            }
            _mm256_storeu_ps(og + c, a0), _mm256_storeu_ps(og + c + 8, a1);
            _mm256_storeu_ps(og + c + 16, a2), _mm256_storeu_ps(og + c + 24, a3);
        }
        for (; c < dim; c += 8) {
            __m256 even = _mm256_loadu_ps(og + c), odd = _mm256_setzero_ps();
            for (int t = 0; t < n; t++) {
                const __m256 term = load8(values, kv_dtype, at + t * dim + c);
                if (t % 2 == 0) even = _mm256_fmadd_ps(_mm256_set1_ps(wg[t]), term, even);
                else odd = _mm256_fmadd_ps(_mm256_set1_ps(wg[t]), term, odd);
            }
            _mm256_storeu_ps(og + c, _mm256_add_ps(even, odd));
        }
    }
}

#endif
