/* canal_server.canal._canalcodec: Canal's Entry bytes written in C (see canal/_native.py).
 * This file: plans, rows, entries and the module; _canaltext.c: the values and their
 * texts; _canalcodec.h: what the two share.
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
#include "_canalcodec.h"

/* -- output buffers ------------------------------------------------------------------ */

CC_HIDDEN int buf_grow(Buf *b, Py_ssize_t more) {
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

/* a length-delimited field (tag below 128) */
CC_HIDDEN int field(Buf *b, unsigned char tag, const char *p, Py_ssize_t n) {
    if (reserve(b, 11 + n) < 0) return ERROR;
    put1(b, tag);
    put_varint(b, (uint64_t)n);
    put(b, p, n);
    return OK;
}

/* protobuf's _text_field: nothing for "" */
CC_HIDDEN int text_field(Buf *b, unsigned char tag, const char *p, Py_ssize_t n) {
    return n ? field(b, tag, p, n) : OK;
}

/* protobuf's _int_field: nothing for 0; a negative int64 as its two's complement */
CC_HIDDEN int int_field(Buf *b, unsigned char tag, uint64_t v) {
    if (v == 0) return OK;
    if (reserve(b, 11) < 0) return ERROR;
    put1(b, tag);
    put_varint(b, v);
    return OK;
}

/* -- a plan: one table's columns ------------------------------------------------------ */

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
