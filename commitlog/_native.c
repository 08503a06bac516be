/* commitlog._native: the leader's record builder (commitlog.records.RecordBuilder.build) in C.
 *
 * It lays out a batch of plain messages as stored records exactly as the Python builder does, and it is
 * tested against it byte for byte. It only handles what it is sure of: any input it does not take as it
 * is (a type other than the exact ones, a field out of range, a topic or message the store would refuse,
 * a property named twice, a transaction message) makes it return NotImplemented, and the Python builder
 * decides, so both always give the same answer. CRCs go through the caller's crc32 (isal's), tag codes
 * through its cache and cached_tag_code, topics through its topic cache: only the per-message loop is
 * here (about a fifth of the leader's CPU when it was Python).
 *
 * Layouts (big-endian, as commitlog.message.RECORD_HEADS):
 *   head ">iIIiiqqiq{born}sq{store}siqi" with an 8-byte (IPv4 + port) or 20-byte (IPv6 + port) born host
 *   (per message) and store host (per batch): 88, 100 or 112 bytes, sysFlag 0x10 / 0x20 set for IPv6 hosts,
 *   then body, topic segment (length byte + bytes), properties length ">h", properties;
 *   meta ">IHBiqiH" (25 bytes); key hash ">I".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MESSAGE_MAGIC 0xDAA320A7u
#define PROPERTIES_BYTES_MAX 32767
#define SYSFLAG_BORNHOST_V6 0x10
#define SYSFLAG_STOREHOST_V6 0x20
#define SPECIAL_TRANSACTION_BIT 0x4
#define HAS_UNIQ_KEY 0x1
#define BORN_HOST_V6 0x2
#define META_BYTES 25
#define HOST_V4_BYTES 8
#define HOST_V6_BYTES 20
/* a record's bytes besides its two hosts, body, topic segment and properties */
#define RECORD_FIXED_BYTES 74
#define TOPICS_MAX 65535
#define KEYS_PER_RECORD_MAX 65535

typedef struct {
    const char *body;
    Py_ssize_t body_length;
    const char *properties;
    Py_ssize_t properties_length;
    const char *born_host;
    Py_ssize_t born_host_length;
    Py_ssize_t topic_index;
    int64_t queue_id, flag, sys_flag, born_timestamp, reconsume_times, prepared_offset, tag_code;
    uint32_t size, body_crc;
    uint8_t flags;
    uint32_t key_count;
} Record;

typedef struct {
    uint32_t *items;
    Py_ssize_t count, capacity;
} Hashes;

static int hashes_push(Hashes *hashes, uint32_t value) {
    if (hashes->count == hashes->capacity) {
        Py_ssize_t capacity = hashes->capacity ? 2 * hashes->capacity : 1024;
        uint32_t *items = PyMem_Realloc(hashes->items, (size_t)capacity * sizeof(uint32_t));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        hashes->items = items;
        hashes->capacity = capacity;
    }
    hashes->items[hashes->count++] = value;
    return 0;
}

static inline void put_u16(char *at, uint32_t value) {
    at[0] = (char)(value >> 8);
    at[1] = (char)value;
}

static inline void put_u32(char *at, uint32_t value) {
    at[0] = (char)(value >> 24);
    at[1] = (char)(value >> 16);
    at[2] = (char)(value >> 8);
    at[3] = (char)value;
}

static inline void put_u64(char *at, uint64_t value) {
    put_u32(at, (uint32_t)(value >> 32));
    put_u32(at + 4, (uint32_t)value);
}

/* An exact int within [low, high] into *out: 1; anything else: 0 (the caller defers); -1 on an error. */
static int exact_int(PyObject *value, int64_t low, int64_t high, int64_t *out) {
    int overflow = 0;
    long long number;
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow || number < low || number > high) {
        return 0;
    }
    *out = (int64_t)number;
    return 1;
}

/* crc32(data[, start]) through the caller's function, as an unsigned 32-bit value; -1 on an error. */
static int64_t crc32_of(PyObject *crc32, PyObject *data, PyObject *start) {
    PyObject *result = start == NULL ? PyObject_CallOneArg(crc32, data)
                                     : PyObject_CallFunctionObjArgs(crc32, data, start, NULL);
    unsigned long value;
    if (result == NULL) {
        return -1;
    }
    value = PyLong_AsUnsignedLongMask(result);
    Py_DECREF(result);
    if (value == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    return (int64_t)(value & 0xFFFFFFFFu);
}

/* crc32 of a slice of a bytes object's data (a key), continuing from start. */
static int64_t call_crc32(PyObject *crc32, const char *data, Py_ssize_t length, PyObject *start) {
    PyObject *bytes = PyBytes_FromStringAndSize(data, length);
    int64_t value;
    if (bytes == NULL) {
        return -1;
    }
    value = crc32_of(crc32, bytes, start);
    Py_DECREF(bytes);
    return value;
}

static int starts_with(const char *at, Py_ssize_t length, const char *prefix, Py_ssize_t prefix_length) {
    return length >= prefix_length && memcmp(at, prefix, (size_t)prefix_length) == 0;
}

/* TAGS, KEYS and UNIQ_KEY of a properties string as the regex (?:^|\x02)(TAGS|KEYS|UNIQ_KEY)\x01([^\x02]*)
 * finds them: a name at the start of a \x02-separated segment, its value the rest of the segment. 1 when
 * each is there at most once; 0 when one is named twice (the caller defers). */
static int dispatch_properties(const char *properties, Py_ssize_t length, const char **values,
                               Py_ssize_t *lengths) {
    static const char *names[3] = {"TAGS\x01", "KEYS\x01", "UNIQ_KEY\x01"};
    static const Py_ssize_t name_lengths[3] = {5, 5, 9};
    Py_ssize_t start = 0;
    int which;
    for (which = 0; which < 3; which++) {
        values[which] = NULL;
        lengths[which] = 0;
    }
    while (start <= length) {
        const char *segment = properties + start;
        const char *separator = memchr(segment, '\x02', (size_t)(length - start));
        Py_ssize_t segment_length = separator ? separator - segment : length - start;
        for (which = 0; which < 3; which++) {
            if (starts_with(segment, segment_length, names[which], name_lengths[which])) {
                if (values[which] != NULL) {
                    return 0;
                }
                values[which] = segment + name_lengths[which];
                lengths[which] = segment_length - name_lengths[which];
                break;
            }
        }
        if (separator == NULL) {
            break;
        }
        start += segment_length + 1;
    }
    return 1;
}

/* The tag code of non-empty TAGS bytes: the cache, else tag_code_of(cache, tags). 1 with *out set, 0 to
 * defer (not an int in range), -1 on an error. */
static int tag_code(PyObject *cache, PyObject *tag_code_of, const char *tags, Py_ssize_t length, int64_t *out) {
    PyObject *key = PyBytes_FromStringAndSize(tags, length);
    PyObject *code;
    int found;
    if (key == NULL) {
        return -1;
    }
    code = PyDict_GetItemWithError(cache, key);
    if (code != NULL) {
        Py_INCREF(code);
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    } else {
        code = PyObject_CallFunctionObjArgs(tag_code_of, cache, key, NULL);
        if (code == NULL) {
            Py_DECREF(key);
            return -1;
        }
    }
    Py_DECREF(key);
    found = exact_int(code, INT64_MIN, INT64_MAX, out);
    Py_DECREF(code);
    return found;
}

typedef struct {
    PyObject *batch_topics; /* topic -> index */
    PyObject *topics;       /* list of str */
    PyObject *segments;     /* list of bytes */
    PyObject *prefixes;     /* list of int (CRC of "topic#") */
} Topics;

/* The batch index of topic, asking topic_entry(topic) -> (segment, prefix CRC) | None the first time.
 * >= 0: the index; -2: defer; -1: an error. */
static Py_ssize_t topic_index(Topics *topics, PyObject *topic_entry, PyObject *topic) {
    PyObject *known = PyDict_GetItemWithError(topics->batch_topics, topic);
    PyObject *entry, *segment, *prefix, *index;
    Py_ssize_t position;
    if (known != NULL) {
        return PyLong_AsSsize_t(known);
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    entry = PyObject_CallOneArg(topic_entry, topic);
    if (entry == NULL) {
        return -1;
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 0))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(entry, 1)) || PyList_GET_SIZE(topics->topics) >= TOPICS_MAX) {
        Py_DECREF(entry); /* None (a topic the store refuses) or more topics than a meta holds */
        return -2;
    }
    segment = PyTuple_GET_ITEM(entry, 0);
    prefix = PyTuple_GET_ITEM(entry, 1);
    position = PyList_GET_SIZE(topics->topics);
    index = PyLong_FromSsize_t(position);
    if (index == NULL || PyDict_SetItem(topics->batch_topics, topic, index) < 0
        || PyList_Append(topics->topics, topic) < 0 || PyList_Append(topics->segments, segment) < 0
        || PyList_Append(topics->prefixes, prefix) < 0) {
        Py_XDECREF(index);
        Py_DECREF(entry);
        return -1;
    }
    Py_DECREF(index);
    Py_DECREF(entry);
    return position;
}

/* Fills *record from message; 1: taken, 0: defer, -1: an error. */
static int read_message(PyObject *message, Record *record, Topics *topics, Hashes *hashes, PyObject *topic_entry,
                        PyObject *tag_cache, PyObject *tag_code_of, PyObject *crc32, int64_t body_max,
                        int64_t segment_max, Py_ssize_t store_host_length) {
    PyObject *topic, *born_host, *body, *properties, *prefix;
    Py_ssize_t index, segment_length;
    const char *values[3];
    Py_ssize_t lengths[3];
    int64_t size, crc;
    int taken;
    uint32_t keys_before = (uint32_t)hashes->count;
    if (!PyTuple_Check(message) || PyTuple_GET_SIZE(message) != 11) {
        return 0;
    }
    topic = PyTuple_GET_ITEM(message, 0);
    born_host = PyTuple_GET_ITEM(message, 5);
    body = PyTuple_GET_ITEM(message, 9);
    properties = PyTuple_GET_ITEM(message, 10);
    if (!PyUnicode_CheckExact(topic) || !PyBytes_CheckExact(born_host) || !PyBytes_CheckExact(body)
        || !PyBytes_CheckExact(properties)) {
        return 0;
    }
#define TAKE_INT(position, low, high, field)                                                 \
    taken = exact_int(PyTuple_GET_ITEM(message, position), (low), (high), &record->field); \
    if (taken != 1) {                                                                       \
        return taken;                                                                       \
    }
    TAKE_INT(1, 0, INT32_MAX, queue_id)
    TAKE_INT(2, INT32_MIN, INT32_MAX, flag)
    TAKE_INT(3, 0, INT32_MAX, sys_flag)
    TAKE_INT(4, INT64_MIN, INT64_MAX, born_timestamp)
    TAKE_INT(7, INT32_MIN, INT32_MAX, reconsume_times)
    TAKE_INT(8, INT64_MIN, INT64_MAX, prepared_offset)
#undef TAKE_INT
    index = topic_index(topics, topic_entry, topic);
    if (index < 0) {
        return index == -2 ? 0 : -1;
    }
    record->topic_index = index;
    record->body = PyBytes_AS_STRING(body);
    record->body_length = PyBytes_GET_SIZE(body);
    record->properties = PyBytes_AS_STRING(properties);
    record->properties_length = PyBytes_GET_SIZE(properties);
    record->born_host = PyBytes_AS_STRING(born_host);
    record->born_host_length = PyBytes_GET_SIZE(born_host);
    if (record->body_length > body_max || record->properties_length > PROPERTIES_BYTES_MAX
        || record->sys_flag & SPECIAL_TRANSACTION_BIT) {
        return 0;
    }
    if (record->born_host_length != HOST_V4_BYTES && record->born_host_length != HOST_V6_BYTES) {
        return 0;
    }
    segment_length = PyBytes_GET_SIZE(PyList_GET_ITEM(topics->segments, index));
    size = RECORD_FIXED_BYTES + (int64_t)store_host_length + (int64_t)record->born_host_length + record->body_length
           + segment_length + record->properties_length;
    if (size > segment_max || size > INT32_MAX) {
        return 0;
    }
    record->size = (uint32_t)size;
    if (!dispatch_properties(record->properties, record->properties_length, values, lengths)) {
        return 0; /* a property named twice: the Python builder says what happens */
    }
    record->sys_flag &= ~(int64_t)(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
    if (store_host_length == HOST_V6_BYTES) {
        record->sys_flag |= SYSFLAG_STOREHOST_V6;
    }
    record->flags = 0;
    if (record->born_host_length == HOST_V6_BYTES) {
        record->sys_flag |= SYSFLAG_BORNHOST_V6;
        record->flags = BORN_HOST_V6;
    }
    crc = crc32_of(crc32, body, NULL);
    if (crc < 0) {
        return -1;
    }
    record->body_crc = (uint32_t)crc & 0x7FFFFFFFu;
    prefix = PyList_GET_ITEM(topics->prefixes, index);
    if (values[2] != NULL && lengths[2] > 0) { /* UNIQ_KEY */
        crc = call_crc32(crc32, values[2], lengths[2], prefix);
        if (crc < 0 || hashes_push(hashes, (uint32_t)crc) < 0) {
            return -1;
        }
        record->flags |= HAS_UNIQ_KEY;
    }
    if (values[1] != NULL && lengths[1] > 0) { /* KEYS, space-separated, empty pieces skipped */
        const char *key = values[1];
        const char *end = values[1] + lengths[1];
        while (key < end) {
            const char *space = memchr(key, ' ', (size_t)(end - key));
            const char *stop = space ? space : end;
            if (stop > key) {
                crc = call_crc32(crc32, key, stop - key, prefix);
                if (crc < 0 || hashes_push(hashes, (uint32_t)crc) < 0) {
                    return -1;
                }
            }
            key = stop + 1;
        }
    }
    record->key_count = (uint32_t)hashes->count - keys_before;
    if (record->key_count > KEYS_PER_RECORD_MAX) {
        return 0;
    }
    record->tag_code = 0;
    if (values[0] != NULL && lengths[0] > 0) { /* TAGS */
        taken = tag_code(tag_cache, tag_code_of, values[0], lengths[0], &record->tag_code);
        if (taken != 1) {
            return taken;
        }
    }
    return 1;
}

static void write_record(char *at, const Record *record, PyObject *segment, int64_t stamp, const char *store_host,
                         Py_ssize_t store_host_length) {
    put_u32(at, record->size);
    put_u32(at + 4, MESSAGE_MAGIC);
    put_u32(at + 8, record->body_crc);
    put_u32(at + 12, (uint32_t)record->queue_id);
    put_u32(at + 16, (uint32_t)record->flag);
    memset(at + 20, 0, 16); /* queue offset and physical offset: apply sets them */
    put_u32(at + 36, (uint32_t)record->sys_flag);
    put_u64(at + 40, (uint64_t)record->born_timestamp);
    memcpy(at + 48, record->born_host, (size_t)record->born_host_length);
    at += 48 + record->born_host_length;
    put_u64(at, (uint64_t)stamp);
    memcpy(at + 8, store_host, (size_t)store_host_length);
    at += 8 + store_host_length;
    put_u32(at, (uint32_t)record->reconsume_times);
    put_u64(at + 4, (uint64_t)record->prepared_offset);
    put_u32(at + 12, (uint32_t)record->body_length);
    at += 16;
    memcpy(at, record->body, (size_t)record->body_length);
    at += record->body_length;
    memcpy(at, PyBytes_AS_STRING(segment), (size_t)PyBytes_GET_SIZE(segment));
    at += PyBytes_GET_SIZE(segment);
    put_u16(at, (uint32_t)record->properties_length);
    memcpy(at + 2, record->properties, (size_t)record->properties_length);
}

static void write_meta(char *at, const Record *record) {
    put_u32(at, record->size);
    put_u16(at + 4, (uint32_t)record->topic_index);
    at[6] = (char)record->flags;
    put_u32(at + 7, (uint32_t)record->queue_id);
    put_u64(at + 11, (uint64_t)record->tag_code);
    put_u32(at + 19, (uint32_t)record->reconsume_times);
    put_u16(at + 23, record->key_count);
}

PyDoc_STRVAR(build_records_doc,
"build_records(messages, stamp, store_host, body_max, segment_max, topic_entry, tag_codes, tag_code_of, crc32)\n"
"--\n\n"
"(topics, metas, key hashes, records) of the batch, as RecordBuilder.build lays them out; NotImplemented\n"
"when the Python builder must decide.");

static PyObject *build_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *sequence = NULL, *result = NULL, *metas = NULL, *key_hashes = NULL, *records = NULL;
    PyObject *topic_tuple = NULL;
    Topics topics = {NULL, NULL, NULL, NULL};
    Hashes hashes = {NULL, 0, 0};
    Record *items = NULL;
    Py_ssize_t count, position, total = 0;
    int64_t stamp, body_max, segment_max;
    PyObject *store_host, *topic_entry, *tag_cache, *tag_code_of, *crc32;
    char *at;
    (void)module;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "build_records takes 9 arguments");
        return NULL;
    }
    store_host = args[2];
    topic_entry = args[5];
    tag_cache = args[6];
    tag_code_of = args[7];
    crc32 = args[8];
    if (!PyBytes_CheckExact(store_host)
        || (PyBytes_GET_SIZE(store_host) != HOST_V4_BYTES && PyBytes_GET_SIZE(store_host) != HOST_V6_BYTES)
        || !PyDict_CheckExact(tag_cache)
        || exact_int(args[1], INT64_MIN, INT64_MAX, &stamp) != 1
        || exact_int(args[3], 0, INT64_MAX, &body_max) != 1 || exact_int(args[4], INT64_MIN, INT64_MAX, &segment_max) != 1) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NOTIMPLEMENTED;
    }
    sequence = PySequence_Fast(args[0], "messages must be a sequence");
    if (sequence == NULL) {
        return NULL;
    }
    count = PySequence_Fast_GET_SIZE(sequence);
    if (count == 0) {
        Py_DECREF(sequence);
        Py_RETURN_NOTIMPLEMENTED;
    }
    items = PyMem_Calloc((size_t)count, sizeof(Record));
    topics.batch_topics = PyDict_New();
    topics.topics = PyList_New(0);
    topics.segments = PyList_New(0);
    topics.prefixes = PyList_New(0);
    if (items == NULL || topics.batch_topics == NULL || topics.topics == NULL || topics.segments == NULL
        || topics.prefixes == NULL) {
        if (items == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    for (position = 0; position < count; position++) {
        int taken = read_message(PySequence_Fast_GET_ITEM(sequence, position), &items[position], &topics, &hashes,
                                 topic_entry, tag_cache, tag_code_of, crc32, body_max, segment_max,
                                 PyBytes_GET_SIZE(store_host));
        if (taken < 0) {
            goto done;
        }
        if (taken == 0) {
            result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        total += items[position].size; /* a record's size counts all of it: head, body, topic, properties */
    }
    records = PyBytes_FromStringAndSize(NULL, total);
    metas = PyBytes_FromStringAndSize(NULL, count * META_BYTES);
    key_hashes = PyBytes_FromStringAndSize(NULL, hashes.count * 4);
    topic_tuple = PyList_AsTuple(topics.topics);
    if (records == NULL || metas == NULL || key_hashes == NULL || topic_tuple == NULL) {
        goto done;
    }
    at = PyBytes_AS_STRING(records);
    for (position = 0; position < count; position++) {
        const Record *record = &items[position];
        write_record(at, record, PyList_GET_ITEM(topics.segments, record->topic_index), stamp,
                     PyBytes_AS_STRING(store_host), PyBytes_GET_SIZE(store_host));
        at += record->size;
        write_meta(PyBytes_AS_STRING(metas) + position * META_BYTES, record);
    }
    for (position = 0; position < hashes.count; position++) {
        put_u32(PyBytes_AS_STRING(key_hashes) + position * 4, hashes.items[position]);
    }
    result = PyTuple_Pack(4, topic_tuple, metas, key_hashes, records);
done:
    Py_XDECREF(topic_tuple);
    Py_XDECREF(records);
    Py_XDECREF(metas);
    Py_XDECREF(key_hashes);
    Py_XDECREF(topics.batch_topics);
    Py_XDECREF(topics.topics);
    Py_XDECREF(topics.segments);
    Py_XDECREF(topics.prefixes);
    PyMem_Free(hashes.items);
    PyMem_Free(items);
    Py_DECREF(sequence);
    return result;
}

static PyMethodDef native_methods[] = {
    {"build_records", (PyCFunction)(void (*)(void))build_records, METH_FASTCALL, build_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "commitlog._native",
    "The leader's record builder in C (commitlog.records uses it when it is built; the Python builder is the "
    "reference and the fallback).",
    -1, native_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "MESSAGE_MAGIC", (long)MESSAGE_MAGIC) < 0
        || PyModule_AddIntConstant(module, "PROPERTIES_BYTES_MAX", PROPERTIES_BYTES_MAX) < 0
        || PyModule_AddIntConstant(module, "META_BYTES", META_BYTES) < 0
        || PyModule_AddIntConstant(module, "HAS_UNIQ_KEY", HAS_UNIQ_KEY) < 0
        || PyModule_AddIntConstant(module, "BORN_HOST_V6", BORN_HOST_V6) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
