/* The rounding verdict of one pair (``noise.judge``) in two passes over memory, without the GIL.
 *
 * Why C: a pair beyond tolerance is judged element by element against a float64 reference, with
 * torch's largest error over the elements of comparable magnitude (binned by binary exponent). In
 * numpy that is ~15 passes and temporaries of the value's size in float64 (a convolution's output:
 * ~1.3 ms); here one SIMD pass gives the maxima, the elements over the first bound (few) and the
 * comparable error of every element no larger than the median; only when a larger element is over
 * the first bound does a second pass bin torch's errors by exponent.
 *
 * Same figures as numpy's path in ``noise.judge`` (all in double, -ffp-contract=off so that no fused
 * multiply-add rounds a bound differently): torch and onnx values as float32 (float16/bfloat16
 * widened exactly by the caller), the reference as float64. A pair holding NaN/Inf is answered None:
 * numpy's path judges where the non-finite values sit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* frexp exponents of doubles (-1073..1024) shifted to 1..; bin 0 holds the zeros (lowest). */
#define EXP_OFFSET 1075
#define N_BINS (EXP_OFFSET + 1025)
#define SAMPLE 8192 /* noise._comparable_error: the median of a strided sample of |R| is the cut */

static int exponent_bin(double a) {
    if (a == 0.0)
        return 0;
    uint64_t bits;
    memcpy(&bits, &a, sizeof bits);
    int biased = (int)((bits >> 52) & 0x7ff);
    if (biased == 0) { /* subnormal */
        int e;
        frexp(a, &e);
        return e + EXP_OFFSET;
    }
    return biased - 1022 + EXP_OFFSET;
}

static int is_format(const Py_buffer *view, char code, Py_ssize_t size) {
    const char *f = view->format;
    if (view->itemsize != size || f == NULL)
        return 0;
    if (f[0] == code && f[1] == 0)
        return 1;
    if (f[0] == '=' && f[1] == code && f[2] == 0)
        return 1;
    return PY_LITTLE_ENDIAN && f[0] == '<' && f[1] == code && f[2] == 0;
}

/* k-th smallest of a[0..n) (reorders a): quickselect, Hoare partition. */
static double select_kth(double *a, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        double pivot = a[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (a[j] > pivot)
                j--;
            if (i <= j) {
                double tmp = a[i];
                a[i] = a[j];
                a[j] = tmp;
                i++;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return a[k];
    }
    return a[k];
}

/* numpy.median of a[0..n): the mean of the two middle values when n is even. */
static double median(double *a, Py_ssize_t n) {
    double upper = select_kth(a, n, n / 2);
    if (n % 2)
        return upper;
    double lower = a[0]; /* the largest of those select_kth left before the middle */
    for (Py_ssize_t i = 1; i < n / 2; i++)
        lower = a[i] > lower ? a[i] : lower;
    return (lower + upper) / 2.0;
}

typedef struct {
    double err_torch, err_onnx, scale, excess;
    double top_over;   /* the largest |R| among the elements over the first bound */
    double comparable; /* torch's largest error over the elements with |R| < below (and the zeros) */
    Py_ssize_t n_over;
    int finite;
} Judged;

#define LANES 8 /* independent accumulators: the compiler turns the first pass into SIMD code */

/* AVX2 code where the CPU has it, chosen when the module loads (GCC/clang on Linux: needs ifunc) */
#if defined(__x86_64__) && defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 14 : defined(__GNUC__))
#define SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SIMD_CLONES
#endif

/* The one pass over every element, branch-free within a block of LANES: the maxima, whether all is
 * finite (a non-finite value makes a lane's running sum NaN), how many elements exceed the first
 * bound (FACTOR * e_t + ULPS * eps * |R|) and in which blocks (``blocks``: their first indices), the
 * largest |R| among them, and torch's largest error below ``below``. */
SIMD_CLONES
static Py_ssize_t one_pass(const float *t, const float *o, const double *r, Py_ssize_t n, double factor,
                           double unit, double below, Py_ssize_t *blocks, Judged *out) {
    double top_t[LANES] = {0}, top_o[LANES] = {0}, top_r[LANES] = {0}, poison[LANES] = {0};
    double top_over[LANES] = {0}, comparable[LANES] = {0};
    Py_ssize_t over[LANES] = {0}, n_blocks = 0, i = 0;
#define ELEMENT(j, k)                                                                                   \
    double ti = t[k], oi = o[k], ri = r[k];                                                           \
    double ar = fabs(ri), et = fabs(ti - ri), eo = fabs(oi - ri);                                     \
    poison[j] += (ti - ti) + (oi - oi) + (ri - ri);                                                   \
    top_t[j] = et > top_t[j] ? et : top_t[j];                                                         \
    top_o[j] = eo > top_o[j] ? eo : top_o[j];                                                         \
    top_r[j] = ar > top_r[j] ? ar : top_r[j];                                                         \
    comparable[j] = ((ar < below) | (ar == 0.0)) & (et > comparable[j]) ? et : comparable[j];         \
    int beyond = eo > factor * et + unit * ar;                                                        \
    over[j] += beyond;                                                                                \
    top_over[j] = beyond & (ar > top_over[j]) ? ar : top_over[j];
    for (; i + LANES <= n; i += LANES) {
        int any = 0;
        for (int j = 0; j < LANES; j++) {
            ELEMENT(j, i + j)
            any |= beyond;
        }
        if (any) /* rare: only elements near zero, or a fault */
            blocks[n_blocks++] = i;
    }
    if (i < n) {
        int any = 0;
        for (Py_ssize_t k = i; k < n; k++) {
            ELEMENT(0, k)
            any |= beyond;
        }
        if (any)
            blocks[n_blocks++] = i;
    }
#undef ELEMENT
    out->err_torch = out->err_onnx = out->scale = out->top_over = out->comparable = 0.0;
    out->finite = 1;
    out->n_over = 0;
    for (int j = 0; j < LANES; j++) {
        out->finite &= poison[j] == 0.0;
        out->err_torch = top_t[j] > out->err_torch ? top_t[j] : out->err_torch;
        out->err_onnx = top_o[j] > out->err_onnx ? top_o[j] : out->err_onnx;
        out->scale = top_r[j] > out->scale ? top_r[j] : out->scale;
        out->top_over = top_over[j] > out->top_over ? top_over[j] : out->top_over;
        out->comparable = comparable[j] > out->comparable ? comparable[j] : out->comparable;
        out->n_over += over[j];
    }
    return n_blocks;
}

/* e_o over the bound that torch's error, or ``comparable`` where larger, allows. */
static double ratio_at(const float *t, const float *o, const double *r, Py_ssize_t i, double factor, double unit,
                       double comparable) {
    double ri = r[i], ar = fabs(ri), et = fabs((double)t[i] - ri), eo = fabs((double)o[i] - ri);
    double bound = factor * et + unit * ar;
    if (!(eo > bound))
        return 0.0;
    double slack = comparable - et;
    return eo / (bound + factor * (slack > 0.0 ? slack : 0.0));
}

/* The comparable error of |R| up to ``limit``: torch's largest error at or below its exponent. */
static double comparable_at(const double *binmax, double limit) { return binmax[exponent_bin(limit)]; }

/* sample: room for 2 * SAMPLE values (the stride n / SAMPLE, at least 1, leaves fewer); blocks: room
 * for n / LANES + 1 indices. */
static void judge_pair(const float *t, const float *o, const double *r, Py_ssize_t n, double eps, double factor,
                       double ulps, double *sample, Py_ssize_t *blocks, Judged *out) {
    double unit = ulps * eps;
    /* the cut first (cheap: a strided sample), so that the one pass also gets the comparable error of
     * every element no larger than the cut: torch's largest below the cut's exponent */
    Py_ssize_t step = n / SAMPLE > 1 ? n / SAMPLE : 1, m = 0;
    for (Py_ssize_t i = 0; i < n; i += step)
        sample[m++] = fabs(r[i]);
    double cut = m ? median(sample, m) : 0.0;
    int e = 0;
    if (cut > 0.0)
        frexp(cut, &e);
    double below = cut > 0.0 ? ldexp(1.0, e) : 0.0; /* |R| < 2**e: binary exponent at most e */
    Py_ssize_t n_blocks = one_pass(t, o, r, n, factor, unit, below, blocks, out);
    if (!out->finite)
        return;
    if (out->n_over == 0) {
        out->excess = n ? 1.0 : 0.0;
        return;
    }
    double excess = 0.0;
    if (out->top_over <= cut) { /* the usual case: all over the first bound are small, one comparable */
        for (Py_ssize_t b = 0; b < n_blocks; b++)
            for (Py_ssize_t i = blocks[b]; i < blocks[b] + LANES && i < n; i++) {
                double ratio = ratio_at(t, o, r, i, factor, unit, out->comparable);
                excess = ratio > excess ? ratio : excess;
            }
        out->excess = excess;
        return;
    }
    /* Larger elements over the first bound: torch's largest error per binary exponent of |R|, then a
     * running max (the largest at or below each exponent). */
    double binmax[N_BINS];
    for (int b = 0; b < N_BINS; b++)
        binmax[b] = -1.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double et = fabs((double)t[i] - r[i]);
        int b = exponent_bin(fabs(r[i]));
        if (et > binmax[b])
            binmax[b] = et;
    }
    for (int b = 1; b < N_BINS; b++)
        if (binmax[b - 1] > binmax[b])
            binmax[b] = binmax[b - 1];
    for (Py_ssize_t b = 0; b < n_blocks; b++)
        for (Py_ssize_t i = blocks[b]; i < blocks[b] + LANES && i < n; i++) {
            double ar = fabs(r[i]);
            double ratio = ratio_at(t, o, r, i, factor, unit, comparable_at(binmax, ar > cut ? ar : cut));
            excess = ratio > excess ? ratio : excess;
        }
    out->excess = excess;
}

PyDoc_STRVAR(judge_f32_doc,
             "judge_f32(torch, onnx, reference, eps, factor, ulps) -> (err_torch, err_onnx, scale, excess) | None\n\n"
             "torch and onnx: C-contiguous float32 buffers, reference: float64, all of one size. None when\n"
             "an element is NaN/Inf on any side (numpy's path judges those).");

static PyObject *judge_f32(PyObject *self, PyObject *args) {
    PyObject *objs[3];
    double eps, factor, ulps;
    if (!PyArg_ParseTuple(args, "OOOddd", &objs[0], &objs[1], &objs[2], &eps, &factor, &ulps))
        return NULL;
    Py_buffer views[3];
    memset(views, 0, sizeof views);
    PyObject *result = NULL;
    int got = 0;
    for (; got < 3; got++)
        if (PyObject_GetBuffer(objs[got], &views[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
    if (!is_format(&views[0], 'f', 4) || !is_format(&views[1], 'f', 4) || !is_format(&views[2], 'd', 8)) {
        PyErr_SetString(PyExc_TypeError, "judge_f32 takes float32, float32, float64 buffers");
        goto done;
    }
    Py_ssize_t n = views[0].len / 4;
    if (views[1].len / 4 != n || views[2].len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "judge_f32: the three arrays must have the same size");
        goto done;
    }
    double *sample = PyMem_RawMalloc(2 * SAMPLE * sizeof(double));
    Py_ssize_t *blocks = PyMem_RawMalloc((size_t)(n / LANES + 1) * sizeof(Py_ssize_t));
    if (sample == NULL || blocks == NULL) {
        PyMem_RawFree(sample);
        PyMem_RawFree(blocks);
        PyErr_NoMemory();
        goto done;
    }
    Judged j;
    Py_BEGIN_ALLOW_THREADS
    judge_pair(views[0].buf, views[1].buf, views[2].buf, n, eps, factor, ulps, sample, blocks, &j);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(sample);
    PyMem_RawFree(blocks);
    result = j.finite ? Py_BuildValue("(dddd)", j.err_torch, j.err_onnx, j.scale, j.excess) : Py_NewRef(Py_None);
done:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"judge_f32", judge_f32, METH_VARARGS, judge_f32_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sbs_widget.engine._noise",
    "The rounding verdict of a float32 pair against a float64 reference (see noise.judge).", -1, methods,
};

PyMODINIT_FUNC PyInit__noise(void) { return PyModule_Create(&module); }
