/* canal_server.canal._canalcodec: what its two files share (_canalcodec.c: plans, rows,
 * entries, the module; _canaltext.c: values read from msgpack or tuples, and their
 * texts as Canal writes them). */
#ifndef CANALCODEC_H
#define CANALCODEC_H
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

#define CC_HIDDEN __attribute__((visibility("hidden")))

/* -- output buffers ------------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

CC_HIDDEN int buf_grow(Buf *b, Py_ssize_t more);

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

typedef struct {
    const unsigned char *d;
    Py_ssize_t pos, end;
} Reader;

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

/* -- between the two files --------------------------------------------------------- */

/* _canalcodec.c */
CC_HIDDEN int field(Buf *b, unsigned char tag, const char *p, Py_ssize_t n);
CC_HIDDEN int text_field(Buf *b, unsigned char tag, const char *p, Py_ssize_t n);
CC_HIDDEN int int_field(Buf *b, unsigned char tag, uint64_t v);

/* _canaltext.c */
CC_HIDDEN int fmt_u64(char *buf, uint64_t v);
CC_HIDDEN int fmt_i64(char *buf, int64_t v);
CC_HIDDEN int read_array(Reader *r, Py_ssize_t *count);
CC_HIDDEN int read_value(Reader *r, Val *v);
CC_HIDDEN int object_value(PyObject *o, Val *v, Buf *s);
CC_HIDDEN int declined(void);
CC_HIDDEN int text_of(const Col *c, const Val *v, Text *t, Buf *s, PyObject *unpackb);

#endif
