"""Property-based fuzzing of the decoders the remoting codec fuzz (tests/remoting) does not cover: SEND
batch bodies, stored records, HEART_BEAT and LOCK_BATCH_MQ bodies (the processor and the ACL resource
reader), and the node's TOML file. Each may refuse its input only with its own error type.

Every Hypothesis test is derandomized and keeps no example database, so runs are repeatable; the
corpus (``corpus/``, see its README) pins regressions and seeds the mutation tests.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.acl.resources import UnreadableRequestError, required_permissions
from broker.config import load_node_file
from broker.consumers import ClientProcessor, ConsumerManager, QueueLocks
from broker.remoting.server import RequestContext
from broker.requests import RequestError
from broker.send import batch_messages
from commitlog.config import ConfigError
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.record_codec import RecordError, decode_record, encode_record
from protocol.batch import BATCH_HEAD
from protocol.codes import RequestCode, ResponseCode
from protocol.command import make_request

CORPUS: Final = Path(__file__).parent / "corpus"
DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                         suppress_health_check=[HealthCheck.too_slow])
HOST: Final = encode_host("127.0.0.1", 10911)


def read_hex(path: Path) -> bytes:
    digits = "".join("".join(line.partition("#")[0].split()) for line in path.read_text().splitlines())
    return bytes.fromhex(digits)


def corpus(prefix: str) -> list[Path]:
    return sorted(CORPUS.glob(f"{prefix}_*"))


def expected_ok(path: Path) -> bool:
    return "_ok" in path.name


# mutations of a seed: (position, action, byte); positions wrap around the seed's length
MUTATIONS = st.lists(st.tuples(st.integers(0, 1 << 16), st.sampled_from(["flip", "insert", "delete", "cut"]),
                               st.integers(0, 255)), max_size=6)


def mutate(seed: bytes, mutations: list[tuple[int, str, int]]) -> bytes:
    data = bytearray(seed)
    for position, action, value in mutations:
        index = position % (len(data) + 1)
        if action == "insert":
            data.insert(index, value)
        elif not data:
            continue
        elif action == "flip":
            data[index % len(data)] ^= value or 1
        elif action == "delete":
            del data[index % len(data)]
        else:
            del data[index:]
    return bytes(data)


# ------------------------------------------------------------------------------------------ batches


def batch_record(body: bytes, properties: bytes, flag: int = 0) -> bytes:
    total = BATCH_HEAD.size + len(body) + 2 + len(properties)
    return (BATCH_HEAD.pack(total, 0, zlib.crc32(body) & 0x7FFFFFFF, flag, len(body)) + body
            + len(properties).to_bytes(2, "big") + properties)


def decode_batch_or_refusal(data: bytes) -> list[Any] | RequestError:
    try:
        items = batch_messages(data)
    except RequestError as error:
        assert error.code == ResponseCode.MESSAGE_ILLEGAL and error.remark
        return error
    assert items and sum(len(item.body) for item in items) <= len(data)
    return items


@pytest.mark.parametrize("path", corpus("batch"), ids=lambda path: path.name)
def test_batch_corpus(path: Path) -> None:
    assert isinstance(decode_batch_or_refusal(read_hex(path)), list) is expected_ok(path)


PROPERTY_TEXT = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), min_size=1,
                        max_size=10)


@DETERMINISTIC
@given(messages=st.lists(st.tuples(st.binary(max_size=64), st.dictionaries(PROPERTY_TEXT, PROPERTY_TEXT, max_size=4),
                                   st.integers(-(2**31), 2**31 - 1)), min_size=1, max_size=8))
def test_batches_round_trip(messages: list[tuple[bytes, dict[str, str], int]]) -> None:
    data = b"".join(batch_record(body, "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode(), flag)
                    for body, props, flag in messages)
    items = decode_batch_or_refusal(data)
    assert isinstance(items, list)
    assert [(item.body, item.properties, item.flag) for item in items] == messages


@DETERMINISTIC
@given(data=st.binary(max_size=512))
def test_random_batches_are_refused_cleanly(data: bytes) -> None:
    decode_batch_or_refusal(data)


@DETERMINISTIC
@given(seed=st.sampled_from([read_hex(path) for path in corpus("batch_ok")]), mutations=MUTATIONS)
def test_mutated_batches_are_refused_cleanly(seed: bytes, mutations: list[tuple[int, str, int]]) -> None:
    decode_batch_or_refusal(mutate(seed, mutations))


# ---------------------------------------------------------------------------------- stored records


def decode_record_or_refusal(data: bytes, offset: int = 0) -> Any:
    try:
        record = decode_record(data, offset)
    except RecordError as error:
        assert str(error)
        return error
    assert record.total_size <= len(data) - offset
    return record


@pytest.mark.parametrize("path", corpus("record"), ids=lambda path: path.name)
def test_record_corpus(path: Path) -> None:
    assert (not isinstance(decode_record_or_refusal(read_hex(path)), RecordError)) is expected_ok(path)


MESSAGES = st.builds(
    MessageInput,
    topic=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20).filter(
        lambda topic: len(topic.encode()) <= 127),
    queue_id=st.integers(0, 2**31 - 1), flag=st.integers(-(2**31), 2**31 - 1), sys_flag=st.integers(0, 0xF),
    born_timestamp=st.integers(0, 2**62), born_host=st.sampled_from([HOST, bytes(16) + HOST[4:]]),
    store_timestamp=st.integers(0, 2**62), reconsume_times=st.integers(0, 1000),
    prepared_transaction_offset=st.integers(0, 2**62), body=st.binary(max_size=200), properties=st.binary(max_size=60),
)


@DETERMINISTIC
@given(message=MESSAGES, queue_offset=st.integers(0, 2**62), physical_offset=st.integers(0, 2**62))
def test_records_round_trip(message: MessageInput, queue_offset: int, physical_offset: int) -> None:
    record = decode_record_or_refusal(encode_record(message, queue_offset, physical_offset, HOST))
    assert not isinstance(record, RecordError)
    assert (record.topic, record.body, record.properties, record.queue_offset, record.physical_offset) == (
        message.topic, message.body, message.properties, queue_offset, physical_offset)


@DETERMINISTIC
@given(data=st.binary(max_size=400), offset=st.integers(-8, 420))
def test_random_records_are_refused_cleanly(data: bytes, offset: int) -> None:
    decode_record_or_refusal(data, offset)


@DETERMINISTIC
@given(seed=st.sampled_from([read_hex(path) for path in corpus("record_ok")]), mutations=MUTATIONS)
def test_mutated_records_are_refused_cleanly(seed: bytes, mutations: list[tuple[int, str, int]]) -> None:
    decode_record_or_refusal(mutate(seed, mutations))


# ------------------------------------------------------------------------------ heartbeat and locks


class _Connection:
    connection_id = 1
    remote_address = "127.0.0.1:5000"
    remote_host = "127.0.0.1"
    remote_port = 5000
    is_closed = False


def client_processor() -> ClientProcessor:
    broker = SimpleNamespace(member=SimpleNamespace(is_leader=False), topic_config=lambda topic: None)
    return ClientProcessor(broker, ConsumerManager(), QueueLocks(60.0))  # type: ignore[arg-type]


def process(code: int, body: bytes) -> int:
    """What the client processor answers (it must answer, never raise); the ACL reader must cope too."""
    request = make_request(code, 1, {}, body)
    response = asyncio.run(client_processor()(RequestContext(request, _Connection())))  # type: ignore[arg-type]
    assert response is not None and response.code in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR,
                                                      ResponseCode.SYSTEM_BUSY), response
    try:
        required_permissions(request)
    except UnreadableRequestError as error:
        assert str(error)
    return response.code


@pytest.mark.parametrize("path", corpus("heartbeat") + corpus("lock"), ids=lambda path: path.name)
def test_heartbeat_and_lock_corpus(path: Path) -> None:
    code = RequestCode.HEART_BEAT if path.name.startswith("heartbeat") else RequestCode.LOCK_BATCH_MQ
    assert (process(code, path.read_bytes()) == ResponseCode.SUCCESS) is expected_ok(path)


NAMES: Final = ["clientID", "clientId", "producerDataSet", "consumerDataSet", "groupName", "subscriptionDataSet",
                "topic", "subString", "messageModel", "consumeType", "mqSet", "consumerGroup", "queueId",
                "brokerName", "tagsSet", "codeSet"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | st.text(max_size=12)
    | st.sampled_from(["CLUSTERING", "BROADCASTING", "T", "G", "*"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(NAMES) | st.text(max_size=6), children, max_size=5),
    max_leaves=25,
)


@DETERMINISTIC
@given(code=st.sampled_from([RequestCode.HEART_BEAT, RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ]),
       body=JSON_VALUES)
def test_any_json_body_is_answered(code: int, body: object) -> None:
    process(code, json.dumps(body).encode())


@DETERMINISTIC
@given(code=st.sampled_from([RequestCode.HEART_BEAT, RequestCode.LOCK_BATCH_MQ]),
       seed=st.sampled_from([path.read_bytes() for path in corpus("heartbeat_ok") + corpus("lock_ok")]),
       mutations=MUTATIONS)
def test_mutated_bodies_are_answered(code: int, seed: bytes, mutations: list[tuple[int, str, int]]) -> None:
    process(code, mutate(seed, mutations))


# ------------------------------------------------------------------------------------- node files


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


def load(scratch: Path, text: str | bytes) -> bool:
    """Whether the node file loads; anything but ConfigError escaping is a failure."""
    path = scratch / "node.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        load_node_file(path)
    except ConfigError as error:
        assert str(error)
        return False
    return True


@pytest.mark.parametrize("path", corpus("node"), ids=lambda path: path.name)
def test_node_file_corpus(path: Path, scratch: Path) -> None:
    assert load(scratch, path.read_text()) is expected_ok(path)


TOML_VALUES = st.sampled_from([
    "1", "-1", "0", "true", "false", "1.5", "nan", "inf", "-inf", '""', '"x"', '"127.0.0.1:1"', '"a:b:c"',
    "[]", "[1, 2]", '["127.0.0.1:9876"]', "{}", "{ a = 1 }", '{ n1 = "127.0.0.1:1" }', "1979-05-27T07:32:00Z",
    "99999999999999999999", '"' + "x" * 300 + '"', "[[1], [2]]", '"\\u0000"',
])
KEYS = st.sampled_from([
    "listen_address", "advertised_address", "broker_name", "cluster_name", "namesrv", "broker_id", "peer_addresses",
    "auto_create_topic",
    "default_topic_queue_nums", "register_interval_seconds", "long_polling_max_ms", "pull_messages_max",
    "pull_bytes_max", "max_reconsume_times", "delay_levels_seconds", "client_expiry_seconds", "queue_lock_seconds",
    "transaction_timeout_ms", "transaction_check_interval_ms", "transaction_check_max", "acl_file", "tls_cert_file",
    "tls_key_file", "remoting_connections_max", "remoting_in_flight_requests_max", "remoting_idle_timeout_seconds",
    "id", "raft_address", "catchup_address", "data_dir", "secret", "store_host", "unknown_key",
])


@DETERMINISTIC
@given(edits=st.lists(st.tuples(st.sampled_from(["[broker]", "[node]", "[store]", "[[peers]]"]), KEYS, TOML_VALUES),
                      min_size=1, max_size=4))
def test_node_files_with_odd_values_load_or_say_why(edits: list[tuple[str, str, str]], scratch: Path) -> None:
    text = (CORPUS / "node_ok.toml").read_text()
    for table, key, value in edits:
        lines = [line for line in text.splitlines() if not line.startswith(f"{key} =")] if table != "[[peers]]" \
            else text.splitlines()
        text = "\n".join(lines) + "\n"
        text = text.replace(f"{table}\n", f"{table}\n{key} = {value}\n", 1)
    load(scratch, text)


@DETERMINISTIC
@given(mutations=MUTATIONS)
def test_mutated_node_files_load_or_say_why(mutations: list[tuple[int, str, int]], scratch: Path) -> None:
    load(scratch, mutate((CORPUS / "node_ok.toml").read_bytes(), mutations))
