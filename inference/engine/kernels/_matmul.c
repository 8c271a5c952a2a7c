/* The linear layers' C kernels (CPU), sharing one elastic pool of threads: float32 weights (_float_matmul.h,
 * transformer.py's FloatLinear) and, below, GGUF Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or K-quant (Q4_K, Q5_K, Q6_K) blocks.
 *
 * Matmul of float32 activations with weights in one of those block formats (block_quant.py):
 * out[M, N] = x[M, K] @ W[N, K]^T.
 *
 * The weights are a GGUF Q4_0 file's blocks, 18 bytes per 32 input values as in the file: a float16 scale d and 32
 * 4-bit codes c (value = (c - 8) * d), two to a byte. Each call quantizes the activations to 8 bits with one scale
 * per 32 values of a row, and a block's product is an exact integer sum scaled by the two blocks' scales, as
 * llama.cpp's Q4_0 dot products work. torch has no CPU kernel for per-block scales: its int8 kernels scale per
 * output channel (several times the error, twice the bytes) and its int4 one is slow without AMX.
 *
 * The integer sum of a block is sum(c * x) - 8 * sum(x): the codes, 0..15, are the unsigned operand of the byte
 * multiply-add instructions (VNNI's vpdpbusd where the CPU has AVX-512 VNNI, AVX2's vpmaddubsw elsewhere, whose
 * pair sums stay under 15 * 127 * 2), and 8 * sum(x) is counted once per activation block when x is quantized.
 * Without AVX2, plain C.
 *
 * Q8_0 blocks (34 bytes per 32 values in the file: a float16 scale and 32 signed 8-bit codes) are kept as signed
 * codes [N, K] and scales [N, K/32]. Their block sums use the sign trick of the byte multiply-adds: |w| (unsigned)
 * times x carrying w's sign, so no offset is subtracted; |w| <= 128 keeps AVX2's pair sums under 2 * 128 * 127.
 *
 * Q4_K super-blocks (144 bytes per 256 values in the file) keep their 4-bit codes q (0..15) packed as Q4_0's, and
 * per super-block a KScales: the float16 d and dmin as float32 and the eight 6-bit (scale, min) pairs as bytes, so
 * block j's value is d * scale_j * q - dmin * min_j, as the file expands (both products are exact in float32). A
 * block's product is then xd * (d * scale_j * sum(q * x) - dmin * min_j * sum(x)): the codes' integer sum as for
 * Q4_0 (no offset), and sum(x) from the activations' block sums, in float once per 8 blocks.
 *
 * Q5_K super-blocks (176 bytes per 256 values in the file) are Q4_K's with a fifth bit per code: kept as Q4_K's
 * (the low four bits packed as Q4_0's, a KScales), then 32 bytes whose bit g of byte p is the fifth bit of code
 * vector g's byte p (160 bytes of codes per 256 values). Q6_K super-blocks (210 bytes in the file: 6-bit codes q, a
 * signed 8-bit scale per 16 values and a float16 d) keep the low four bits packed as Q4_0's, then two 32-byte planes
 * of the top two bits (vectors 0-3 in the first, 4-7 in the second, bits 2h and 2h + 1 for vector h), 192 bytes, and
 * a Q6Scales: d as float32 and each block's two scales (of its first and its second 16 values). The value is
 * d * scale * (q - 32), as the file expands: the codes become signed bytes q - 32 as they are unpacked, and a
 * block's two halves (the first four code vectors hold the first half) are summed apart and scaled in float.
 *
 * Layout: a row's K values are cut into super-blocks of 8 blocks (256 values), and a super-block's codes are seen as
 * 8 vectors of 32 bytes, vector g holding values 4g .. 4g + 3 of each of the 8 blocks (block j in bytes
 * 4j .. 4j + 3). A multiply-add of 4 byte pairs per int32 lane then builds all 8 blocks' sums at once, lane j block
 * j's, and the float work (convert, scale, add) is done once per 8 blocks instead of once per block. The weights
 * pack vectors g and g + 4 into 32 bytes: g's in the low nibbles, g + 4's in the high ones (Q4_0), or keep each
 * vector in 32 bytes of its own (Q8_0). The activations' 8-bit
 * codes are laid out the same way, unpacked; the scales stay in block order ([rows, K / 32]).
 *
 * Q5_0 blocks (22 bytes per 32 values in the file: a float16 scale, 32 fifth bits, 32 nibbles; value = (c - 16) * d)
 * are kept as Q4_0's with Q5_K's plane of fifth bits after each super-block's nibbles, the same 22 bytes: their
 * integer sums are Q4_0's with the offset 16 * sum(x).
 *
 * Q4_1 and Q5_1 blocks (20 and 24 bytes in the file: a float16 scale d and minimum m, then Q4_0's or Q5_0's codes q,
 * 0..15 or 0..31; value = d * q + m) are kept as Q4_0's and Q5_0's codes, and per super-block the 8 blocks' d then
 * their 8 m as float16 (32 bytes): a block's product is xd * (d * sum(q x) + m * sum(x)), as for Q4_K with the
 * scale and minimum per block, with sum(x) from the activations' block sums.
 *
 * Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 rows of a length that is a multiple of 32 but not of 256 (a model 896 or
 * 576 wide) are stored padded to whole super-blocks with zero codes and zero scales (block_quant.py), and each call
 * quantizes the activations into rows padded the same way with zeros: the padding adds nothing to a sum, and the
 * kernel sees only whole super-blocks.
 *
 * The work is shared, with the GIL released, among the threads of the elastic pool (_elastic_pool.h) rather than
 * torch's OpenMP ones: activation rows to quantize, then output rows, in chunks claimed one at a time, so a thread
 * the host preempts holds back only its chunk. Each chunk walks its weight rows one at a time (AVX2, and VNNI's Q8_0
 * for under four activation rows: one sequential stream, see ONE_ROW_AVX2) or in tiles of 2 or 4 (VNNI), and each
 * tile every activation row in groups of four, so a weight vector is read from memory once per call and reused from
 * registers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_elastic_pool.h"
#include "_float_matmul.h"
#include "_transposed_matmul.h"

#define BLOCK 32
#define SUPER 256 /* values per super-block: 8 blocks */
#define ROWS_PER_TILE 4

enum {
    FORMAT_Q4_0 = 0,
    FORMAT_Q8_0 = 1,
    FORMAT_Q4_K = 2,
    FORMAT_Q6_K = 3,
    FORMAT_Q5_K = 4,
    FORMAT_Q5_0 = 5,
    FORMAT_Q4_1 = 6,
    FORMAT_Q5_1 = 7
};

/* A Q4_K or Q5_K super-block's scales (24 bytes; block_quant.py writes them). */
typedef struct {
    float d, dmin;
    uint8_t scales[8], mins[8];
} KScales;

/* A Q6_K super-block's scales (20 bytes; block_quant.py writes them): block j's first 16 values take first[j]. */
typedef struct {
    float d;
    int8_t first[8], second[8];
} Q6Scales;

typedef struct {
    float *out;            /* [M, N], rows out_stride floats apart */
    const int8_t *xq;      /* [M, K] activation codes, interleaved */
    const float *xd;       /* [M, K/32] activation scales */
    const int32_t *xsum8;  /* [M, K/32] 8 * each activation block's sum of codes */
    const uint8_t *codes;  /* Q4_0: uint8 [N, K/2]; Q8_0: int8 [N, K]; interleaved */
    const uint16_t *wd;    /* Q4_0, Q5_0, Q8_0: [N, K/32] weight scales, float16; Q4_1, Q5_1: [N, K/256, 16] */
    const KScales *ks;     /* Q4_K, Q5_K: [N, K/256] */
    const Q6Scales *q6;    /* Q6_K: [N, K/256] */
    int64_t m, n, k, out_stride;
    int64_t row_bytes;     /* bytes of one weight row's codes */
    int64_t scale_bytes;   /* bytes of one weight row's scales */
    int format;
} Matmul;

/* One row of activations: codes = round(x / d) with d = max |x| / 127 per block of 32 (ties to even, as the vector
 * conversion rounds), interleaved, and 8 times each block's sum of codes. */
static void quantize_row_portable(const float *x, int64_t k, int8_t *q, float *d, int32_t *sum8) {
    for (int64_t b = 0; b < k / BLOCK; b++) {
        const float *xb = x + b * BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < BLOCK; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t *super = q + b / 8 * SUPER + (b % 8) * 4; /* block j's 4-value groups: bytes 4j + 32g */
        int32_t total = 0;
        for (int i = 0; i < BLOCK; i++) {
            const int8_t code = (int8_t)nearbyintf(xb[i] * inv);
            super[i / 4 * BLOCK + i % 4] = code;
            total += code;
        }
        d[b] = amax / 127.0f;
        sum8[b] = 8 * total;
    }
}

static float f16_to_f32(uint16_t h) { return (float)*(const _Float16 *)&h; }

/* Bytes of a super-block's codes, per format: Q8_0's bytes, Q4_0's and Q4_K's nibbles, Q5_0's, Q5_K's and Q6_K's
 * with their planes of top bits. */
static inline int64_t super_bytes(int format) {
    if (format == FORMAT_Q8_0) return SUPER;
    const int five = format == FORMAT_Q5_K || format == FORMAT_Q5_0 || format == FORMAT_Q5_1;
    return SUPER / 2 + (five ? BLOCK : format == FORMAT_Q6_K ? 2 * BLOCK : 0);
}

static void matmul_rows_portable(const Matmul *mm, int64_t n_first, int64_t n_last) {
    const int64_t blocks = mm->k / BLOCK, supers = mm->k / SUPER;
    for (int64_t n = n_first; n < n_last; n++) {
        for (int64_t m = 0; m < mm->m; m++) {
            float total = 0.0f;
            for (int64_t s = 0; s < supers; s++) {
                int32_t sums[8], second[8] = {0}; /* Q6_K: the blocks' first and second halves apart */
                const int q8 = mm->format == FORMAT_Q8_0, k6 = mm->format == FORMAT_Q6_K;
                const int mins = mm->format == FORMAT_Q4_K || mm->format == FORMAT_Q5_K;
                const int block_mins = mm->format == FORMAT_Q4_1 || mm->format == FORMAT_Q5_1;
                const int offset = mm->format == FORMAT_Q5_0 ? 2 : 1; /* 16 or 8 times sum(x) */
                for (int j = 0; j < 8; j++)
                    sums[j] = q8 || mins || block_mins || k6 ? 0 : -offset * mm->xsum8[m * blocks + s * 8 + j];
                const uint8_t *codes = mm->codes + n * mm->row_bytes + s * super_bytes(mm->format);
                const int8_t *x = mm->xq + m * mm->k + s * SUPER;
                for (int g = 0; g < 8; g++)
                    for (int p = 0; p < BLOCK; p++) {
                        const uint8_t byte = codes[(q8 ? g : g % 4) * BLOCK + p];
                        int w = q8 ? (int8_t)byte : g < 4 ? byte & 0x0F : byte >> 4;
                        if (super_bytes(mm->format) == SUPER / 2 + BLOCK) /* Q5_0, Q5_1, Q5_K */
                            w |= (codes[4 * BLOCK + p] >> g & 1) << 4;
                        if (k6) w = (w | (codes[(4 + g / 4) * BLOCK + p] >> 2 * (g % 4) & 3) << 4) - 32;
                        (k6 && g >= 4 ? second : sums)[p / 4] += w * x[g * BLOCK + p];
                    }
                for (int j = 0; j < 8; j++) {
                    const float xd = mm->xd[m * blocks + s * 8 + j];
                    if (mins) {
                        const KScales *ks = mm->ks + n * supers + s;
                        const float x_sum = (float)(mm->xsum8[m * blocks + s * 8 + j] / 8);
                        total += xd * (ks->d * ks->scales[j] * (float)sums[j] - ks->dmin * ks->mins[j] * x_sum);
                    } else if (block_mins) {
                        const uint16_t *dm = mm->wd + (n * supers + s) * 16;
                        const float x_sum = (float)(mm->xsum8[m * blocks + s * 8 + j] / 8);
                        total += xd * (f16_to_f32(dm[j]) * (float)sums[j] + f16_to_f32(dm[8 + j]) * x_sum);
                    } else if (k6) {
                        const Q6Scales *q6 = mm->q6 + n * supers + s;
                        total += xd * q6->d * (q6->first[j] * (float)sums[j] + q6->second[j] * (float)second[j]);
                    } else
                        total += (float)sums[j] * (f16_to_f32(mm->wd[n * blocks + s * 8 + j]) * xd);
                }
            }
            mm->out[m * mm->out_stride + n] = total;
        }
    }
}

static void (*quantize_row)(const float *, int64_t, int8_t *, float *, int32_t *) = quantize_row_portable;
static void (*matmul_rows)(const Matmul *, int64_t, int64_t) = matmul_rows_portable;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 "avx2,fma,f16c"
#define VNNI "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"

__attribute__((target(AVX2))) static void quantize_row_avx2(const float *x, int64_t k, int8_t *q, float *d,
                                                            int32_t *sum8) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / BLOCK; b++) {
        const float *xb = x + b * BLOCK;
        __m256 v[4], top = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            top = _mm256_max_ps(top, _mm256_andnot_ps(sign_bit, v[i]));
        }
        __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        half = _mm_max_ps(half, _mm_movehl_ps(half, half));
        const float amax = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i i32[4];
        for (int i = 0; i < 4; i++) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)); /* nearest, ties even */
        __m256i total = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
        __m128i total4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
        total4 = _mm_hadd_epi32(total4, total4);
        /* the packs interleave 128-bit lanes; the permute puts the 32 codes back in order, 4 to a dword */
        const __m256i codes = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3])),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        int32_t dwords[8];
        _mm256_storeu_si256((__m256i *)dwords, codes);
        int8_t *super = q + b / 8 * SUPER + (b % 8) * 4; /* dword g (values 4g .. 4g + 3) to byte 32g + 4j */
        for (int g = 0; g < 8; g++) memcpy(super + g * BLOCK, &dwords[g], 4);
        d[b] = amax / 127.0f;
        sum8[b] = 8 * (_mm_cvtsi128_si32(total4) + _mm_extract_epi32(total4, 1));
    }
}

__attribute__((target(AVX2), always_inline)) static inline float sum8_ps(__m256 v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
}

/* sums (8 x int32) += the 4-pair dot products of unsigned codes and signed activation bytes */
__attribute__((target(AVX2), always_inline)) static inline __m256i dot_add_avx2(__m256i sums, __m256i codes,
                                                                               __m256i x) {
    return _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), _mm256_set1_epi16(1)));
}

__attribute__((target(VNNI), always_inline)) static inline __m256i dot_add_vnni(__m256i sums, __m256i codes,
                                                                               __m256i x) {
    return _mm256_dpbusd_epi32(sums, codes, x);
}

/* sums += the 4-pair dot products of signed codes and signed activation bytes: |w| times x with w's sign */
__attribute__((target(AVX2), always_inline)) static inline __m256i dot_add_signed_avx2(__m256i sums, __m256i w,
                                                                                      __m256i x) {
    return dot_add_avx2(sums, _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}

__attribute__((target(VNNI), always_inline)) static inline __m256i dot_add_signed_vnni(__m256i sums, __m256i w,
                                                                                      __m256i x) {
    return dot_add_vnni(sums, _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}

/* Eight bytes, unsigned or signed, as eight floats: a super-block's scales. */
__attribute__((target(AVX2), always_inline)) static inline __m256 u8_to_ps(const uint8_t *bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes)));
}
__attribute__((target(AVX2), always_inline)) static inline __m256 i8_to_ps(const int8_t *bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)bytes)));
}

/* Bits `from` onwards of each byte moved to bit `to` onwards (a mask keeps the ones wanted): 16-bit shifts, which
 * for these moves (from + the bits kept <= 8) take each byte's bits from that byte alone. */
__attribute__((target(AVX2), always_inline)) static inline __m256i move_bits(__m256i v, const int from, const int to) {
    return from < to ? _mm256_slli_epi16(v, to - from) : from > to ? _mm256_srli_epi16(v, from - to) : v;
}

/* Asks for the weight rows PREFETCH_ROWS further on, into L2: a thread walks its rows in order, but the hardware
 * prefetcher, seeing a few rows read side by side in short runs, fetches too little ahead of them. Into L2 rather than
 * L1, where they pushed out the activations (docs/performance.md). */
#define PREFETCH_ROWS 8
static inline void prefetch_ahead(const Matmul *mm, int64_t n0, const int RN) {
    const int64_t row_bytes = mm->row_bytes, scale_bytes = mm->scale_bytes;
    const int64_t first = n0 + PREFETCH_ROWS, last = first + RN < mm->n ? first + RN : mm->n;
    if (first >= last) return;
    const char *codes = (const char *)mm->codes + first * row_bytes;
    for (int64_t o = 0; o < (last - first) * row_bytes; o += 64) __builtin_prefetch(codes + o, 0, 2);
    const char *scales = (const char *)mm->wd + first * scale_bytes; /* every format's scales start there */
    for (int64_t o = 0; o < (last - first) * scale_bytes; o += 64) __builtin_prefetch(scales + o, 0, 2);
}

/* out[m0 .. m0 + RM, n0 .. n0 + RN]: each weight vector is loaded once for RM activation rows, each activation
 * vector once for RN weight rows. A super-block's 8 int32 block sums start at -8 * sum(x) per block for Q4_0 (its
 * codes are the values plus 8), -16 * sum(x) for Q5_0, at 0 for the others (the minimum of Q4_1, Q5_1, Q4_K and
 * Q5_K is added in float). Q8 (signed byte codes), MINS (1: Q4_K's and Q5_K's scales; 2: Q4_1's and Q5_1's float16
 * scale and minimum per block) and HIGH (the planes of top bits after the nibbles: 1 for Q5_0, Q5_1 and Q5_K, 2 for
 * Q6_K, whose blocks' halves are summed apart) are constants: each format gets its own code. */
#define TILE(TARGET, SUFFIX, FMT, Q8, MINS, HIGH, ONE_ROW)                                                         \
    __attribute__((target(TARGET), always_inline)) static inline void tile_##SUFFIX##FMT(                         \
        const Matmul *mm, int64_t n0, int64_t m0, const int RN, const int RM) {                                    \
        const int64_t blocks = mm->k / BLOCK, supers = mm->k / SUPER;                                              \
        const __m256i low_nibbles = _mm256_set1_epi8(0x0F);                                                        \
        __m256 acc[4][ROWS_PER_TILE];                                                                              \
        for (int i = 0; i < RN; i++)                                                                               \
            for (int r = 0; r < RM; r++) acc[i][r] = _mm256_setzero_ps();                                          \
        if (m0 == 0) prefetch_ahead(mm, n0, RN);                                                                   \
        for (int64_t s = 0; s < supers; s++) {                                                                     \
            __m256i sums[4][ROWS_PER_TILE], second[4][ROWS_PER_TILE];                                              \
            for (int r = 0; r < RM; r++) {                                                                         \
                const __m256i x_sum8 =                                                                             \
                    _mm256_loadu_si256((const __m256i *)(mm->xsum8 + (m0 + r) * blocks + s * 8));                  \
                const __m256i start = Q8 || MINS || HIGH == 2 ? _mm256_setzero_si256()                             \
                                      : _mm256_sub_epi32(_mm256_setzero_si256(),                                   \
                                                         HIGH ? _mm256_slli_epi32(x_sum8, 1) : x_sum8);            \
                for (int i = 0; i < RN; i++) sums[i][r] = second[i][r] = start;                                    \
            }                                                                                                      \
            _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) {                                                  \
                __m256i low[4], high[4]; /* the weight vectors that meet activation vectors h and h + 4 */        \
                for (int i = 0; i < RN; i++) {                                                                     \
                    const __m256i *row = (const __m256i *)(mm->codes + (n0 + i) * mm->row_bytes +                  \
                                                           s * (Q8 ? SUPER : SUPER / 2 + HIGH * BLOCK));           \
                    if (Q8) {                                                                                      \
                        low[i] = _mm256_loadu_si256(row + h);                                                      \
                        high[i] = _mm256_loadu_si256(row + h + 4);                                                 \
                    } else {                                                                                       \
                        const __m256i packed = _mm256_loadu_si256(row + h);                                        \
                        low[i] = _mm256_and_si256(packed, low_nibbles);                                            \
                        high[i] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);                     \
                    }                                                                                              \
                    if (HIGH == 1) { /* vector g's fifth bits: bit g of the plane's bytes */                       \
                        const __m256i bits = _mm256_loadu_si256(row + 4), fifth = _mm256_set1_epi8(0x10);          \
                        low[i] = _mm256_or_si256(low[i], _mm256_and_si256(move_bits(bits, h, 4), fifth));          \
                        high[i] = _mm256_or_si256(high[i], _mm256_and_si256(move_bits(bits, h + 4, 4), fifth));    \
                    }                                                                                              \
                    if (HIGH == 2) { /* vector h's top bits: bits 2h, 2h + 1 of the first plane (h + 4's: second) */ \
                        const __m256i top = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);                 \
                        const __m256i first = _mm256_loadu_si256(row + 4), later = _mm256_loadu_si256(row + 5);   \
                        low[i] = _mm256_sub_epi8(                                                                  \
                            _mm256_or_si256(low[i], _mm256_and_si256(move_bits(first, 2 * h, 4), top)), offset);   \
                        high[i] = _mm256_sub_epi8(                                                                 \
                            _mm256_or_si256(high[i], _mm256_and_si256(move_bits(later, 2 * h, 4), top)), offset);  \
                    }                                                                                              \
                }                                                                                                  \
                for (int r = 0; r < RM; r++) {                                                                     \
                    const __m256i *x = (const __m256i *)(mm->xq + (m0 + r) * mm->k + s * SUPER);                   \
                    const __m256i x_low = _mm256_loadu_si256(x + h), x_high = _mm256_loadu_si256(x + h + 4);       \
                    for (int i = 0; i < RN; i++) {                                                                 \
                        if (HIGH == 2) {                                                                           \
                            sums[i][r] = dot_add_signed_##SUFFIX(sums[i][r], low[i], x_low);                       \
                            second[i][r] = dot_add_signed_##SUFFIX(second[i][r], high[i], x_high);                 \
                        } else if (Q8) {                                                                           \
                            sums[i][r] = dot_add_signed_##SUFFIX(sums[i][r], low[i], x_low);                       \
                            sums[i][r] = dot_add_signed_##SUFFIX(sums[i][r], high[i], x_high);                     \
                        } else {                                                                                   \
                            sums[i][r] = dot_add_##SUFFIX(sums[i][r], low[i], x_low);                              \
                            sums[i][r] = dot_add_##SUFFIX(sums[i][r], high[i], x_high);                            \
                        }                                                                                          \
                    }                                                                                              \
                }                                                                                                  \
            }                                                                                                      \
            for (int i = 0; i < RN; i++) {                                                                         \
                if (MINS) { /* xd * (scale_j * sum(q x) + min_j / 8 * 8 sum(x)) */                                 \
                    __m256 scale, min;                                                                             \
                    if (MINS == 2) { /* Q4_1, Q5_1: d_j and m_j */                                                 \
                        const uint16_t *dm = mm->wd + ((n0 + i) * supers + s) * 16;                                \
                        scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dm));                             \
                        min = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + 8))),           \
                                            _mm256_set1_ps(0.125f));                                               \
                    } else { /* Q4_K, Q5_K: d * scale_j and -dmin * min_j (the minimum is taken off) */            \
                        const KScales *ks = mm->ks + (n0 + i) * supers + s;                                        \
                        scale = _mm256_mul_ps(_mm256_set1_ps(ks->d), u8_to_ps(ks->scales));                        \
                        min = _mm256_mul_ps(_mm256_set1_ps(-ks->dmin * 0.125f), u8_to_ps(ks->mins));               \
                    }                                                                                              \
                    for (int r = 0; r < RM; r++) {                                                                 \
                        const __m256 x_sum8 = _mm256_cvtepi32_ps(                                                  \
                            _mm256_loadu_si256((const __m256i *)(mm->xsum8 + (m0 + r) * blocks + s * 8)));         \
                        const __m256 block = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums[i][r]),                \
                                                             _mm256_mul_ps(min, x_sum8));                          \
                        acc[i][r] = _mm256_fmadd_ps(block, _mm256_loadu_ps(mm->xd + (m0 + r) * blocks + s * 8),    \
                                                    acc[i][r]);                                                    \
                    }                                                                                              \
                    continue;                                                                                      \
                }                                                                                                  \
                if (HIGH == 2) { /* xd * d * (first_j * sum over the first half + second_j * over the second) */   \
                    const Q6Scales *q6 = mm->q6 + (n0 + i) * supers + s;                                           \
                    const __m256 d = _mm256_set1_ps(q6->d);                                                        \
                    const __m256 first = _mm256_mul_ps(d, i8_to_ps(q6->first));                                    \
                    const __m256 later = _mm256_mul_ps(d, i8_to_ps(q6->second));                                   \
                    for (int r = 0; r < RM; r++) {                                                                 \
                        const __m256 block = _mm256_fmadd_ps(first, _mm256_cvtepi32_ps(sums[i][r]),                \
                                                             _mm256_mul_ps(later, _mm256_cvtepi32_ps(second[i][r]))); \
                        acc[i][r] = _mm256_fmadd_ps(block, _mm256_loadu_ps(mm->xd + (m0 + r) * blocks + s * 8),    \
                                                    acc[i][r]);                                                    \
                    }                                                                                              \
                    continue;                                                                                      \
                }                                                                                                  \
                const __m256 w_scale = _mm256_cvtph_ps(                                                            \
                    _mm_loadu_si128((const __m128i *)(mm->wd + (n0 + i) * blocks + s * 8)));                       \
                for (int r = 0; r < RM; r++) {                                                                     \
                    const __m256 scale = _mm256_mul_ps(w_scale, _mm256_loadu_ps(mm->xd + (m0 + r) * blocks + s * 8)); \
                    acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i][r]), scale, acc[i][r]);                 \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        for (int i = 0; i < RN; i++)                                                                               \
            for (int r = 0; r < RM; r++) mm->out[(m0 + r) * mm->out_stride + n0 + i] = sum8_ps(acc[i][r]);         \
    }                                                                                                              \
    __attribute__((target(TARGET), always_inline)) static inline void tiles_##SUFFIX##FMT(                        \
        const Matmul *mm, int64_t n0, const int RN) {                                                              \
        int64_t m0 = 0;                                                                                            \
        for (; m0 + ROWS_PER_TILE <= mm->m; m0 += ROWS_PER_TILE) tile_##SUFFIX##FMT(mm, n0, m0, RN, ROWS_PER_TILE); \
        switch (mm->m - m0) {                                                                                      \
        case 3: tile_##SUFFIX##FMT(mm, n0, m0, RN, 3); break;                                                      \
        case 2: tile_##SUFFIX##FMT(mm, n0, m0, RN, 2); break;                                                      \
        case 1: tile_##SUFFIX##FMT(mm, n0, m0, RN, 1); break;                                                      \
        default: break;                                                                                            \
        }                                                                                                          \
    }                                                                                                              \
    __attribute__((target(TARGET))) static void matmul_rows_##SUFFIX##FMT(const Matmul *mm, int64_t n_first,      \
                                                                         int64_t n_last) {                         \
        int64_t n = n_first;                                                                                       \
        if (ONE_ROW) { /* one sequential stream of weights per thread (ONE_ROW_AVX2, ONE_ROW_VNNI_FEW_ROWS) */   \
            for (; n < n_last; n++) tiles_##SUFFIX##FMT(mm, n, 1);                                                 \
            return;                                                                                                \
        }                                                                                                          \
        if (mm->m < ROWS_PER_TILE) /* few rows: more weight rows per tile keep more multiply-add chains going */   \
            for (; n + 4 <= n_last; n += 4) tiles_##SUFFIX##FMT(mm, n, 4);                                         \
        for (; n + 2 <= n_last; n += 2) tiles_##SUFFIX##FMT(mm, n, 2);                                             \
        if (n < n_last) tiles_##SUFFIX##FMT(mm, n, 1);                                                             \
    }

/* The AVX2 kernel walks one weight row at a time: each thread then reads its weights as one sequential stream, which
 * the hardware prefetcher follows, where a tile of several rows, read side by side 256 values at a time, made it
 * fetch too little ahead and the loads no longer overlapped the arithmetic. Measured on an AVX2-only AMD Zen 2 host,
 * from one row to eight (docs/performance.md); the VNNI kernel keeps its tiles, tuned on an AVX-512 host. */
#define ONE_ROW_AVX2 1
/* The VNNI kernel walks Q8_0 and Q6_K weights one row at a time too while there are fewer activation rows than a
 * tile holds: there one stream per thread read the weights faster than four side by side (Q8_0 on an AMD Zen 4 host,
 * Q6_K on an Intel AMX one: 49 layers of the 85M model at one row 2.36-2.41 against 2.56-2.63 ms;
 * docs/performance.md). Q4_0 and Q4_K (there 1.45-1.82 with tiles against 1.58-1.86), Q5_K (even) and every
 * format at four rows or more keep the tiles. */
#define ONE_ROW_VNNI_FEW_ROWS (mm->m < ROWS_PER_TILE)
TILE(AVX2, avx2, _q4_0, 0, 0, 0, ONE_ROW_AVX2)
TILE(AVX2, avx2, _q8_0, 1, 0, 0, ONE_ROW_AVX2)
TILE(AVX2, avx2, _q4_k, 0, 1, 0, ONE_ROW_AVX2)
TILE(AVX2, avx2, _q5_k, 0, 1, 1, ONE_ROW_AVX2)
TILE(AVX2, avx2, _q6_k, 0, 0, 2, ONE_ROW_AVX2)
TILE(AVX2, avx2, _q5_0, 0, 0, 1, ONE_ROW_AVX2)
TILE(AVX2, avx2, _q4_1, 0, 2, 0, ONE_ROW_AVX2)
TILE(AVX2, avx2, _q5_1, 0, 2, 1, ONE_ROW_AVX2)
TILE(VNNI, vnni, _q4_0, 0, 0, 0, 0)
TILE(VNNI, vnni, _q8_0, 1, 0, 0, ONE_ROW_VNNI_FEW_ROWS)
TILE(VNNI, vnni, _q4_k, 0, 1, 0, 0)
TILE(VNNI, vnni, _q5_k, 0, 1, 1, 0)
TILE(VNNI, vnni, _q6_k, 0, 0, 2, ONE_ROW_VNNI_FEW_ROWS)
TILE(VNNI, vnni, _q5_0, 0, 0, 1, 0)
TILE(VNNI, vnni, _q4_1, 0, 2, 0, 0)
TILE(VNNI, vnni, _q5_1, 0, 2, 1, 0)

/* One implementation's row walk, per weight format. */
#define BY_FORMAT(SUFFIX)                                                                                          \
    __attribute__((unused)) static void matmul_rows_##SUFFIX(const Matmul *mm, int64_t n_first, int64_t n_last) {  \
        if (mm->format == FORMAT_Q8_0) matmul_rows_##SUFFIX##_q8_0(mm, n_first, n_last);                           \
        else if (mm->format == FORMAT_Q4_K) matmul_rows_##SUFFIX##_q4_k(mm, n_first, n_last);                      \
        else if (mm->format == FORMAT_Q6_K) matmul_rows_##SUFFIX##_q6_k(mm, n_first, n_last);                      \
        else if (mm->format == FORMAT_Q5_K) matmul_rows_##SUFFIX##_q5_k(mm, n_first, n_last);                      \
        else if (mm->format == FORMAT_Q5_0) matmul_rows_##SUFFIX##_q5_0(mm, n_first, n_last);                      \
        else if (mm->format == FORMAT_Q4_1) matmul_rows_##SUFFIX##_q4_1(mm, n_first, n_last);                      \
        else if (mm->format == FORMAT_Q5_1) matmul_rows_##SUFFIX##_q5_1(mm, n_first, n_last);                      \
        else matmul_rows_##SUFFIX##_q4_0(mm, n_first, n_last);                                                     \
    }
BY_FORMAT(avx2)
BY_FORMAT(vnni)
#endif

/* A call's work in chunks for the pool (_elastic_pool.h): activation rows to quantize, then output rows. */
typedef struct {
    const Matmul *mm;
    const float *input;
    int64_t input_k; /* the input's row length: K, or less where the weights' rows are padded */
    int64_t rows_per_chunk;
} Chunks;

static void quantize_chunk(void *ctx, int64_t c) {
    const Chunks *ch = ctx;
    const Matmul *mm = ch->mm;
    const int64_t blocks = mm->k / BLOCK, first = c * ch->rows_per_chunk;
    const int64_t last = first + ch->rows_per_chunk < mm->m ? first + ch->rows_per_chunk : mm->m;
    for (int64_t m = first; m < last; m++)
        quantize_row(ch->input + m * ch->input_k, ch->input_k, (int8_t *)mm->xq + m * mm->k,
                     (float *)mm->xd + m * blocks, (int32_t *)mm->xsum8 + m * blocks);
}

static void matmul_chunk(void *ctx, int64_t c) {
    const Chunks *ch = ctx;
    const int64_t first = c * ch->rows_per_chunk, last = first + ch->rows_per_chunk;
    matmul_rows(ch->mm, first, last < ch->mm->n ? last : ch->mm->n);
}

/* Output rows per chunk: some eight chunks per thread, so a preempted helper holds back little, in whole tiles. */
static int64_t output_rows_per_chunk(int64_t n) {
    const int64_t rows = n / ((int64_t)pool.threads * 8) / ROWS_PER_TILE * ROWS_PER_TILE;
    return rows < 16 ? 16 : rows;
}

static PyObject *matmul(PyObject *self, PyObject *args) {
    Py_ssize_t out, x, codes, scales;
    Matmul mm;
    if (!PyArg_ParseTuple(args, "nnnnLLLiL", &out, &x, &codes, &scales, &mm.m, &mm.n, &mm.k, &mm.format,
                          &mm.out_stride))
        return NULL;
    if (mm.format < FORMAT_Q4_0 || mm.format > FORMAT_Q5_1) {
        PyErr_Format(PyExc_ValueError, "no block format %d (FORMATS has the codes)", mm.format);
        return NULL;
    }
    const int k_quant = mm.format == FORMAT_Q4_K || mm.format == FORMAT_Q5_K || mm.format == FORMAT_Q6_K;
    const int padded = !k_quant;
    if (mm.k % (padded ? BLOCK : SUPER) != 0) {
        PyErr_SetString(PyExc_ValueError, padded ? "in_features must be a multiple of 32"
                                                 : "in_features must be a multiple of 256 for a K-quant");
        return NULL;
    }
    const int64_t input_k = mm.k;
    mm.k = (mm.k + SUPER - 1) / SUPER * SUPER; /* the weights' rows and the quantized activations', padded */
    const int64_t blocks = mm.k / BLOCK, supers = mm.k / SUPER;
    mm.row_bytes = supers * super_bytes(mm.format);
    mm.scale_bytes = mm.format == FORMAT_Q4_K || mm.format == FORMAT_Q5_K ? supers * (int64_t)sizeof(KScales)
                     : mm.format == FORMAT_Q6_K                           ? supers * (int64_t)sizeof(Q6Scales)
                     : mm.format == FORMAT_Q4_1 || mm.format == FORMAT_Q5_1 ? blocks * 4
                                                                          : blocks * 2;
    /* codes, then scales and sums: K (padded) is a multiple of 256, so the 4-byte arrays stay aligned */
    const size_t scratch = (size_t)(mm.m * mm.k) + 8 * (size_t)(mm.m * blocks);
    int8_t *xq = input_k == mm.k ? malloc(scratch) : calloc(scratch, 1); /* the padding: zero codes and scales */
    if (xq == NULL) return PyErr_NoMemory();
    float *xd = (float *)(xq + mm.m * mm.k);
    int32_t *xsum8 = (int32_t *)(xd + mm.m * blocks);
    mm.out = (float *)out;
    mm.xq = xq;
    mm.xd = xd;
    mm.xsum8 = xsum8;
    mm.codes = (const uint8_t *)codes;
    mm.wd = (const uint16_t *)scales;
    mm.ks = (const KScales *)scales;
    mm.q6 = (const Q6Scales *)scales;
    Py_BEGIN_ALLOW_THREADS;
    /* threads only for enough work: handing out a few rows costs more than computing them */
    Chunks rows = {&mm, (const float *)x, input_k, 16384 / mm.k > 1 ? 16384 / mm.k : 1};
    pool_run(quantize_chunk, &rows, (mm.m + rows.rows_per_chunk - 1) / rows.rows_per_chunk, mm.m * mm.k >= 2 * 16384);
    Chunks outputs = {&mm, NULL, input_k, output_rows_per_chunk(mm.n)};
    pool_run(matmul_chunk, &outputs, (mm.n + outputs.rows_per_chunk - 1) / outputs.rows_per_chunk,
             mm.n * mm.m * blocks >= 2 * 4096);
    Py_END_ALLOW_THREADS;
    free(xq);
    Py_RETURN_NONE;
}

/* The products' implementations this CPU can run, best first (the one chosen at import). */
typedef struct {
    const char *name;
    void (*quantize)(const float *, int64_t, int8_t *, float *, int32_t *);
    void (*rows)(const Matmul *, int64_t, int64_t);
} Kernel;

static Kernel kernels[3];
static int kernel_count = 0;

static PyObject *available(PyObject *self, PyObject *unused) {
    PyObject *names = PyList_New(kernel_count);
    if (names == NULL) return NULL;
    for (int i = 0; i < kernel_count; i++) PyList_SET_ITEM(names, i, PyUnicode_FromString(kernels[i].name));
    return names;
}

static PyObject *kernel_name(PyObject *self, PyObject *unused) {
    for (int i = 0; i < kernel_count; i++)
        if (kernels[i].rows == matmul_rows) return PyUnicode_FromString(kernels[i].name);
    Py_RETURN_NONE;
}

static PyObject *select_kernel(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int i = 0; i < kernel_count; i++)
        if (strcmp(kernels[i].name, name) == 0) {
            quantize_row = kernels[i].quantize;
            matmul_rows = kernels[i].rows;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "no kernel %s on this CPU", name);
    return NULL;
}

#ifdef FLOAT_MATMUL_X86
/* The float32 product's chunks for the pool: output rows, in whole bands of 24 (a multiple of every tile's rows). */
typedef struct {
    const FloatMatmul *mm;
    int64_t rows_per_chunk;
    void (*rows)(const FloatMatmul *, int64_t, int64_t);
} FloatChunks;

static void float_chunk(void *ctx, int64_t c) {
    const FloatChunks *ch = ctx;
    const int64_t first = c * ch->rows_per_chunk, last = first + ch->rows_per_chunk;
    ch->rows(ch->mm, first, last < ch->mm->n ? last : ch->mm->n);
}
#endif

/* The float32 kernel this CPU runs (_float_matmul.h): AVX-512F's, else AVX2's, else none. */
static void (*float_rows(void))(const FloatMatmul *, int64_t, int64_t) {
#ifdef FLOAT_MATMUL_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return float_rows_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return float_rows_avx2;
#endif
    return NULL;
}

static int float_kernel_runs(void) { return float_rows() != NULL; }

/* A float32 entry point's arguments (out, x, weight, m, n, k: pointers as ints) into `mm`; 0 with the Python error
 * set when they do not parse or the CPU does not run the kernel (`runs`), named by `needs`. */
static int float_operands(PyObject *args, FloatMatmul *mm, int runs, const char *needs) {
    Py_ssize_t out, x, weight;
    if (!PyArg_ParseTuple(args, "nnnLLL", &out, &x, &weight, &mm->m, &mm->n, &mm->k)) return 0;
    if (!runs) {
        PyErr_SetString(PyExc_RuntimeError, needs);
        return 0;
    }
    mm->out = (float *)out;
    mm->x = (const float *)x;
    mm->w = (const float *)weight;
    return 1;
}

static PyObject *float_matmul(PyObject *self, PyObject *args) {
    FloatMatmul mm;
    if (!float_operands(args, &mm, float_kernel_runs(), "the float32 kernel needs AVX2 and FMA")) return NULL;
#ifdef FLOAT_MATMUL_X86
    Py_BEGIN_ALLOW_THREADS;
    int64_t rows = mm.n / ((int64_t)pool.threads * 8) / 24 * 24;
    FloatChunks chunks = {&mm, rows < 24 ? 24 : rows, float_rows()};
    pool_run(float_chunk, &chunks, (mm.n + chunks.rows_per_chunk - 1) / chunks.rows_per_chunk,
             mm.n * mm.m * mm.k >= 65536);
    Py_END_ALLOW_THREADS;
#endif
    Py_RETURN_NONE;
}

static PyObject *float_available(PyObject *self, PyObject *unused) { return PyBool_FromLong(float_kernel_runs()); }

static int transposed_kernel_runs(void) {
#ifdef TRANSPOSED_MATMUL_X86
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* On the calling thread, with the GIL held: the call is a few microseconds (_transposed_matmul.h). */
static PyObject *transposed_matmul(PyObject *self, PyObject *args) {
    FloatMatmul mm;
    if (!float_operands(args, &mm, transposed_kernel_runs(), "the transposed float32 kernel needs AVX2 and FMA"))
        return NULL;
#ifdef TRANSPOSED_MATMUL_X86
    transposed_matmul_avx2(&mm);
#endif
    Py_RETURN_NONE;
}

static PyObject *transposed_available(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(transposed_kernel_runs());
}

/* A weight row's bytes of codes and of scales in `format` for `k` input values (padded as `matmul` pads them), so
 * the wrapper can check a layer's tensors hold what the kernel will read. */
static PyObject *block_layout(PyObject *self, PyObject *args) {
    int format;
    long long k;
    if (!PyArg_ParseTuple(args, "iL", &format, &k)) return NULL;
    if (format < FORMAT_Q4_0 || format > FORMAT_Q5_1) {
        PyErr_Format(PyExc_ValueError, "no block format %d", format);
        return NULL;
    }
    const int k_quant = format == FORMAT_Q4_K || format == FORMAT_Q5_K || format == FORMAT_Q6_K;
    if (k <= 0 || k % (k_quant ? SUPER : BLOCK) != 0) {
        PyErr_Format(PyExc_ValueError, "in_features %lld is not a positive multiple of %d", k, k_quant ? SUPER : BLOCK);
        return NULL;
    }
    const int64_t padded = (k + SUPER - 1) / SUPER * SUPER, blocks = padded / BLOCK, supers = padded / SUPER;
    const int64_t scale_bytes = format == FORMAT_Q4_K || format == FORMAT_Q5_K ? supers * (int64_t)sizeof(KScales)
                                : format == FORMAT_Q6_K                          ? supers * (int64_t)sizeof(Q6Scales)
                                : format == FORMAT_Q4_1 || format == FORMAT_Q5_1 ? blocks * 4
                                                                                 : blocks * 2;
    return Py_BuildValue("LL", (long long)(supers * super_bytes(format)), (long long)scale_bytes);
}

static PyObject *set_threads(PyObject *self, PyObject *args) {
    int threads;
    if (!PyArg_ParseTuple(args, "i", &threads)) return NULL;
    pool_set_threads(threads);
    Py_RETURN_NONE;
}

static PyObject *threads(PyObject *self, PyObject *unused) { return PyLong_FromLong(pool.threads); }

static PyMethodDef methods[] = {
    {"matmul", matmul, METH_VARARGS,
     "matmul(out, x, codes, scales, m, n, k, format, out_stride): out[m, n] = x[m, k] @ dequantized(codes, "
     "scales)[n, k]^T (pointers as ints; float32 out, its rows out_stride floats apart, and x; format: one of "
     "FORMATS' codes, block_quant.py's layouts). Call it through the wrapper (matmul.py), which checks the tensors."},
    {"kernel_name", kernel_name, METH_NOARGS, "which implementation the products run on"},
    {"available", available, METH_NOARGS, "the implementations this CPU can run, best first"},
    {"select", select_kernel, METH_VARARGS, "select(name): run the products on that implementation (for tests)"},
    {"float_matmul", float_matmul, METH_VARARGS,
     "float_matmul(out, x, weight, m, n, k): out[m, n] = x[m, k] @ weight[n, k]^T (float32 pointers as ints)."},
    {"float_available", float_available, METH_NOARGS, "whether this CPU runs the float32 kernel (AVX-512F or AVX2)"},
    {"transposed_matmul", transposed_matmul, METH_VARARGS,
     "transposed_matmul(out, x, weight_t, m, n, k): out[m, n] = x[m, k] @ weight_t[k, n] (float32 pointers as ints)."},
    {"transposed_available", transposed_available, METH_NOARGS,
     "whether this CPU runs the transposed float32 kernel (AVX2 and FMA)"},
    {"block_layout", block_layout, METH_VARARGS,
     "block_layout(format, k): (bytes of codes, bytes of scales) of one weight row of k values in that format"},
    {"set_threads", set_threads, METH_VARARGS, "set_threads(n): share each call's work among n threads"},
    {"threads", threads, METH_NOARGS, "how many threads each call's work is shared among"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_matmul", NULL, -1, methods};

/* The pool's entry point for the other extensions (_pool_run.h). */
static void pool_run_shared(ChunkFn fn, void *ctx, int64_t total, int parallel) { pool_run(fn, ctx, total, parallel); }

PyMODINIT_FUNC PyInit__matmul(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        if (__builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            kernels[kernel_count++] = (Kernel){"avx512-vnni", quantize_row_avx2, matmul_rows_vnni};
        kernels[kernel_count++] = (Kernel){"avx2", quantize_row_avx2, matmul_rows_avx2};
    }
#endif
    kernels[kernel_count++] = (Kernel){"portable", quantize_row_portable, matmul_rows_portable};
    quantize_row = kernels[0].quantize;
    matmul_rows = kernels[0].rows;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* the block formats' codes, by the names linear_formats reports: the wrapper reads them here */
    PyObject *formats = Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "q4_0", FORMAT_Q4_0, "q8_0", FORMAT_Q8_0,
                                      "q4_k", FORMAT_Q4_K, "q6_k", FORMAT_Q6_K, "q5_k", FORMAT_Q5_K, "q5_0",
                                      FORMAT_Q5_0, "q4_1", FORMAT_Q4_1, "q5_1", FORMAT_Q5_1);
    if (formats == NULL || PyModule_AddObject(m, "FORMATS", formats) < 0) {
        Py_XDECREF(formats);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New((void *)pool_run_shared, POOL_RUN_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "pool_run", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
