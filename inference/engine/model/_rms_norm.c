/* RMSNorm of float32 rows in one pass per row (rms_norm.py): out = x / sqrt(mean(x^2) + eps) * weight.
 *
 * torch's CPU rms_norm is composite: pow, mean (a sum and a division), add, rsqrt and two multiplies, seven kernel
 * launches per call, which at one decode row costs tens of microseconds where the arithmetic takes one, and a
 * decode step runs two norms per layer (docs/performance.md). Rows are shared among torch's own OpenMP threads when
 * there are enough of them (the extension links the libgomp torch has loaded, as _paged_attention.c does).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

MULTIVERSION
static void normalize_row(float *out, const float *x, const float *weight, int64_t dim, float eps) {
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < dim; i++) squares += x[i] * x[i];
    const float scale = 1.0f / sqrtf(squares / (float)dim + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; i++) out[i] = x[i] * scale * weight[i];
}

static PyObject *rms_norm(PyObject *self, PyObject *args) {
    Py_ssize_t out, x, weight;
    long long rows, dim;
    float eps;
    if (!PyArg_ParseTuple(args, "nnnLLf", &out, &x, &weight, &rows, &dim, &eps)) return NULL;
    float *o = (float *)out;
    const float *in = (const float *)x, *w = (const float *)weight;
    const int threads = rows * dim >= (1 << 16) ? omp_get_max_threads() : 1;
    Py_BEGIN_ALLOW_THREADS;
    if (threads == 1) {
        for (int64_t r = 0; r < rows; r++) normalize_row(o + r * dim, in + r * dim, w, dim, eps);
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t r = 0; r < rows; r++) normalize_row(o + r * dim, in + r * dim, w, dim, eps);
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rms_norm", rms_norm, METH_VARARGS,
     "rms_norm(out, x, weight, rows, dim, eps): out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (float32 pointers "
     "as ints)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rms_norm", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rms_norm(void) { return PyModule_Create(&module); }
