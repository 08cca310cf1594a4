/* canal_server._rowcodec: the C decoder of rows-event row images (see rowcodec.py).
 *
 * compile(spec) turns a table's column spec (a tuple of (kind, a, b, values), made by
 * rowcodec.TableCodec) into an opaque codec. Two ways to decode the row images in
 * data[pos:end] with it, sharing one reader per value (read_fixed: plain C, no Python
 * object, no GIL needed; it formats decimals, dates and times into a char buffer):
 *
 * - decode(codec, data, pos, end, images_per_row, slow): the list of value tuples of
 *   every row image. Values the fast code does not format itself (dates before year
 *   1000, fields out of range) are passed to slow(column_index, raw_bytes), the
 *   reference.
 * - pack(codec, data, pos, end, images_per_row, after, release_gil): (rows, before,
 *   after), the images as msgpack bytes, byte-identical to msgpack.packb(images,
 *   use_bin_type=True) of what decode gives (before = even images and after = odd ones
 *   when images_per_row is 2, else every image on the side `after` says and b"\x90" on
 *   the other). No Python object is made per value, and the whole loop runs with the
 *   GIL released (unless release_gil is false). None when a value needs slow(): the
 *   caller decodes instead.
 *
 * Every read is bounds-checked: truncated or corrupt data (also invalid UTF-8 in a
 * UTF-8 column) raises ValueError, in both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    K_I8 = 1, K_U8, K_I16, K_U16, K_I24, K_U24, K_I32, K_U32, K_I64, K_U64,
    K_FLOAT, K_DOUBLE, K_DECIMAL, K_DATE, K_TIME2, K_DATETIME2, K_TIMESTAMP2,
    K_YEAR, K_UTF8, K_BYTES, K_ENUM, K_SET, K_BIT, K_END
};

#define CAPSULE "canal_server._rowcodec.codec"
#define MAX_GROUPS 16
#define SET_CACHE_MAX 4096
#define TEXT_MAX 96 /* longest formatted value: DECIMAL(65,30) is 67 characters */

typedef struct {
    int kind, a, b;
    int width;                       /* bytes of a fixed-width value, else 0 */
    PyObject *values;                /* ENUM values / SET members (tuple of str) */
    PyObject *cache;                 /* SET: mask -> str */
    Py_ssize_t nvalues;              /* ENUM/SET: len(values) */
    char *utf8;                      /* ENUM/SET: the values' UTF-8, one after the other */
    Py_ssize_t *offsets;             /* value k is utf8[offsets[k]:offsets[k + 1]] */
    int ngroups;                     /* DECIMAL groups: bytes, digits, integral */
    unsigned char gbytes[MAX_GROUPS], gdigits[MAX_GROUPS], gint[MAX_GROUPS];
} Col;

typedef struct {
    Py_ssize_t ncols;
    Col cols[];
} Codec;

static const uint32_t POW10[10] = {
    1u, 10u, 100u, 1000u, 10000u, 100000u, 1000000u, 10000000u, 100000000u, 1000000000u
};
static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

/* -- compile --------------------------------------------------------------------- */

static void codec_free(PyObject *capsule) {
    Codec *c = (Codec *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (c == NULL) {
        PyErr_Clear();
        return;
    }
    for (Py_ssize_t i = 0; i < c->ncols; i++) {
        Py_XDECREF(c->cols[i].values);
        Py_XDECREF(c->cols[i].cache);
        PyMem_Free(c->cols[i].utf8);
        PyMem_Free(c->cols[i].offsets);
    }
    PyMem_Free(c);
}

static void add_group(Col *col, int bytes, int digits, int integral) {
    col->gbytes[col->ngroups] = (unsigned char)bytes;
    col->gdigits[col->ngroups] = (unsigned char)digits;
    col->gint[col->ngroups] = (unsigned char)integral;
    col->ngroups++;
    col->width += bytes;
}

static int decimal_layout(Col *col) {
    int prec = col->a, scale = col->b, intg = prec - scale;
    if (prec < 1 || prec > 65 || scale < 0 || scale > prec) {
        PyErr_SetString(PyExc_ValueError, "bad DECIMAL precision/scale");
        return -1;
    }
    col->ngroups = 0;
    col->width = 0;
    if (intg % 9) add_group(col, DIG2BYTES[intg % 9], intg % 9, 1);
    for (int k = 0; k < intg / 9; k++) add_group(col, 4, 9, 1);
    for (int k = 0; k < scale / 9; k++) add_group(col, 4, 9, 0);
    if (scale % 9) add_group(col, DIG2BYTES[scale % 9], scale % 9, 0);
    return 0;
}

static int fixed_width(Col *col) {
    int fsp_bytes = (col->a + 1) / 2;
    switch (col->kind) {
    case K_I8: case K_U8: case K_YEAR: return 1;
    case K_I16: case K_U16: return 2;
    case K_I24: case K_U24: case K_DATE: return 3;
    case K_I32: case K_U32: case K_FLOAT: return 4;
    case K_I64: case K_U64: case K_DOUBLE: return 8;
    case K_TIME2: return 3 + fsp_bytes;
    case K_DATETIME2: return 5 + fsp_bytes;
    case K_TIMESTAMP2: return 4 + fsp_bytes;
    case K_ENUM: case K_SET: case K_BIT: return col->a;
    default: return 0;
    }
}

/* ENUM/SET: the values (str) as UTF-8 C strings, for writing without the GIL */
static int values_utf8(Col *col) {
    Py_ssize_t n = PyTuple_GET_SIZE(col->values), total = 0;
    col->nvalues = n;
    col->offsets = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    if (col->offsets == NULL) goto nomem;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t len;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(col->values, k), &len) == NULL) return -1;
        total += len;
        col->offsets[k + 1] = total;
    }
    if ((col->utf8 = PyMem_Malloc((size_t)total + 1)) == NULL) goto nomem;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(col->values, k), &len);
        memcpy(col->utf8 + col->offsets[k], s, (size_t)len);
    }
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

static int check_col(Col *col) {
    int k = col->kind;
    if (k < K_I8 || k >= K_END) goto bad;
    if ((k == K_TIME2 || k == K_DATETIME2 || k == K_TIMESTAMP2) && (col->a < 0 || col->a > 6))
        goto bad;
    if ((k == K_UTF8 || k == K_BYTES) && (col->a < 1 || col->a > 4)) goto bad;
    if (k == K_BYTES && (col->b < 0 || col->b > 0xFFFF)) goto bad;
    if (k == K_ENUM && (col->a < 1 || col->a > 2)) goto bad;
    if (k == K_SET && (col->a < 1 || col->a > 8)) goto bad;
    if (k == K_BIT && (col->a < 1 || col->a > 8 || col->b < 1 || col->b > 64)) goto bad;
    if (k == K_DECIMAL) return decimal_layout(col);
    if (k == K_ENUM || k == K_SET) {
        if (!PyTuple_Check(col->values)) goto bad;
        for (Py_ssize_t v = 0; v < PyTuple_GET_SIZE(col->values); v++)
            if (!PyUnicode_Check(PyTuple_GET_ITEM(col->values, v))) goto bad;
        if (values_utf8(col) < 0) return -1;
    }
    col->width = fixed_width(col);
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "bad column spec (kind %d, %d, %d)", k, col->a, col->b);
    return -1;
}

static PyObject *rc_compile(PyObject *self, PyObject *spec) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) == 0) {
        PyErr_SetString(PyExc_TypeError, "spec must be a non-empty tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    Codec *c = PyMem_Calloc(1, sizeof(Codec) + (size_t)n * sizeof(Col));
    if (c == NULL) return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(c, CAPSULE, codec_free);
    if (capsule == NULL) {
        PyMem_Free(c);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Col *col = &c->cols[i];
        PyObject *values;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(spec, i), "iiiO", &col->kind, &col->a, &col->b,
                              &values))
            goto fail;
        c->ncols = i + 1;  /* from here codec_free releases this column */
        Py_INCREF(values);
        col->values = values;
        if (check_col(col) < 0) goto fail;
        if (col->kind == K_SET && (col->cache = PyDict_New()) == NULL) goto fail;
    }
    return capsule;
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* -- reading and formatting one value (plain C: no Python API, no GIL needed) ---------- */

static inline uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--) v = (v << 8) | p[k];
    return v;
}

/* The length prefix of a variable-length value at *pp: read into *len and *pp moved past
   it; 0, or -1 when the prefix or the value would run past end (*pp as far as it got). */
static inline int var_len(const Col *col, const unsigned char *d, Py_ssize_t *pp,
                          Py_ssize_t end, uint64_t *len) {
    if (end - *pp < col->a) return -1;
    *len = le(d + *pp, col->a);
    *pp += col->a;
    return (uint64_t)(end - *pp) < *len ? -1 : 0;
}

static inline uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; k++) v = (v << 8) | p[k];
    return v;
}

/* v in decimal, zero-padded to at least `width` digits; returns the end */
static char *put_uint(char *o, unsigned long long v, int width) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n < width) tmp[n++] = '0';
    while (n) *o++ = tmp[--n];
    return o;
}

/* first `fsp` digits of a 6-digit fraction (micro < 10^6) */
static char *put_fraction(char *o, long long micro, int fsp) {
    if (fsp == 0) return o;
    *o++ = '.';
    return put_uint(o, (unsigned long long)(micro / POW10[6 - fsp]), fsp);
}

/* What read_fixed found: a number, a text in `text`, an ENUM/SET index/mask, or why not. */
enum {
    V_INT, V_UINT, V_DOUBLE, V_TEXT, V_ENUM, V_SET,
    V_FLOAT_NAN,  /* a FLOAT NaN (corrupt data): the object path converts it itself */
    V_SLOW,       /* for the reference (slow) */
    V_BAD_ENUM,   /* an ENUM index out of range: corrupt */
};

typedef struct {
    int tag;
    int len;  /* V_TEXT */
    union {
        long long i;
        unsigned long long u;
        double d;
    } n;
    char text[TEXT_MAX];
} Value;

/* FLOAT: the shortest of 6..9 significant digits that reads back as the same float32
 * (decoding._float32). The C library's printf and strtod round correctly (like the
 * dtoa Python uses: ties to even), and give the same value in any locale (the same
 * decimal point both ways). A candidate never overflows the float32 range (FLT_MAX
 * rounds down at 6 and 7 digits and within half a unit at 8 and 9). */
static void float32_value(const unsigned char *p, Value *v) {
    uint32_t bits = (uint32_t)le(p, 4), again;
    float f;
    memcpy(&f, &bits, 4);
    double x = (double)f;
    v->tag = V_DOUBLE;
    v->n.d = x;
    if (isnan(x)) {
        v->tag = V_FLOAT_NAN;
        return;
    }
    if (isinf(x)) return;
    for (int digits = 6; digits < 10; digits++) {
        char s[48];
        snprintf(s, sizeof s, "%.*e", digits - 1, x);
        double candidate = strtod(s, NULL);
        float back = (float)candidate;
        memcpy(&again, &back, 4);
        if (again == bits) {
            v->n.d = candidate;
            return;
        }
    }
}

/* DECIMAL: the text length, or -1 when a group is out of range (for the reference) */
static int decimal_text(const Col *col, const unsigned char *p, char *out) {
    char ibuf[96], fbuf[96];
    char *io = ibuf, *fo = fbuf, *o = out;
    int neg = !(p[0] & 0x80), off = 0;
    unsigned char flip = neg ? 0xFF : 0x00;
    for (int g = 0; g < col->ngroups; g++) {
        uint32_t v = 0;
        for (int k = 0; k < col->gbytes[g]; k++, off++) {
            unsigned char byte = p[off] ^ flip;
            if (off == 0) byte ^= 0x80;
            v = (v << 8) | byte;
        }
        if (v >= POW10[col->gdigits[g]]) return -1;
        if (col->gint[g])
            io = put_uint(io, v, col->gdigits[g]);
        else
            fo = put_uint(fo, v, col->gdigits[g]);
    }
    const char *digits = ibuf;
    while (digits < io && *digits == '0') digits++;
    if (neg) *o++ = '-';
    if (digits == io) {
        *o++ = '0';
    } else {
        memcpy(o, digits, (size_t)(io - digits));
        o += io - digits;
    }
    if (fo > fbuf) {
        *o++ = '.';
        memcpy(o, fbuf, (size_t)(fo - fbuf));
        o += fo - fbuf;
    }
    return (int)(o - out);
}

static int date_text(const unsigned char *p, char *out) {
    char *o = out;
    uint32_t v = (uint32_t)le(p, 3);
    o = put_uint(o, v >> 9, 4);
    *o++ = '-';
    o = put_uint(o, (v >> 5) & 15, 2);
    *o++ = '-';
    o = put_uint(o, v & 31, 2);
    return (int)(o - out);
}

/* TIME2 exactly as decoding's fixed reader + formatter (any bit pattern) */
static int time_text(const Col *col, const unsigned char *p, char *out) {
    int fsp = col->a, size = (fsp + 1) / 2;
    long long packed;
    if (size == 3) {
        packed = (long long)be(p, 6) - 0x800000000000LL;
    } else {
        long long intpart = (long long)be(p, 3) - 0x800000LL;
        long long frac = size ? (long long)be(p + 3, size) : 0;
        if (intpart < 0 && frac) {
            intpart += 1;
            frac -= 1LL << (8 * size);
        }
        packed = intpart * 16777216LL + frac * (size == 1 ? 10000 : 100);
    }
    int neg = packed < 0;
    unsigned long long a = (unsigned long long)(neg ? -packed : packed);
    unsigned long long hms = a >> 24;
    unsigned long long total =
        (((hms >> 12) & 1023) * 3600 + ((hms >> 6) & 63) * 60 + (hms & 63)) * 1000000ULL +
        (a & 0xFFFFFF);
    unsigned long long secs = total / 1000000, rest = secs % 3600;
    char *o = out;
    if (neg && total) *o++ = '-';
    o = put_uint(o, secs / 3600, 2);
    *o++ = ':';
    o = put_uint(o, rest / 60, 2);
    *o++ = ':';
    o = put_uint(o, rest % 60, 2);
    o = put_fraction(o, (long long)(total % 1000000), fsp);
    return (int)(o - out);
}

static char *put_datetime(char *o, long long y, int mo, int d, int h, int mi, int s) {
    o = put_uint(o, (unsigned long long)y, 4);
    *o++ = '-';
    o = put_uint(o, (unsigned)mo, 2);
    *o++ = '-';
    o = put_uint(o, (unsigned)d, 2);
    *o++ = 'T';
    o = put_uint(o, (unsigned)h, 2);
    *o++ = ':';
    o = put_uint(o, (unsigned)mi, 2);
    *o++ = ':';
    return put_uint(o, (unsigned)s, 2);
}

/* DATETIME2: the text length, or -1 for the reference */
static int datetime_text(const Col *col, const unsigned char *p, char *out) {
    int fsp = col->a, size = (fsp + 1) / 2;
    long long v = (long long)be(p, 5) - 0x8000000000LL;
    long long micro = size ? (long long)be(p + 5, size) * POW10[6 - 2 * size] : 0;
    if (v < 0 || micro > 999999) return -1;
    long long ymd = v >> 17, hms = v & 0x1FFFF, ym = ymd >> 5, y = ym / 13;
    if (y != 0 && y < 1000) return -1;  /* strftime's %Y does not pad these */
    char *o = out;
    o = put_datetime(o, y, (int)(ym % 13), (int)(ymd & 31), (int)(hms >> 12),
                     (int)((hms >> 6) & 63), (int)(hms & 63));
    o = put_fraction(o, micro, fsp);
    return (int)(o - out);
}

/* TIMESTAMP2 (UTC, "...Z"): the text length, or -1 for the reference */
static int timestamp_text(const Col *col, const unsigned char *p, char *out) {
    int fsp = col->a, size = (fsp + 1) / 2;
    long long sec = (int32_t)(uint32_t)be(p, 4), raw = 0, micro = 0;
    if (size) {
        raw = (long long)be(p + 4, size);
        if (raw >= (1LL << (8 * size - 1))) raw -= 1LL << (8 * size);  /* signed read */
        if (raw > 0) micro = ((fsp % 2) ? raw / 10 : raw) * POW10[6 - fsp];
    }
    if (sec < 0 || micro > 999999) return -1;
    char *o = out;
    if (sec == 0) {
        o = put_datetime(o, 0, 0, 0, 0, 0, 0);
        o = put_fraction(o, 0, fsp);
    } else {
        long long z = sec / 86400 + 719468, rem = sec % 86400;
        long long era = z / 146097, doe = z - era * 146097;
        long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
        int d = (int)(doy - (153 * mp + 2) / 5 + 1), m = (int)(mp < 10 ? mp + 3 : mp - 9);
        long long y = yoe + era * 400 + (m <= 2);
        o = put_datetime(o, y, m, d, (int)(rem / 3600), (int)(rem / 60 % 60), (int)(rem % 60));
        o = put_fraction(o, micro, fsp);
    }
    *o++ = 'Z';
    return (int)(o - out);
}

/* SET: the bytes of the members whose bit is set, joined by ",", in definition order */
static Py_ssize_t set_text_length(const Col *col, uint64_t mask) {
    Py_ssize_t n = 0, count = 0;
    for (Py_ssize_t k = 0; k < col->nvalues && k < 64; k++) {
        if ((mask >> k) & 1) {
            n += col->offsets[k + 1] - col->offsets[k];
            count++;
        }
    }
    return count ? n + count - 1 : 0;
}

static void set_text(const Col *col, uint64_t mask, char *o) {
    int first = 1;
    for (Py_ssize_t k = 0; k < col->nvalues && k < 64; k++) {
        if (!((mask >> k) & 1)) continue;
        if (!first) *o++ = ',';
        first = 0;
        Py_ssize_t len = col->offsets[k + 1] - col->offsets[k];
        memcpy(o, col->utf8 + col->offsets[k], (size_t)len);
        o += len;
    }
}

static void text_value(Value *v, int len) {
    v->len = len;
    v->tag = len < 0 ? V_SLOW : V_TEXT;
}

/* one fixed-width value at p (col->width bytes, bounds already checked) */
static void read_fixed(const Col *col, const unsigned char *p, Value *v) {
    v->tag = V_INT;
    switch (col->kind) {
    case K_I8: v->n.i = (int8_t)p[0]; return;
    case K_U8: v->n.i = p[0]; return;
    case K_I16: v->n.i = (int16_t)(uint16_t)le(p, 2); return;
    case K_U16: v->n.i = (long long)le(p, 2); return;
    case K_I24: {
        long long x = (long long)le(p, 3);
        v->n.i = x >= 0x800000 ? x - 0x1000000 : x;
        return;
    }
    case K_U24: v->n.i = (long long)le(p, 3); return;
    case K_I32: v->n.i = (int32_t)(uint32_t)le(p, 4); return;
    case K_U32: v->n.i = (long long)le(p, 4); return;
    case K_I64: v->n.i = (long long)le(p, 8); return;
    case K_U64: v->tag = V_UINT; v->n.u = le(p, 8); return;
    case K_YEAR: v->n.i = p[0] ? 1900 + p[0] : 0; return;
    case K_FLOAT: float32_value(p, v); return;
    case K_DOUBLE: {
        uint64_t bits = le(p, 8);
        v->tag = V_DOUBLE;
        memcpy(&v->n.d, &bits, 8);
        return;
    }
    case K_DECIMAL: text_value(v, decimal_text(col, p, v->text)); return;
    case K_DATE: text_value(v, date_text(p, v->text)); return;
    case K_TIME2: text_value(v, time_text(col, p, v->text)); return;
    case K_DATETIME2: text_value(v, datetime_text(col, p, v->text)); return;
    case K_TIMESTAMP2: text_value(v, timestamp_text(col, p, v->text)); return;
    case K_ENUM:
        v->n.u = le(p, col->a);
        v->tag = v->n.u < (uint64_t)col->nvalues ? V_ENUM : V_BAD_ENUM;
        return;
    case K_SET: v->tag = V_SET; v->n.u = le(p, col->a); return;
    case K_BIT:
        v->tag = V_UINT;
        v->n.u = be(p, col->a);
        if (col->b < 64) v->n.u &= (1ULL << col->b) - 1;
        return;
    }
    v->tag = V_BAD_ENUM;  /* unreachable: check_col accepts known kinds only */
}

/* UTF-8 exactly as CPython's strict decoder accepts it (Unicode's well-formed
 * sequences: no overlong forms, no surrogates, nothing above U+10FFFF) */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            if (!(word & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += need + 1;
    }
    return 1;
}

/* -- decode: Python objects ------------------------------------------------------------ */

static PyObject *ascii(const char *s, Py_ssize_t n) {
    PyObject *u = PyUnicode_New(n, 127);
    if (u != NULL) memcpy(PyUnicode_1BYTE_DATA(u), s, (size_t)n);
    return u;
}

static PyObject *call_slow(PyObject *slow, Py_ssize_t i, const unsigned char *p, int width) {
    return PyObject_CallFunction(slow, "ny#", i, (const char *)p, (Py_ssize_t)width);
}

static PyObject *set_object(const Col *col, uint64_t mask) {
    PyObject *key = PyLong_FromUnsignedLongLong(mask);
    if (key == NULL) return NULL;
    PyObject *text = PyDict_GetItemWithError(col->cache, key);
    if (text != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        Py_XINCREF(text);
        return text;
    }
    Py_ssize_t len = set_text_length(col, mask);
    char *buf = PyMem_Malloc((size_t)len + 1);
    if (buf == NULL) {
        Py_DECREF(key);
        return PyErr_NoMemory();
    }
    set_text(col, mask, buf);
    text = PyUnicode_DecodeUTF8(buf, len, NULL);
    PyMem_Free(buf);
    if (text != NULL && PyDict_GET_SIZE(col->cache) < SET_CACHE_MAX &&
        PyDict_SetItem(col->cache, key, text) < 0)
        Py_CLEAR(text);
    Py_DECREF(key);
    return text;
}

static PyObject *bytes_value(const Col *col, const unsigned char *p, Py_ssize_t len) {
    if (col->b <= len) return PyBytes_FromStringAndSize((const char *)p, len);
    PyObject *b = PyBytes_FromStringAndSize(NULL, col->b);  /* BINARY(n): pad with 0x00 */
    if (b != NULL) {
        memcpy(PyBytes_AS_STRING(b), p, (size_t)len);
        memset(PyBytes_AS_STRING(b) + len, 0, (size_t)(col->b - len));
    }
    return b;
}

/* the Python object of what read_fixed found in the value at p */
static PyObject *fixed_object(const Col *col, const Value *v, const unsigned char *p,
                              PyObject *slow, Py_ssize_t i) {
    switch (v->tag) {
    case V_INT: return PyLong_FromLongLong(v->n.i);
    case V_UINT: return PyLong_FromUnsignedLongLong(v->n.u);
    case V_DOUBLE: return PyFloat_FromDouble(v->n.d);
    case V_TEXT: return ascii(v->text, v->len);
    case V_ENUM: {
        PyObject *o = PyTuple_GET_ITEM(col->values, (Py_ssize_t)v->n.u);
        Py_INCREF(o);
        return o;
    }
    case V_SET: return set_object(col, v->n.u);
    case V_FLOAT_NAN: {  /* what decoding._float32 returns: the NaN struct read */
        double x = PyFloat_Unpack4((const char *)p, 1);
        if (x == -1.0 && PyErr_Occurred()) return NULL;
        return PyFloat_FromDouble(x);
    }
    case V_SLOW: return call_slow(slow, i, p, col->width);
    }
    PyErr_Format(PyExc_ValueError, "column %zd: ENUM index %llu out of range", i, v->n.u);
    return NULL;
}

static PyObject *truncated(Py_ssize_t i, Py_ssize_t p) {
    PyErr_Format(PyExc_ValueError, "row image truncated in column %zd at byte %zd", i, p);
    return NULL;
}

/* one row image at *pp; advances *pp */
static PyObject *decode_image(const Codec *c, const unsigned char *d, Py_ssize_t *pp,
                              Py_ssize_t end, PyObject *slow) {
    Py_ssize_t p = *pp, n = c->ncols, nbytes = (n + 7) / 8;
    if (end - p < nbytes) return truncated(0, p);
    const unsigned char *nulls = d + p;
    p += nbytes;
    PyObject *row = PyTuple_New(n);
    if (row == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Col *col = &c->cols[i];
        PyObject *v;
        if ((nulls[i >> 3] >> (i & 7)) & 1) {
            v = Py_None;
            Py_INCREF(v);
        } else if (col->width) {
            if (end - p < col->width) goto trunc;
            Value value;
            read_fixed(col, d + p, &value);
            v = fixed_object(col, &value, d + p, slow, i);
            p += col->width;
        } else {
            uint64_t len;
            if (var_len(col, d, &p, end, &len) < 0) goto trunc;
            if (col->kind == K_UTF8)
                v = PyUnicode_DecodeUTF8((const char *)d + p, (Py_ssize_t)len, NULL);
            else
                v = bytes_value(col, d + p, (Py_ssize_t)len);
            p += (Py_ssize_t)len;
        }
        if (v == NULL) goto fail;
        PyTuple_SET_ITEM(row, i, v);
        continue;
    trunc:
        truncated(i, p);
        goto fail;
    }
    /* Only atoms (None, int, float, str, bytes) in it: the tuple can never be part of a
       cycle, so the cyclic GC need not walk it (it would untrack it itself at its first
       collection; the store holds millions of these, and every collection that walks
       them again costs). */
    PyObject_GC_UnTrack(row);
    *pp = p;
    return row;
fail:
    Py_DECREF(row);
    return NULL;
}

static PyObject *rc_decode(PyObject *self, PyObject *args) {
    PyObject *capsule, *slow, *out = NULL;
    Py_buffer buf;
    Py_ssize_t pos, end;
    int per_row;
    if (!PyArg_ParseTuple(args, "Oy*nniO", &capsule, &buf, &pos, &end, &per_row, &slow))
        return NULL;
    const Codec *c = PyCapsule_GetPointer(capsule, CAPSULE);
    if (c == NULL) goto done;
    if (pos < 0 || end < pos || end > buf.len || per_row < 1) {
        PyErr_SetString(PyExc_ValueError, "bad rows body bounds");
        goto done;
    }
    if ((out = PyList_New(0)) == NULL) goto done;
    const unsigned char *d = buf.buf;
    Py_ssize_t p = pos;
    while (p < end) {
        PyObject *row = decode_image(c, d, &p, end, slow);
        if (row == NULL || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(row);
    }
    if (PyList_GET_SIZE(out) % per_row) {
        PyErr_Format(PyExc_ValueError, "%zd row images, not pairs of before/after images",
                     PyList_GET_SIZE(out));
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&buf);
    return out;
}

/* -- pack: msgpack, as msgpack-python's packb(..., use_bin_type=True) writes it ---------- */

/* A growing output buffer (raw allocator: used without the GIL). HEAD bytes are kept
 * free at the start for the array header, known only at the end. */
#define HEAD 5

typedef struct {
    unsigned char *data;
    size_t len, cap;
} Buf;

static int grow(Buf *b, size_t more) {
    size_t cap = b->cap ? b->cap : 256;
    if (more > (size_t)PY_SSIZE_T_MAX - b->len) return -1;
    while (cap - b->len < more) {
        if (cap > (size_t)PY_SSIZE_T_MAX / 2) {
            cap = b->len + more;
            break;
        }
        cap *= 2;
    }
    unsigned char *data = PyMem_RawRealloc(b->data, cap);
    if (data == NULL) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int reserve(Buf *b, size_t more) {
    return b->cap - b->len >= more ? 0 : grow(b, more);
}

/* big-endian `n` bytes of v after the type byte (room reserved by the caller) */
static inline void put_be(Buf *b, unsigned char type, uint64_t v, int n) {
    unsigned char *o = b->data + b->len;
    *o++ = type;
    for (int k = n - 1; k >= 0; k--) *o++ = (unsigned char)(v >> (8 * k));
    b->len += 1 + (size_t)n;
}

static inline void put_byte(Buf *b, unsigned char x) { b->data[b->len++] = x; }

static void pack_uint(Buf *b, uint64_t v) {  /* 9 bytes reserved */
    if (v < 0x80) put_byte(b, (unsigned char)v);
    else if (v < 0x100) put_be(b, 0xcc, v, 1);
    else if (v < 0x10000) put_be(b, 0xcd, v, 2);
    else if (v < 0x100000000ULL) put_be(b, 0xce, v, 4);
    else put_be(b, 0xcf, v, 8);
}

static void pack_int(Buf *b, long long v) {  /* 9 bytes reserved */
    if (v >= 0) pack_uint(b, (uint64_t)v);
    else if (v >= -32) put_byte(b, (unsigned char)(int8_t)v);
    else if (v >= -128) put_be(b, 0xd0, (uint64_t)v & 0xFF, 1);
    else if (v >= -32768) put_be(b, 0xd1, (uint64_t)v & 0xFFFF, 2);
    else if (v >= -2147483648LL) put_be(b, 0xd2, (uint64_t)v & 0xFFFFFFFFULL, 4);
    else put_be(b, 0xd3, (uint64_t)v, 8);
}

/* header of a str (use_bin_type: str8 exists), 5 bytes reserved */
static void pack_str_head(Buf *b, size_t n) {
    if (n < 32) put_byte(b, (unsigned char)(0xa0 | n));
    else if (n < 0x100) put_be(b, 0xd9, n, 1);
    else if (n < 0x10000) put_be(b, 0xda, n, 2);
    else put_be(b, 0xdb, n, 4);
}

static void pack_bin_head(Buf *b, size_t n) {
    if (n < 0x100) put_be(b, 0xc4, n, 1);
    else if (n < 0x10000) put_be(b, 0xc5, n, 2);
    else put_be(b, 0xc6, n, 4);
}

/* an array header, 5 bytes reserved */
static void pack_array_head(Buf *b, size_t n) {
    if (n < 16) put_byte(b, (unsigned char)(0x90 | n));
    else if (n < 0x10000) put_be(b, 0xdc, n, 2);
    else put_be(b, 0xdd, n, 4);
}

/* what pack_rows ends with */
enum { P_OK, P_SLOW, P_TRUNCATED, P_BAD_ENUM, P_BAD_UTF8, P_NOT_PAIRS, P_NO_MEMORY };

typedef struct {
    int status;
    Py_ssize_t column, at;     /* where it stopped (errors) */
    unsigned long long detail; /* P_BAD_ENUM: the index */
    Py_ssize_t images;
} Packed;

static int pack_text(Buf *b, const char *s, size_t n) {
    if (reserve(b, 5 + n) < 0) return P_NO_MEMORY;
    pack_str_head(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return P_OK;
}

/* one fixed-width value; P_OK or why not */
static int pack_fixed(Buf *b, const Col *col, const unsigned char *p, Packed *r) {
    Value v;
    read_fixed(col, p, &v);
    if (reserve(b, 9) < 0) return P_NO_MEMORY;
    switch (v.tag) {
    case V_INT: pack_int(b, v.n.i); return P_OK;
    case V_UINT: pack_uint(b, v.n.u); return P_OK;
    case V_DOUBLE: {
        uint64_t bits;
        memcpy(&bits, &v.n.d, 8);
        put_be(b, 0xcb, bits, 8);
        return P_OK;
    }
    case V_TEXT: return pack_text(b, v.text, (size_t)v.len);
    case V_ENUM: {
        Py_ssize_t k = (Py_ssize_t)v.n.u, start = col->offsets[k];
        return pack_text(b, col->utf8 + start, (size_t)(col->offsets[k + 1] - start));
    }
    case V_SET: {
        size_t n = (size_t)set_text_length(col, v.n.u);
        if (reserve(b, 5 + n) < 0) return P_NO_MEMORY;
        pack_str_head(b, n);
        set_text(col, v.n.u, (char *)b->data + b->len);
        b->len += n;
        return P_OK;
    }
    case V_BAD_ENUM: r->detail = v.n.u; return P_BAD_ENUM;
    }
    return P_SLOW;  /* V_SLOW, V_FLOAT_NAN */
}

/* one length-prefixed value of `len` bytes at p (bounds checked) */
static int pack_var(Buf *b, const Col *col, const unsigned char *p, size_t len) {
    if (col->kind == K_UTF8) {
        if (!valid_utf8(p, len)) return P_BAD_UTF8;
        return pack_text(b, (const char *)p, len);
    }
    size_t n = len < (size_t)col->b ? (size_t)col->b : len;  /* BINARY(n): 0x00-padded */
    if (reserve(b, 5 + n) < 0) return P_NO_MEMORY;
    pack_bin_head(b, n);
    memcpy(b->data + b->len, p, len);
    memset(b->data + b->len + len, 0, n - len);
    b->len += n;
    return P_OK;
}

/* one row image at *pp into b, as an array; advances *pp */
static int pack_image(const Codec *c, const unsigned char *d, Py_ssize_t *pp, Py_ssize_t end,
                      Buf *b, Packed *r) {
    Py_ssize_t p = *pp, n = c->ncols, nbytes = (n + 7) / 8;
    r->column = 0;
    r->at = p;
    if (end - p < nbytes) return P_TRUNCATED;
    const unsigned char *nulls = d + p;
    p += nbytes;
    if (reserve(b, 5) < 0) return P_NO_MEMORY;
    pack_array_head(b, (size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Col *col = &c->cols[i];
        int status;
        r->column = i;
        r->at = p;
        if ((nulls[i >> 3] >> (i & 7)) & 1) {
            if (reserve(b, 1) < 0) return P_NO_MEMORY;
            put_byte(b, 0xc0);
            continue;
        }
        if (col->width) {
            if (end - p < col->width) return P_TRUNCATED;
            status = pack_fixed(b, col, d + p, r);
            p += col->width;
        } else {
            uint64_t len;
            if (var_len(col, d, &p, end, &len) < 0) return P_TRUNCATED;
            status = pack_var(b, col, d + p, (size_t)len);
            p += (Py_ssize_t)len;
        }
        if (status != P_OK) return status;
    }
    *pp = p;
    return P_OK;
}

/* every row image of data[pos:end]: in out[0] (before) and out[1] (after) after HEAD
 * bytes; per_row 2: even images before, odd ones after; per_row 1: all on `after`'s
 * side. Plain C: runs without the GIL. */
static void pack_rows(const Codec *c, const unsigned char *d, Py_ssize_t pos, Py_ssize_t end,
                      int per_row, int after, Buf out[2], Packed *r) {
    size_t guess = (size_t)(end - pos) + (size_t)(end - pos) / 2;
    r->images = 0;
    r->status = P_NO_MEMORY;
    for (int k = 0; k < 2; k++) {
        if (per_row == 1 && k != after) continue;
        if (reserve(&out[k], HEAD + guess / (size_t)per_row + 64) < 0) return;
        out[k].len = HEAD;
    }
    r->status = P_OK;
    Py_ssize_t p = pos;
    while (p < end) {
        Buf *b = &out[per_row == 2 ? (int)(r->images & 1) : after];
        r->status = pack_image(c, d, &p, end, b, r);
        if (r->status != P_OK) return;
        r->images++;
    }
    if (r->images % per_row) r->status = P_NOT_PAIRS;
}

/* the bytes of one side: its array header (`count` images) just before its images */
static PyObject *side_bytes(Buf *b, size_t count) {
    unsigned char head[HEAD];
    Buf h = {head, 0, HEAD};
    pack_array_head(&h, count);
    size_t start = HEAD - h.len;
    memcpy(b->data + start, head, h.len);
    return PyBytes_FromStringAndSize((const char *)b->data + start, (Py_ssize_t)(b->len - start));
}

static PyObject *packed_result(Buf out[2], int per_row, int after, Py_ssize_t images) {
    Py_ssize_t rows = images / per_row;
    PyObject *sides[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        if (per_row == 2 || k == after)
            sides[k] = side_bytes(&out[k], (size_t)rows);
        else
            sides[k] = PyBytes_FromStringAndSize("\x90", 1);
        if (sides[k] == NULL) {
            Py_XDECREF(sides[0]);
            return NULL;
        }
    }
    return Py_BuildValue("nNN", rows, sides[0], sides[1]);
}

static void pack_error(const Packed *r) {
    switch (r->status) {
    case P_TRUNCATED: truncated(r->column, r->at); return;
    case P_BAD_ENUM:
        PyErr_Format(PyExc_ValueError, "column %zd: ENUM index %llu out of range", r->column,
                     r->detail);
        return;
    case P_BAD_UTF8:
        PyErr_Format(PyExc_ValueError, "column %zd: invalid UTF-8 at byte %zd", r->column, r->at);
        return;
    case P_NOT_PAIRS:
        PyErr_Format(PyExc_ValueError, "%zd row images, not pairs of before/after images",
                     r->images);
        return;
    default: PyErr_NoMemory();
    }
}

static PyObject *rc_pack(PyObject *self, PyObject *args) {
    PyObject *capsule, *result = NULL;
    Py_buffer buf;
    Py_ssize_t pos, end;
    int per_row, after, release;
    if (!PyArg_ParseTuple(args, "Oy*nnipp", &capsule, &buf, &pos, &end, &per_row, &after,
                          &release))
        return NULL;
    Buf out[2] = {{NULL, 0, 0}, {NULL, 0, 0}};
    Packed r = {P_OK, 0, 0, 0, 0};
    const Codec *c = PyCapsule_GetPointer(capsule, CAPSULE);
    if (c == NULL) goto done;
    if (pos < 0 || end < pos || end > buf.len || per_row < 1 || per_row > 2) {
        PyErr_SetString(PyExc_ValueError, "bad rows body bounds");
        goto done;
    }
    const unsigned char *d = buf.buf;
    if (release) {
        Py_BEGIN_ALLOW_THREADS
        pack_rows(c, d, pos, end, per_row, after, out, &r);
        Py_END_ALLOW_THREADS
    } else {
        pack_rows(c, d, pos, end, per_row, after, out, &r);
    }
    if (r.status == P_OK && (uint64_t)(r.images / per_row) > 0xFFFFFFFFULL) {
        PyErr_SetString(PyExc_ValueError, "more row images than a msgpack array holds");
    } else if (r.status == P_OK) {
        result = packed_result(out, per_row, after, r.images);
    } else if (r.status == P_SLOW) {
        result = Py_None;
        Py_INCREF(result);
    } else {
        pack_error(&r);
    }
done:
    PyMem_RawFree(out[0].data);
    PyMem_RawFree(out[1].data);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"compile", rc_compile, METH_O, "compile(spec) -> codec: a table's column spec, compiled."},
    {"decode", rc_decode, METH_VARARGS,
     "decode(codec, data, pos, end, images_per_row, slow) -> list of value tuples."},
    {"pack", rc_pack, METH_VARARGS,
     "pack(codec, data, pos, end, images_per_row, after, release_gil) -> (rows, before, "
     "after) msgpack bytes, or None when a value needs the reference."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "canal_server._rowcodec",
    "C decoder of rows-event row images (see canal_server.rowcodec).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rowcodec(void) { return PyModule_Create(&module); }
