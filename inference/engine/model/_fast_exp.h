/* exp(x) for float32 in a form the compiler vectorizes, shared by the C kernels (softmax in _paged_attention.c, SiLU
 * in _pointwise.c): libm's expf is a call per value. Cephes' single-precision polynomial after reducing x to
 * r = x - n ln 2, |r| <= ln 2 / 2; within 2 ulp. x is clamped to [-87, 88], where float32's exp neither underflows
 * to a denormal nor overflows: below, the result is exp(-87) (~1.6e-38), which a softmax weight or a sigmoid treats
 * as the zero it is at float precision. */
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

#endif
