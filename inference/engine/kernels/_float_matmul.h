/* Matmul of float32 activations with a float32 weight in nn.Linear's layout: out[M, N] = x[M, K] @ W[N, K]^T
 * (transformer.py's FloatLinear), made for the few rows of a decode step; a prompt's many rows take it too, so the
 * weight is held once.
 *
 * oneDNN's packed float32 linear (PackedLinear) reads the weights at ~23 GB/s at one row on this project's 2-core
 * AVX-512 machine, this kernel at ~28-30 GB/s, and at eight rows it is ~13% faster; from ~32 rows on oneDNN wins.
 * On an AVX2-only machine the gap is wider at every row count measured (docs/performance.md). The kernel also runs
 * on the elastic pool (_elastic_pool.h) instead of OpenMP, which is what matters most when serving.
 *
 * A tile is RN weight rows by RM activation rows, RN x RM accumulators along K (the tail of K through a masked
 * load), summed across lanes at the end: each weight vector is loaded once for RM rows, each activation vector once
 * for RN weight rows. Two versions, by register file:
 * - AVX-512F (32 registers of 16 lanes): one to three activation rows are walked eight weight rows at a time (eight
 *   streams keep the hardware prefetcher ahead); five to eight all at once against three weight rows (one pass over
 *   the weights); more in tiles of four weight rows by six activation rows. Each activation vector is loaded once
 *   per tile step and the sums of four outputs are taken together (sum4_avx512).
 * - AVX2 + FMA (16 registers of 8 lanes): at most 12 accumulators, so one to four rows all at once against 8, 6, 4
 *   or 3 weight rows; five to eight all at once against one weight row (one pass over the weights, the activations
 *   read from L1), or against two where the activations do not fit L1; more in tiles of 3 x 4.
 * On the first pass over a tile's rows, the next tile's weight rows are prefetched into L2, a cache line of each per
 * step along K: the hardware prefetcher starts each row's stream late, and prefetching into L1 (as this did first,
 * further ahead) pushed out the activations the tile reads from there; see docs/performance.md for what it changed.
 * Without either instruction set FloatLinear is not used (kernels/matmul.py).
 */
#pragma once
#include <stdint.h>

/* A float32 product's operands, for this kernel and _transposed_matmul.h's: the weight is [N, K] here (nn.Linear's
 * layout) and [K, N] there. */
typedef struct {
    float *out;        /* [M, N] */
    const float *x;    /* [M, K] */
    const float *w;    /* [N, K] here, [K, N] for the transposed kernel */
    int64_t m, n, k;
} FloatMatmul;

#if defined(__x86_64__) && defined(__GNUC__)
#define FLOAT_MATMUL_X86 1
#include <immintrin.h>
#define AVX512 "avx512f,fma"

/* The sums of four vectors' lanes, [sum(a), sum(b), sum(c), sum(d)]: eleven shuffles and adds for the four where
 * four _mm512_reduce_add_ps take some thirty-two. */
__attribute__((target(AVX512), always_inline)) static inline __m128 sum4_avx512(__m512 a, __m512 b, __m512 c,
                                                                               __m512 d) {
    /* halves added pairwise, then quarters: each 128-bit lane of t holds four partial sums of one vector */
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    /* within each lane: element 0 becomes the lane's sum */
    t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0xB1));
    t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0x4E));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), t));
}

__attribute__((target(AVX512), always_inline)) static inline void float_tile_avx512(const FloatMatmul *mm, int64_t n0,
                                                                                   int64_t m0, const int RN,
                                                                                   const int RM) {
    __m512 acc[8][8];
    for (int i = 0; i < RN; i++)
        for (int r = 0; r < RM; r++) acc[i][r] = _mm512_setzero_ps();
    const int64_t k = mm->k;
    int64_t j = 0;
    /* the next tile's rows, on the first pass over these */
    const int prefetch = m0 == 0 && n0 + 2 * RN <= mm->n;
    for (; j + 16 <= k; j += 16) {
        if (prefetch)
            for (int i = 0; i < RN; i++) _mm_prefetch((const char *)(mm->w + (n0 + RN + i) * k + j), _MM_HINT_T1);
        __m512 w[8];
        for (int i = 0; i < RN; i++) w[i] = _mm512_loadu_ps(mm->w + (n0 + i) * k + j);
        for (int r = 0; r < RM; r++) {
            __m512 x = _mm512_loadu_ps(mm->x + (m0 + r) * k + j);
            /* in a register from here on: left to itself, GCC folds the load into each of the RN multiply-adds,
             * which makes the tile bound by loads rather than by multiply-adds */
            __asm__("" : "+v"(x));
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
    if (RN < 3) {
        for (int i = 0; i < RN; i++)
            for (int r = 0; r < RM; r++) mm->out[(m0 + r) * mm->n + n0 + i] = _mm512_reduce_add_ps(acc[i][r]);
        return;
    }
    /* four weight rows' outputs at a time are adjacent in an output row: summed together, stored together */
    const __m512 zero = _mm512_setzero_ps();
    for (int r = 0; r < RM; r++)
        for (int i = 0; i < RN; i += 4) {
            const __m128 sums = sum4_avx512(acc[i][r], acc[i + 1][r], i + 2 < RN ? acc[i + 2][r] : zero,
                                            i + 3 < RN ? acc[i + 3][r] : zero);
            const __mmask16 mask = (__mmask16)((1u << (RN - i < 4 ? RN - i : 4)) - 1);
            _mm512_mask_storeu_ps(mm->out + (m0 + r) * mm->n + n0 + i, mask, _mm512_castps128_ps512(sums));
        }
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

/* Many activation rows: four weight rows (in L1 from the first tile on) against six activation rows at a time. */
__attribute__((target(AVX512))) static void float_tiles_avx512_4x6(const FloatMatmul *mm, int64_t n0) {
    int64_t m0 = 0;
    for (; m0 + 6 <= mm->m; m0 += 6) float_tile_avx512(mm, n0, m0, 4, 6);
    switch (mm->m - m0) {
    case 5: float_tile_avx512(mm, n0, m0, 4, 5); break;
    case 4: float_tile_avx512(mm, n0, m0, 4, 4); break;
    case 3: float_tile_avx512(mm, n0, m0, 4, 3); break;
    case 2: float_tile_avx512(mm, n0, m0, 4, 2); break;
    case 1: float_tile_avx512(mm, n0, m0, 4, 1); break;
    default: break;
    }
}

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
    if (mm->m > 8)
        for (; n + 4 <= n_last; n += 4) float_tiles_avx512_4x6(mm, n);
    for (; n + 4 <= n_last; n += 4) float_tiles_avx512_4(mm, n);
    for (; n + 2 <= n_last; n += 2) float_tiles_avx512_2(mm, n);
    if (n < n_last) float_tiles_avx512_1(mm, n);
}

#define AVX2_FMA "avx2,fma"

__attribute__((target(AVX2_FMA), always_inline)) static inline float sum_lanes_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

__attribute__((target(AVX2_FMA), always_inline)) static inline void float_tile_avx2(const FloatMatmul *mm, int64_t n0,
                                                                                  int64_t m0, const int RN,
                                                                                  const int RM) {
    __m256 acc[8][8];
    for (int i = 0; i < RN; i++)
        for (int r = 0; r < RM; r++) acc[i][r] = _mm256_setzero_ps();
    const int64_t k = mm->k;
    int64_t j = 0;
    const int prefetch = m0 == 0 && n0 + 2 * RN <= mm->n;
    for (; j + 8 <= k; j += 8) {
        if (prefetch && j % 16 == 0)
            for (int i = 0; i < RN; i++) _mm_prefetch((const char *)(mm->w + (n0 + RN + i) * k + j), _MM_HINT_T1);
        if (RN == 2 && RM > 4) { /* two weight registers, each activation vector used twice */
            const __m256 w0 = _mm256_loadu_ps(mm->w + n0 * k + j), w1 = _mm256_loadu_ps(mm->w + (n0 + 1) * k + j);
            for (int r = 0; r < RM; r++) {
                __m256 xr = _mm256_loadu_ps(mm->x + (m0 + r) * k + j);
                __asm__("" : "+x"(xr)); /* in a register, as in the AVX-512 tile (15 of the 16 are in use) */
                acc[0][r] = _mm256_fmadd_ps(w0, xr, acc[0][r]);
                acc[1][r] = _mm256_fmadd_ps(w1, xr, acc[1][r]);
            }
            continue;
        }
        if (RN == 1) { /* the activations straight from L1, one register for the weight */
            const __m256 w = _mm256_loadu_ps(mm->w + n0 * k + j);
            for (int r = 0; r < RM; r++) acc[0][r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(mm->x + (m0 + r) * k + j), acc[0][r]);
            continue;
        }
        __m256 x[4];
        for (int r = 0; r < RM; r++) x[r] = _mm256_loadu_ps(mm->x + (m0 + r) * k + j);
        for (int i = 0; i < RN; i++) {
            const __m256 w = _mm256_loadu_ps(mm->w + (n0 + i) * k + j);
            for (int r = 0; r < RM; r++) acc[i][r] = _mm256_fmadd_ps(w, x[r], acc[i][r]);
        }
    }
    if (j < k) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int i = 0; i < RN; i++) {
            const __m256 w = _mm256_maskload_ps(mm->w + (n0 + i) * k + j, mask);
            for (int r = 0; r < RM; r++)
                acc[i][r] = _mm256_fmadd_ps(w, _mm256_maskload_ps(mm->x + (m0 + r) * k + j, mask), acc[i][r]);
        }
    }
    for (int i = 0; i < RN; i++)
        for (int r = 0; r < RM; r++) mm->out[(m0 + r) * mm->n + n0 + i] = sum_lanes_avx2(acc[i][r]);
}

/* Five to eight rows whose activations fit in L1 go against one weight row at a time, reading the activations from
 * L1 for every multiply-add; longer ones (the down projection's) would come from L2 that way, so they go against two
 * weight rows at a time, each activation vector loaded once for both. */
#define FLOAT_L1_BYTES 32768

/* Weight rows [n, n_last) against activation rows [m0, m0 + RM): RN at a time, then one at a time. */
#define FLOAT_ROWS_AVX2(RN, RM)                                                                                     \
    __attribute__((target(AVX2_FMA))) static int64_t float_rows_avx2_##RN##_##RM(const FloatMatmul *mm, int64_t n, \
                                                                                int64_t n_last, int64_t m0) {      \
        for (; n + RN <= n_last; n += RN) float_tile_avx2(mm, n, m0, RN, RM);                                       \
        for (; n < n_last; n++) float_tile_avx2(mm, n, m0, 1, RM);                                                  \
        return n;                                                                                                   \
    }
FLOAT_ROWS_AVX2(8, 1)
FLOAT_ROWS_AVX2(6, 2)
FLOAT_ROWS_AVX2(4, 3)
FLOAT_ROWS_AVX2(3, 4)
FLOAT_ROWS_AVX2(2, 5)
FLOAT_ROWS_AVX2(2, 6)
/* Seven or eight long rows: six against two weight rows, then the rest against the same two while they are in L1. */
__attribute__((target(AVX2_FMA))) static void float_rows_avx2_six_and_rest(const FloatMatmul *mm, int64_t n,
                                                                           int64_t n_last) {
    for (; n + 2 <= n_last; n += 2) {
        float_tile_avx2(mm, n, 0, 2, 6);
        if (mm->m == 8) float_tile_avx2(mm, n, 6, 2, 2);
        else float_tile_avx2(mm, n, 6, 2, 1);
    }
    for (; n < n_last; n++) {
        float_tile_avx2(mm, n, 0, 1, 4);
        float_tile_avx2(mm, n, 4, 1, (int)mm->m - 4 == 4 ? 4 : 3);
    }
}
FLOAT_ROWS_AVX2(1, 5)
FLOAT_ROWS_AVX2(1, 6)
FLOAT_ROWS_AVX2(1, 7)
FLOAT_ROWS_AVX2(1, 8)

__attribute__((target(AVX2_FMA))) static void float_rows_avx2(const FloatMatmul *mm, int64_t n_first, int64_t n_last) {
    const int two = mm->m * mm->k * (int64_t)sizeof(float) > FLOAT_L1_BYTES;
    switch (mm->m) {
    case 1: float_rows_avx2_8_1(mm, n_first, n_last, 0); return;
    case 2: float_rows_avx2_6_2(mm, n_first, n_last, 0); return;
    case 3: float_rows_avx2_4_3(mm, n_first, n_last, 0); return;
    case 4: float_rows_avx2_3_4(mm, n_first, n_last, 0); return;
    case 5: if (two) { float_rows_avx2_2_5(mm, n_first, n_last, 0); return; } float_rows_avx2_1_5(mm, n_first, n_last, 0); return;
    case 6: if (two) { float_rows_avx2_2_6(mm, n_first, n_last, 0); return; } float_rows_avx2_1_6(mm, n_first, n_last, 0); return;
    case 7: if (two) { float_rows_avx2_six_and_rest(mm, n_first, n_last); return; } float_rows_avx2_1_7(mm, n_first, n_last, 0); return;
    case 8: if (two) { float_rows_avx2_six_and_rest(mm, n_first, n_last); return; } float_rows_avx2_1_8(mm, n_first, n_last, 0); return;
    default: break;
    }
    /* many rows: each band of 24 weight rows against every four activation rows while the band is in cache */
    for (int64_t n = n_first; n < n_last; n += 24) {
        const int64_t band = n + 24 < n_last ? n + 24 : n_last;
        int64_t m0 = 0;
        for (; m0 + 4 <= mm->m; m0 += 4) float_rows_avx2_3_4(mm, n, band, m0);
        switch (mm->m - m0) {
        case 3: float_rows_avx2_4_3(mm, n, band, m0); break;
        case 2: float_rows_avx2_6_2(mm, n, band, m0); break;
        case 1: float_rows_avx2_8_1(mm, n, band, m0); break;
        default: break;
        }
    }
}
#endif
