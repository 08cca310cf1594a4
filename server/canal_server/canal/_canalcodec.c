/* canal_server.canal._canalcodec: Canal's Entry bytes written in C (see canal/_native.py).
 *
 * Plan(spec) holds one table's columns as _native.plan_spec gives them: per column a
 * kind (how its value becomes Canal's text), the Python text function (for values the
 * C code does not format itself) and every constant byte of its Column message,
 * precomputed by _wire for the three ways a column appears (before image, after image
 * not updated, after image updated): the fields before the value (index, name, isKey,
 * mysqlType, sqlType, updated, isNull) and the whole message of a NULL.
 *
 * Encoder(...).encode(entries) writes the serialized Entry of every entry (the header,
 * TransactionBegin/End, a rows RowChange with its rowDatas) straight from the entries'
 * attributes and their row values: the store's msgpack bytes (PackedRows, read here
 * without a Python object per value) or value tuples (RowImages). It writes what
 * convert's Python encoder writes, byte for byte (tests/test_canal_native.py). An entry
 * it does not handle itself (a statement, an attribute of an unexpected type, a value
 * whose text function raises, malformed msgpack) goes to the Python encoder
 * (`fallback`): the reference, which also raises its errors.
 *
 * The GIL is held throughout (text functions are called back); nothing is global, so
 * several threads may encode at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>

/* Column kinds: the same numbers are in _native.py. */
enum {
    K_STR = 1,      /* str(v): integers (with a widened sqlType above wide_above), DATE, TIME */
    K_DECIMAL,      /* values.decimal_text */
    K_DATETIME,     /* values.datetime_text */
    K_TIMESTAMP,    /* values.timestamp_text in a zone (zone_mode) */
    K_YEAR,         /* values.year_text */
    K_BIT,          /* values.bit_text */
    K_STRING,       /* values.string_text */
    K_BINARY,       /* values.binary_text */
    K_FIXED_BINARY, /* values.fixed_binary_text */
    K_ENUM,         /* values.EnumIndex */
    K_SET,          /* values.SetBits */
    K_JSON,         /* values.json_text */
    K_CALL,         /* the text function for every value */
    K_FLOAT,        /* values.java_float */
    K_DOUBLE,       /* values.java_double */
    K_END
};
enum { ZONE_LOCAL = 0, ZONE_FIXED = 1, ZONE_CALL = 2 };

/* what a step ends with: done, hand the entry to the reference, or a Python error */
#define OK 0
#define DECLINE 1
#define ERROR (-1)

/* -- output buffers ------------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t more) {
    if (more > PY_SSIZE_T_MAX - b->len) {
        PyErr_NoMemory();
        return ERROR;
    }
    Py_ssize_t need = b->len + more, cap = b->cap ? b->cap : 1024;
    while (cap < need) cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return ERROR;
    }
    b->data = data;
    b->cap = cap;
    return OK;
}

static inline int reserve(Buf *b, Py_ssize_t more) {
    return b->cap - b->len >= more ? OK : buf_grow(b, more);
}

/* the put_ functions write into room reserved before */
static inline void put(Buf *b, const void *p, Py_ssize_t n) {
    memcpy(b->data + b->len, p, (size_t)n);
    b->len += n;
}

static inline void put1(Buf *b, unsigned char c) { b->data[b->len++] = (char)c; }

/* a plan's constant bytes (readable CONST_PAD bytes past their end): a short one in a
 * copy of a fixed size, inlined (room for CONST_PAD more reserved by the caller) */
static inline void put_const(Buf *b, const char *p, Py_ssize_t n) {
    if (n <= 32) memcpy(b->data + b->len, p, 32);
    else memcpy(b->data + b->len, p, (size_t)n);
    b->len += n;
}

static inline int varint_len(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline void put_varint(Buf *b, uint64_t v) {
    while (v >= 0x80) {
        b->data[b->len++] = (char)(v | 0x80);
        v >>= 7;
    }
    b->data[b->len++] = (char)v;
}

/* a length-delimited field (tag below 128) */
static int field(Buf *b, unsigned char tag, const char *p, Py_ssize_t n) {
    if (reserve(b, 11 + n) < 0) return ERROR;
    put1(b, tag);
    put_varint(b, (uint64_t)n);
    put(b, p, n);
    return OK;
}

/* protobuf's _text_field: nothing for "" */
static int text_field(Buf *b, unsigned char tag, const char *p, Py_ssize_t n) {
    return n ? field(b, tag, p, n) : OK;
}

/* protobuf's _int_field: nothing for 0; a negative int64 as its two's complement */
static int int_field(Buf *b, unsigned char tag, uint64_t v) {
    if (v == 0) return OK;
    if (reserve(b, 11) < 0) return ERROR;
    put1(b, tag);
    put_varint(b, v);
    return OK;
}

static const char PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* decimal text of an integer into buf (at least 21 bytes); its length */
static int fmt_u64(char *buf, uint64_t v) {
    char tmp[20];
    int k = 20;
    while (v >= 100) {
        unsigned int r = (unsigned int)(v % 100);
        v /= 100;
        k -= 2;
        memcpy(tmp + k, PAIRS + 2 * r, 2);
    }
    if (v >= 10) {
        k -= 2;
        memcpy(tmp + k, PAIRS + 2 * v, 2);
    } else {
        tmp[--k] = (char)('0' + v);
    }
    memcpy(buf, tmp + k, (size_t)(20 - k));
    return 20 - k;
}

static int fmt_i64(char *buf, int64_t v) {
    if (v >= 0) return fmt_u64(buf, (uint64_t)v);
    buf[0] = '-';
    return 1 + fmt_u64(buf + 1, (uint64_t)0 - (uint64_t)v);
}

/* -- values ---------------------------------------------------------------------------- */

/* One value of a row image: from msgpack bytes (V_RAW: a value made in Python only when
 * a text function needs it) or from a tuple (V_OBJ: the object itself). */
enum { V_NULL, V_INT, V_UINT, V_DBL, V_STR, V_BIN, V_OBJ, V_RAW };

typedef struct {
    int t;
    int64_t i;
    uint64_t u;
    double d;
    const char *p; /* V_STR/V_BIN: the bytes; V_RAW: the msgpack value */
    Py_ssize_t n;
    PyObject *obj; /* V_OBJ (borrowed); V_STR/V_BIN of a tuple: its object, else NULL */
} Val;

/* A value's text: a slice of the input (p) or of the scratch buffer (off). */
typedef struct {
    const char *p;
    Py_ssize_t off, n;
    char null, wide, scratch, updated;
} Text;

static inline const char *text_ptr(const Text *t, const Buf *s) {
    return t->scratch ? s->data + t->off : t->p;
}

/* strict UTF-8 as Python decodes it (no surrogates, no overlong forms, up to U+10FFFF) */
static int valid_utf8(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (n - i < 3 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0) return 0; /* overlong */
            if (c == 0xED && s[i + 1] > 0x9F) return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (n - i < 4 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90) return 0;
            if (c == 0xF4 && s[i + 1] > 0x8F) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* -- msgpack reading --------------------------------------------------------------- */

typedef struct {
    const unsigned char *d;
    Py_ssize_t pos, end;
} Reader;

static inline int take(Reader *r, Py_ssize_t n, const unsigned char **p) {
    if (n < 0 || r->end - r->pos < n) return DECLINE;
    *p = r->d + r->pos;
    r->pos += n;
    return OK;
}

static inline int be(Reader *r, int n, uint64_t *v) {
    const unsigned char *p;
    if (take(r, n, &p)) return DECLINE;
    uint64_t x = 0;
    for (int k = 0; k < n; k++) x = (x << 8) | p[k];
    *v = x;
    return OK;
}

/* the length of a str/bin/ext/array/map of format byte c (its size bytes read) */
static int skip(Reader *r, int depth);

static int skip_n(Reader *r, uint64_t items, int depth) {
    for (uint64_t k = 0; k < items; k++)
        if (skip(r, depth + 1)) return DECLINE;
    return OK;
}

static int skip(Reader *r, int depth) {
    const unsigned char *p;
    uint64_t n;
    if (depth > 512 || take(r, 1, &p)) return DECLINE;
    unsigned char c = *p;
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) return OK;
    if ((c & 0xf0) == 0x80) return skip_n(r, 2 * (uint64_t)(c & 0x0f), depth);
    if ((c & 0xf0) == 0x90) return skip_n(r, c & 0x0f, depth);
    if ((c & 0xe0) == 0xa0) return take(r, c & 0x1f, &p);
    switch (c) {
    case 0xc4: case 0xd9: if (be(r, 1, &n)) return DECLINE; return take(r, (Py_ssize_t)n, &p);
    case 0xc5: case 0xda: if (be(r, 2, &n)) return DECLINE; return take(r, (Py_ssize_t)n, &p);
    case 0xc6: case 0xdb: if (be(r, 4, &n)) return DECLINE; return take(r, (Py_ssize_t)n, &p);
    case 0xc7: if (be(r, 1, &n)) return DECLINE; return take(r, (Py_ssize_t)n + 1, &p);
    case 0xc8: if (be(r, 2, &n)) return DECLINE; return take(r, (Py_ssize_t)n + 1, &p);
    case 0xc9: if (be(r, 4, &n)) return DECLINE; return take(r, (Py_ssize_t)n + 1, &p);
    case 0xca: case 0xce: case 0xd2: return take(r, 4, &p);
    case 0xcb: case 0xcf: case 0xd3: return take(r, 8, &p);
    case 0xcc: case 0xd0: return take(r, 1, &p);
    case 0xcd: case 0xd1: return take(r, 2, &p);
    case 0xd4: return take(r, 2, &p);
    case 0xd5: return take(r, 3, &p);
    case 0xd6: return take(r, 5, &p);
    case 0xd7: return take(r, 9, &p);
    case 0xd8: return take(r, 17, &p);
    case 0xdc: if (be(r, 2, &n)) return DECLINE; return skip_n(r, n, depth);
    case 0xdd: if (be(r, 4, &n)) return DECLINE; return skip_n(r, n, depth);
    case 0xde: if (be(r, 2, &n)) return DECLINE; return skip_n(r, 2 * n, depth);
    case 0xdf: if (be(r, 4, &n)) return DECLINE; return skip_n(r, 2 * n, depth);
    default: return DECLINE; /* 0xc1: never used */
    }
}

static int read_array(Reader *r, Py_ssize_t *count) {
    const unsigned char *p;
    uint64_t n;
    if (take(r, 1, &p)) return DECLINE;
    if ((*p & 0xf0) == 0x90) n = *p & 0x0f;
    else if (*p == 0xdc) { if (be(r, 2, &n)) return DECLINE; }
    else if (*p == 0xdd) { if (be(r, 4, &n)) return DECLINE; }
    else return DECLINE;
    *count = (Py_ssize_t)n;
    return OK;
}

/* one value; a str is checked as msgpack's unpacker (raw=False) decodes it */
static int read_value(Reader *r, Val *v) {
    const unsigned char *p, *q;
    uint64_t n;
    Py_ssize_t start = r->pos;
    if (take(r, 1, &p)) return DECLINE;
    unsigned char c = *p;
    v->obj = NULL;
    if (c <= 0x7f) { v->t = V_INT; v->i = c; return OK; }
    if (c >= 0xe0) { v->t = V_INT; v->i = (int8_t)c; return OK; }
    if ((c & 0xe0) == 0xa0) { n = c & 0x1f; goto str; }
    switch (c) {
    case 0xc0: v->t = V_NULL; return OK;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        if (be(r, 1 << (c - 0xcc), &n)) return DECLINE;
        v->t = V_UINT;
        v->u = n;
        return OK;
    case 0xd0: if (be(r, 1, &n)) return DECLINE; v->t = V_INT; v->i = (int8_t)n; return OK;
    case 0xd1: if (be(r, 2, &n)) return DECLINE; v->t = V_INT; v->i = (int16_t)n; return OK;
    case 0xd2: if (be(r, 4, &n)) return DECLINE; v->t = V_INT; v->i = (int32_t)n; return OK;
    case 0xd3: if (be(r, 8, &n)) return DECLINE; v->t = V_INT; v->i = (int64_t)n; return OK;
    case 0xca: {
        if (be(r, 4, &n)) return DECLINE;
        uint32_t bits = (uint32_t)n;
        float f;
        memcpy(&f, &bits, 4);
        v->t = V_DBL;
        v->d = f;
        return OK;
    }
    case 0xcb: {
        if (be(r, 8, &n)) return DECLINE;
        memcpy(&v->d, &n, 8);
        v->t = V_DBL;
        return OK;
    }
    case 0xd9: if (be(r, 1, &n)) return DECLINE; goto str;
    case 0xda: if (be(r, 2, &n)) return DECLINE; goto str;
    case 0xdb: if (be(r, 4, &n)) return DECLINE; goto str;
    case 0xc4: if (be(r, 1, &n)) return DECLINE; goto bin;
    case 0xc5: if (be(r, 2, &n)) return DECLINE; goto bin;
    case 0xc6: if (be(r, 4, &n)) return DECLINE; goto bin;
    default:  /* true, false, arrays, maps, ext: made by msgpack when asked */
        r->pos = start;
        if (skip(r, 0)) return DECLINE;
        v->t = V_RAW;
        v->p = (const char *)r->d + start;
        v->n = r->pos - start;
        return OK;
    }
str:
    if (take(r, (Py_ssize_t)n, &q) || !valid_utf8(q, (Py_ssize_t)n)) return DECLINE;
    v->t = V_STR;
    v->p = (const char *)q;
    v->n = (Py_ssize_t)n;
    return OK;
bin:
    if (take(r, (Py_ssize_t)n, &q)) return DECLINE;
    v->t = V_BIN;
    v->p = (const char *)q;
    v->n = (Py_ssize_t)n;
    return OK;
}

/* a Python value of a tuple as a Val; a str not all ASCII is encoded into scratch */
static int object_value(PyObject *o, Val *v, Buf *s) {
    v->obj = o;
    if (o == Py_None) {
        v->t = V_NULL;
        return OK;
    }
    if (PyLong_CheckExact(o)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (x == -1 && PyErr_Occurred()) return ERROR;
        if (!overflow) {
            v->t = V_INT;
            v->i = x;
            return OK;
        }
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (!(u == (unsigned long long)-1 && PyErr_Occurred())) {
                v->t = V_UINT;
                v->u = u;
                return OK;
            }
            PyErr_Clear();
        }
        v->t = V_OBJ;
        return OK;
    }
    if (PyUnicode_CheckExact(o)) {
        if (PyUnicode_IS_ASCII(o)) {
            v->t = V_STR;
            v->p = (const char *)PyUnicode_DATA(o);
            v->n = PyUnicode_GET_LENGTH(o);
            return OK;
        }
        /* not the str's own UTF-8 cache: that would stay with the stored value */
        PyObject *b = PyUnicode_AsUTF8String(o);
        if (b == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) return ERROR;
            PyErr_Clear();
            return DECLINE; /* a lone surrogate: the reference says so */
        }
        Py_ssize_t n = PyBytes_GET_SIZE(b);
        if (reserve(s, n) < 0) {
            Py_DECREF(b);
            return ERROR;
        }
        /* the scratch offset travels in i: the pointer is made when it is read */
        v->t = V_STR;
        v->i = s->len;
        v->n = n;
        v->p = NULL;
        put(s, PyBytes_AS_STRING(b), n);
        Py_DECREF(b);
        return OK;
    }
    if (PyBytes_CheckExact(o)) {
        v->t = V_BIN;
        v->p = PyBytes_AS_STRING(o);
        v->n = PyBytes_GET_SIZE(o);
        return OK;
    }
    if (PyFloat_CheckExact(o)) {
        v->t = V_DBL;
        v->d = PyFloat_AS_DOUBLE(o);
        return OK;
    }
    v->t = V_OBJ;
    return OK;
}

/* -- a plan: one table's columns ------------------------------------------------------ */

typedef struct {
    const char *p;
    Py_ssize_t n;
} Bytes;

typedef struct {
    int kind, zone_mode;
    long zone_offset;
    uint64_t wide_above; /* 0: never widened */
    PyObject *text;      /* borrowed from the spec */
    Bytes pre[3], wide[3], null[3];
    Py_ssize_t nmembers;
    Bytes *members; /* ENUM/SET members' UTF-8 */
} Col;

typedef struct {
    PyObject_HEAD
    PyObject *spec; /* keeps the text functions alive */
    Py_ssize_t ncols;
    Col *cols;
    char *arena; /* every constant byte, then CONST_PAD bytes (copies read past the end) */
} Plan;

/* the longest constant part written by a copy of a fixed size (see put_const) */
#define CONST_PAD 32

static void plan_dealloc(Plan *self) {
    if (self->cols != NULL) {
        for (Py_ssize_t i = 0; i < self->ncols; i++) PyMem_Free(self->cols[i].members);
        PyMem_Free(self->cols);
    }
    PyMem_Free(self->arena);
    Py_XDECREF(self->spec);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int three_bytes(PyObject *triple, Bytes out[3], const char *what) {
    if (!PyTuple_Check(triple) || PyTuple_GET_SIZE(triple) != 3) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple of three bytes", what);
        return ERROR;
    }
    for (int k = 0; k < 3; k++) {
        PyObject *b = PyTuple_GET_ITEM(triple, k);
        if (!PyBytes_Check(b)) {
            PyErr_Format(PyExc_TypeError, "%s: a tuple of three bytes", what);
            return ERROR;
        }
        out[k].p = PyBytes_AS_STRING(b);
        out[k].n = PyBytes_GET_SIZE(b);
    }
    return OK;
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "O!:Plan", &PyTuple_Type, &spec)) return NULL;
    Plan *self = (Plan *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(spec);
    self->spec = spec;
    self->ncols = PyTuple_GET_SIZE(spec);
    self->cols = PyMem_Calloc((size_t)(self->ncols ? self->ncols : 1), sizeof(Col));
    if (self->cols == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        Col *c = &self->cols[i];
        PyObject *members, *pre, *wide, *null;
        unsigned long long above;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(spec, i), "iKOO!ilOOO:column", &c->kind, &above,
                              &c->text, &PyTuple_Type, &members, &c->zone_mode,
                              &c->zone_offset, &pre, &wide, &null))
            goto fail;
        c->wide_above = above;
        if (c->kind < K_STR || c->kind >= K_END) {
            PyErr_Format(PyExc_ValueError, "column %zd: unknown kind %d", i, c->kind);
            goto fail;
        }
        if (three_bytes(pre, c->pre, "pre") || three_bytes(wide, c->wide, "wide") ||
            three_bytes(null, c->null, "null"))
            goto fail;
        c->nmembers = PyTuple_GET_SIZE(members);
        c->members = PyMem_Calloc((size_t)(c->nmembers ? c->nmembers : 1), sizeof(Bytes));
        if (c->members == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t k = 0; k < c->nmembers; k++) {
            PyObject *m = PyTuple_GET_ITEM(members, k);
            if (!PyUnicode_Check(m)) {
                PyErr_SetString(PyExc_TypeError, "members: str");
                goto fail;
            }
            c->members[k].p = PyUnicode_AsUTF8AndSize(m, &c->members[k].n);
            if (c->members[k].p == NULL) goto fail;
        }
    }
    /* the constant bytes in one block of this plan's own, padded */
    Py_ssize_t size = CONST_PAD;
    for (Py_ssize_t i = 0; i < self->ncols; i++)
        for (int k = 0; k < 3; k++)
            size += self->cols[i].pre[k].n + self->cols[i].wide[k].n + self->cols[i].null[k].n;
    self->arena = PyMem_Calloc((size_t)size, 1);
    if (self->arena == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    char *at = self->arena;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        Col *c = &self->cols[i];
        Bytes *parts[9] = {&c->pre[0], &c->pre[1], &c->pre[2], &c->wide[0], &c->wide[1],
                           &c->wide[2], &c->null[0], &c->null[1], &c->null[2]};
        for (int k = 0; k < 9; k++) {
            memcpy(at, parts[k]->p, (size_t)parts[k]->n);
            parts[k]->p = at;
            at += parts[k]->n;
        }
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "canal_server.canal._canalcodec.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(spec): one table's columns, as _native.plan_spec gives them.",
    .tp_new = plan_new,
};

/* -- a value's text ------------------------------------------------------------------ */

/* an exception of a callback: the reference's business (DECLINE), unless it is not an
 * Exception (KeyboardInterrupt, ...) */
static int declined(void) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return ERROR;
    PyErr_Clear();
    return DECLINE;
}

static PyObject *value_object(const Val *v, const Buf *s, PyObject *unpackb) {
    switch (v->t) {
    case V_INT: return PyLong_FromLongLong(v->i);
    case V_UINT: return PyLong_FromUnsignedLongLong(v->u);
    case V_DBL: return PyFloat_FromDouble(v->d);
    case V_STR:
        if (v->obj != NULL) break;
        return PyUnicode_DecodeUTF8(v->p, v->n, NULL);
    case V_BIN:
        if (v->obj != NULL) break;
        return PyBytes_FromStringAndSize(v->p, v->n);
    case V_RAW: {
        PyObject *raw = PyBytes_FromStringAndSize(v->p, v->n);
        if (raw == NULL) return NULL;
        PyObject *o = PyObject_CallOneArg(unpackb, raw);
        Py_DECREF(raw);
        return o;
    }
    default: break;
    }
    Py_INCREF(v->obj);
    return v->obj;
}

/* the column's text function on the value (the reference's own text) */
static int call_text(const Col *c, const Val *v, Text *t, Buf *s, PyObject *unpackb) {
    PyObject *o = value_object(v, s, unpackb);
    if (o == NULL) return declined();
    PyObject *res = PyObject_CallOneArg(c->text, o);
    Py_DECREF(o);
    if (res == NULL) return declined();
    if (!PyUnicode_Check(res)) {
        Py_DECREF(res);
        return DECLINE;
    }
    PyObject *b = PyUnicode_AsUTF8String(res);
    Py_DECREF(res);
    if (b == NULL) return declined();
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    if (reserve(s, n) < 0) {
        Py_DECREF(b);
        return ERROR;
    }
    t->scratch = 1;
    t->off = s->len;
    t->n = n;
    put(s, PyBytes_AS_STRING(b), n);
    Py_DECREF(b);
    return OK;
}

static inline void text_in(Text *t, const char *p, Py_ssize_t n) {
    t->scratch = 0;
    t->p = p;
    t->n = n;
}

/* a V_STR's bytes (a non-ASCII str of a tuple sits in scratch at offset i) */
static inline void str_text(const Val *v, Text *t) {
    if (v->p == NULL) {
        t->scratch = 1;
        t->off = (Py_ssize_t)v->i;
        t->n = v->n;
    } else {
        text_in(t, v->p, v->n);
    }
}

static inline const char *str_ptr(const Val *v, const Buf *s) {
    return v->p == NULL ? s->data + v->i : v->p;
}

static int int_text(const Val *v, Text *t, Buf *s) {
    if (reserve(s, 24) < 0) return ERROR;
    t->scratch = 1;
    t->off = s->len;
    t->n = v->t == V_INT ? fmt_i64(s->data + s->len, v->i) : fmt_u64(s->data + s->len, v->u);
    s->len += t->n;
    return OK;
}

/* a V_STR's bytes copied into scratch (to change them) */
static int copy_str(const Val *v, Text *t, Buf *s) {
    if (reserve(s, v->n) < 0) return ERROR;
    t->scratch = 1;
    t->off = s->len;
    t->n = v->n;
    put(s, str_ptr(v, s), v->n);
    return OK;
}

/* ISO-8859-1 bytes as UTF-8: a byte of 0x80 or more is two (written without a branch:
 * binary values are as often above 0x80 as not) */
static int latin1_text(Text *t, Buf *s, const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t high = 0;
    for (Py_ssize_t k = 0; k < n; k++) high += p[k] >> 7;
    if (high == 0) {
        text_in(t, (const char *)p, n);
        return OK;
    }
    if (reserve(s, n + high + 1) < 0) return ERROR;
    t->scratch = 1;
    t->off = s->len;
    t->n = n + high;
    unsigned char *o = (unsigned char *)s->data + s->len;
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned int c = p[k], hi = c >> 7;
        o[0] = (unsigned char)(hi ? 0xC0 | (c >> 6) : c);
        o[1] = (unsigned char)(0x80 | (c & 0x3F)); /* overwritten next unless c is high */
        o += 1 + hi;
    }
    s->len += n + high;
    return OK;
}

static inline int digits(const char *p, int n, int *out) {
    int x = 0;
    for (int k = 0; k < n; k++) {
        if (p[k] < '0' || p[k] > '9') return 0;
        x = x * 10 + (p[k] - '0');
    }
    *out = x;
    return 1;
}

/* days from 1970-01-01 to y-m-1 (proleptic Gregorian; Howard Hinnant's days_from_civil) */
static int64_t days_from_civil(int64_t y, int m) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* values.timestamp_text: canal-ha's UTC text as local time (zone_mode) */
static int timestamp_text(const Col *c, const Val *v, Text *t, Buf *s, PyObject *unpackb) {
    if (v->t != V_STR || c->zone_mode == ZONE_CALL) return call_text(c, v, t, s, unpackb);
    const char *p = str_ptr(v, s);
    Py_ssize_t n = v->n;
    while (n > 0 && p[n - 1] == 'Z') n--;
    Py_ssize_t dot = 0;
    while (dot < n && p[dot] != '.') dot++;
    Py_ssize_t rest = n - dot; /* ".ffffff" or nothing */
    char head[19];
    if (dot >= 10 && memcmp(p, "0000-00-00", 10) == 0) {
        memcpy(head, "0000-00-00 00:00:00", 19);
    } else {
        int y, mo, d, h, mi, se;
        if (dot != 19 || !digits(p, 4, &y) || !digits(p + 5, 2, &mo) || !digits(p + 8, 2, &d) ||
            !digits(p + 11, 2, &h) || !digits(p + 14, 2, &mi) || !digits(p + 17, 2, &se) ||
            y < 1 || mo < 1 || mo > 12)
            return call_text(c, v, t, s, unpackb);
        int64_t moment = ((days_from_civil(y, mo) + d - 1) * 24 + h) * 3600 + mi * 60 + se;
        struct tm tm;
        time_t when = (time_t)moment;
        if (c->zone_mode == ZONE_LOCAL) {
            if (localtime_r(&when, &tm) == NULL) return call_text(c, v, t, s, unpackb);
        } else {
            /* datetime.fromtimestamp(t, timezone): UTC in range, then shifted */
            if (gmtime_r(&when, &tm) == NULL || tm.tm_year + 1900 < 1 ||
                tm.tm_year + 1900 > 9999)
                return call_text(c, v, t, s, unpackb);
            when = (time_t)(moment + c->zone_offset);
            if (gmtime_r(&when, &tm) == NULL) return call_text(c, v, t, s, unpackb);
        }
        int year = tm.tm_year + 1900;
        /* local: datetime probes a day earlier for a fold, out of range in year 1 */
        if (year < (c->zone_mode == ZONE_LOCAL ? 2 : 1) || year > 9999)
            return call_text(c, v, t, s, unpackb);
        int sec = tm.tm_sec > 59 ? 59 : tm.tm_sec; /* as datetime does with a leap second */
        int vals[6] = {year, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, sec};
        static const int width[6] = {4, 2, 2, 2, 2, 2};
        static const char sep[6] = {'-', '-', ' ', ':', ':', 0};
        int k = 0;
        for (int f = 0; f < 6; f++) {
            int x = vals[f];
            for (int w = width[f] - 1; w >= 0; w--) {
                head[k + w] = (char)('0' + x % 10);
                x /= 10;
            }
            k += width[f];
            if (sep[f]) head[k++] = sep[f];
        }
    }
    if (reserve(s, 19 + rest) < 0) return ERROR;
    p = str_ptr(v, s); /* scratch may have moved */
    t->scratch = 1;
    t->off = s->len;
    t->n = 19 + rest;
    put(s, head, 19);
    put(s, p + dot, rest);
    return OK;
}

/* -- Java's Float.toString / Double.toString (values.java_float / java_double) -------- */

/* significant digits (no trailing zeros, "0" for none) and the decimal exponent of the
 * first one, of a number Python formatted ("123.45", "1.5e-05", "1e+16", "0.001") */
static int split_digits(const char *t, char digits[32], int *exp) {
    int n = 0, before_point = 0, seen_point = 0, lead = 0, any = 0;
    const char *p = t;
    for (; *p && *p != 'e' && *p != 'E'; p++) {
        if (*p == '.') {
            seen_point = 1;
            continue;
        }
        if (*p < '0' || *p > '9') return -1;
        if (!seen_point) before_point++;
        if (!any && *p == '0') {
            lead++;
            continue;
        }
        any = 1;
        if (n >= 31) return -1;
        digits[n++] = *p;
    }
    int e = 0;
    if (*p) e = atoi(p + 1);
    while (n > 0 && digits[n - 1] == '0') n--;
    if (n == 0) digits[n++] = '0';
    digits[n] = 0;
    *exp = before_point - 1 - lead + e;
    return n;
}

/* Python's format(x, f".{precision}e") / repr(x) ('r'), split */
static int formatted_digits(double x, char code, int precision, char digits[32], int *exp) {
    char *t = PyOS_double_to_string(x, code, precision, 0, NULL);
    if (t == NULL) {
        PyErr_Clear();
        return -1;
    }
    int n = split_digits(t, digits, exp);
    PyMem_Free(t);
    return n;
}

/* values._java_text: d.ddd x 10^exp as Java lays it out, into out (64 bytes) */
static int java_layout(int negative, const char *digits, int n, int exp, char *out) {
    int k = 0;
    if (negative) out[k++] = '-';
    if (exp >= -3 && exp < 7) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++) out[k++] = i < n ? digits[i] : '0';
            out[k++] = '.';
            if (n > exp + 1) {
                for (int i = exp + 1; i < n; i++) out[k++] = digits[i];
            } else {
                out[k++] = '0';
            }
        } else {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[k++] = '0';
            for (int i = 0; i < n; i++) out[k++] = digits[i];
        }
    } else {
        out[k++] = digits[0];
        out[k++] = '.';
        if (n > 1) {
            for (int i = 1; i < n; i++) out[k++] = digits[i];
        } else {
            out[k++] = '0';
        }
        out[k++] = 'E';
        k += snprintf(out + k, 16, "%d", exp);
    }
    return k;
}

/* the special texts (NaN, infinities, zeros): their length, 0 for a finite nonzero */
static int java_special(double x, int zero, int negative, char *out) {
    const char *t = NULL;
    if (isnan(x)) t = "NaN";
    else if (isinf(x)) t = x > 0 ? "Infinity" : "-Infinity";
    else if (zero) t = negative ? "-0.0" : "0.0";
    if (t == NULL) return 0;
    size_t n = strlen(t);
    memcpy(out, t, n);
    return (int)n;
}

/* Java's rule for a one-digit shortest decimal (values._two_digits): where the
 * two-digit one differs, the reference decides (-1) */
static int one_digit_holds(double x, const char *digits, int n) {
    if (n != 1) return 1;
    char two[32];
    int exp2, n2 = formatted_digits(x, 'e', 1, two, &exp2);
    return n2 == 1 && two[0] == digits[0];
}

/* Double.toString(x) into out (64 bytes): its length, -1 for the reference's */
static int java_double(double x, char *out) {
    int negative = !isnan(x) && signbit(x);
    int n = java_special(x, x == 0, negative, out);
    if (n) return n;
    double a = fabs(x);
    if (a >= 9007199254740992.0 && a < 9223372036854775808.0 && a == floor(a))
        return -1; /* Java 8-18's digits of a large whole number */
    char digits[32];
    int exp;
    n = formatted_digits(a, 'r', 0, digits, &exp);
    if (n < 0 || !one_digit_holds(a, digits, n)) return -1;
    return java_layout(negative, digits, n, exp, out);
}

/* Float.toString of the float32 nearest x into out (64 bytes): its length, -1 for the
 * reference's */
static int java_float(double x, char *out) {
    int negative = !isnan(x) && signbit(x);
    if (isnan(x) || isinf(x)) return java_special(x, 0, negative, out);
    double a = fabs(x);
    if (a > 3.4028235677973366e38) return -1; /* no float32: the reference's error */
    float f = (float)a;
    if (isinf(f)) return -1;
    if (f == 0) return java_special(0.0, 1, negative, out);
    double fd = f;
    if (fd >= 16777216.0 && fd < 9223372036854775808.0 && fd == floor(fd)) return -1;
    char digits[32];
    int exp = 0, n = -1;
    for (int precision = 0; precision < 9; precision++) {
        char *t = PyOS_double_to_string(fd, 'e', precision, 0, NULL);
        if (t == NULL) {
            PyErr_Clear();
            return -1;
        }
        n = split_digits(t, digits, &exp);
        double back = PyOS_string_to_double(t, NULL, NULL);
        PyMem_Free(t);
        if (n < 0 || (back == -1.0 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
        if (fabs(back) <= 3.4028235677973366e38 && (float)back == f) break;
    }
    if (!one_digit_holds(fd, digits, n)) return -1;
    return java_layout(negative, digits, n, exp, out);
}

static int member_index(const Col *c, const char *p, Py_ssize_t n) {
    for (Py_ssize_t k = c->nmembers - 1; k >= 0; k--) /* a later duplicate wins, as a dict */
        if (c->members[k].n == n && memcmp(c->members[k].p, p, (size_t)n) == 0) return (int)k;
    return -1;
}

static int text_of(const Col *c, const Val *v, Text *t, Buf *s, PyObject *unpackb) {
    t->wide = 0;
    switch (c->kind) {
    case K_STR:
        if (v->t == V_INT || v->t == V_UINT) {
            if (c->wide_above &&
                (v->t == V_UINT ? v->u > c->wide_above : (v->i > 0 && (uint64_t)v->i > c->wide_above)))
                t->wide = 1;
            return int_text(v, t, s);
        }
        if (c->wide_above) return DECLINE; /* the reference compares it with an int */
        if (v->t == V_STR) {
            str_text(v, t);
            return OK;
        }
        break;
    case K_DECIMAL:
        if (v->t == V_STR) {
            const char *p = str_ptr(v, s);
            str_text(v, t);
            if (v->n > 0 && p[0] == '-') {
                Py_ssize_t k = 0;
                while (k < v->n && (p[k] == '-' || p[k] == '0' || p[k] == '.')) k++;
                if (k == v->n) { /* BigDecimal has no negative zero */
                    t->n -= 1;
                    if (t->scratch) t->off += 1;
                    else t->p += 1;
                }
            }
            return OK;
        }
        break;
    case K_DATETIME:
        if (v->t == V_STR) {
            const char *p = str_ptr(v, s);
            Py_ssize_t n = v->n, tpos = 0, dash = 0;
            while (tpos < n && p[tpos] != 'T') tpos++;
            while (dash < n && p[dash] != '-') dash++;
            /* a year of other than four characters: the reference (it is the text
             * before the first '-', or the whole text) */
            Py_ssize_t chars = 0;
            for (Py_ssize_t k = 0; k < dash; k++) chars += (p[k] & 0xC0) != 0x80;
            if (chars != 4) break;
            if (tpos == n) {
                str_text(v, t);
                return OK;
            }
            if (copy_str(v, t, s) < 0) return ERROR;
            s->data[t->off + tpos] = ' ';
            return OK;
        }
        break;
    case K_TIMESTAMP:
        return timestamp_text(c, v, t, s, unpackb);
    case K_YEAR:
        if (v->t == V_INT && v->i == 0) {
            text_in(t, "0000", 4);
            return OK;
        }
        if (v->t == V_INT || v->t == V_UINT) return int_text(v, t, s);
        break;
    case K_BIT:
        if (v->t == V_INT || v->t == V_UINT) return int_text(v, t, s);
        break;
    case K_STRING:
        if (v->t == V_STR) {
            str_text(v, t);
            return OK;
        }
        if (v->t == V_BIN && valid_utf8((const unsigned char *)v->p, v->n)) {
            text_in(t, v->p, v->n);
            return OK;
        }
        break;
    case K_BINARY:
        if (v->t == V_BIN) return latin1_text(t, s, (const unsigned char *)v->p, v->n);
        break;
    case K_FIXED_BINARY:
        if (v->t == V_BIN) {
            Py_ssize_t n = v->n;
            while (n > 0 && v->p[n - 1] == 0) n--;
            return latin1_text(t, s, (const unsigned char *)v->p, n);
        }
        break;
    case K_ENUM:
        if (v->t == V_STR) {
            int k = member_index(c, str_ptr(v, s), v->n);
            Val index = {V_INT, k + 1, 0, 0, NULL, 0, NULL};
            return int_text(&index, t, s);
        }
        break;
    case K_SET:
        if (v->t == V_STR) {
            const char *p = str_ptr(v, s);
            uint64_t mask = 0;
            Py_ssize_t start = 0;
            for (Py_ssize_t k = 0; k <= v->n; k++) {
                if (k < v->n && p[k] != ',') continue;
                if (k > start) {
                    int m = member_index(c, p + start, k - start);
                    if (m >= 64) return call_text(c, v, t, s, unpackb);
                    if (m >= 0) {
                        uint64_t bit = (uint64_t)1 << m;
                        if (mask + bit < mask) return call_text(c, v, t, s, unpackb);
                        mask += bit; /* a sum, as the reference: a repeated member twice */
                    }
                }
                start = k + 1;
            }
            Val sum = {V_UINT, 0, mask, 0, NULL, 0, NULL};
            return int_text(&sum, t, s);
        }
        break;
    case K_JSON:
        if (v->t == V_STR) {
            str_text(v, t);
            return OK;
        }
        break;
    case K_FLOAT:
    case K_DOUBLE:
        if (v->t == V_DBL) {
            if (reserve(s, 64) < 0) return ERROR;
            int n = (c->kind == K_FLOAT ? java_float : java_double)(v->d, s->data + s->len);
            if (n < 0) break;
            t->scratch = 1;
            t->off = s->len;
            t->n = n;
            s->len += n;
            return OK;
        }
        break;
    default:
        break;
    }
    return call_text(c, v, t, s, unpackb);
}

/* -- rows -------------------------------------------------------------------------- */

static const unsigned char SIDE_TAG[3] = {0x0A, 0x12, 0x12}; /* before / after columns */

static inline Py_ssize_t column_size(const Col *c, int side, const Text *t) {
    if (t->null) return c->null[side].n;
    Py_ssize_t body = (t->wide ? c->wide : c->pre)[side].n;
    if (t->n) body += 1 + varint_len((uint64_t)t->n) + t->n;
    return 1 + varint_len((uint64_t)body) + body;
}

static inline void put_column(Buf *b, const Col *c, int side, const Text *t, const Buf *s) {
    if (t->null) {
        put_const(b, c->null[side].p, c->null[side].n);
        return;
    }
    const Bytes *pre = &(t->wide ? c->wide : c->pre)[side];
    Py_ssize_t body = pre->n;
    if (t->n) body += 1 + varint_len((uint64_t)t->n) + t->n;
    put1(b, SIDE_TAG[side]);
    put_varint(b, (uint64_t)body);
    put_const(b, pre->p, pre->n);
    if (t->n) {
        put1(b, 0x42);
        put_varint(b, (uint64_t)t->n);
        put(b, text_ptr(t, s), t->n);
    }
}

/* Where a side's images come from: msgpack bytes or a sequence of sequences. */
typedef struct {
    Reader r;       /* msgpack */
    PyObject *seq;  /* PySequence_Fast of the images, or NULL */
    Py_ssize_t count;
} Images;

static int images_open(Images *im, PyObject *side) {
    im->seq = NULL;
    if (PyBytes_CheckExact(side)) {
        im->r.d = (const unsigned char *)PyBytes_AS_STRING(side);
        im->r.pos = 0;
        im->r.end = PyBytes_GET_SIZE(side);
        return read_array(&im->r, &im->count);
    }
    im->seq = PySequence_Fast(side, "row images: a sequence");
    if (im->seq == NULL) return declined();
    im->count = PySequence_Fast_GET_SIZE(im->seq);
    return OK;
}

/* after the last row: msgpack must end there (msgpack's unpackb rejects extra bytes) */
static int images_close(Images *im) {
    if (im->seq != NULL) {
        Py_CLEAR(im->seq);
        return OK;
    }
    return im->r.pos == im->r.end ? OK : DECLINE;
}

/* the texts of image `row` of a side (s holds what they point into) */
static int image_texts(const Plan *plan, Images *im, Py_ssize_t row, Text *texts, Buf *s,
                       PyObject *unpackb) {
    Py_ssize_t n = plan->ncols;
    PyObject *fast = NULL;
    PyObject **items = NULL;
    int rc = OK;
    if (im->seq == NULL) {
        Py_ssize_t width;
        if (read_array(&im->r, &width) || width != n) return DECLINE;
    } else {
        fast = PySequence_Fast_GET_ITEM(im->seq, row);
        /* a tuple (or list) held by the side's sequence: its str values stay alive */
        if (!(PyTuple_CheckExact(fast) || PyList_CheckExact(fast)) ||
            PySequence_Fast_GET_SIZE(fast) != n)
            return DECLINE;
        items = PySequence_Fast_ITEMS(fast);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Val v;
        rc = fast == NULL ? read_value(&im->r, &v) : object_value(items[i], &v, s);
        if (rc) break;
        Text *t = &texts[i];
        t->null = v.t == V_NULL;
        if (t->null) {
            t->n = 0;
            t->wide = 0;
            continue;
        }
        rc = text_of(&plan->cols[i], &v, t, s, unpackb);
        if (rc) break;
    }
    return rc;
}

typedef struct {
    Buf out, scratch;
    Text *texts;
    Py_ssize_t ntexts;
} Work;

static int texts_for(Work *w, Py_ssize_t n) {
    if (w->ntexts >= n) return OK;
    Text *t = PyMem_Realloc(w->texts, (size_t)n * sizeof(Text));
    if (t == NULL) {
        PyErr_NoMemory();
        return ERROR;
    }
    w->texts = t;
    w->ntexts = n;
    return OK;
}

/* rowDatas fields of a RowChange into w->out: an UPDATE's pairs, or one side's images */
static int row_datas(const Plan *plan, PyObject *before, PyObject *after, Work *w,
                     PyObject *unpackb) {
    Images b = {{NULL, 0, 0}, NULL, 0}, a = {{NULL, 0, 0}, NULL, 0};
    Py_ssize_t n = plan->ncols;
    int rc = images_open(&b, before);
    if (rc == OK) rc = images_open(&a, after);
    if (rc == OK) rc = texts_for(w, 2 * n + 1);
    if (rc) goto done;
    int pairs = b.count && a.count;
    if (pairs && b.count != a.count) {
        rc = DECLINE; /* zip(strict=True) */
        goto done;
    }
    Py_ssize_t rows = a.count ? a.count : b.count;
    Text *tb = w->texts, *ta = w->texts + n;
    for (Py_ssize_t row = 0; row < rows; row++) {
        w->scratch.len = 0;
        Py_ssize_t size = 0;
        if (pairs) {
            if ((rc = image_texts(plan, &b, row, tb, &w->scratch, unpackb)) ||
                (rc = image_texts(plan, &a, row, ta, &w->scratch, unpackb)))
                goto done;
            for (Py_ssize_t i = 0; i < n; i++) {
                size += column_size(&plan->cols[i], 0, &tb[i]);
                /* Canal's isUpdate: the text or the nullness changed */
                int same = tb[i].null == ta[i].null &&
                           (ta[i].null || (tb[i].n == ta[i].n &&
                                           memcmp(text_ptr(&tb[i], &w->scratch),
                                                  text_ptr(&ta[i], &w->scratch),
                                                  (size_t)ta[i].n) == 0));
                ta[i].updated = (char)!same;
                size += column_size(&plan->cols[i], same ? 1 : 2, &ta[i]);
            }
        } else {
            Images *im = a.count ? &a : &b;
            if ((rc = image_texts(plan, im, row, ta, &w->scratch, unpackb))) goto done;
            for (Py_ssize_t i = 0; i < n; i++)
                size += column_size(&plan->cols[i], a.count ? 2 : 0, &ta[i]);
        }
        if ((rc = reserve(&w->out, 11 + size + CONST_PAD))) goto done;
        put1(&w->out, 0x62);
        put_varint(&w->out, (uint64_t)size);
        if (pairs) {
            for (Py_ssize_t i = 0; i < n; i++) put_column(&w->out, &plan->cols[i], 0, &tb[i], &w->scratch);
            for (Py_ssize_t i = 0; i < n; i++)
                put_column(&w->out, &plan->cols[i], ta[i].updated ? 2 : 1, &ta[i], &w->scratch);
        } else {
            int side = a.count ? 2 : 0;
            for (Py_ssize_t i = 0; i < n; i++) put_column(&w->out, &plan->cols[i], side, &ta[i], &w->scratch);
        }
    }
    if (rc == OK) rc = images_close(&b);
    if (rc == OK) rc = images_close(&a);
done:
    Py_XDECREF(b.seq);
    Py_XDECREF(a.seq);
    return rc;
}

/* -- entries ------------------------------------------------------------------------ */

static PyObject *s_type, *s_header, *s_event_type, *s_is_ddl, *s_images, *s_logfile,
    *s_offset, *s_end_offset, *s_server_id, *s_timestamp_ms, *s_gtid, *s_schema, *s_table,
    *s_snapshot, *s_gtid_state, *s_thread_id, *s_xid, *s_count, *s_packed_before,
    *s_packed_after, *s_before, *s_after, *s_columns;

typedef struct {
    PyObject_HEAD
    PyObject *begin, *rowdata, *end, *heartbeat; /* EntryType / EventType members */
    PyObject *entry_codes;  /* EntryType -> entryType code */
    PyObject *event_codes;  /* EventType -> header eventType code */
    PyObject *rows_heads;   /* EventType of rows -> the RowChange's bytes before rowDatas */
    PyObject *canal_gtid, *plan_of, *packed_type, *fallback, *unpackb;
    /* the last table and GTID asked (entries of a batch share them) */
    PyObject *last_columns, *last_plan;
    PyObject *memo_gtid, *memo_state, *memo_result;
} Encoder;

static int encoder_traverse(Encoder *self, visitproc visit, void *arg) {
    Py_VISIT(self->begin); Py_VISIT(self->rowdata); Py_VISIT(self->end);
    Py_VISIT(self->heartbeat); Py_VISIT(self->entry_codes); Py_VISIT(self->event_codes);
    Py_VISIT(self->rows_heads); Py_VISIT(self->canal_gtid); Py_VISIT(self->plan_of);
    Py_VISIT(self->packed_type); Py_VISIT(self->fallback); Py_VISIT(self->unpackb);
    Py_VISIT(self->last_columns); Py_VISIT(self->last_plan); Py_VISIT(self->memo_gtid);
    Py_VISIT(self->memo_state); Py_VISIT(self->memo_result);
    return 0;
}

static int encoder_clear(Encoder *self) {
    Py_CLEAR(self->begin); Py_CLEAR(self->rowdata); Py_CLEAR(self->end);
    Py_CLEAR(self->heartbeat); Py_CLEAR(self->entry_codes); Py_CLEAR(self->event_codes);
    Py_CLEAR(self->rows_heads); Py_CLEAR(self->canal_gtid); Py_CLEAR(self->plan_of);
    Py_CLEAR(self->packed_type); Py_CLEAR(self->fallback); Py_CLEAR(self->unpackb);
    Py_CLEAR(self->last_columns); Py_CLEAR(self->last_plan); Py_CLEAR(self->memo_gtid);
    Py_CLEAR(self->memo_state); Py_CLEAR(self->memo_result);
    return 0;
}

static void encoder_dealloc(Encoder *self) {
    PyObject_GC_UnTrack(self);
    encoder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *encoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"begin", "rowdata", "end", "heartbeat", "entry_codes",
                            "event_codes", "rows_heads", "canal_gtid", "plan_of",
                            "packed_type", "fallback", "unpackb", NULL};
    PyObject *v[12];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO!O!O!OOOOO:Encoder", names, &v[0],
                                     &v[1], &v[2], &v[3], &PyDict_Type, &v[4], &PyDict_Type,
                                     &v[5], &PyDict_Type, &v[6], &v[7], &v[8], &v[9], &v[10],
                                     &v[11]))
        return NULL;
    Encoder *self = (Encoder *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject **slots[12] = {&self->begin, &self->rowdata, &self->end, &self->heartbeat,
                            &self->entry_codes, &self->event_codes, &self->rows_heads,
                            &self->canal_gtid, &self->plan_of, &self->packed_type,
                            &self->fallback, &self->unpackb};
    for (int k = 0; k < 12; k++) {
        Py_INCREF(v[k]);
        *slots[k] = v[k];
    }
    return (PyObject *)self;
}

/* an int attribute in int64 (DECLINE: not an int, or out of range: the reference's) */
static int get_i64(PyObject *o, PyObject *name, int64_t *out) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (x == NULL) return declined();
    int rc = DECLINE;
    if (PyLong_Check(x)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (v == -1 && PyErr_Occurred()) rc = ERROR;
        else if (!overflow) {
            *out = v;
            rc = OK;
        }
    }
    Py_DECREF(x);
    return rc;
}

/* a str attribute (a new reference) and its UTF-8 */
static int get_str(PyObject *o, PyObject *name, PyObject **obj, const char **p, Py_ssize_t *n) {
    *obj = PyObject_GetAttr(o, name);
    if (*obj == NULL) return declined();
    if (!PyUnicode_CheckExact(*obj)) return DECLINE;
    *p = PyUnicode_AsUTF8AndSize(*obj, n);
    return *p == NULL ? declined() : OK;
}

static inline int has_char(const char *p, Py_ssize_t n, char c) {
    return memchr(p, c, (size_t)n) != NULL;
}

static inline Py_ssize_t before_dash(const char *p, Py_ssize_t n) {
    const char *d = memchr(p, '-', (size_t)n);
    return d == NULL ? n : d - p;
}

static int same_str(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (a == NULL || b == NULL) return 0;
    return PyUnicode_Compare(a, b) == 0;
}

/* convert.canal_gtid: Canal's header gtid (a new reference) */
static PyObject *canal_gtid(Encoder *e, PyObject *gtid, PyObject *state) {
    Py_ssize_t gn, sn;
    const char *g = PyUnicode_AsUTF8AndSize(gtid, &gn);
    const char *s = PyUnicode_AsUTF8AndSize(state, &sn);
    if (g == NULL || s == NULL) return NULL;
    if (sn == 0 || (sn == gn && memcmp(s, g, (size_t)sn) == 0)) return Py_NewRef(gtid);
    if (gn == 0) return Py_NewRef(state);
    if (same_str(gtid, e->memo_gtid) && same_str(state, e->memo_state))
        return Py_NewRef(e->memo_result);
    Py_ssize_t sd = before_dash(s, sn), gd = before_dash(g, gn);
    if (!has_char(s, sn, ',') && !has_char(s, sn, ':') && sd == gd &&
        memcmp(s, g, (size_t)sd) == 0)
        return Py_NewRef(gtid); /* MariaDB, one domain */
    PyObject *merged = PyObject_CallFunctionObjArgs(e->canal_gtid, gtid, state, NULL);
    if (merged == NULL) return NULL;
    if (!PyUnicode_CheckExact(merged)) {
        Py_DECREF(merged);
        PyErr_SetString(PyExc_TypeError, "canal_gtid: not a str");
        return NULL;
    }
    PyObject *old[3] = {e->memo_gtid, e->memo_state, e->memo_result};
    e->memo_gtid = Py_NewRef(gtid);
    e->memo_state = Py_NewRef(state);
    e->memo_result = Py_NewRef(merged);
    for (int k = 0; k < 3; k++) Py_XDECREF(old[k]);
    return merged;
}

/* the plan of a table's columns (a new reference) */
static PyObject *plan_of(Encoder *e, PyObject *columns) {
    if (columns == e->last_columns) return Py_NewRef(e->last_plan);
    PyObject *plan = PyObject_CallOneArg(e->plan_of, columns);
    if (plan == NULL) return NULL;
    if (!PyObject_TypeCheck(plan, &PlanType)) {
        Py_DECREF(plan);
        PyErr_SetString(PyExc_TypeError, "plan_of: not a Plan");
        return NULL;
    }
    PyObject *old[2] = {e->last_columns, e->last_plan};
    e->last_columns = Py_NewRef(columns);
    e->last_plan = Py_NewRef(plan);
    Py_XDECREF(old[0]);
    Py_XDECREF(old[1]);
    return plan;
}

static int prop(Buf *b, const char *k, Py_ssize_t kn, const char *v, Py_ssize_t vn) {
    Py_ssize_t body = (kn ? 1 + varint_len((uint64_t)kn) + kn : 0) +
                      (vn ? 1 + varint_len((uint64_t)vn) + vn : 0);
    if (reserve(b, 11) < 0) return ERROR;
    put1(b, 0x62);
    put_varint(b, (uint64_t)body);
    if (text_field(b, 0x0A, k, kn) || text_field(b, 0x12, v, vn)) return ERROR;
    return OK;
}

/* the rows of a rows entry into w->out (after its RowChange head) */
static int entry_rows(Encoder *e, PyObject *images, Work *w) {
    PyObject *before = NULL, *after = NULL, *columns = NULL, *plan = NULL;
    int rc = DECLINE;
    if (Py_IS_TYPE(images, (PyTypeObject *)e->packed_type)) {
        before = PyObject_GetAttr(images, s_packed_before);
        after = before ? PyObject_GetAttr(images, s_packed_after) : NULL;
        if (after == NULL) {
            rc = declined();
            goto done;
        }
        if (!PyBytes_CheckExact(before) || !PyBytes_CheckExact(after)) goto done;
    } else {
        before = PyObject_GetAttr(images, s_before);
        after = before ? PyObject_GetAttr(images, s_after) : NULL;
        if (after == NULL) {
            rc = declined();
            goto done;
        }
    }
    columns = PyObject_GetAttr(images, s_columns);
    if (columns == NULL) {
        rc = declined();
        goto done;
    }
    plan = plan_of(e, columns);
    if (plan == NULL) {
        rc = declined();
        goto done;
    }
    rc = row_datas((Plan *)plan, before, after, w, e->unpackb);
done:
    Py_XDECREF(before);
    Py_XDECREF(after);
    Py_XDECREF(columns);
    Py_XDECREF(plan);
    return rc;
}

/* len(entry.images) (PackedRows: its count) */
static int row_count(Encoder *e, PyObject *images, int64_t *n) {
    if (Py_IS_TYPE(images, (PyTypeObject *)e->packed_type)) return get_i64(images, s_count, n);
    Py_ssize_t k = PyObject_Length(images);
    if (k < 0) return declined();
    *n = k;
    return OK;
}

/* One entry's bytes (*result NULL: an entry with no Canal form, dropped). */
static int encode_entry(Encoder *e, PyObject *entry, Work *w, PyObject **result) {
    PyObject *type = NULL, *h = NULL, *et = NULL, *images = NULL, *logfile = NULL,
             *gtid = NULL, *schema = NULL, *table = NULL, *state = NULL, *canal = NULL;
    const char *lp, *gp, *sp, *tp, *cp;
    Py_ssize_t ln, gn, sn, tn, cn;
    int64_t offset, end_offset, server_id, time_ms, snapshot, rows = 0;
    Buf *head = &w->scratch, *store = &w->out; /* the rows' scratch is free between rows */
    int rc;
    *result = NULL;
    type = PyObject_GetAttr(entry, s_type);
    h = type ? PyObject_GetAttr(entry, s_header) : NULL;
    et = h ? PyObject_GetAttr(h, s_event_type) : NULL;
    if (et == NULL) {
        rc = declined();
        goto done;
    }
    if (et == e->heartbeat) { /* Canal's sink drops heartbeats */
        rc = OK;
        goto done;
    }
    int kind = type == e->begin ? 1 : type == e->rowdata ? 2 : type == e->end ? 3 : 0;
    PyObject *code = kind ? PyDict_GetItemWithError(e->entry_codes, type) : NULL;
    if (code == NULL || !PyLong_CheckExact(code)) {
        rc = PyErr_Occurred() ? declined() : DECLINE;
        goto done;
    }
    long entry_code = PyLong_AsLong(code);
    PyObject *rows_head = NULL, *event_code = NULL;
    store->len = 0;
    if (kind == 2) {
        PyObject *ddl = PyObject_GetAttr(entry, s_is_ddl);
        int is_ddl = ddl ? PyObject_IsTrue(ddl) : -1;
        Py_XDECREF(ddl);
        if (is_ddl < 0) {
            rc = declined();
            goto done;
        }
        rows_head = is_ddl ? NULL : PyDict_GetItemWithError(e->rows_heads, et);
        event_code = rows_head ? PyDict_GetItemWithError(e->event_codes, et) : NULL;
        if (event_code == NULL || !PyBytes_CheckExact(rows_head) ||
            !PyLong_CheckExact(event_code)) {
            /* a statement, or an event type the reference has its own word for */
            rc = PyErr_Occurred() ? declined() : DECLINE;
            goto done;
        }
        images = PyObject_GetAttr(entry, s_images);
        if (images == NULL) {
            rc = declined();
            goto done;
        }
        if ((rc = reserve(store, PyBytes_GET_SIZE(rows_head)))) goto done;
        put(store, PyBytes_AS_STRING(rows_head), PyBytes_GET_SIZE(rows_head));
        if (images != Py_None) {
            if ((rc = row_count(e, images, &rows)) || (rc = entry_rows(e, images, w))) goto done;
        }
    } else if (kind == 1) {
        int64_t thread_id;
        if ((rc = get_i64(entry, s_thread_id, &thread_id)) ||
            (rc = int_field(store, 0x20, (uint64_t)thread_id)))
            goto done;
    } else {
        PyObject *xid = PyObject_GetAttr(entry, s_xid);
        if (xid == NULL) {
            rc = declined();
            goto done;
        }
        char text[24];
        int n = -1;
        if (PyLong_CheckExact(xid)) {
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(xid, &overflow);
            if (!overflow && !(v == -1 && PyErr_Occurred())) {
                n = fmt_i64(text, v);
            } else if (overflow > 0) {
                unsigned long long u = PyLong_AsUnsignedLongLong(xid);
                if (!(u == (unsigned long long)-1 && PyErr_Occurred())) n = fmt_u64(text, u);
            }
            PyErr_Clear();
        }
        Py_DECREF(xid);
        if (n < 0) {
            rc = DECLINE;
            goto done;
        }
        if ((rc = field(store, 0x12, text, n))) goto done;
    }
    /* the header */
    if ((rc = get_str(h, s_logfile, &logfile, &lp, &ln)) ||
        (rc = get_str(h, s_gtid, &gtid, &gp, &gn)) ||
        (rc = get_str(h, s_schema, &schema, &sp, &sn)) ||
        (rc = get_str(h, s_table, &table, &tp, &tn)) ||
        (rc = get_i64(h, s_offset, &offset)) || (rc = get_i64(h, s_end_offset, &end_offset)) ||
        (rc = get_i64(h, s_server_id, &server_id)) ||
        (rc = get_i64(h, s_timestamp_ms, &time_ms)) || (rc = get_i64(h, s_snapshot, &snapshot)))
        goto done;
    state = PyObject_GetAttr(entry, s_gtid_state);
    if (state == NULL) {
        rc = declined();
        goto done;
    }
    if (!PyUnicode_CheckExact(state)) {
        rc = DECLINE;
        goto done;
    }
    canal = canal_gtid(e, gtid, state);
    if (canal == NULL) {
        rc = declined();
        goto done;
    }
    cp = PyUnicode_AsUTF8AndSize(canal, &cn);
    if (cp == NULL) {
        rc = declined();
        goto done;
    }
    int64_t length;
    if (__builtin_sub_overflow(end_offset, offset, &length)) {
        rc = DECLINE;
        goto done;
    }
    head->len = 0;
    static const char constant[] = "\x08\x01\x2a\x05UTF-8\x38\x02";
    if ((rc = reserve(head, sizeof(constant) - 1))) goto done;
    put(head, constant, sizeof(constant) - 1);
    if ((rc = text_field(head, 0x12, lp, ln)) || (rc = int_field(head, 0x20, (uint64_t)server_id)) ||
        (rc = int_field(head, 0x18, (uint64_t)offset)) ||
        (rc = int_field(head, 0x30, (uint64_t)time_ms)) || (rc = text_field(head, 0x42, sp, sn)) ||
        (rc = text_field(head, 0x4A, tp, tn)) ||
        (rc = int_field(head, 0x50, length > 0 ? (uint64_t)length : 0)))
        goto done;
    if (kind == 2) {
        if ((rc = reserve(head, 11))) goto done;
        put1(head, 0x58);
        put_varint(head, (uint64_t)PyLong_AsLongLong(event_code));
    }
    char num[24];
    if (gn && !snapshot && has_char(gp, gn, ':') && (rc = prop(head, "curtGtid", 8, gp, gn)))
        goto done;
    if (rows > 0 && (rc = prop(head, "rowsCount", 9, num, fmt_i64(num, rows)))) goto done;
    if (snapshot && (rc = prop(head, "snapshot", 8, num, fmt_i64(num, snapshot)))) goto done;
    if ((rc = text_field(head, 0x6A, cp, cn))) goto done;
    /* the entry: header, entryType, storeValue */
    Py_ssize_t hn = head->len, stn = store->len;
    Py_ssize_t total = 1 + varint_len((uint64_t)hn) + hn + 2 +
                       (stn ? 1 + varint_len((uint64_t)stn) + stn : 0);
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        rc = ERROR;
        goto done;
    }
    Buf o = {PyBytes_AS_STRING(out), 0, total};
    put1(&o, 0x0A);
    put_varint(&o, (uint64_t)hn);
    put(&o, head->data, hn);
    put1(&o, 0x10);
    put1(&o, (unsigned char)entry_code);
    if (stn) {
        put1(&o, 0x1A);
        put_varint(&o, (uint64_t)stn);
        put(&o, store->data, stn);
    }
    *result = out;
    rc = OK;
done:
    Py_XDECREF(type);
    Py_XDECREF(h);
    Py_XDECREF(et);
    Py_XDECREF(images);
    Py_XDECREF(logfile);
    Py_XDECREF(gtid);
    Py_XDECREF(schema);
    Py_XDECREF(table);
    Py_XDECREF(state);
    Py_XDECREF(canal);
    return rc;
}

static PyObject *encoder_encode(Encoder *self, PyObject *entries) {
    PyObject *seq = PySequence_Fast(entries, "entries: a sequence");
    if (seq == NULL) return NULL;
    PyObject *out = PyList_New(0);
    Work w = {{NULL, 0, 0}, {NULL, 0, 0}, NULL, 0};
    if (out == NULL) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(seq, k), *res;
        int rc = encode_entry(self, entry, &w, &res);
        if (rc == ERROR) goto fail;
        if (rc == DECLINE) { /* the reference: its bytes, None (dropped) or its error */
            res = PyObject_CallOneArg(self->fallback, entry);
            if (res == NULL) goto fail;
            if (res == Py_None) Py_CLEAR(res);
        }
        if (res != NULL) {
            int bad = PyList_Append(out, res);
            Py_DECREF(res);
            if (bad) goto fail;
        }
    }
    Py_DECREF(seq);
    PyMem_Free(w.out.data);
    PyMem_Free(w.scratch.data);
    PyMem_Free(w.texts);
    return out;
fail:
    Py_DECREF(seq);
    Py_XDECREF(out);
    PyMem_Free(w.out.data);
    PyMem_Free(w.scratch.data);
    PyMem_Free(w.texts);
    return NULL;
}

static PyMethodDef encoder_methods[] = {
    {"encode", (PyCFunction)encoder_encode, METH_O,
     "encode(entries) -> list of serialized Canal Entry bytes (convert.encode_entries)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "canal_server.canal._canalcodec.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_dealloc = (destructor)encoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Encoder(...): canal-ha entries as Canal's Entry bytes (see _native.py).",
    .tp_traverse = (traverseproc)encoder_traverse,
    .tp_clear = (inquiry)encoder_clear,
    .tp_methods = encoder_methods,
    .tp_new = encoder_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "canal_server.canal._canalcodec",
    "Canal's Entry bytes written in C (see canal_server.canal._native).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__canalcodec(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&s_type, "type"}, {&s_header, "header"}, {&s_event_type, "event_type"},
        {&s_is_ddl, "is_ddl"}, {&s_images, "images"}, {&s_logfile, "logfile"},
        {&s_offset, "offset"}, {&s_end_offset, "end_offset"}, {&s_server_id, "server_id"},
        {&s_timestamp_ms, "timestamp_ms"}, {&s_gtid, "gtid"}, {&s_schema, "schema"},
        {&s_table, "table"}, {&s_snapshot, "snapshot"}, {&s_gtid_state, "gtid_state"},
        {&s_thread_id, "thread_id"}, {&s_xid, "xid"}, {&s_count, "count"},
        {&s_packed_before, "packed_before"}, {&s_packed_after, "packed_after"},
        {&s_before, "before"}, {&s_after, "after"}, {&s_columns, "columns"},
    };
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        if (*names[k].slot == NULL) {
            *names[k].slot = PyUnicode_InternFromString(names[k].name);
            if (*names[k].slot == NULL) return NULL;
        }
    }
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0 ||
        PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0 ||
        PyModule_AddIntConstant(m, "KINDS", K_END - 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
