"""commitlog._native: the record builder in C lays out exactly what the Python builder does, and hands
whatever it is not sure of to it (RecordBuilder.build against RecordBuilder.build_python)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.message import MessageInput
from commitlog.record_codec import crc32, encode_record
from commitlog.records import RecordBuilder
from commitlog.sys_flags import SYSFLAG_STOREHOST_V6, TRANSACTION_COMMIT_TYPE
from commitlog.tag_codes import cached_tag_code
from tests.commitlog.helpers import message, small_config
from tests.commitlog.test_records import STAMP, V6_HOST, varied

try:
    from commitlog import _native
except ImportError:  # not built: the tests below say so
    _native = None  # type: ignore[assignment]

CONFIG = small_config(Path("/nonexistent"))
#: the store hosts a builder can have: IPv4 and IPv6 (each with both born host families in the batches)
V4_STORE_HOST = CONFIG.store_host_bytes
V6_STORE_HOST = small_config(Path("/nonexistent"), store_host="[fd00::7]:10911").store_host_bytes
store_hosts = st.sampled_from([V4_STORE_HOST, V6_STORE_HOST])


def builders(store_host: bytes = V4_STORE_HOST) -> tuple[RecordBuilder, RecordBuilder]:
    """Two builders, so neither sees the other's topic and tag caches."""
    return tuple(RecordBuilder(store_host, CONFIG.segment_size_bytes, CONFIG.body_size_max_bytes,
                               ("TIMER_TOPIC",)) for _ in range(2))  # type: ignore[return-value]


@pytest.mark.parametrize("store_host", [V4_STORE_HOST, V6_STORE_HOST], ids=["store-v4", "store-v6"])
def test_the_c_builder_is_built_and_lays_out_plain_batches_itself(store_host: bytes) -> None:
    native = _native
    assert native is not None, "commitlog._native was not built (setup.py): the leader runs the Python builder"
    c_builder, python_builder = builders(store_host)
    batch = varied(60)
    built = native.build_records(batch, STAMP, c_builder.store_host, c_builder.body_size_max_bytes,
                                 c_builder.segment_size_bytes - 8, c_builder._topic, c_builder._tag_codes,
                                 cached_tag_code, crc32)
    assert built is not NotImplemented  # taken by C, not handed over
    assert c_builder.build(batch, STAMP) == python_builder.build_python(batch, STAMP)
    records = built[3]
    sys_flag = int.from_bytes(records[36:40], "big")
    assert bool(sys_flag & SYSFLAG_STOREHOST_V6) == (len(store_host) == 20)
    assert store_host in records


def test_a_store_host_of_neither_width_is_handed_to_python_which_refuses_it() -> None:
    native = _native
    assert native is not None
    for store_host in (b"", V4_STORE_HOST[:4], V6_STORE_HOST + b"\x00"):
        c_builder, python_builder = builders(store_host)
        assert native.build_records([message(1)], STAMP, store_host, c_builder.body_size_max_bytes,
                                    c_builder.segment_size_bytes - 8, c_builder._topic, c_builder._tag_codes,
                                    cached_tag_code, crc32) is NotImplemented
        assert c_builder.build([message(1)], STAMP) is None is python_builder.build_python([message(1)], STAMP)


def test_what_it_is_not_sure_of_is_handed_to_python() -> None:
    native = _native
    assert native is not None
    c_builder, _ = builders()
    fine = message(1)
    for odd in (fine._replace(properties=fine.properties + b"TAGS\x01again\x02"), fine._replace(topic="bad topic"),
                fine._replace(flag=True), fine._replace(born_host=b"\x00" * 5), fine._replace(sys_flag=-8),
                fine._replace(body=bytearray(b"body"))):  # type: ignore[arg-type]  # a bytes-like body
        assert native.build_records([fine, odd], STAMP, c_builder.store_host, c_builder.body_size_max_bytes,
                                    c_builder.segment_size_bytes - 8, c_builder._topic, c_builder._tag_codes,
                                    cached_tag_code, crc32) is NotImplemented, odd


names = st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"TAG", b"XKEYS", b"WAIT", b"UNIQ_KEYS", b""])
values = st.binary(max_size=12).map(lambda value: value.replace(b"\x02", b"")) | st.sampled_from(
    [b"", b" ", b"a  b", b" k1 k2 ", b"x\x01y", "é".encode()])
properties = st.lists(st.tuples(names, values), max_size=5).map(
    lambda pairs: b"\x02".join(name + b"\x01" + value for name, value in pairs)) | st.sampled_from(
    [b"", b"\x02", b"\x02\x02TAGS\x01t", b"TAGS\x01t\x02", b"KEYS\x01a\x02\x02KEYS\x01b", b"TAGS"])
ints32 = st.sampled_from([0, 1, 7, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1])
ints64 = st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, -(2**63)]) | st.integers(0, 2**45)
messages = st.builds(
    MessageInput,
    topic=st.sampled_from(["TopicTest", "Other_topic-2", "%RETRY%g", "TIMER_TOPIC", "bad topic", "t" * 128]),
    queue_id=st.sampled_from([0, 3, 2**31 - 1, 2**31, -1]),
    flag=ints32,
    sys_flag=st.sampled_from([0, 0x1, 0x4, TRANSACTION_COMMIT_TYPE, 0xC, 0x10, 0x20, 0x30, -8, 2**31]),
    born_timestamp=ints64,
    born_host=st.sampled_from([message(0).born_host, V6_HOST, b"\x00" * 5, b""]),
    store_timestamp=st.just(0),
    reconsume_times=ints32,
    prepared_transaction_offset=ints64,
    body=st.binary(max_size=64) | st.sampled_from([b"x" * 9000, b"y" * (CONFIG.body_size_max_bytes + 1)]).map(bytes),
    properties=properties,
)


@settings(max_examples=400, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6), st.sampled_from([STAMP, 0, 2**63 - 1]), store_hosts)
def test_c_and_python_builders_agree(batch: list[MessageInput], store_timestamp: int, store_host: bytes) -> None:
    c_builder, python_builder = builders(store_host)
    assert c_builder.build(batch, store_timestamp) == python_builder.build_python(batch, store_timestamp)
    # and again, with both caches warm
    assert c_builder.build(batch, store_timestamp) == python_builder.build_python(batch, store_timestamp)


plain_messages = st.builds(
    MessageInput,
    topic=st.sampled_from(["TopicTest", "Other_topic-2"]),
    queue_id=st.integers(0, 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    sys_flag=st.sampled_from([0, 0x1, TRANSACTION_COMMIT_TYPE, 0x10, 0x20, 0x30]),
    born_timestamp=st.integers(-(2**63), 2**63 - 1),
    born_host=st.sampled_from([message(0).born_host, V6_HOST]),
    store_timestamp=st.just(0),
    reconsume_times=st.integers(-(2**31), 2**31 - 1),
    prepared_transaction_offset=st.integers(-(2**63), 2**63 - 1),
    body=st.binary(max_size=300),
    properties=properties,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(plain_messages, min_size=1, max_size=8), store_hosts)
def test_plain_batches_agree_and_c_takes_them_unless_a_property_is_named_twice(batch: list[MessageInput],
                                                                                 store_host: bytes) -> None:
    c_builder, python_builder = builders(store_host)
    native = _native
    assert native is not None
    built = native.build_records(batch, STAMP, c_builder.store_host, c_builder.body_size_max_bytes,
                                 c_builder.segment_size_bytes - 8, c_builder._topic, c_builder._tag_codes,
                                 cached_tag_code, crc32)
    expected = python_builder.build_python(batch, STAMP)
    assert (built is NotImplemented) == (expected is None)  # None here only for a property named twice
    assert c_builder.build(batch, STAMP) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(plain_messages, min_size=1, max_size=8), st.sampled_from([STAMP, 0, 2**63 - 1]), store_hosts)
def test_each_record_the_c_builder_lays_out_is_the_reference_encoding(batch: list[MessageInput], store_timestamp: int,
                                                                     store_host: bytes) -> None:
    """Record by record, the C builder's bytes are :func:`commitlog.record_codec.encode_record`'s (the one layout
    every path stores) with the batch's stamp, queue and physical offsets still zero."""
    native = _native
    assert native is not None
    c_builder, _ = builders(store_host)
    built = native.build_records(batch, store_timestamp, c_builder.store_host, c_builder.body_size_max_bytes,
                                 c_builder.segment_size_bytes - 8, c_builder._topic,
                                 c_builder._tag_codes, cached_tag_code, crc32)
    if built is NotImplemented:
        return  # a property named twice: the Python builder decides (the tests above)
    expected = b"".join(encode_record(each._replace(store_timestamp=store_timestamp), 0, 0, store_host) for each in batch)
    assert built[3] == expected
