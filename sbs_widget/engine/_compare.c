/* The error figures of many float32 pairs in one pass each, without the GIL.
 *
 * Why C: a run compares ~1,000 pairs of a few thousand elements. In numpy, even batched, each figure
 * is its own pass over memory (subtract, abs, max, divide, square, sum, three counts: ~12 passes) and
 * the main thread holds the GIL throughout; here every figure comes from one read of both values.
 *
 * Same figures as ``metrics.compute_errors`` on float32 pairs, computed in float32 like numpy does
 * (|diff|, the tolerance test, the relative error, the counts and histogram edges), except the sum of
 * squares, accumulated in double (numpy's float32 sums are the less accurate ones). A pair holding
 * NaN/Inf is answered None: the caller takes numpy's path for it.
 * Built with -ffp-contract=off: a fused multiply-add would round the tolerance test differently.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <string.h>

#define N_EDGES 10 /* metrics.HISTOGRAM_EDGES: 0, 1e-7, ..., 10 (the last bucket is open) */

typedef struct {
    float top, rel, slack, scale; /* max |diff|, max relative, max (|diff| - rtol |e|), max |e| */
    double sumsq;
    Py_ssize_t viol, h01, h001;
    Py_ssize_t hist[N_EDGES];
    int finite;
} Figures;

/* A buffer of native float32 values ("<f" is native only on little-endian machines). */
static int is_float32(const Py_buffer *view) {
    const char *f = view->format;
    return view->itemsize == 4 && f != NULL &&
           (strcmp(f, "f") == 0 || strcmp(f, "=f") == 0 || (PY_LITTLE_ENDIAN && strcmp(f, "<f") == 0) ||
            (!PY_LITTLE_ENDIAN && strcmp(f, ">f") == 0));
}

/* Reads ``obj``'s float32 buffer into ``view``; a strided one (a transposed or expanded torch view)
 * gets ``*copy``, room for its values in C order, filled by ``gather`` (freed by the caller).
 * 0 when it is not a float32 buffer. */
static int readable(PyObject *obj, Py_buffer *view, float **copy) {
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (!is_float32(view) || view->ndim > 32)
        return 0;
    if (!PyBuffer_IsContiguous(view, 'C')) {
        *copy = PyMem_RawMalloc(view->len ? view->len : 1);
        if (*copy == NULL)
            return 0;
    }
    return 1;
}

/* A strided buffer's values in C order: an odometer over the outer axes, a strided loop over the
 * last one. Runs without the GIL (PyBuffer_ToContiguous would need it). */
static void gather(const Py_buffer *view, float *dst) {
    int nd = view->ndim;
    Py_ssize_t index[32] = {0};
    Py_ssize_t inner = view->shape[nd - 1], step = view->strides[nd - 1];
    Py_ssize_t rows = inner ? view->len / 4 / inner : 0;
    const char *row = (const char *)view->buf;
    for (Py_ssize_t r = 0; r < rows; r++) {
        for (Py_ssize_t j = 0; j < inner; j++)
            *dst++ = *(const float *)(row + j * step);
        for (int axis = nd - 2; axis >= 0; axis--) { /* next row: carry like an odometer */
            row += view->strides[axis];
            if (++index[axis] < view->shape[axis])
                break;
            row -= view->strides[axis] * view->shape[axis];
            index[axis] = 0;
        }
    }
}

static const float *data(const Py_buffer *view, const float *copy) {
    return copy != NULL ? copy : (const float *)view->buf;
}

#define LANES 16 /* independent accumulators: the compiler turns each loop below into SIMD code */
#define FOLD 16  /* blocks of LANES values summed in float32 before they join the double total */

/* AVX2 code where the CPU has it, chosen when the module loads (GCC/clang on Linux: needs ifunc) */
#if defined(__x86_64__) && defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 14 : defined(__GNUC__))
#define SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SIMD_CLONES
#endif

/* One pass over a pair: every figure but the histogram. */
SIMD_CLONES
static void measure(const float *e, const float *g, Py_ssize_t n, float atol, float rtol, Figures *f) {
    const float eps = 1e-6f, tenth = 0.1f, hundredth = 0.01f;
    float top[LANES] = {0}, rel[LANES] = {0}, sq[LANES] = {0}, slack[LANES] = {0}, scale[LANES] = {0};
    int bad[LANES] = {0}, viol[LANES] = {0}, h01[LANES] = {0}, h001[LANES] = {0};
    float tail_e[LANES] = {0}, tail_g[LANES] = {0}; /* the last values, padded with zeros (neutral) */
    double sumsq = 0.0;
    Py_ssize_t nviol = 0, n01 = 0, n001 = 0;
    int finite = 1, blocks = 0;
    for (Py_ssize_t i = 0; i < n; i += LANES) {
        const float *pe = e + i, *pg = g + i;
        if (n - i < LANES) {
            memcpy(tail_e, pe, (size_t)(n - i) * sizeof(float));
            memcpy(tail_g, pg, (size_t)(n - i) * sizeof(float));
            pe = tail_e;
            pg = tail_g;
        }
        for (int j = 0; j < LANES; j++) {
            float d = fabsf(pe[j] - pg[j]);
            float a = fabsf(pe[j]);
            float limit = a * rtol;
            limit = limit + atol;
            float r = d / (a < eps ? eps : a);
            float over = d - a * rtol; /* the atol this element needs */
            bad[j] |= !(d <= FLT_MAX); /* NaN or Inf: numpy's path counts such positions */
            top[j] = d > top[j] ? d : top[j];
            rel[j] = r > rel[j] ? r : rel[j];
            slack[j] = over > slack[j] ? over : slack[j];
            scale[j] = a > scale[j] ? a : scale[j];
            sq[j] += d * d;
            viol[j] += d > limit;
            h01[j] += d > tenth;
            h001[j] += d > hundredth;
        }
        /* float32 sums of squares stay short (accurate), int counts far from overflow */
        if (++blocks == FOLD || i + LANES >= n) {
            for (int j = 0; j < LANES; j++) {
                sumsq += sq[j];
                nviol += viol[j];
                n01 += h01[j];
                n001 += h001[j];
                finite &= !bad[j];
                sq[j] = 0.0f;
                viol[j] = h01[j] = h001[j] = 0;
            }
            blocks = 0;
        }
    }
    float t = 0.0f, rl = 0.0f, sl = 0.0f, sc = 0.0f;
    for (int j = 0; j < LANES; j++) {
        t = top[j] > t ? top[j] : t;
        rl = rel[j] > rl ? rel[j] : rl;
        sl = slack[j] > sl ? slack[j] : sl;
        sc = scale[j] > sc ? scale[j] : sc;
    }
    f->top = t;
    f->rel = rl;
    f->slack = sl;
    f->scale = sc;
    f->sumsq = sumsq;
    f->viol = nviol;
    f->h01 = n01;
    f->h001 = n001;
    f->finite = finite;
}

/* How many values have |diff| >= edge. */
SIMD_CLONES
static Py_ssize_t count_at_or_above(const float *e, const float *g, Py_ssize_t n, float edge) {
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        count += fabsf(e[i] - g[i]) >= edge;
    return count;
}

/* The histogram, once ``measure`` gave the largest |diff|: edges above it cost nothing, so agreeing
 * values (the common case) take one or two passes over data still in cache. */
static void fill_histogram(const float *e, const float *g, Py_ssize_t n, const float *edges, Figures *f) {
    Py_ssize_t above[N_EDGES + 1] = {0}; /* above[b]: values with |diff| >= edges[b] */
    above[0] = n;
    for (int b = 1; b < N_EDGES && edges[b] <= f->top; b++)
        above[b] = count_at_or_above(e, g, n, edges[b]);
    for (int b = 0; b < N_EDGES; b++)
        f->hist[b] = above[b] - above[b + 1];
}

/* An instance of ``errors_type`` (metrics.Errors, a tuple subclass) holding ``items``: what
 * ``tuple.__new__(Errors, items)`` makes, without a Python call. Steals the references. */
static PyObject *new_errors(PyTypeObject *errors_type, PyObject **items, Py_ssize_t n) {
    PyObject *obj = errors_type->tp_alloc(errors_type, n);
    if (obj == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(obj, i, items[i]);
    return obj;
}

static PyObject *figures_to_errors(PyTypeObject *errors_type, const Figures *f, Py_ssize_t n, double atol,
                                   int histogram) {
    PyObject *items[12];
    int zero = f->top == 0.0f;
    items[0] = PyFloat_FromDouble(zero ? 0.0 : (double)f->top);
    items[1] = PyFloat_FromDouble(zero ? 0.0 : (double)f->rel);
    items[2] = PyFloat_FromDouble(zero ? 0.0 : sqrt(f->sumsq / (double)n));
    items[3] = PyLong_FromLong(0);
    items[4] = PyLong_FromSsize_t(f->h01);
    items[5] = PyLong_FromSsize_t(f->h001);
    items[6] = PyLong_FromSsize_t(n);
    items[7] = PyBool_FromLong(zero || (double)f->top <= atol || f->viol == 0);
    if (histogram) {
        items[8] = PyTuple_New(N_EDGES);
        for (int b = 0; items[8] != NULL && b < N_EDGES; b++) {
            PyObject *count = PyLong_FromSsize_t(f->hist[b]);
            if (count == NULL)
                Py_CLEAR(items[8]);
            else
                PyTuple_SET_ITEM(items[8], b, count);
        }
    } else {
        items[8] = Py_NewRef(Py_None);
    }
    items[9] = PyFloat_FromDouble(zero ? 0.0 : (double)f->slack);
    items[10] = PyFloat_FromDouble((double)f->scale);
    items[11] = PyLong_FromSsize_t(n); /* n_finite: this pass answers only pairs finite everywhere */
    for (int i = 0; i < 12; i++)
        if (items[i] == NULL) {
            for (int j = 0; j < 12; j++)
                Py_XDECREF(items[j]);
            return NULL;
        }
    return new_errors(errors_type, items, 12);
}

PyDoc_STRVAR(errors_f32_doc,
             "errors_f32(errors_type, expected, got, atol, rtol, histogram, edges) -> list\n\n"
             "For each pair of float32 arrays (two lists of equal length, arrays of equal size), an\n"
             "``errors_type`` instance, or None where numpy's path must answer (NaN/Inf,\n"
             "not float32). ``edges``: the histogram's left edges (metrics.HISTOGRAM_EDGES).");

static PyObject *errors_f32(PyObject *self, PyObject *args) {
    PyObject *errors_type, *expected, *got, *edges_seq;
    double atol_d, rtol_d;
    int histogram;
    if (!PyArg_ParseTuple(args, "O!O!O!ddpO", &PyType_Type, &errors_type, &PyList_Type, &expected, &PyList_Type,
                          &got, &atol_d, &rtol_d, &histogram, &edges_seq))
        return NULL;
    Py_ssize_t k = PyList_GET_SIZE(expected);
    if (PyList_GET_SIZE(got) != k) {
        PyErr_SetString(PyExc_ValueError, "expected and got must have the same length");
        return NULL;
    }
    float edges[N_EDGES];
    PyObject *fast = PySequence_Fast(edges_seq, "edges must be a sequence");
    if (fast == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != N_EDGES) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "edges must hold %d values", N_EDGES);
        return NULL;
    }
    for (int b = 0; b < N_EDGES; b++)
        edges[b] = (float)PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, b));
    Py_DECREF(fast);
    if (PyErr_Occurred())
        return NULL;

    Py_buffer *views = PyMem_Calloc(2 * (size_t)(k ? k : 1), sizeof(Py_buffer));
    float **copies = PyMem_Calloc(2 * (size_t)(k ? k : 1), sizeof(float *));
    Figures *figures = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Figures));
    char *usable = PyMem_Calloc((size_t)(k ? k : 1), 1);
    PyObject *out = NULL;
    if (views == NULL || copies == NULL || figures == NULL || usable == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!(readable(PyList_GET_ITEM(expected, i), &views[2 * i], &copies[2 * i]) &&
              readable(PyList_GET_ITEM(got, i), &views[2 * i + 1], &copies[2 * i + 1])))
            continue;
        usable[i] = views[2 * i].len == views[2 * i + 1].len && views[2 * i].len > 0;
    }
    float atol = (float)atol_d, rtol = (float)rtol_d;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < 2 * k; i++)
        if (copies[i] != NULL && usable[i / 2])
            gather(&views[i], copies[i]);
    for (Py_ssize_t i = 0; i < k; i++)
        if (usable[i])
        {
            const float *e = data(&views[2 * i], copies[2 * i]), *g = data(&views[2 * i + 1], copies[2 * i + 1]);
            measure(e, g, views[2 * i].len / 4, atol, rtol, &figures[i]);
            if (histogram && figures[i].finite)
                fill_histogram(e, g, views[2 * i].len / 4, edges, &figures[i]);
        }
    Py_END_ALLOW_THREADS

    out = PyList_New(k);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *item;
        if (usable[i] && figures[i].finite) {
            item = figures_to_errors((PyTypeObject *)errors_type, &figures[i], views[2 * i].len / 4, atol_d, histogram);
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        } else {
            item = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(out, i, item);
    }
done:
    if (views != NULL)
        for (Py_ssize_t i = 0; i < 2 * k; i++)
            if (views[i].obj != NULL)
                PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    if (copies != NULL)
        for (Py_ssize_t i = 0; i < 2 * k; i++)
            PyMem_RawFree(copies[i]);
    PyMem_Free(copies);
    PyMem_Free(figures);
    PyMem_Free(usable);
    return out;
}

static PyMethodDef methods[] = {
    {"errors_f32", errors_f32, METH_VARARGS, errors_f32_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sbs_widget._compare",
    "The error figures of float32 pairs, one pass each, without the GIL (see metrics.compute_errors_many).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__compare(void) { return PyModule_Create(&module); }
