"""An IPv6 store host (``[IPv6]:port``), as RocketMQ stores one: records carry sysFlag 0x20 and a 20-byte store
host (12 bytes more of head), message ids are 56 hex characters, in every encode path (encode_record, the
store's own encoder, the Python and C record builders), and every reader of records (recovery, dispatch,
queries, the scrubber) finds its way through them. A store with an IPv4 store host writes exactly what it
always did."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from commitlog.config import ConfigError, StoreConfig
from commitlog.errors import StoreError
from commitlog.hosts import decode_message_id, encode_address, encode_message_id, format_address
from commitlog.message import MessageInput
from commitlog.outcomes import GetStatus
from commitlog.record_codec import body_at, decode_record, encode_record, record_size
from commitlog.records import STORE_TIMESTAMP_AT, RecordBuilder, check_layout, meta_list, uniq_key_of
from commitlog.store import MessageStore
from commitlog.sys_flags import SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6
from tests.commitlog.helpers import data_bytes, message, retry_of, small_config
from tests.support.apply_paths import both_apply_paths  # noqa: F401  (a fixture)

STORE_HOST = "[fd00:1:2::3]:10911"
STORE_HOST_BYTES = bytes.fromhex("fd000001000200000000000000000003") + (10911).to_bytes(4, "big")
V6_BORN = bytes(range(16)) + (40123).to_bytes(4, "big")
V4_BORN = message(0).born_host
STAMP = 1_700_000_200_000
#: sha256 of :func:`ipv4_outputs`
IPV4_OUTPUTS_SHA256 = "f2864d2a55e366c13177eec581ba5227a63c7678cf495adb68610bf558fc7f1f"


def v6_config(directory: Path) -> StoreConfig:
    return small_config(directory, store_host=STORE_HOST)


def mixed(count: int, start: int = 0) -> list[MessageInput]:
    """Both born host families, several topics, queues, tags and keys, bodies large enough to cross segments."""
    return [message(number, topic=("TopicTest", "Other")[number % 2], queue_id=number % 3,
                    tags=None if number % 4 == 0 else f"T{number % 3}",
                    keys=" ".join(f"k{number}-{j}" for j in range(number % 3)),
                    born_host=V6_BORN if number % 3 == 0 else V4_BORN,
                    body=bytes([number % 251]) * (30 + number * 131 % 7000))
            for number in range(start, start + count)]


# ------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(("spelled", "canonical"), [
    (STORE_HOST, STORE_HOST),
    ("[FD00:1:2:0:0::3]:10911", STORE_HOST),
    ("[::1]:0", "[::1]:0"),
    ("[2001:db8::]:65535", "[2001:db8::]:65535"),
])
def test_a_bracketed_ipv6_store_host_is_accepted(tmp_path: Path, spelled: str, canonical: str) -> None:
    config = StoreConfig.from_mapping({"data_dir": str(tmp_path), "store_host": spelled})
    assert len(config.store_host_bytes) == 20 and encode_address(spelled) == config.store_host_bytes
    assert format_address(config.store_host_bytes) == canonical
    assert encode_address(canonical) == config.store_host_bytes


@pytest.mark.parametrize(("store_host", "reason"), [
    ("localhost:10911", "host name"),
    ("raftmq-0.raftmq:10911", "host name"),
    ("fd00::1:10911", "needs brackets"),
    ("fd00::1", "needs brackets"),
    ("[fd00::1]", r"\[address\]:port"),
    ("[fd00::1]:", "no port"),
    ("[fd00::1]:65536", "port out of range"),
    ("[fd00::1]:-1", "port out of range"),
    ("10.1.2.3:65536", "port out of range"),
    ("10.1.2.3", "no port"),
    ("10.1.2.256:1", "not an IPv4 address"),
    ("[fe80::1%eth0]:10911", "scope id"),
    ("[::ffff:10.1.2.3]:10911", r"IPv4-mapped address: write it as IPv4 \(10.1.2.3:10911\)"),
    ("[fd00::zz]:10911", "not an IPv6 address"),
    ("[raftmq-0]:10911", "not an IPv6 address"),
])
def test_a_store_host_that_is_no_ip_address_and_port_is_refused_clearly(tmp_path: Path, store_host: str,
                                                                          reason: str) -> None:
    with pytest.raises(ConfigError, match=r"store_host must be IPv4:port or \[IPv6\]:port, got .*: .*" + reason):
        StoreConfig.from_mapping({"data_dir": str(tmp_path), "store_host": store_host})


# ------------------------------------------------------------------------------------------------- records


@pytest.mark.parametrize("born_host", [V4_BORN, V6_BORN], ids=["born-v4", "born-v6"])
def test_a_record_with_an_ipv6_store_host_is_laid_out_as_rocketmq_stores_it(born_host: bytes) -> None:
    sent = message(7, born_host=born_host, sys_flag=SYSFLAG_STOREHOST_V6 | SYSFLAG_BORNHOST_V6 | 0x1)
    raw = encode_record(sent, queue_offset=9, physical_offset=123_456_789, store_host=STORE_HOST_BYTES)
    born_v6 = len(born_host) == 20
    sys_flag = int.from_bytes(raw[36:40], "big")
    assert sys_flag == 0x1 | SYSFLAG_STOREHOST_V6 | (SYSFLAG_BORNHOST_V6 if born_v6 else 0)
    topic_length = len(sent.topic.encode())
    assert len(raw) == int.from_bytes(raw[:4], "big") == record_size(len(sent.body), topic_length,
                                                                     len(sent.properties), born_v6, True)
    assert len(raw) == record_size(len(sent.body), topic_length, len(sent.properties), born_v6) + 12
    # the store timestamp sits where it does with an IPv4 store host; the store host follows it
    timestamp_at = STORE_TIMESTAMP_AT[born_v6]
    assert int.from_bytes(raw[timestamp_at : timestamp_at + 8], "big") == sent.store_timestamp
    assert raw[timestamp_at + 8 : timestamp_at + 28] == STORE_HOST_BYTES
    body_start = body_at(sys_flag)
    assert body_start == (112 if born_v6 else 100) == timestamp_at + 28 + 4 + 8 + 4
    assert int.from_bytes(raw[body_start - 4 : body_start], "big") == len(sent.body)
    assert raw[body_start : body_start + len(sent.body)] == sent.body
    decoded = decode_record(raw)
    assert (decoded.store_host, decoded.born_host, decoded.body, decoded.properties, decoded.total_size) == (
        STORE_HOST_BYTES, born_host, sent.body, sent.properties, len(raw))
    assert decoded.msg_id == (STORE_HOST_BYTES + (123_456_789).to_bytes(8, "big")).hex().upper()


@pytest.mark.parametrize("offset", [0, 4096, 123_456_789, 2**63 - 1])
def test_an_ipv6_offset_message_id_is_56_hex_characters_and_decodes(offset: int) -> None:
    msg_id = encode_message_id(STORE_HOST_BYTES, offset)
    assert len(msg_id) == 56 and msg_id == msg_id.upper()
    assert msg_id[:40] == STORE_HOST_BYTES.hex().upper() and int(msg_id[40:], 16) == offset
    assert decode_message_id(msg_id) == (STORE_HOST_BYTES, offset)
    assert decode_message_id(msg_id.lower()) == (STORE_HOST_BYTES, offset)
    # RocketMQ's MessageDecoder.createMessageId of [::1]:10911 at 4096: 16 address bytes, port, offset
    assert encode_message_id(encode_address("[::1]:10911"), 4096) == (
        "00000000000000000000000000000001" "00002A9F" "0000000000001000")


def ipv4_outputs(tmp_path: Path) -> bytes:
    """Records, message ids, prepared batches and store files with an IPv4 store host (both born host
    families), written by every encode path."""
    config = small_config(tmp_path / "x")
    parts: list[bytes] = []
    for sent in mixed(10):
        raw = encode_record(sent, 7, 4096 + sent.queue_id, config.store_host_bytes)
        parts += [raw, decode_record(raw).msg_id.encode()]
    builder = RecordBuilder(config.store_host_bytes, config.segment_size_bytes, config.body_size_max_bytes)
    built = builder.build(mixed(10), STAMP)
    assert built is not None and built == builder.build_python(mixed(10), STAMP)
    parts += [built.records, built.metas, built.key_hashes]
    plain = MessageStore(small_config(tmp_path / "plain"))
    prepared = MessageStore(small_config(tmp_path / "prepared"))
    for index in range(1, 16):
        batch = mixed(10, index * 10)
        records = builder.build(batch, STAMP + index)
        assert records is not None
        ids = [result.msg_id for result in plain.append(index, batch, STAMP + index).results]
        assert ids == [result.msg_id for result in prepared.append_records(index, records).results]
        parts += [msg_id.encode() for msg_id in ids]
    for store in (plain, prepared):
        store.flush()
        store.close()
    assert data_bytes(tmp_path / "plain") == data_bytes(tmp_path / "prepared")
    for name, data in sorted(data_bytes(tmp_path / "plain").items()):
        parts += [name.encode(), data]
    return b"".join(parts)


def test_an_ipv4_store_host_writes_exactly_what_it_always_did(tmp_path: Path) -> None:
    """The figure was taken from the code before IPv6 store hosts existed (C builder built)."""
    assert hashlib.sha256(ipv4_outputs(tmp_path)).hexdigest() == IPV4_OUTPUTS_SHA256


# ------------------------------------------------------------------------------------------------- the store


@pytest.mark.usefixtures("both_apply_paths")
def test_every_encode_path_writes_the_same_ipv6_store_host_records(tmp_path: Path) -> None:
    """The store's own encoder (plain messages), the record builders (C where built, and Python) with
    append_records, and encode_record: the same bytes, fillers included."""
    plain = MessageStore(v6_config(tmp_path / "plain"))
    prepared = MessageStore(v6_config(tmp_path / "prepared"))
    python_built = MessageStore(v6_config(tmp_path / "python"))
    config = plain.config
    builder = RecordBuilder(config.store_host_bytes, config.segment_size_bytes, config.body_size_max_bytes)
    for index in range(1, 21):
        batch = mixed(10, index * 10)
        records = builder.build(batch, STAMP + index)
        python_records = builder.build_python(batch, STAMP + index)
        assert records is not None and records == python_records and check_layout(records) is None
        assert records.store_host == STORE_HOST_BYTES
        expected = plain.append(index, batch, STAMP + index)
        assert prepared.append_records(index, records).results == expected.results
        assert python_built.append_records(index, python_records).results == expected.results
        for result, sent in zip(expected.results, batch, strict=True):
            assert len(result.msg_id) == 56 and decode_message_id(result.msg_id) == (
                STORE_HOST_BYTES, result.physical_offset)
            stored = plain.read_record(result.physical_offset)
            assert stored == encode_record(sent._replace(store_timestamp=STAMP + index), result.queue_offset,
                                           result.physical_offset, STORE_HOST_BYTES)
    assert plain.commit_log.end_offset > 3 * config.segment_size_bytes  # fillers were written
    for store in (plain, prepared, python_built):
        store.flush()
        store.close()
    assert data_bytes(tmp_path / "plain") == data_bytes(tmp_path / "prepared") == data_bytes(tmp_path / "python")


@pytest.mark.usefixtures("both_apply_paths")
def test_prepared_ipv6_store_host_records_are_read_back_by_their_meta(tmp_path: Path) -> None:
    """uniq_key_of finds the properties past the wider head; a raised stamp lands on the store timestamp."""
    config = v6_config(tmp_path / "s")
    builder = RecordBuilder(config.store_host_bytes, config.segment_size_bytes, config.body_size_max_bytes)
    batch = [message(1), message(2, born_host=V6_BORN), message(3)._replace(properties=b"TAGS\x01a\x02")]
    records = builder.build(batch, STAMP)
    assert records is not None
    keys, start = [], 0
    for meta in meta_list(records):
        keys.append(uniq_key_of(records, start, meta[2]))
        start += meta[0]
    assert keys == [b"C0A8000A9CB3" + f"{1:020X}".encode(), b"C0A8000A9CB3" + f"{2:020X}".encode(), None]
    store = MessageStore(config)
    plain = MessageStore(v6_config(tmp_path / "plain"))
    raised = STAMP + 5_000
    got = store.append_records(1, records, skip={2}, store_timestamp=raised)
    assert got.results == plain.append(1, batch[:2], raised).results
    assert [store.read_message(result.physical_offset).store_timestamp for result in got.results] == [raised] * 2
    for each in (store, plain):
        each.flush()
        each.close()
    assert data_bytes(tmp_path / "s") == data_bytes(tmp_path / "plain")


@pytest.mark.usefixtures("both_apply_paths")
def test_a_store_with_an_ipv6_store_host_reopens_recovers_and_answers_queries(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    store = MessageStore(v6_config(directory))
    config = store.config
    builder = RecordBuilder(config.store_host_bytes, config.segment_size_bytes, config.body_size_max_bytes)
    sent = {}

    def append(target: MessageStore, index: int) -> None:
        """Raft entry ``index``: plain messages when odd, prepared records when even."""
        batch = mixed(8, index * 8)
        if index % 2:
            outcome = target.append(index, batch, STAMP + index)
        else:
            records = builder.build(batch, STAMP + index)
            assert records is not None
            outcome = target.append_records(index, records)
        assert outcome.applied
        sent.update({result.physical_offset: one for result, one in zip(outcome.results, batch, strict=True)})

    for index in range(1, 31):
        append(store, index)
        if index == 20:
            store.flush()  # a checkpoint here: recovery validates the records after it
    assert store.commit_log.end_offset > 4 * config.segment_size_bytes
    end = store.commit_log.end_offset
    store.abandon()  # a crash: no flush, no close

    recovered = MessageStore(v6_config(directory))
    assert recovered.applied_raft_index == 30 and recovered.commit_log.end_offset == end
    found = {}
    for topic, queue_id in recovered.queue_ids():
        offset = 0
        while (got := recovered.get_messages(topic, queue_id, offset, 64)).status is GetStatus.FOUND:
            for raw in got.messages:
                stored = decode_record(raw)
                assert stored.sys_flag & SYSFLAG_STOREHOST_V6 and stored.store_host == STORE_HOST_BYTES
                found[stored.physical_offset] = stored
            offset = got.next_begin_offset
    assert sorted(found) == sorted(sent)
    for physical_offset, stored in found.items():
        assert (stored.body, stored.born_host, stored.topic) == (
            sent[physical_offset].body, sent[physical_offset].born_host, sent[physical_offset].topic)
    some = max(found)
    assert recovered.view_message_by_id(encode_message_id(STORE_HOST_BYTES, some)).physical_offset == some
    with pytest.raises(StoreError, match="another store host"):
        recovered.view_message_by_id(encode_message_id(encode_address("10.1.2.3:10911"), some))
    assert {m.physical_offset for m in recovered.query_by_key("Other", "k11-1", 5)} == {
        offset for offset, one in sent.items() if one.topic == "Other" and b"k11-1\x02" in one.properties} != set()
    assert recovered.offset_by_timestamp("Other", 1, STAMP + 25) == min(
        found[offset].queue_offset for offset in found
        if found[offset].topic == "Other" and found[offset].queue_id == 1 and found[offset].store_timestamp >= STAMP + 25)
    last = sent[some]
    assert recovered.find_recent_send(*retry_of(last), STAMP) is not None
    next_start, _ = recovered.scrub(0, 1 << 30)
    assert next_start is None  # every record checked out

    # more appends, then a crash that tears the last record: recovery falls back to what it can trust, Raft
    # replays the rest, and the replica ends byte-identical to one that never crashed
    for index in range(31, 35):
        append(recovered, index)
    torn_at = max(sent) + 114  # in the last record's body (past a head of at most 112 bytes): its CRC fails
    recovered.commit_log.write(torn_at, os.urandom(16))
    recovered.abandon()
    again = MessageStore(v6_config(directory))
    assert again.applied_raft_index < 34 and again.commit_log.end_offset <= torn_at
    for index in range(again.applied_raft_index + 1, 35):
        append(again, index)
    clean = MessageStore(v6_config(tmp_path / "clean"))
    for index in range(1, 35):
        append(clean, index)
    for each in (again, clean):
        each.flush()
        each.close()
    assert data_bytes(directory) == data_bytes(tmp_path / "clean")
