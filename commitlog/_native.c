/* commitlog._native: the leader's record builder (commitlog.records.RecordBuilder.build) in C, and the
 * scrubber's record walk (commitlog.scrub_walk, at the end of this file).
 *
 * It lays out a batch of plain messages as stored records exactly as the Python builder does, and it is
 * tested against it byte for byte. It only handles what it is sure of: any input it does not take as it
 * is (a type other than the exact ones, a field out of range, a topic or message the store would refuse,
 * a property named twice, a transaction message) makes it return NotImplemented, and the Python builder
 * decides, so both always give the same answer. CRCs go through the caller's crc32 (isal's), tag codes
 * through its cache and cached_tag_code, topics through its topic cache: only the per-message loop is
 * here (where much of the leader's CPU went when it was Python).
 *
 * Layouts (big-endian, as commitlog.record_codec.RECORD_HEADS):
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
 * finds them: a name at the start of a \x02-separated segment, its value the rest of the segment. With
 * last_wins, a repeated name's last value is kept (commitlog.dispatch.dispatch_fields) and 1 is returned;
 * without, 1 when each is there at most once and 0 when one is named twice (the caller defers). */
static int dispatch_properties(const char *properties, Py_ssize_t length, const char **values,
                               Py_ssize_t *lengths, int last_wins) {
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
                if (values[which] != NULL && !last_wins) {
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
    if (!dispatch_properties(record->properties, record->properties_length, values, lengths, 0)) {
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

static void write_record(char *at, const Record *record, PyObject *segment, int64_t store_timestamp, const char *store_host,
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
    put_u64(at, (uint64_t)store_timestamp);
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
"build_records(messages, store_timestamp, store_host, body_max, segment_max, topic_entry, tag_codes, tag_code_of, crc32)\n"
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
    int64_t store_timestamp, body_max, segment_max;
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
        || exact_int(args[1], INT64_MIN, INT64_MAX, &store_timestamp) != 1
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
        write_record(at, record, PyList_GET_ITEM(topics.segments, record->topic_index), store_timestamp,
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

/* ------------------------------------------------------------------ the scrubber's record walk
 *
 * commitlog.scrub_walk.walk_segment_python in C: validate the records of one segment's mapping from a local
 * offset as CommitLog.scan and decode_record do (framing, lengths, UTF-8 topic, body CRC, the record naming
 * its own offset; a filler must run to the segment's end), and hand back only what the scrubber's checks
 * need, packed (little-endian, as commitlog.scrub_walk.RECORD_FACTS and KEY_ENTRY):
 *   facts "<qqqiiiIB" per valid record: physical offset, queue offset, store timestamp, size, queue id,
 *         tag code, topic number, 1 when its consume-queue unit is checked (not a prepared or rolled-back
 *         transaction message)
 *   entries "<Iqq" per key-index entry dispatch makes of it: hash, physical offset, store timestamp
 * Body CRCs and key hashes go through the caller's crc32, a non-ASCII tag's code through its cache and
 * cached_tag_code. Tested against the Python walk on valid and damaged segments. */

#define BLANK_MAGIC 0xCBD43194u
#define TRANSACTION_TYPE_MASK 0xC
#define TRANSACTION_PREPARED_TYPE 0x4
#define TRANSACTION_ROLLBACK_TYPE 0xC
/* record_size(0, 1, 0): the smallest total size decode_record takes */
#define RECORD_SIZE_MIN 92
#define FILLER_HEADER_BYTES 8
#define FACTS_BYTES 41 /* RECORD_FACTS_BYTES */
#define KEY_ENTRY_BYTES 20

typedef struct {
    char *items;
    Py_ssize_t length, capacity;
} Packed;

static char *packed_grow(Packed *packed, Py_ssize_t size) {
    char *at;
    if (packed->length + size > packed->capacity) {
        Py_ssize_t capacity = packed->capacity ? 2 * packed->capacity : 4096;
        char *items;
        while (capacity < packed->length + size) {
            capacity *= 2;
        }
        items = PyMem_Realloc(packed->items, (size_t)capacity);
        if (items == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        packed->items = items;
        packed->capacity = capacity;
    }
    at = packed->items + packed->length;
    packed->length += size;
    return at;
}

static inline uint32_t get_u32(const unsigned char *at) {
    return ((uint32_t)at[0] << 24) | ((uint32_t)at[1] << 16) | ((uint32_t)at[2] << 8) | (uint32_t)at[3];
}

static inline uint64_t get_u64(const unsigned char *at) {
    return ((uint64_t)get_u32(at) << 32) | get_u32(at + 4);
}

static inline void put_le(char *at, uint64_t value, int bytes) {
    int position;
    for (position = 0; position < bytes; position++) {
        at[position] = (char)(value >> (8 * position));
    }
}

/* crc32(data, start) of bytes inside the walked buffer, through a read-only memoryview; -1 on an error. */
static int64_t crc32_of_memory(PyObject *crc32, const unsigned char *data, Py_ssize_t length, PyObject *start) {
    PyObject *view = PyMemoryView_FromMemory((char *)data, length, PyBUF_READ);
    int64_t value;
    if (view == NULL) {
        return -1;
    }
    value = crc32_of(crc32, view, start);
    Py_DECREF(view);
    return value;
}

/* cached_tag_code(cache, tags): Java's String.hashCode of ASCII tags computed here, others through the
 * caller; 0 for none. 0 on success, -1 on an error. */
static int walk_tag_code(PyObject *cache, PyObject *tag_code_of, const char *tags, Py_ssize_t length, int32_t *out) {
    Py_ssize_t position;
    uint32_t hash = 0;
    int64_t code;
    int found;
    if (tags == NULL || length == 0) {
        *out = 0;
        return 0;
    }
    for (position = 0; position < length; position++) {
        unsigned char byte = (unsigned char)tags[position];
        if (byte >= 0x80) {
            break;
        }
        hash = 31u * hash + byte;
    }
    if (position == length) {
        *out = (int32_t)hash;
        return 0;
    }
    found = tag_code(cache, tag_code_of, tags, length, &code);
    if (found < 0) {
        return -1;
    }
    if (found == 0 || code < INT32_MIN || code > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "cached_tag_code gave no 32-bit int");
        return -1;
    }
    *out = (int32_t)code;
    return 0;
}

/* The number of a record's topic in this walk and the CRC of "topic#", taking a new one (valid UTF-8) the
 * first time. >= 0: the number; -2: not UTF-8 (an invalid record); -1: an error. */
static Py_ssize_t walk_topic(PyObject *numbers, PyObject *topics, PyObject *prefixes, PyObject *crc32,
                             const char *topic, Py_ssize_t length, PyObject **prefix) {
    PyObject *key = PyBytes_FromStringAndSize(topic, length);
    PyObject *known, *text = NULL, *number = NULL, *hashed = NULL, *crc = NULL;
    Py_ssize_t position = -1;
    if (key == NULL) {
        return -1;
    }
    known = PyDict_GetItemWithError(numbers, key);
    if (known != NULL) {
        position = PyLong_AsSsize_t(known);
        *prefix = PyList_GET_ITEM(prefixes, position);
        Py_DECREF(key);
        return position;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    text = PyUnicode_DecodeUTF8(topic, length, "strict");
    if (text == NULL) {
        Py_DECREF(key);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return -2;
        }
        return -1;
    }
    hashed = PyBytes_FromStringAndSize(NULL, length + 1);
    if (hashed != NULL) {
        memcpy(PyBytes_AS_STRING(hashed), topic, (size_t)length);
        PyBytes_AS_STRING(hashed)[length] = '#';
        crc = PyObject_CallOneArg(crc32, hashed);
    }
    position = PyList_GET_SIZE(topics);
    if (crc == NULL || (number = PyLong_FromSsize_t(position)) == NULL || PyDict_SetItem(numbers, key, number) < 0
        || PyList_Append(topics, text) < 0 || PyList_Append(prefixes, crc) < 0) {
        position = -1;
    } else {
        *prefix = crc;
    }
    Py_XDECREF(number);
    Py_XDECREF(crc);
    Py_XDECREF(hashed);
    Py_DECREF(text);
    Py_DECREF(key);
    return position;
}

static int push_entry(Packed *entries, int64_t hash, int64_t physical, int64_t store_timestamp) {
    char *at = packed_grow(entries, KEY_ENTRY_BYTES);
    if (at == NULL) {
        return -1;
    }
    put_le(at, (uint64_t)hash, 4);
    put_le(at + 4, (uint64_t)physical, 8);
    put_le(at + 12, (uint64_t)store_timestamp, 8);
    return 0;
}

/* The key-index entries of a record (not a rolled-back half): UNIQ_KEY's, then each space-separated key's. */
static int push_entries(Packed *entries, PyObject *crc32, PyObject *prefix, const char **values,
                        const Py_ssize_t *lengths, int64_t physical, int64_t store_timestamp) {
    int64_t hash;
    Py_ssize_t start = 0;
    if (values[2] != NULL && lengths[2] > 0) {
        hash = crc32_of_memory(crc32, (const unsigned char *)values[2], lengths[2], prefix);
        if (hash < 0 || push_entry(entries, hash, physical, store_timestamp) < 0) {
            return -1;
        }
    }
    if (values[1] == NULL) {
        return 0;
    }
    while (start < lengths[1]) {
        const char *key = values[1] + start;
        const char *space = memchr(key, ' ', (size_t)(lengths[1] - start));
        Py_ssize_t key_length = space ? space - key : lengths[1] - start;
        if (key_length > 0) {
            hash = crc32_of_memory(crc32, (const unsigned char *)key, key_length, prefix);
            if (hash < 0 || push_entry(entries, hash, physical, store_timestamp) < 0) {
                return -1;
            }
        }
        start += key_length + 1;
    }
    return 0;
}

PyDoc_STRVAR(walk_records_doc,
"walk_records(segment, segment_start, local_start, local_stop, tag_codes, tag_code_of, crc32)\n"
"--\n\n"
"(end, facts, entries, topics) of the valid records of a segment's bytes from local_start, as\n"
"commitlog.scrub_walk.walk_segment_python gives them.");

static PyObject *walk_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    PyObject *numbers = NULL, *topics = NULL, *prefixes = NULL, *topic_tuple = NULL;
    PyObject *facts_bytes = NULL, *entries_bytes = NULL, *result = NULL;
    PyObject *tag_cache, *tag_code_of, *crc32;
    Packed facts = {NULL, 0, 0}, entries = {NULL, 0, 0};
    int64_t segment_start, local, local_stop, segment_size;
    const unsigned char *data;
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "walk_records takes 7 arguments");
        return NULL;
    }
    tag_cache = args[4];
    tag_code_of = args[5];
    crc32 = args[6];
    if (exact_int(args[1], 0, INT64_MAX, &segment_start) != 1 || exact_int(args[2], 0, INT64_MAX, &local) != 1
        || exact_int(args[3], 0, INT64_MAX, &local_stop) != 1 || !PyDict_CheckExact(tag_cache)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "walk_records: bad offsets or tag-code cache");
        }
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    data = (const unsigned char *)view.buf;
    segment_size = view.len;
    numbers = PyDict_New();
    topics = PyList_New(0);
    prefixes = PyList_New(0);
    if (numbers == NULL || topics == NULL || prefixes == NULL) {
        goto done;
    }
    while (local < local_stop) {
        const unsigned char *record = data + local;
        int64_t size, body_length, queue_id, queue_offset, physical, store_timestamp, sys_flag;
        int64_t position, born_length, store_length, topic_length, properties_length, crc;
        uint32_t magic, body_crc;
        const char *values[3];
        Py_ssize_t lengths[3], topic_number;
        PyObject *prefix = NULL;
        int32_t tags_code;
        int queue_check;
        char *at;
        if (local + FILLER_HEADER_BYTES > segment_size) {
            break;
        }
        size = (int32_t)get_u32(record);
        magic = get_u32(record + 4);
        if (magic == BLANK_MAGIC) {
            if (size == segment_size - local) {
                local = segment_size; /* the filler ends the segment */
            }
            break;
        }
        /* CommitLog.scan's framing, then decode_record's checks in its order */
        if (magic != MESSAGE_MAGIC || size <= 0 || local + size + FILLER_HEADER_BYTES > segment_size
            || size < RECORD_SIZE_MIN) {
            break;
        }
        body_crc = get_u32(record + 8);
        queue_id = (int32_t)get_u32(record + 12);
        queue_offset = (int64_t)get_u64(record + 20);
        physical = (int64_t)get_u64(record + 28);
        sys_flag = (int32_t)get_u32(record + 36);
        born_length = sys_flag & SYSFLAG_BORNHOST_V6 ? HOST_V6_BYTES : HOST_V4_BYTES;
        store_length = sys_flag & SYSFLAG_STOREHOST_V6 ? HOST_V6_BYTES : HOST_V4_BYTES;
        position = 48;
        if (position + born_length + 8 + store_length + 16 > size) {
            break;
        }
        store_timestamp = (int64_t)get_u64(record + position + born_length);
        position += born_length + 8 + store_length + 12;
        body_length = (int32_t)get_u32(record + position);
        position += 4;
        if (body_length < 0 || position + body_length + 3 > size) {
            break;
        }
        topic_length = record[position + body_length];
        if (topic_length == 0 || position + body_length + 1 + topic_length + 2 > size) {
            break;
        }
        properties_length = (int16_t)(((uint32_t)record[position + body_length + 1 + topic_length] << 8)
                                      | record[position + body_length + 2 + topic_length]);
        if (properties_length < 0 || position + body_length + 3 + topic_length + properties_length != size) {
            break;
        }
        crc = crc32_of_memory(crc32, record + position, (Py_ssize_t)body_length, NULL);
        if (crc < 0) {
            goto done;
        }
        if (body_crc != ((uint32_t)crc & 0x7FFFFFFFu) && body_crc != (uint32_t)crc) {
            break;
        }
        if (physical != segment_start + local) {
            break;
        }
        /* last: a topic is numbered only for a record found valid (the Python walk numbers them so) */
        topic_number = walk_topic(numbers, topics, prefixes, crc32, (const char *)record + position + body_length + 1,
                                  (Py_ssize_t)topic_length, &prefix);
        if (topic_number == -1) {
            goto done;
        }
        if (topic_number == -2) {
            break;
        }
        dispatch_properties((const char *)record + size - properties_length, (Py_ssize_t)properties_length, values, lengths,
                            1);
        queue_check = (sys_flag & TRANSACTION_TYPE_MASK) != TRANSACTION_PREPARED_TYPE
                      && (sys_flag & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK_TYPE;
        if (walk_tag_code(tag_cache, tag_code_of, values[0], lengths[0], &tags_code) < 0) {
            goto done;
        }
        at = packed_grow(&facts, FACTS_BYTES);
        if (at == NULL) {
            goto done;
        }
        put_le(at, (uint64_t)physical, 8);
        put_le(at + 8, (uint64_t)queue_offset, 8);
        put_le(at + 16, (uint64_t)store_timestamp, 8);
        put_le(at + 24, (uint64_t)size, 4);
        put_le(at + 28, (uint64_t)queue_id, 4);
        put_le(at + 32, (uint64_t)(uint32_t)tags_code, 4);
        put_le(at + 36, (uint64_t)topic_number, 4);
        at[40] = (char)queue_check;
        if ((sys_flag & TRANSACTION_TYPE_MASK) != TRANSACTION_ROLLBACK_TYPE
            && push_entries(&entries, crc32, prefix, values, lengths, physical, store_timestamp) < 0) {
            goto done;
        }
        local += size;
    }
    facts_bytes = PyBytes_FromStringAndSize(facts.items, facts.length);
    entries_bytes = PyBytes_FromStringAndSize(entries.items, entries.length);
    topic_tuple = PyList_AsTuple(topics);
    if (facts_bytes != NULL && entries_bytes != NULL && topic_tuple != NULL) {
        result = Py_BuildValue("(LOOO)", (long long)local, facts_bytes, entries_bytes, topic_tuple);
    }
done:
    Py_XDECREF(facts_bytes);
    Py_XDECREF(entries_bytes);
    Py_XDECREF(topic_tuple);
    Py_XDECREF(numbers);
    Py_XDECREF(topics);
    Py_XDECREF(prefixes);
    PyMem_Free(facts.items);
    PyMem_Free(entries.items);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef native_methods[] = {
    {"walk_records", (PyCFunction)(void (*)(void))walk_records, METH_FASTCALL, walk_records_doc},
    {"build_records", (PyCFunction)(void (*)(void))build_records, METH_FASTCALL, build_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "commitlog._native",
    "The leader's record builder and the scrubber's record walk in C (commitlog.records and commitlog.scrub_walk "
    "use them when they are built; their Python twins are the references and the fallbacks).",
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
        || PyModule_AddIntConstant(module, "BORN_HOST_V6", BORN_HOST_V6) < 0
        || PyModule_AddIntConstant(module, "RECORD_FACTS_BYTES", FACTS_BYTES) < 0
        || PyModule_AddIntConstant(module, "KEY_ENTRY_BYTES", KEY_ENTRY_BYTES) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
