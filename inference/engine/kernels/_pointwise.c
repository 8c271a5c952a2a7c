/* The decoder layer's row-wise work on float32 rows, one pass per row and one call per layer step (pointwise.py):
 * RMSNorm, optionally with the residual add that precedes it, and SwiGLU's silu(gate) * up.
 *
 * torch's CPU rms_norm is composite: pow, mean (a sum and a division), add, rsqrt and two multiplies, seven kernel
 * launches per call; SwiGLU is a split, a silu and a multiply; the residual add is one more. At decode sizes each
 * launch costs tens of microseconds of dispatch where the arithmetic takes one, on every layer of every step
 * (docs/performance.md). Rows are shared among torch's own OpenMP threads when there are enough of them (the
 * extension links the libgomp torch has loaded, as _paged_attention.c does).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "_fast_exp.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* Elements below which a call stays on the calling thread: waking the pool costs more than the work. */
#define THREADED_ELEMENTS (1 << 16)

/* out = x / sqrt(mean(x^2) + eps) * weight; with `residual`, x += residual first (x is written back). */
MULTIVERSION
static void normalize_row(float *out, float *x, const float *residual, const float *weight, int64_t dim, float eps) {
    float squares = 0.0f;
    if (residual != NULL) {
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < dim; i++) {
            x[i] += residual[i];
            squares += x[i] * x[i];
        }
    } else {
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < dim; i++) squares += x[i] * x[i];
    }
    const float scale = 1.0f / sqrtf(squares / (float)dim + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; i++) out[i] = x[i] * scale * weight[i];
}

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). */
MULTIVERSION
static void swiglu_row(float *out, const float *gate, const float *up, int64_t width) {
#pragma omp simd
    for (int64_t i = 0; i < width; i++) out[i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
}

/* swiglu_row with AVX2 + FMA, eight values at a time through fast_exp8 (the compiler leaves swiglu_row scalar:
 * _fast_exp.h), the tail through swiglu_row. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void swiglu_row_avx2(float *out, const float *gate, const float *up,
                                                               int64_t width) {
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 exp_minus_g = fast_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_minus_g));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    swiglu_row(out + i, gate + i, up + i, width - i);
}
#endif

/* The SwiGLU row this CPU runs (set at import). */
static void (*swiglu_rows)(float *, const float *, const float *, int64_t) = swiglu_row;

static PyObject *rms_norm(PyObject *self, PyObject *args) {
    Py_ssize_t out, x, residual, weight;
    long long rows, dim;
    float eps;
    if (!PyArg_ParseTuple(args, "nnnnLLf", &out, &x, &residual, &weight, &rows, &dim, &eps)) return NULL;
    float *o = (float *)out, *in = (float *)x;
    const float *add = (const float *)residual, *w = (const float *)weight;
    const int threads = rows * dim >= THREADED_ELEMENTS ? omp_get_max_threads() : 1;
    Py_BEGIN_ALLOW_THREADS;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; r++)
        normalize_row(o + r * dim, in + r * dim, add == NULL ? NULL : add + r * dim, w, dim, eps);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyObject *swiglu(PyObject *self, PyObject *args) {
    Py_ssize_t out, gate_up;
    long long rows, width;
    if (!PyArg_ParseTuple(args, "nnLL", &out, &gate_up, &rows, &width)) return NULL;
    float *o = (float *)out;
    const float *in = (const float *)gate_up;
    const int threads = rows * width >= THREADED_ELEMENTS ? omp_get_max_threads() : 1;
    Py_BEGIN_ALLOW_THREADS;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; r++) swiglu_rows(o + r * width, in + 2 * r * width, in + (2 * r + 1) * width, width);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rms_norm", rms_norm, METH_VARARGS,
     "rms_norm(out, x, residual, weight, rows, dim, eps): out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, after "
     "x[r] += residual[r] unless residual is 0 (float32 pointers as ints)."},
    {"swiglu", swiglu, METH_VARARGS,
     "swiglu(out, gate_up, rows, width): out[r] = silu(gate_up[r, :width]) * gate_up[r, width:] (float32 pointers as "
     "ints)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pointwise", NULL, -1, methods};

PyMODINIT_FUNC PyInit__pointwise(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) swiglu_rows = swiglu_row_avx2;
#endif
    return PyModule_Create(&module);
}
