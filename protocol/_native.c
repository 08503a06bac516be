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
        *text = PyUnicode_DecodeUTF8((const char *)start, at - start, NULL);
        if (*text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                return FAILED;
            }
            PyErr_Clear();
            return DECLINED;
        }
        *utf8_length = at - start;
        reader->at = at + 1;
        return TAKEN;
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
    *text = PyUnicode_DecodeUTF8(out, length, NULL);
    if (*text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            return FAILED;
        }
        PyErr_Clear();
        return DECLINED;
    }
    *utf8_length = length;
    reader->at = at + 1;
    return TAKEN;
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

static PyMethodDef native_methods[] = {
    {"decode_json_header", (PyCFunction)(void (*)(void))decode_json_header, METH_FASTCALL, decode_json_header_doc},
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
