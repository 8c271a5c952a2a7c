/* exp(x) for float32 without libm's call per value, shared by the C kernels (softmax in _paged_attention.c, SiLU in
 * _pointwise.c), and fast_exp8, the same on eight AVX2 lanes: GCC does not vectorize fast_exp's loops (floorf and the
 * clamps leave control flow in them), so the kernels' AVX2 paths call fast_exp8. Cephes' single-precision
 * polynomial after reducing x to r = x - n ln 2, |r| <= ln 2 / 2; within 2 ulp. x is clamped to [-87, 88], where
 * float32's exp neither underflows to a denormal nor overflows: below, the result is exp(-87) (~1.6e-38), which a
 * softmax weight or a sigmoid treats as the zero it is at float precision. */
#ifndef PANTHEON_FAST_EXP_H
#define PANTHEON_FAST_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* fast_exp on eight lanes with AVX2 + FMA: the same clamp, reduction and polynomial. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 fast_exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f),
                                     _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}
#endif

#endif
