/* Matmul of float32 activations with Q4_0-quantized weights (block_quant.py): out[M, N] = x[M, K] @ W[N, K]^T.
 *
 * The weights keep a GGUF Q4_0 file's blocks: one float32 scale per 32 input values and 4-bit codes, two to a byte,
 * stored value + 8. Each call quantizes the activations to 8 bits with one scale per 32 values of a row, and a
 * block's product is an exact int32 sum of 32 products, scaled by the two blocks' scales, as llama.cpp's Q4_0 dot
 * products work. torch has no CPU kernel for per-block scales: its int8 kernels scale per output channel (several
 * times the error, twice the bytes) and its int4 one is slow without AMX.
 *
 * Layout: a row's K values are cut into super-blocks of 8 blocks (256 values), and a super-block's codes are seen as
 * 8 vectors of 32 bytes, vector g holding values 4g .. 4g + 3 of each of the 8 blocks (block j in bytes
 * 4j .. 4j + 3). An int32 multiply-add of 4 byte pairs per lane then builds all 8 blocks' sums at once, lane j
 * block j's, and the float work (convert, scale, add) is done once per 8 blocks instead of once per block. The
 * weights pack vectors g and g + 4 into one: g's in the low nibbles, g + 4's in the high ones. The activations'
 * 8-bit codes are laid out the same way, unpacked; the scales stay in block order ([rows, K / 32]).
 *
 * Output rows are split in contiguous shares among OpenMP threads, with the GIL released; the extension links
 * libgomp.so.1 by that name, which torch has already loaded, so the threads are torch's own (_paged_attention.c
 * says why that matters). Each thread walks its weight rows in tiles of 2 or 4, and each tile every activation
 * row in groups of four, so a weight vector is read from memory once per call and reused from registers.
 *
 * The products use VNNI (vpdpbusd, unsigned by signed bytes) where the CPU has AVX-512 VNNI: x + 128 times w, less
 * 128 times each block's stored sum of w. With AVX2 alone: |w| times x carrying w's sign (pair sums under 2^15).
 * Without AVX2, plain C.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32
#define SUPER 256 /* values per super-block: 8 blocks */
#define ROWS_PER_TILE 4

typedef struct {
    float *out;           /* [M, N] */
    const int8_t *xq;     /* [M, K] activation codes, interleaved */
    const float *xd;      /* [M, K/32] activation scales */
    const uint8_t *codes; /* uint8 [N, K/2], interleaved */
    const float *wd;      /* [N, K/32] weight scales */
    const int16_t *wsum;  /* [N, K/32] each weight block's sum of values */
    int64_t m, n, k;
} Matmul;

/* Where value i of a super-block lies in its interleaved layout. */
static inline int interleaved(int i) { return (i % BLOCK / 4) * BLOCK + (i / BLOCK) * 4 + i % 4; }

/* One row of activations: codes = round(x / d) with d = max |x| / 127 per block of 32, interleaved. */
static void quantize_row(const float *x, int64_t k, int8_t *q, float *d) {
    for (int64_t b = 0; b < k / BLOCK; b++) {
        const float *xb = x + b * BLOCK;
        float amax = 0.0f;
#pragma omp simd reduction(max : amax)
        for (int i = 0; i < BLOCK; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t *super = q + b / 8 * SUPER;
        const int first = (int)(b % 8) * BLOCK;
        for (int i = 0; i < BLOCK; i++) super[interleaved(first + i)] = (int8_t)lrintf(xb[i] * inv);
        d[b] = amax / 127.0f;
    }
}

/* Vector g (32 bytes) of super-block s of weight row n, as int8: byte 4j + v is value 4g + v of block j. */
static inline void weight_vector_portable(const Matmul *mm, int64_t n, int64_t s, int g, int8_t *w) {
    const uint8_t *packed = mm->codes + n * (mm->k / 2) + s * (SUPER / 2) + (g % 4) * BLOCK;
    for (int p = 0; p < BLOCK; p++) w[p] = (int8_t)((g < 4 ? packed[p] & 0x0F : packed[p] >> 4) - 8);
}

static void matmul_rows_portable(const Matmul *mm, int64_t n_first, int64_t n_last) {
    const int64_t blocks = mm->k / BLOCK, supers = mm->k / SUPER;
    int8_t w[BLOCK];
    for (int64_t n = n_first; n < n_last; n++) {
        for (int64_t m = 0; m < mm->m; m++) {
            float total = 0.0f;
            for (int64_t s = 0; s < supers; s++) {
                int32_t sums[8] = {0};
                for (int g = 0; g < 8; g++) {
                    weight_vector_portable(mm, n, s, g, w);
                    const int8_t *x = mm->xq + m * mm->k + s * SUPER + g * BLOCK;
                    for (int p = 0; p < BLOCK; p++) sums[p / 4] += (int32_t)w[p] * (int32_t)x[p];
                }
                for (int j = 0; j < 8; j++)
                    total += (float)sums[j] * (mm->wd[n * blocks + s * 8 + j] * mm->xd[m * blocks + s * 8 + j]);
            }
            mm->out[m * mm->n + n] = total;
        }
    }
}

static void (*matmul_rows)(const Matmul *, int64_t, int64_t) = matmul_rows_portable;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 "avx2,fma"
#define VNNI "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"

__attribute__((target(AVX2), always_inline)) static inline float sum8(__m256 v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
}

/* Vector g of super-block s of weight row n, as int8. */
#define WEIGHT_VECTOR(TARGET, SUFFIX)                                                                              \
    __attribute__((target(TARGET), always_inline)) static inline __m256i weight_vector_##SUFFIX(                   \
        const Matmul *mm, int64_t n, int64_t s, int g) {                                                           \
        const __m256i packed =                                                                                     \
            _mm256_loadu_si256((const __m256i *)(mm->codes + n * (mm->k / 2) + s * (SUPER / 2)) + g % 4);          \
        const __m256i nibbles = g < 4 ? packed : _mm256_srli_epi16(packed, 4);                                     \
        return _mm256_sub_epi8(_mm256_and_si256(nibbles, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));           \
    }

WEIGHT_VECTOR(AVX2, avx2)
WEIGHT_VECTOR(VNNI, vnni)

/* Asks for super-block s of the weight rows PREFETCH_ROWS further on: a thread walks its rows in order, but the
 * hardware prefetcher, seeing a few rows read side by side in short runs, fetches too little ahead of them. */
#define PREFETCH_ROWS 8
static inline void prefetch_ahead(const Matmul *mm, int64_t n0, const int RN) {
    const int64_t row_bytes = mm->k / 2;
    const int64_t first = n0 + PREFETCH_ROWS, last = first + RN < mm->n ? first + RN : mm->n;
    if (first >= last) return;
    const char *at = (const char *)mm->codes + first * row_bytes;
    for (int64_t o = 0; o < (last - first) * row_bytes; o += 64) __builtin_prefetch(at + o);
}

/* The 8 blocks' int32 sums of super-block s for weight rows n0 .. n0 + RN and activation rows m0 .. m0 + RM.
 * AVX2: |w| times x carrying w's sign (pair sums under 2^15). VNNI: (x + 128) as unsigned times w, the 128 * sum(w)
 * this adds taken off per block from the stored sums; one instruction per vector and pair of rows. */
__attribute__((target(AVX2), always_inline)) static inline void super_sums_avx2(const Matmul *mm, int64_t n0,
                                                                               int64_t m0, int64_t s, const int RN,
                                                                               const int RM,
                                                                               __m256i sums[4][ROWS_PER_TILE]) {
    for (int i = 0; i < RN; i++)
        for (int r = 0; r < RM; r++) sums[i][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        __m256i w[4], w_abs[4];
        for (int i = 0; i < RN; i++) {
            w[i] = weight_vector_avx2(mm, n0 + i, s, g);
            w_abs[i] = _mm256_sign_epi8(w[i], w[i]);
        }
        for (int r = 0; r < RM; r++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(mm->xq + (m0 + r) * mm->k + s * SUPER) + g);
            for (int i = 0; i < RN; i++) {
                const __m256i pairs = _mm256_maddubs_epi16(w_abs[i], _mm256_sign_epi8(x, w[i]));
                sums[i][r] = _mm256_add_epi32(sums[i][r], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
            }
        }
    }
}

__attribute__((target(VNNI), always_inline)) static inline void super_sums_vnni(const Matmul *mm, int64_t n0,
                                                                               int64_t m0, int64_t s, const int RN,
                                                                               const int RM,
                                                                               __m256i sums[4][ROWS_PER_TILE]) {
    const int64_t blocks = mm->k / BLOCK;
    for (int i = 0; i < RN; i++) {
        /* start from -128 * sum(w) per block */
        const __m128i block_sums = _mm_loadu_si128((const __m128i *)(mm->wsum + (n0 + i) * blocks + s * 8));
        const __m256i start = _mm256_sub_epi32(_mm256_setzero_si256(),
                                               _mm256_slli_epi32(_mm256_cvtepi16_epi32(block_sums), 7));
        for (int r = 0; r < RM; r++) sums[i][r] = start;
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        __m256i w[4];
        for (int i = 0; i < RN; i++) w[i] = weight_vector_vnni(mm, n0 + i, s, g);
        for (int r = 0; r < RM; r++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(mm->xq + (m0 + r) * mm->k + s * SUPER) + g);
            const __m256i x_unsigned = _mm256_xor_si256(x, _mm256_set1_epi8((char)0x80));
            for (int i = 0; i < RN; i++) sums[i][r] = _mm256_dpbusd_epi32(sums[i][r], x_unsigned, w[i]);
        }
    }
}

/* out[m0 .. m0 + RM, n0 .. n0 + RN]: each weight vector is loaded once for RM activation rows, each activation
 * vector once for RN weight rows. */
#define TILE(TARGET, SUFFIX)                                                                                       \
    __attribute__((target(TARGET), always_inline)) static inline void tile_##SUFFIX(                               \
        const Matmul *mm, int64_t n0, int64_t m0, const int RN, const int RM) {                    \
        const int64_t blocks = mm->k / BLOCK, supers = mm->k / SUPER;                                              \
        __m256 acc[4][ROWS_PER_TILE];                                                                              \
        __m256i sums[4][ROWS_PER_TILE];                                                                            \
        for (int i = 0; i < RN; i++)                                                                               \
            for (int r = 0; r < RM; r++) acc[i][r] = _mm256_setzero_ps();                                          \
        if (m0 == 0) prefetch_ahead(mm, n0, RN);                                                                   \
        for (int64_t s = 0; s < supers; s++) {                                                                     \
            super_sums_##SUFFIX(mm, n0, m0, s, RN, RM, sums);                                                \
            for (int r = 0; r < RM; r++) {                                                                         \
                const __m256 x_scale = _mm256_loadu_ps(mm->xd + (m0 + r) * blocks + s * 8);                        \
                for (int i = 0; i < RN; i++) {                                                                     \
                    const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(mm->wd + (n0 + i) * blocks + s * 8), x_scale); \
                    acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i][r]), scale, acc[i][r]);                 \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        for (int i = 0; i < RN; i++)                                                                               \
            for (int r = 0; r < RM; r++) mm->out[(m0 + r) * mm->n + n0 + i] = sum8(acc[i][r]);                     \
    }                                                                                                              \
    __attribute__((target(TARGET), always_inline)) static inline void tiles_##SUFFIX(                              \
        const Matmul *mm, int64_t n0, const int RN) {                                              \
        int64_t m0 = 0;                                                                                            \
        for (; m0 + ROWS_PER_TILE <= mm->m; m0 += ROWS_PER_TILE) tile_##SUFFIX(mm, n0, m0, RN, ROWS_PER_TILE); \
        switch (mm->m - m0) {                                                                                      \
        case 3: tile_##SUFFIX(mm, n0, m0, RN, 3); break;                                                     \
        case 2: tile_##SUFFIX(mm, n0, m0, RN, 2); break;                                                     \
        case 1: tile_##SUFFIX(mm, n0, m0, RN, 1); break;                                                     \
        default: break;                                                                                            \
        }                                                                                                          \
    }                                                                                                              \
    __attribute__((target(TARGET))) static void matmul_rows_##SUFFIX(const Matmul *mm, int64_t n_first,           \
                                                                     int64_t n_last) {                             \
        int64_t n = n_first;                                                                                       \
        if (mm->m < ROWS_PER_TILE) /* few rows: more weight rows per tile keep more multiply-add chains going */   \
            for (; n + 4 <= n_last; n += 4) tiles_##SUFFIX(mm, n, 4);                                        \
        for (; n + 2 <= n_last; n += 2) tiles_##SUFFIX(mm, n, 2);                                            \
        if (n < n_last) tiles_##SUFFIX(mm, n, 1);                                                            \
    }

TILE(AVX2, avx2)
TILE(VNNI, vnni)
#endif

/* Fewer threads than cores for a small matmul: a share of a few rows costs more to hand out than to compute. */
static int threads_for(int64_t work, int64_t per_thread_at_least) {
    const int64_t most = omp_get_max_threads(), useful = work / per_thread_at_least;
    return (int)(useful < 1 ? 1 : useful < most ? useful : most);
}

static PyObject *matmul(PyObject *self, PyObject *args) {
    Py_ssize_t out, x, codes, scales, sums;
    Matmul mm;
    if (!PyArg_ParseTuple(args, "nnnnnLLL", &out, &x, &codes, &scales, &sums, &mm.m, &mm.n, &mm.k)) return NULL;
    if (mm.k % SUPER != 0) {
        PyErr_SetString(PyExc_ValueError, "in_features must be a multiple of 256");
        return NULL;
    }
    const int64_t blocks = mm.k / BLOCK;
    int8_t *xq = malloc((size_t)(mm.m * mm.k) + sizeof(float) * (size_t)(mm.m * blocks));
    if (xq == NULL) return PyErr_NoMemory();
    float *xd = (float *)(xq + mm.m * mm.k); /* K is a multiple of 32: the scales stay 4-byte aligned */
    mm.out = (float *)out;
    mm.xq = xq;
    mm.xd = xd;
    mm.codes = (const uint8_t *)codes;
    mm.wd = (const float *)scales;
    mm.wsum = (const int16_t *)sums;
    const float *input = (const float *)x;
    Py_BEGIN_ALLOW_THREADS;
#pragma omp parallel for num_threads(threads_for(mm.m, 8)) schedule(static)
    for (int64_t m = 0; m < mm.m; m++) quantize_row(input + m * mm.k, mm.k, xq + m * mm.k, xd + m * blocks);
#pragma omp parallel num_threads(threads_for(mm.n * mm.m * blocks, 4096))
    {
        const int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        matmul_rows(&mm, mm.n * t / count, mm.n * (t + 1) / count);
    }
    Py_END_ALLOW_THREADS;
    free(xq);
    Py_RETURN_NONE;
}

static PyObject *kernel_name(PyObject *self, PyObject *unused) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (matmul_rows == matmul_rows_vnni) return PyUnicode_FromString("avx512-vnni");
    if (matmul_rows == matmul_rows_avx2) return PyUnicode_FromString("avx2");
#endif
    return PyUnicode_FromString("portable");
}

static PyMethodDef methods[] = {
    {"matmul", matmul, METH_VARARGS,
     "matmul(out, x, codes, scales, sums, m, n, k): out[m, n] = x[m, k] @ dequantized(codes, scales)[n, k]^T "
     "(pointers as ints; float32 out, x and scales, int16 block sums)."},
    {"kernel_name", kernel_name, METH_NOARGS, "which instruction set the products run on here"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_block_matmul", NULL, -1, methods};

PyMODINIT_FUNC PyInit__block_matmul(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        matmul_rows = matmul_rows_avx2;
        if (__builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) matmul_rows = matmul_rows_vnni;
    }
#endif
    return PyModule_Create(&module);
}
