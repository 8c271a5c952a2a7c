/* Matmul of float32 activations with a float32 weight in nn.Linear's layout: out[M, N] = x[M, K] @ W[N, K]^T
 * (transformer.py's FloatLinear), made for the few rows of a decode step; a prompt's many rows take it too, so the
 * weight is held once.
 *
 * oneDNN's packed float32 linear (PackedLinear) reads the weights at ~23 GB/s at one row on this project's 2-core
 * AVX-512 machine, this kernel at ~28-30 GB/s, and at eight rows it is ~13% faster; from ~32 rows on oneDNN wins
 * (docs/performance.md). It also runs on the elastic pool (_elastic_pool.h) instead of OpenMP, which is what
 * matters most when serving.
 *
 * A tile is RN weight rows by RM activation rows, RN x RM 16-lane accumulators along K (the tail of K through a
 * masked load), summed across lanes at the end: each weight vector is loaded once for RM rows, each activation
 * vector once for RN weight rows. One to three activation rows are walked eight weight rows at a time (eight
 * streams keep the hardware prefetcher ahead); five to eight all at once against three weight rows (one pass over
 * the weights); more in tiles of 4 x 4. From four rows on, the weight rows 16 further on are prefetched on the
 * first pass over a tile's rows. AVX-512F only: on other CPUs FloatLinear is not used (matmul_kernel.py).
 */
#pragma once
#include <stdint.h>

typedef struct {
    float *out;        /* [M, N] */
    const float *x;    /* [M, K] */
    const float *w;    /* [N, K] */
    int64_t m, n, k;
} FloatMatmul;

#if defined(__x86_64__) && defined(__GNUC__)
#define FLOAT_MATMUL_AVX512 1
#include <immintrin.h>
#define AVX512 "avx512f,fma"

__attribute__((target(AVX512), always_inline)) static inline void float_tile_avx512(const FloatMatmul *mm, int64_t n0,
                                                                                   int64_t m0, const int RN,
                                                                                   const int RM) {
    __m512 acc[8][8];
    for (int i = 0; i < RN; i++)
        for (int r = 0; r < RM; r++) acc[i][r] = _mm512_setzero_ps();
    const int64_t k = mm->k;
    int64_t j = 0;
    /* rows 16 further on, on the first pass over these; a few activation rows need no help (8 rows per tile) */
    const int prefetch = mm->m >= 4 && m0 == 0 && n0 + 16 + RN <= mm->n;
    for (; j + 16 <= k; j += 16) {
        if (prefetch)
            for (int i = 0; i < RN; i++) _mm_prefetch((const char *)(mm->w + (n0 + 16 + i) * k + j), _MM_HINT_T0);
        __m512 w[8];
        for (int i = 0; i < RN; i++) w[i] = _mm512_loadu_ps(mm->w + (n0 + i) * k + j);
        for (int r = 0; r < RM; r++) {
            const __m512 x = _mm512_loadu_ps(mm->x + (m0 + r) * k + j);
            for (int i = 0; i < RN; i++) acc[i][r] = _mm512_fmadd_ps(w[i], x, acc[i][r]);
        }
    }
    if (j < k) {
        const __mmask16 mask = (__mmask16)((1u << (k - j)) - 1);
        __m512 x[8];
        for (int r = 0; r < RM; r++) x[r] = _mm512_maskz_loadu_ps(mask, mm->x + (m0 + r) * k + j);
        for (int i = 0; i < RN; i++) {
            const __m512 w = _mm512_maskz_loadu_ps(mask, mm->w + (n0 + i) * k + j);
            for (int r = 0; r < RM; r++) acc[i][r] = _mm512_fmadd_ps(w, x[r], acc[i][r]);
        }
    }
    for (int i = 0; i < RN; i++)
        for (int r = 0; r < RM; r++) mm->out[(m0 + r) * mm->n + n0 + i] = _mm512_reduce_add_ps(acc[i][r]);
}

#define FLOAT_TILES(RN)                                                                                            \
    __attribute__((target(AVX512))) static void float_tiles_avx512_##RN(const FloatMatmul *mm, int64_t n0) {     \
        int64_t m0 = 0;                                                                                            \
        for (; m0 + 4 <= mm->m; m0 += 4) float_tile_avx512(mm, n0, m0, RN, 4);                                    \
        switch (mm->m - m0) {                                                                                      \
        case 3: float_tile_avx512(mm, n0, m0, RN, 3); break;                                                       \
        case 2: float_tile_avx512(mm, n0, m0, RN, 2); break;                                                       \
        case 1: float_tile_avx512(mm, n0, m0, RN, 1); break;                                                       \
        default: break;                                                                                            \
        }                                                                                                          \
    }
FLOAT_TILES(8)
FLOAT_TILES(4)

/* 5 to 8 activation rows: all of them against RN weight rows at a time, one pass over the weights */
__attribute__((target(AVX512))) static void float_tiles_avx512_rows(const FloatMatmul *mm, int64_t n0, const int RN) {
    switch (mm->m) {
    case 8: float_tile_avx512(mm, n0, 0, RN, 8); break;
    case 7: float_tile_avx512(mm, n0, 0, RN, 7); break;
    case 6: float_tile_avx512(mm, n0, 0, RN, 6); break;
    default: float_tile_avx512(mm, n0, 0, RN, 5); break;
    }
}
FLOAT_TILES(2)
FLOAT_TILES(1)

__attribute__((target(AVX512))) static void float_rows_avx512(const FloatMatmul *mm, int64_t n_first, int64_t n_last) {
    int64_t n = n_first;
    if (mm->m > 4 && mm->m <= 8) {
        for (; n + 3 <= n_last; n += 3) float_tiles_avx512_rows(mm, n, 3);
        for (; n + 2 <= n_last; n += 2) float_tiles_avx512_rows(mm, n, 2);
        if (n < n_last) float_tiles_avx512_rows(mm, n, 1);
        return;
    }
    if (mm->m < 4)
        for (; n + 8 <= n_last; n += 8) float_tiles_avx512_8(mm, n);
    for (; n + 4 <= n_last; n += 4) float_tiles_avx512_4(mm, n);
    for (; n + 2 <= n_last; n += 2) float_tiles_avx512_2(mm, n);
    if (n < n_last) float_tiles_avx512_1(mm, n);
}
#endif
