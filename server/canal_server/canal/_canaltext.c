/* canal_server.canal._canalcodec, values: a row value read from the store's msgpack
 * bytes (without a Python object) or from a tuple, and its text as Canal writes it
 * (values.py's rules: integers, DECIMAL, dates, times, DATETIME, TIMESTAMP in a zone,
 * strings, ISO-8859-1 binary, ENUM, SET, BIT, YEAR, JSON text, Java's FLOAT and DOUBLE
 * texts); what the rules leave to Python goes to the column's text function. */
#include "_canalcodec.h"

static const char PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* decimal text of an integer into buf (at least 21 bytes); its length */
CC_HIDDEN int fmt_u64(char *buf, uint64_t v) {
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

CC_HIDDEN int fmt_i64(char *buf, int64_t v) {
    if (v >= 0) return fmt_u64(buf, (uint64_t)v);
    buf[0] = '-';
    return 1 + fmt_u64(buf + 1, (uint64_t)0 - (uint64_t)v);
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

CC_HIDDEN int read_array(Reader *r, Py_ssize_t *count) {
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
CC_HIDDEN int read_value(Reader *r, Val *v) {
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
CC_HIDDEN int object_value(PyObject *o, Val *v, Buf *s) {
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

/* -- a value's text ------------------------------------------------------------------ */

/* an exception of a callback: the reference's business (DECLINE), unless it is not an
 * Exception (KeyboardInterrupt, ...) */
CC_HIDDEN int declined(void) {
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

CC_HIDDEN int text_of(const Col *c, const Val *v, Text *t, Buf *s, PyObject *unpackb) {
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

