/* protocol._native: the remoting codec's JSON header reader in C (protocol.codec._decode_json_header_fast
 * asks it first; orjson and then the stdlib reference read what it leaves).
 *
 * A frame's JSON header is one flat object: code, opaque, flag, version (ints), language, remark (strings)
 * and extFields (an object of strings). Reading it through orjson builds a dict of every field, then Python
 * checks each one; here it is one pass over the bytes that builds only the result. It takes only what it is
 * sure of, and gives exactly what the reference gives for it: anything else (a float, a nested value, a
 * language given by its ordinal, a lone surrogate escape, invalid UTF-8, a control
 * character in a string, a leading zero, an integer out of int32 range, extFields given twice, a limit
 * passed, any syntax error) makes it return None, and the next reader decides, errors included.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const unsigned char *at;
    const unsigned char *end;
    /* an escaped string's UTF-8, unescaped */
    char *scratch;
    Py_ssize_t scratch_capacity;
} Reader;

/* outcomes of the readers below: taken, left to the next reader, or a Python error (memory) */
#define TAKEN 1
#define DECLINED 0
#define FAILED (-1)

static void skip_space(Reader *reader) {
    const unsigned char *at = reader->at, *end = reader->end;
    while (at < end && (*at == ' ' || *at == '\n' || *at == '\r' || *at == '\t')) {
        at++;
    }
    reader->at = at;
}

static int scratch_reserve(Reader *reader, Py_ssize_t needed) {
    if (needed <= reader->scratch_capacity) {
        return TAKEN;
    }
    Py_ssize_t capacity = reader->scratch_capacity ? reader->scratch_capacity : 256;
    while (capacity < needed) {
        capacity *= 2;
    }
    char *grown = PyMem_Realloc(reader->scratch, (size_t)capacity);
    if (grown == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    reader->scratch = grown;
    reader->scratch_capacity = capacity;
    return TAKEN;
}

static int hex_digit(unsigned char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* four hex digits after "\u" at ``at`` (``at`` + 4 <= end checked by the caller), or -1 */
static long hex4(const unsigned char *at) {
    long value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_digit(at[i]);
        if (digit < 0) {
            return -1;
        }
        value = value * 16 + digit;
    }
    return value;
}

/* A string's ``length`` bytes of UTF-8 as a new str (strict: no surrogates, no overlong forms), the reader
 * moved past its closing quote at ``closing``. */
static int take_string(Reader *reader, const char *utf8, Py_ssize_t length, const unsigned char *closing,
                       PyObject **text, Py_ssize_t *utf8_length) {
    *text = PyUnicode_DecodeUTF8(utf8, length, NULL);
    if (*text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            return FAILED;
        }
        PyErr_Clear();
        return DECLINED;
    }
    *utf8_length = length;
    reader->at = closing + 1;
    return TAKEN;
}

/* A string at the reader (its opening quote): ``*text`` a new str, ``*utf8_length`` its UTF-8 bytes. Strict
 * UTF-8 (no surrogates, no overlong forms), no raw control character, escapes of JSON only, surrogate escapes
 * only as a pair. */
static int read_string(Reader *reader, PyObject **text, Py_ssize_t *utf8_length) {
    const unsigned char *at = reader->at, *end = reader->end;
    if (at >= end || *at != '"') {
        return DECLINED;
    }
    const unsigned char *start = ++at;
    while (at < end && *at != '"' && *at != '\\' && *at >= 0x20) {
        at++;
    }
    if (at >= end || *at < 0x20) {
        return DECLINED;
    }
    if (*at == '"') {  /* no escape: the bytes as they are */
        return take_string(reader, (const char *)start, at - start, at, text, utf8_length);
    }
    /* escapes: unescaped into the scratch buffer (never longer than the escaped text) */
    if (scratch_reserve(reader, end - start) == FAILED) {
        return FAILED;
    }
    char *out = reader->scratch;
    Py_ssize_t length = at - start;
    memcpy(out, start, (size_t)length);
    while (at < end) {
        unsigned char c = *at;
        if (c == '"') {
            break;
        }
        if (c < 0x20) {
            return DECLINED;
        }
        if (c != '\\') {
            out[length++] = (char)c;
            at++;
            continue;
        }
        if (at + 1 >= end) {
            return DECLINED;
        }
        unsigned char escaped = at[1];
        at += 2;
        switch (escaped) {
            case '"': out[length++] = '"'; continue;
            case '\\': out[length++] = '\\'; continue;
            case '/': out[length++] = '/'; continue;
            case 'b': out[length++] = '\b'; continue;
            case 'f': out[length++] = '\f'; continue;
            case 'n': out[length++] = '\n'; continue;
            case 'r': out[length++] = '\r'; continue;
            case 't': out[length++] = '\t'; continue;
            case 'u': break;
            default: return DECLINED;
        }
        if (at + 4 > end) {
            return DECLINED;
        }
        long code_point = hex4(at);
        if (code_point < 0) {
            return DECLINED;
        }
        at += 4;
        if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
            return DECLINED;  /* a low surrogate alone */
        }
        if (code_point >= 0xD800 && code_point <= 0xDBFF) {
            if (at + 6 > end || at[0] != '\\' || at[1] != 'u') {
                return DECLINED;  /* a high surrogate alone */
            }
            long low = hex4(at + 2);
            if (low < 0xDC00 || low > 0xDFFF) {
                return DECLINED;
            }
            at += 6;
            code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
        }
        /* "\uXXXX" is 6 bytes, a pair 12: the UTF-8 (at most 3 and 4 bytes) never outgrows them */
        if (code_point < 0x80) {
            out[length++] = (char)code_point;
        } else if (code_point < 0x800) {
            out[length++] = (char)(0xC0 | (code_point >> 6));
            out[length++] = (char)(0x80 | (code_point & 0x3F));
        } else if (code_point < 0x10000) {
            out[length++] = (char)(0xE0 | (code_point >> 12));
            out[length++] = (char)(0x80 | ((code_point >> 6) & 0x3F));
            out[length++] = (char)(0x80 | (code_point & 0x3F));
        } else {
            out[length++] = (char)(0xF0 | (code_point >> 18));
            out[length++] = (char)(0x80 | ((code_point >> 12) & 0x3F));
            out[length++] = (char)(0x80 | ((code_point >> 6) & 0x3F));
            out[length++] = (char)(0x80 | (code_point & 0x3F));
        }
    }
    if (at >= end) {
        return DECLINED;
    }
    return take_string(reader, out, length, at, text, utf8_length);
}

/* An integer (no fraction, no exponent, no leading zero, at most 18 digits) at the reader. */
static int read_integer(Reader *reader, int64_t *value) {
    const unsigned char *at = reader->at, *end = reader->end;
    int negative = 0;
    if (at < end && *at == '-') {
        negative = 1;
        at++;
    }
    const unsigned char *digits = at;
    int64_t number = 0;
    while (at < end && *at >= '0' && *at <= '9') {
        if (at - digits >= 18) {
            return DECLINED;
        }
        number = number * 10 + (*at - '0');
        at++;
    }
    if (at == digits || (*digits == '0' && at - digits > 1)) {
        return DECLINED;
    }
    if (at < end && (*at == '.' || *at == 'e' || *at == 'E')) {
        return DECLINED;
    }
    *value = negative ? -number : number;
    reader->at = at;
    return TAKEN;
}

static int read_literal(Reader *reader, const char *word, Py_ssize_t length) {
    if (reader->end - reader->at < length || memcmp(reader->at, word, (size_t)length) != 0) {
        return DECLINED;
    }
    reader->at += length;
    return TAKEN;
}

/* An int32 field (code, opaque, flag, version): ``*present`` 0 for null. */
static int read_int32_field(Reader *reader, int64_t *value, int *present) {
    if (reader->at < reader->end && *reader->at == 'n') {
        *present = 0;
        return read_literal(reader, "null", 4);
    }
    int outcome = read_integer(reader, value);
    if (outcome != TAKEN) {
        return outcome;
    }
    if (*value < INT32_MIN || *value > INT32_MAX) {
        return DECLINED;
    }
    *present = 1;
    return TAKEN;
}

/* A value of a field the header does not keep: a string, an integer, true, false or null (checked as the
 * reference checks them: a string must still be valid UTF-8). */
static int skip_scalar(Reader *reader) {
    if (reader->at >= reader->end) {
        return DECLINED;
    }
    switch (*reader->at) {
        case '"': {
            PyObject *text = NULL;
            Py_ssize_t length;
            int outcome = read_string(reader, &text, &length);
            Py_XDECREF(text);
            return outcome;
        }
        case 't': return read_literal(reader, "true", 4);
        case 'f': return read_literal(reader, "false", 5);
        case 'n': return read_literal(reader, "null", 4);
        default: {
            int64_t ignored;
            return read_integer(reader, &ignored);
        }
    }
}

/* An extFields value as the reference keeps it: a string as it is, an integer as its digits (C++ clients write
 * numbers), true and false as words; null as None, which the caller drops once every key has its place. */
static int read_ext_value(Reader *reader, PyObject **value, Py_ssize_t *utf8_length) {
    if (reader->at >= reader->end) {
        return DECLINED;
    }
    const unsigned char *start = reader->at;
    int outcome;
    switch (*start) {
        case '"':
            return read_string(reader, value, utf8_length);
        case 't':
        case 'f': {
            int truth = *start == 't';
            outcome = truth ? read_literal(reader, "true", 4) : read_literal(reader, "false", 5);
            if (outcome != TAKEN) {
                return outcome;
            }
            *value = PyUnicode_FromString(truth ? "true" : "false");
            *utf8_length = truth ? 4 : 5;
            return *value == NULL ? FAILED : TAKEN;
        }
        case 'n':
            outcome = read_literal(reader, "null", 4);
            if (outcome == TAKEN) {
                *value = Py_NewRef(Py_None);
                *utf8_length = 0;
            }
            return outcome;
        default: {
            int64_t number;
            outcome = read_integer(reader, &number);
            if (outcome != TAKEN) {
                return outcome;
            }
            /* no leading zero: the digits are the number's text, but for "-0" */
            *value = number == 0 ? PyUnicode_FromString("0")
                                 : PyUnicode_FromStringAndSize((const char *)start, reader->at - start);
            *utf8_length = PyUnicode_GET_LENGTH(*value);
            return *value == NULL ? FAILED : TAKEN;
        }
    }
}

/* extFields' object at the reader into ``fields``, each value within ``value_max_bytes``; ``*nulls`` set when a
 * null holds a key's place. */
static int read_ext_fields(Reader *reader, PyObject *fields, Py_ssize_t value_max_bytes, int *nulls) {
    reader->at++;  /* '{' */
    skip_space(reader);
    if (reader->at < reader->end && *reader->at == '}') {
        reader->at++;
        return TAKEN;
    }
    for (;;) {
        PyObject *key = NULL, *value = NULL;
        Py_ssize_t key_length, value_length;
        int outcome = read_string(reader, &key, &key_length);
        if (outcome != TAKEN) {
            return outcome;
        }
        skip_space(reader);
        if (reader->at >= reader->end || *reader->at != ':') {
            Py_DECREF(key);
            return DECLINED;
        }
        reader->at++;
        skip_space(reader);
        outcome = read_ext_value(reader, &value, &value_length);
        if (outcome != TAKEN) {
            Py_DECREF(key);
            return outcome;
        }
        if (value == Py_None) {
            *nulls = 1;
        }
        if (value_length > value_max_bytes) {
            Py_DECREF(key);
            Py_DECREF(value);
            return DECLINED;
        }
        /* a key given twice keeps its first place and its last value, as a dict does */
        int stored = PyDict_SetItem(fields, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (stored < 0) {
            return FAILED;
        }
        skip_space(reader);
        if (reader->at >= reader->end) {
            return DECLINED;
        }
        if (*reader->at == '}') {
            reader->at++;
            return TAKEN;
        }
        if (*reader->at != ',') {
            return DECLINED;
        }
        reader->at++;
        skip_space(reader);
    }
}

typedef enum { KEY_OTHER, KEY_CODE, KEY_OPAQUE, KEY_FLAG, KEY_VERSION, KEY_LANGUAGE, KEY_REMARK, KEY_EXT } Key;

static Key key_of(PyObject *name) {
    Py_ssize_t length = PyUnicode_GET_LENGTH(name);
    if (!PyUnicode_IS_ASCII(name) || length < 4 || length > 9) {
        return KEY_OTHER;
    }
    const char *text = (const char *)PyUnicode_DATA(name);
    switch (length) {
        case 4:
            if (memcmp(text, "code", 4) == 0) return KEY_CODE;
            if (memcmp(text, "flag", 4) == 0) return KEY_FLAG;
            return KEY_OTHER;
        case 6:
            if (memcmp(text, "opaque", 6) == 0) return KEY_OPAQUE;
            if (memcmp(text, "remark", 6) == 0) return KEY_REMARK;
            return KEY_OTHER;
        case 7:
            return memcmp(text, "version", 7) == 0 ? KEY_VERSION : KEY_OTHER;
        case 8:
            return memcmp(text, "language", 8) == 0 ? KEY_LANGUAGE : KEY_OTHER;
        case 9:
            return memcmp(text, "extFields", 9) == 0 ? KEY_EXT : KEY_OTHER;
        default:
            return KEY_OTHER;
    }
}

typedef struct {
    int64_t code, opaque, flag, version;
    int has_code, has_opaque;
    PyObject *language;  /* NULL: missing or null */
    PyObject *remark;    /* NULL: missing or null */
    PyObject *ext_fields;
    int ext_nulls;
} Header;

static int read_field(Reader *reader, Header *header, Key key, Py_ssize_t remark_max_bytes,
                      Py_ssize_t value_max_bytes) {
    int present = 0;
    int64_t number = 0;
    int outcome;
    switch (key) {
        case KEY_CODE:
            outcome = read_int32_field(reader, &header->code, &header->has_code);
            return outcome;
        case KEY_OPAQUE:
            return read_int32_field(reader, &header->opaque, &header->has_opaque);
        case KEY_FLAG:
        case KEY_VERSION:
            outcome = read_int32_field(reader, &number, &present);
            if (outcome == TAKEN) {
                *(key == KEY_FLAG ? &header->flag : &header->version) = present ? number : 0;
            }
            return outcome;
        case KEY_LANGUAGE:
        case KEY_REMARK: {
            PyObject **slot = key == KEY_LANGUAGE ? &header->language : &header->remark;
            if (reader->at < reader->end && *reader->at == 'n') {
                outcome = read_literal(reader, "null", 4);
                if (outcome == TAKEN) {
                    Py_CLEAR(*slot);
                }
                return outcome;
            }
            PyObject *text = NULL;
            Py_ssize_t length;
            outcome = read_string(reader, &text, &length);  /* a language given by its ordinal: declined */
            if (outcome != TAKEN) {
                return outcome;
            }
            if (key == KEY_REMARK && length > remark_max_bytes) {
                Py_DECREF(text);
                return DECLINED;
            }
            Py_XSETREF(*slot, text);
            return TAKEN;
        }
        case KEY_EXT:
            if (header->ext_fields != NULL) {
                return DECLINED;  /* given twice */
            }
            header->ext_fields = PyDict_New();
            if (header->ext_fields == NULL) {
                return FAILED;
            }
            if (reader->at < reader->end && *reader->at == 'n') {
                return read_literal(reader, "null", 4);
            }
            if (reader->at >= reader->end || *reader->at != '{') {
                return DECLINED;
            }
            return read_ext_fields(reader, header->ext_fields, value_max_bytes, &header->ext_nulls);
        default:
            return skip_scalar(reader);
    }
}

static int read_header(Reader *reader, Header *header, Py_ssize_t remark_max_bytes, Py_ssize_t value_max_bytes) {
    skip_space(reader);
    if (reader->at >= reader->end || *reader->at != '{') {
        return DECLINED;
    }
    reader->at++;
    skip_space(reader);
    if (reader->at < reader->end && *reader->at == '}') {
        return DECLINED;  /* no code, no opaque */
    }
    for (;;) {
        PyObject *name = NULL;
        Py_ssize_t name_length;
        int outcome = read_string(reader, &name, &name_length);
        if (outcome != TAKEN) {
            return outcome;
        }
        Key key = key_of(name);
        Py_DECREF(name);
        skip_space(reader);
        if (reader->at >= reader->end || *reader->at != ':') {
            return DECLINED;
        }
        reader->at++;
        skip_space(reader);
        outcome = read_field(reader, header, key, remark_max_bytes, value_max_bytes);
        if (outcome != TAKEN) {
            return outcome;
        }
        skip_space(reader);
        if (reader->at >= reader->end) {
            return DECLINED;
        }
        if (*reader->at == '}') {
            reader->at++;
            skip_space(reader);
            return reader->at == reader->end ? TAKEN : DECLINED;
        }
        if (*reader->at != ',') {
            return DECLINED;
        }
        reader->at++;
        skip_space(reader);
    }
}

PyDoc_STRVAR(decode_json_header_doc,
"decode_json_header(buffer, start, end, remark_max_bytes, ext_fields_count_max, ext_field_value_max_bytes,\n"
"                   language_missing)\n"
"--\n\n"
"(code, language, version, opaque, flag, remark, ext_fields) of the JSON header in buffer[start:end], as\n"
"protocol.codec._decode_json_header_fast gives them, or None for anything it leaves to the next reader.");

static PyObject *decode_json_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decode_json_header takes 7 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t remark_max_bytes = PyLong_AsSsize_t(args[3]);
    Py_ssize_t count_max = PyLong_AsSsize_t(args[4]);
    Py_ssize_t value_max_bytes = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *language_missing = args[6];
    if (!PyUnicode_Check(language_missing)) {
        PyErr_SetString(PyExc_TypeError, "language_missing must be a str");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (start < 0 || end < start || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start and end must delimit a part of the buffer");
        return NULL;
    }
    Reader reader = {(const unsigned char *)view.buf + start, (const unsigned char *)view.buf + end, NULL, 0};
    Header header = {0, 0, 0, 0, 0, 0, NULL, NULL, NULL, 0};
    PyObject *result = NULL;
    int outcome = read_header(&reader, &header, remark_max_bytes, value_max_bytes);
    if (outcome == TAKEN && header.has_code && header.has_opaque
        && (header.ext_fields == NULL || PyDict_GET_SIZE(header.ext_fields) <= count_max)) {
        if (header.ext_fields == NULL) {
            header.ext_fields = PyDict_New();
        } else if (header.ext_nulls) {  /* Java's map holds null, which every reader treats as absent */
            PyObject *kept = PyDict_New();
            PyObject *key, *value;
            Py_ssize_t position = 0;
            while (kept != NULL && PyDict_Next(header.ext_fields, &position, &key, &value)) {
                if (value != Py_None && PyDict_SetItem(kept, key, value) < 0) {
                    Py_CLEAR(kept);
                }
            }
            Py_SETREF(header.ext_fields, kept);
        }
        if (header.ext_fields != NULL) {
            result = Py_BuildValue("(LOLLLOO)", (long long)header.code,
                                   header.language != NULL ? header.language : language_missing,
                                   (long long)header.version, (long long)header.opaque, (long long)header.flag,
                                   header.remark != NULL ? header.remark : Py_None, header.ext_fields);
        }
    } else if (outcome != FAILED) {
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(header.language);
    Py_XDECREF(header.remark);
    Py_XDECREF(header.ext_fields);
    PyMem_Free(reader.scratch);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------------------------ the send header */

/* broker.requests.SendHeader's fields, in its order; built into its slots directly (what its __init__ does
 * through each slot's setter, a twelfth of the cost each) */
#define SEND_FIELDS 12
static const char *const send_field_names[SEND_FIELDS] = {
    "producer_group", "topic", "default_topic", "default_topic_queue_nums", "queue_id", "sys_flag",
    "born_timestamp", "flag", "properties", "reconsume_times", "max_reconsume_times", "batch",
};
static PyTypeObject *send_header_type = NULL;
static Py_ssize_t send_field_offsets[SEND_FIELDS];

/* The slot offsets of ``type``'s fields (once per type): 0, or -1 with TypeError when they are not plain
 * object slots. */
static int learn_send_header(PyTypeObject *type) {
    if (type == send_header_type) {
        return 0;
    }
    for (int i = 0; i < SEND_FIELDS; i++) {
        PyObject *descriptor = PyObject_GetAttrString((PyObject *)type, send_field_names[i]);
        if (descriptor == NULL) {
            return -1;
        }
        int plain = Py_IS_TYPE(descriptor, &PyMemberDescr_Type)
                    && ((PyMemberDescrObject *)descriptor)->d_member->type == T_OBJECT_EX;
        if (plain) {
            send_field_offsets[i] = ((PyMemberDescrObject *)descriptor)->d_member->offset;
        }
        Py_DECREF(descriptor);
        if (!plain) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, send_field_names[i]);
            return -1;
        }
    }
    Py_XSETREF(send_header_type, (PyTypeObject *)Py_NewRef(type));
    return 0;
}

/* A decimal integer as Java's Integer.parseInt and Python's int() both read it (an optional '-', then at most
 * 18 ASCII digits), within low..high: a new int, or NULL without an error for anything else. */
static PyObject *strict_integer(PyObject *text, int64_t low, int64_t high) {
    if (!PyUnicode_IS_ASCII(text)) {
        return NULL;
    }
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    const char *at = (const char *)PyUnicode_DATA(text);
    const char *end = at + length;
    int negative = 0;
    if (at < end && *at == '-') {
        negative = 1;
        at++;
    }
    if (at == end || end - at > 18) {
        return NULL;
    }
    int64_t number = 0;
    for (; at < end; at++) {
        if (*at < '0' || *at > '9') {
            return NULL;
        }
        number = number * 10 + (*at - '0');
    }
    if (negative) {
        number = -number;
    }
    if (number < low || number > high) {
        return NULL;
    }
    return PyLong_FromLongLong((long long)number);
}

static int is_text(PyObject *value) {
    return value != Py_None && PyUnicode_CheckExact(value);
}

/* one field: its value, or ``fallback`` (a new reference) when it is absent or empty */
static PyObject *integer_field(PyObject *value, long long fallback, int64_t low, int64_t high) {
    if (value == Py_None || (PyUnicode_CheckExact(value) && PyUnicode_GET_LENGTH(value) == 0)) {
        return PyLong_FromLongLong(fallback);
    }
    return PyUnicode_CheckExact(value) ? strict_integer(value, low, high) : NULL;
}

PyDoc_STRVAR(read_send_header_doc,
"read_send_header(type, values)\n"
"--\n"
"\n"
"broker.requests.SendHeader.parse's common case: a ``type`` (SendHeader) instance from ``values``, the 12\n"
"fields as sent (str, or None when absent) in its order, or None for anything the Python parse must decide\n"
"(a missing required field, an integer written other than -?[0-9]+ or out of range, a batch flag other\n"
"than true/false/1/0): it then raises the error that names the field, or reads what only it reads.");

static PyObject *read_send_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyTuple_CheckExact(args[1])
        || PyTuple_GET_SIZE(args[1]) != SEND_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "read_send_header takes a type and a tuple of 12 values");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    if (learn_send_header(type) < 0) {
        return NULL;
    }
    PyObject *const *values = ((PyTupleObject *)args[1])->ob_item;
    for (int i = 0; i < SEND_FIELDS; i++) {
        if (values[i] != Py_None && !PyUnicode_CheckExact(values[i])) {
            return Py_NewRef(Py_None);
        }
    }
    /* producer_group and topic are required, born_timestamp too */
    if (!is_text(values[0]) || !is_text(values[1]) || !is_text(values[6])) {
        return Py_NewRef(Py_None);
    }
    PyObject *fields[SEND_FIELDS] = {NULL};
    int complete = 0;
    fields[0] = Py_NewRef(values[0]);
    fields[1] = Py_NewRef(values[1]);
    if (values[2] == Py_None) {
        fields[2] = PyUnicode_FromString("TBW102");
    } else {
        fields[2] = Py_NewRef(values[2]);
    }
    if ((fields[3] = integer_field(values[3], 4, 1, 1024)) == NULL
        || (fields[4] = integer_field(values[4], -1, INT32_MIN, INT32_MAX)) == NULL
        || (fields[5] = integer_field(values[5], 0, INT32_MIN, INT32_MAX)) == NULL
        || (fields[6] = strict_integer(values[6], INT64_MIN, INT64_MAX)) == NULL
        || (fields[7] = integer_field(values[7], 0, INT32_MIN, INT32_MAX)) == NULL) {
        goto done;
    }
    fields[8] = values[8] == Py_None ? PyUnicode_FromString("") : Py_NewRef(values[8]);
    if ((fields[9] = integer_field(values[9], 0, 0, INT32_MAX)) == NULL) {
        goto done;
    }
    if (values[10] == Py_None || PyUnicode_GET_LENGTH(values[10]) == 0) {
        fields[10] = Py_NewRef(Py_None);
    } else if ((fields[10] = strict_integer(values[10], -1, INT32_MAX)) == NULL) {
        goto done;
    }
    PyObject *batch = values[11];
    if (batch == Py_None || PyUnicode_GET_LENGTH(batch) == 0 || PyUnicode_CompareWithASCIIString(batch, "false") == 0
        || PyUnicode_CompareWithASCIIString(batch, "0") == 0) {
        fields[11] = Py_NewRef(Py_False);
    } else if (PyUnicode_CompareWithASCIIString(batch, "true") == 0
               || PyUnicode_CompareWithASCIIString(batch, "1") == 0) {
        fields[11] = Py_NewRef(Py_True);
    } else {
        goto done;
    }
    complete = 1;
done:
    if (PyErr_Occurred()) {  /* memory: the fields below are released, the error raised */
        complete = 0;
    }
    PyObject *header = NULL;
    if (complete) {
        for (int i = 0; i < SEND_FIELDS; i++) {
            if (fields[i] == NULL) {
                complete = 0;
            }
        }
    }
    if (complete) {
        header = type->tp_alloc(type, 0);
        if (header != NULL) {
            for (int i = 0; i < SEND_FIELDS; i++) {
                *(PyObject **)((char *)header + send_field_offsets[i]) = fields[i];  /* the reference moves */
                fields[i] = NULL;
            }
        }
    }
    for (int i = 0; i < SEND_FIELDS; i++) {
        Py_XDECREF(fields[i]);
    }
    if (header != NULL || PyErr_Occurred()) {
        return header;
    }
    return Py_NewRef(Py_None);
}

/* --------------------------------------------------------------------------------- a send's properties */

static int text_in(PyObject *key, PyObject *keys) {
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyUnicode_Compare(key, PyTuple_GET_ITEM(keys, i)) == 0) {
            return 1;
        }
    }
    return 0;
}

#define PLAIN_PAIRS_MAX 64

PyDoc_STRVAR(plain_properties_doc,
"plain_properties(text, cluster_key, cluster, delay_key, timer_keys, bytes_max)\n"
"--\n"
"\n"
"The stored properties of a plain send (no transaction, no batch) whose ``text`` asks for no delay level and\n"
"no delivery time: ``text`` as UTF-8 with ``cluster_key``=``cluster`` added when it is not there, exactly\n"
"what broker.send.SendProcessor.build_message stores for it, or None for anything it must decide (a delay\n"
"level other than 0, any of ``timer_keys``, a pair without its separator or key, a key given twice, a\n"
"separator in a value, more than 64 pairs, more than ``bytes_max`` bytes, a lone surrogate). Such text\n"
"parses into the pairs it is made of, in its order, so writing them again gives the text back.");

static PyObject *plain_properties(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyUnicode_CheckExact(args[0]) || !PyUnicode_CheckExact(args[1])
        || !PyUnicode_CheckExact(args[2]) || !PyUnicode_CheckExact(args[3]) || !PyTuple_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "plain_properties takes 4 str, a tuple of str and an int");
        return NULL;
    }
    Py_ssize_t bytes_max = PyLong_AsSsize_t(args[5]);
    if (bytes_max == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *text = args[0], *cluster_key = args[1], *cluster = args[2], *delay_key = args[3], *timer_keys = args[4];
    Py_ssize_t length;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &length);
    if (utf8 == NULL) {  /* a lone surrogate */
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    Py_ssize_t cluster_length;
    const char *cluster_utf8 = PyUnicode_AsUTF8AndSize(cluster, &cluster_length);
    if (cluster_utf8 == NULL) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    if (memchr(cluster_utf8, 1, (size_t)cluster_length) || memchr(cluster_utf8, 2, (size_t)cluster_length)) {
        return Py_NewRef(Py_None);
    }
    if (length > 0 && utf8[length - 1] != 2) {
        return Py_NewRef(Py_None);  /* text after the last pair */
    }
    /* each pair: a key (no separator, not empty), \x01, a value (no separator), \x02 */
    const char *keys[PLAIN_PAIRS_MAX];
    Py_ssize_t key_lengths[PLAIN_PAIRS_MAX];
    int pairs = 0, has_cluster = 0;
    const char *at = utf8, *end = utf8 + length;
    while (at < end) {
        const char *pair_end = memchr(at, 2, (size_t)(end - at));  /* found: the text ends with \x02 */
        const char *separator = memchr(at, 1, (size_t)(pair_end - at));
        if (separator == NULL || separator == at || memchr(separator + 1, 1, (size_t)(pair_end - separator - 1))
            || pairs == PLAIN_PAIRS_MAX) {
            return Py_NewRef(Py_None);
        }
        Py_ssize_t key_length = separator - at;
        for (int i = 0; i < pairs; i++) {
            if (key_lengths[i] == key_length && memcmp(keys[i], at, (size_t)key_length) == 0) {
                return Py_NewRef(Py_None);  /* given twice: the parse keeps the last value in the first place */
            }
        }
        keys[pairs] = at;
        key_lengths[pairs] = key_length;
        pairs++;
        PyObject *key = PyUnicode_DecodeUTF8(at, key_length, NULL);
        if (key == NULL) {
            return NULL;
        }
        int timer = text_in(key, timer_keys);
        int delay = PyUnicode_Compare(key, delay_key) == 0;
        has_cluster |= PyUnicode_Compare(key, cluster_key) == 0;
        Py_DECREF(key);
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_ssize_t value_length = pair_end - separator - 1;
        if (timer || (delay && !(value_length == 0 || (value_length == 1 && separator[1] == '0')))) {
            return Py_NewRef(Py_None);
        }
        at = pair_end + 1;
    }
    Py_ssize_t cluster_key_length;
    const char *cluster_key_utf8 = PyUnicode_AsUTF8AndSize(cluster_key, &cluster_key_length);
    if (cluster_key_utf8 == NULL) {
        return NULL;
    }
    Py_ssize_t total = has_cluster ? length : length + cluster_key_length + cluster_length + 2;
    if (total > bytes_max) {
        return Py_NewRef(Py_None);
    }
    PyObject *encoded = PyBytes_FromStringAndSize(NULL, total);
    if (encoded == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(encoded);
    memcpy(out, utf8, (size_t)length);
    if (!has_cluster) {
        out += length;
        memcpy(out, cluster_key_utf8, (size_t)cluster_key_length);
        out += cluster_key_length;
        *out++ = 1;
        memcpy(out, cluster_utf8, (size_t)cluster_length);
        out[cluster_length] = 2;
    }
    return encoded;
}

static PyMethodDef native_methods[] = {
    {"plain_properties", (PyCFunction)(void (*)(void))plain_properties, METH_FASTCALL, plain_properties_doc},
    {"decode_json_header", (PyCFunction)(void (*)(void))decode_json_header, METH_FASTCALL, decode_json_header_doc},
    {"read_send_header", (PyCFunction)(void (*)(void))read_send_header, METH_FASTCALL, read_send_header_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "protocol._native",
    "The remoting codec's JSON header reader in C (protocol.codec uses it when it is built; orjson and the "
    "stdlib reference read what it leaves, and the reference is what it is tested against).",
    -1, native_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    return PyModule_Create(&native_module);
}
