/* The OPEN and CLOSE frames a lane writes into the spool mapping, and the JSON of a step's
 * params, byte for byte what the Python path writes.
 *
 * Mirrors counterd/wire/framing.py's framing (encode_open, encode_close: OPEN_HEAD, CLOSE_HEAD,
 * COUNTER, big-endian; dumps_payload for the params), counterd/markers/step.py's clean_marker
 * (the plain case, checked here without calling it) and parts (a CLOSE's flags and scaling).
 * Part of the one extension module counterd._native._hotpath (see hotpath.h).
 */
#include "hotpath.h"

/* Big-endian stores into a frame being written. */
static char *put_u8(char *p, uint8_t v) { *p = (char)v; return p + 1; }
static char *put_u16(char *p, uint16_t v) { v = htobe16(v); memcpy(p, &v, 2); return p + 2; }
static char *put_u32(char *p, uint32_t v) { v = htobe32(v); memcpy(p, &v, 4); return p + 4; }
static char *put_u64(char *p, uint64_t v) { v = htobe64(v); memcpy(p, &v, 8); return p + 8; }
static char *put_f64(char *p, double d) { uint64_t v; memcpy(&v, &d, 8); return put_u64(p, v); }

static int json_append(PyObject **out, Py_ssize_t *len, const char *src, Py_ssize_t n)
{
    Py_ssize_t cap = PyBytes_GET_SIZE(*out);
    if (*len + n > cap) {
        Py_ssize_t want = cap * 2 > *len + n ? cap * 2 : *len + n + 64;
        if (_PyBytes_Resize(out, want) < 0)
            return -1;
    }
    memcpy(PyBytes_AS_STRING(*out) + *len, src, (size_t)n);
    *len += n;
    return 0;
}

static int json_ascii(PyObject **out, Py_ssize_t *len, PyObject *s)
{
    static const char hex[] = "0123456789abcdef";
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    const unsigned char *p = PyUnicode_1BYTE_DATA(s);
    if (json_append(out, len, "\"", 1) < 0)
        return -1;
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        char esc[6];
        int k = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\'; esc[1] = (char)c; k = 2;
        } else if (c < 0x20) {
            esc[0] = '\\';
            k = 2;
            switch (c) {
            case '\n': esc[1] = 'n'; break;
            case '\r': esc[1] = 'r'; break;
            case '\t': esc[1] = 't'; break;
            case '\b': esc[1] = 'b'; break;
            case '\f': esc[1] = 'f'; break;
            default:
                esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
                esc[4] = hex[c >> 4]; esc[5] = hex[c & 15]; k = 6;
            }
        }
        if (k) {
            if (json_append(out, len, (const char *)p + i - run, run) < 0
                || json_append(out, len, esc, k) < 0)
                return -1;
            run = 0;
        } else {
            run++;
        }
    }
    if (json_append(out, len, (const char *)p + n - run, run) < 0)
        return -1;
    return json_append(out, len, "\"", 1);
}

/* JSON of params already checked by params_plain (ASCII keys and strings, int64, bool, finite
 * float), byte for byte what protocol.dumps_payload gives (compact separators, json's escapes,
 * float repr). Returns a new bytes object. */
static PyObject *json_params(PyObject *params)
{
    Py_ssize_t len = 0, pos = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 128), *key, *value;
    if (out == NULL)
        return NULL;
    if (json_append(&out, &len, "{", 1) < 0)
        goto fail;
    int first = 1;
    while (PyDict_Next(params, &pos, &key, &value)) {
        if (!first && json_append(&out, &len, ",", 1) < 0)
            goto fail;
        first = 0;
        if (json_ascii(&out, &len, key) < 0 || json_append(&out, &len, ":", 1) < 0)
            goto fail;
        if (PyBool_Check(value)) {
            const char *t = value == Py_True ? "true" : "false";
            if (json_append(&out, &len, t, (Py_ssize_t)strlen(t)) < 0)
                goto fail;
        } else if (PyLong_CheckExact(value)) {
            char num[32];
            int k = snprintf(num, sizeof num, "%lld", PyLong_AsLongLong(value));
            if (json_append(&out, &len, num, k) < 0)
                goto fail;
        } else if (PyFloat_CheckExact(value)) {
            char *r = PyOS_double_to_string(PyFloat_AS_DOUBLE(value), 'r', 0,
                                            Py_DTSF_ADD_DOT_0, NULL);
            if (r == NULL)
                goto fail;
            int bad = json_append(&out, &len, r, (Py_ssize_t)strlen(r));
            PyMem_Free(r);
            if (bad)
                goto fail;
        } else if (json_ascii(&out, &len, value) < 0) {
            goto fail;
        }
    }
    if (json_append(&out, &len, "}", 1) < 0 || _PyBytes_Resize(&out, len) < 0)
        goto fail;
    return out;
fail:
    Py_XDECREF(out);
    return NULL;
}

/* The common case of recorder.clean_marker, checked without calling it: an ASCII name and
 * params that every sink encodes as they are. 1: plain; 0: clean_marker must see them. */
int hot_params_plain(PyObject *name, PyObject *params)
{
    if (!PyUnicode_CheckExact(name) || !PyUnicode_IS_ASCII(name)
        || PyUnicode_GET_LENGTH(name) > hot_K.max_name)
        return 0;
    if (params == NULL)
        return 1;
    if (PyDict_GET_SIZE(params) > hot_K.max_params)
        return 0;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(params, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_IS_ASCII(key)
            || PyUnicode_GET_LENGTH(key) > hot_K.max_name)
            return 0;
        if (PyBool_Check(value))
            continue;
        if (PyLong_CheckExact(value)) {
            int overflow;
            PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow)
                return 0;
        } else if (PyUnicode_CheckExact(value)) {
            if (!PyUnicode_IS_ASCII(value) || PyUnicode_GET_LENGTH(value) > hot_K.max_value)
                return 0;
        } else if (PyFloat_CheckExact(value)) {
            if (!isfinite(PyFloat_AS_DOUBLE(value)))
                return 0;
        } else {
            return 0;
        }
    }
    return 1;
}

/* The OPEN frame of a step into the spool mapping: 1 written, 0 not (the caller goes the
 * Python way), -1 error. */
int hot_write_open(Lane *lane, HotStep *st, int64_t t)
{
    if (!st->plain || !mf_usable(lane->writer) || st->rank < INT32_MIN || st->rank > INT32_MAX)
        return 0;
    Py_ssize_t name_len;
    const char *name = PyUnicode_AsUTF8AndSize(st->name, &name_len);
    if (name == NULL)
        return -1;
    PyObject *tail = NULL;
    Py_ssize_t tail_len = 0;
    if (PyDict_GET_SIZE(st->params)) {
        tail = json_params(st->params);
        if (tail == NULL)
            return -1;
        tail_len = PyBytes_GET_SIZE(tail);
    }
    size_t body = 36 + (size_t)name_len + (size_t)tail_len; /* OPEN_HEAD is 36 bytes */
    if (name_len > 0xFFFF || body + 2 > MAX_FRAME_BYTES) {
        Py_XDECREF(tail);
        return 0;
    }
    char *p = mf_reserve(lane->writer, 6 + body);
    if (p == NULL) {
        Py_XDECREF(tail);
        return 0; /* the Python path meets the same error and falls back to lines */
    }
    char *q = p;
    q = put_u32(q, (uint32_t)(body + 2));
    q = put_u8(q, (uint8_t)hot_K.version);
    q = put_u8(q, (uint8_t)hot_K.open_type);
    q = put_u64(q, ++lane->writer->seq);
    q = put_u16(q, (uint16_t)lane->c_open);
    q = put_u64(q, (uint64_t)st->index);
    q = put_u64(q, (uint64_t)t);
    q = put_u32(q, (uint32_t)(int32_t)st->rank);
    q = put_u32(q, (uint32_t)(int32_t)st->cpu);
    q = put_u16(q, (uint16_t)name_len);
    memcpy(q, name, (size_t)name_len);
    q += name_len;
    if (tail != NULL) {
        memcpy(q, PyBytes_AS_STRING(tail), (size_t)tail_len);
        Py_DECREF(tail);
    }
    mf_commit(lane->writer, 6 + body);
    return 1;
}

/* The flags a CLOSE carries and the counters' scaling (Recorder._parts and
 * PerfGroup.delta_raw, restated for the one-group case). */
uint32_t hot_close_flags(Lane *lane, HotStep *st, double *factor, double *ratio)
{
    uint32_t flags = st->flags | lane->close_flags;
    *factor = 1.0;
    *ratio = 1.0;
    if (st->sampled)
        flags |= hot_K.sampled;
    else if (lane->n > 0) {
        uint64_t *a = st->raw, *b = st->raw + 2 + lane->n;
        int64_t de = (int64_t)(b[0] - a[0]), dr = (int64_t)(b[1] - a[1]);
        if (de > 0) { /* scale(1, de, dr) */
            if (dr <= 0) {
                *factor = 0.0;
                *ratio = 0.0;
            } else if (dr < de) {
                *factor = (double)de / (double)dr;
                *ratio = (double)dr / (double)de;
            }
        }
        if (*ratio < 1.0)
            flags |= hot_K.multiplexed;
    }
    if (st->end_cpu != st->cpu)
        flags |= hot_K.migrated;
    return flags;
}

/* The CLOSE frame into the spool mapping: 1 written, 0 not (the Python path takes it). */
int hot_write_close(Lane *lane, HotStep *st)
{
    if (!mf_usable(lane->writer) || st->sent != (int64_t)lane->writer->gen
        || st->dropped != Py_None
        || !(st->sampled || lane->fd < 0 || (st->has_start && st->has_stop))
        || st->end_ns < st->begin_ns || st->unsupported_obj != NULL || st->exception != NULL)
        return 0;
    double factor, ratio;
    uint32_t flags = hot_close_flags(lane, st, &factor, &ratio);
    Py_ssize_t tail_len = PyBytes_GET_SIZE(lane->close_tail);
    size_t body = 40 + 25 * (size_t)lane->n + (size_t)tail_len; /* CLOSE_HEAD, COUNTER */
    char *p = mf_reserve(lane->writer, 6 + body);
    if (p == NULL)
        return 0;
    char *q = p;
    q = put_u32(q, (uint32_t)(body + 2));
    q = put_u8(q, (uint8_t)hot_K.version);
    q = put_u8(q, (uint8_t)hot_K.close_type);
    st->close_seq = (int64_t)++lane->writer->seq;
    q = put_u64(q, (uint64_t)st->close_seq);
    q = put_u16(q, (uint16_t)lane->c_close);
    q = put_u64(q, (uint64_t)st->index);
    q = put_u64(q, (uint64_t)st->begin_ns);
    q = put_u64(q, (uint64_t)st->end_ns);
    q = put_u32(q, flags);
    q = put_u16(q, (uint16_t)tail_len);
    uint64_t *a = st->raw, *b = st->raw + 2 + lane->n;
    if (st->sampled) { /* sampling.Basis.estimate */
        double scale, v;
        int64_t basis_ns;
        memcpy(&basis_ns, &st->raw[lane->n], 8);
        scale = (double)(st->end_ns - st->begin_ns) / (double)basis_ns;
        for (int i = 0; i < lane->n; i++) {
            memcpy(&v, &st->raw[i], 8);
            q = put_u8(q, (uint8_t)hot_K.sampled_source);
            q = put_f64(q, v * scale);
            q = put_f64(q, 1.0);
            q = put_u64(q, (uint64_t)INT64_MIN); /* protocol.NO_RAW */
        }
    } else {
        for (int i = 0; i < lane->n; i++) {
            int j = 2 + lane->perm[i];
            int64_t d = (int64_t)(b[j] - a[j]);
            q = put_u8(q, 0); /* SOURCES.index("measured") */
            q = put_f64(q, (double)d * factor);
            q = put_f64(q, ratio);
            q = put_u64(q, (uint64_t)d);
        }
    }
    memcpy(q, PyBytes_AS_STRING(lane->close_tail), (size_t)tail_len);
    mf_commit(lane->writer, 6 + body);
    return 1;
}
