/* Matmul of float32 activations with a small float32 weight kept as [in, out]: out[M, N] = x[M, K] @ Wt[K, N]
 * (transformer.py's TransposedLinear: the layers too small for the kernel of _float_matmul.h to share out, such as
 * every layer of stories260K).
 *
 * At these sizes a call's fixed cost is most of it: torch.matmul's dispatch cost more than its arithmetic, some
 * twenty calls per decode step of such a model (docs/performance.md). Here the call goes straight to the loop, on
 * the calling thread (no pool: the work is a few microseconds). Each weight row Wt[k] is a run of N floats, so a
 * tile is RM activation rows by 16 outputs: the activation x[r, k] is broadcast and multiplied into the 16 outputs'
 * two vectors, K steps of one multiply-add chain per accumulator. Every output is the same chain over k = 0 .. K-1
 * whatever tile it falls in, so a row's result does not depend on the rows beside it (batching changes no bits).
 * A decode step's rows come here; a prompt's many rows stay with MKL, whose larger tiles win there
 * (transformer.py's transposed_product).
 */
#pragma once
#include "_float_matmul.h" /* FloatMatmul: the operands, here with w [K, N] */

#if defined(__x86_64__) && defined(__GNUC__)
#define TRANSPOSED_MATMUL_X86 1

/* out[m0 .. m0 + RM, n0 .. n0 + 16); with MASKED, only the lanes of `mask0` and `mask1`, for the last outputs of a
 * row that ends mid-vector (a masked load costs more than a plain one, so full bands do without). */
__attribute__((target("avx2,fma"), always_inline)) static inline void transposed_tile_avx2(
    const FloatMatmul *mm, int64_t m0, int64_t n0, const int RM, const int MASKED, __m256i mask0, __m256i mask1) {
    __m256 acc[4][2];
    for (int r = 0; r < RM; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float *w = mm->w + n0;
    for (int64_t j = 0; j < mm->k; j++, w += mm->n) {
        const __m256 w0 = MASKED ? _mm256_maskload_ps(w, mask0) : _mm256_loadu_ps(w);
        const __m256 w1 = MASKED ? _mm256_maskload_ps(w + 8, mask1) : _mm256_loadu_ps(w + 8);
        for (int r = 0; r < RM; r++) {
            const __m256 x = _mm256_broadcast_ss(mm->x + (m0 + r) * mm->k + j);
            acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < RM; r++) {
        float *out = mm->out + (m0 + r) * mm->n + n0;
        if (MASKED) {
            _mm256_maskstore_ps(out, mask0, acc[r][0]);
            _mm256_maskstore_ps(out + 8, mask1, acc[r][1]);
        } else {
            _mm256_storeu_ps(out, acc[r][0]);
            _mm256_storeu_ps(out + 8, acc[r][1]);
        }
    }
}

/* Every four activation rows against one band of 16 outputs (its weight columns, K x 64 bytes, stay in L1). */
#define TRANSPOSED_BAND(MASKED)                                                                                    \
    __attribute__((target("avx2,fma"))) static void transposed_band_avx2_##MASKED(                                \
        const FloatMatmul *mm, int64_t n0, __m256i mask0, __m256i mask1) {                                    \
        int64_t m0 = 0;                                                                                            \
        for (; m0 + 4 <= mm->m; m0 += 4) transposed_tile_avx2(mm, m0, n0, 4, MASKED, mask0, mask1);               \
        switch (mm->m - m0) {                                                                                      \
        case 3: transposed_tile_avx2(mm, m0, n0, 3, MASKED, mask0, mask1); break;                                  \
        case 2: transposed_tile_avx2(mm, m0, n0, 2, MASKED, mask0, mask1); break;                                  \
        case 1: transposed_tile_avx2(mm, m0, n0, 1, MASKED, mask0, mask1); break;                                  \
        default: break;                                                                                            \
        }                                                                                                          \
    }
TRANSPOSED_BAND(0)
TRANSPOSED_BAND(1)

/* Lanes [0, count) of a vector, count clamped to 0 .. 8. */
__attribute__((target("avx2"), always_inline)) static inline __m256i first_lanes(int64_t count) {
    const int n = count < 0 ? 0 : count > 8 ? 8 : (int)count;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2,fma"))) static void transposed_matmul_avx2(const FloatMatmul *mm) {
    const __m256i all = _mm256_set1_epi32(-1);
    int64_t n0 = 0;
    for (; n0 + 16 <= mm->n; n0 += 16) transposed_band_avx2_0(mm, n0, all, all);
    if (n0 < mm->n) transposed_band_avx2_1(mm, n0, first_lanes(mm->n - n0), first_lanes(mm->n - n0 - 8));
}
#endif
