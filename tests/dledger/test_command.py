"""The replicated command format: round trips of every operation type, compression, and rejection of
anything malformed (apply turns a CommandError into a recorded no-op)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.message import MessageInput
from dledger.command import (
    COMMAND_VERSION,
    FLAG_LZ4,
    TIMER_RELEASE_KEY,
    TIMER_RELEASE_STARTS,
    Command,
    CommandError,
    ConsumerOffset,
    ConsumerOffsets,
    LeaderStamp,
    Messages,
    Retention,
    SubscriptionGroup,
    TimerProgress,
    TimerRelease,
    TopicConfig,
    TransactionAction,
    TransactionOp,
    decode_command,
    encode_command,
    encode_records_command,
)

text = st.text(max_size=20)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
messages = st.builds(
    MessageInput,
    topic=text, queue_id=int32, flag=int32, sys_flag=int32, born_timestamp=int64,
    born_host=st.binary(max_size=20), store_timestamp=int64, reconsume_times=int32,
    prepared_transaction_offset=int64, body=st.binary(max_size=200), properties=st.binary(max_size=100),
)
operations = st.one_of(
    st.builds(Messages, st.lists(messages, max_size=5).map(tuple)),
    st.builds(ConsumerOffsets, st.lists(st.builds(ConsumerOffset, text, text, int32, int64), max_size=4).map(tuple)),
    st.builds(TopicConfig, text, int32, int32, int32, int32, st.booleans(), st.booleans()),
    st.builds(SubscriptionGroup, text, st.booleans(), st.booleans(), int32, int64, st.booleans()),
    st.builds(TransactionOp, int64, st.sampled_from(TransactionAction), text, int64),
    st.builds(TimerProgress, text.filter(lambda key: key != TIMER_RELEASE_KEY), int64),
    st.builds(TimerRelease, st.integers(-(2**63 // TIMER_RELEASE_STARTS), (2**63 - 1) // TIMER_RELEASE_STARTS - 1),
              st.integers(0, TIMER_RELEASE_STARTS - 1)),
    st.builds(Retention, int64),
    st.builds(LeaderStamp, int64, text, int64),
)
commands = st.builds(Command, st.lists(operations, max_size=6).map(tuple))


@settings(derandomize=True, max_examples=300)
@given(commands, st.booleans())
def test_round_trip(command: Command, compress: bool) -> None:
    assert decode_command(encode_command(command, compress)) == command


#: TimerRelease(1_700_000_100, 256) as every version so far wrote it (raft journals hold such entries): a
#: TIMER_PROGRESS operation under "timer-deliver" whose value is second * 1,000,000 + start
RELEASE_AS_WRITTEN = bytes.fromhex("0100000000010600000017000d74696d65722d64656c6976657200060a241e142200")


def test_a_timer_release_keeps_the_bytes_journals_already_hold() -> None:
    release = TimerRelease(1_700_000_100, 256)
    assert decode_command(RELEASE_AS_WRITTEN) == Command((release,))
    assert encode_command(Command((release,))) == RELEASE_AS_WRITTEN
    assert release.packed == 1_700_000_100_000_256 and TimerRelease.unpacked(release.packed) == release
    with pytest.raises(ValueError, match="is a TimerRelease"):  # one way to say it, so round trips hold
        encode_command(Command((TimerProgress(TIMER_RELEASE_KEY, 5),)))
    with pytest.raises(ValueError, match="starts in"):
        TimerRelease(1_700_000_100, TIMER_RELEASE_STARTS)


def test_large_compressible_batches_are_compressed() -> None:
    batch = tuple(MessageInput("T", 0, 0, 0, i, bytes(8), i, 0, 0, b"hello world " * 80, b"TAGS\x01a\x02")
                  for i in range(100))
    encoded = encode_command(Command((Messages(batch),)))
    assert encoded[0] == COMMAND_VERSION and encoded[1] == 1
    assert len(encoded) < sum(len(m.body) for m in batch) / 4
    assert decode_command(encoded) == Command((Messages(batch),))


def test_incompressible_batches_are_stored_plain() -> None:
    import random

    rng = random.Random(3)
    batch = tuple(MessageInput("T", 0, 0, 0, i, bytes(8), i, 0, 0, rng.randbytes(1000), b"") for i in range(20))
    encoded = encode_command(Command((Messages(batch),)))
    assert encoded[1] == 0


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "shorter than its header"),
        (bytes((9, 0)) + bytes(4), "unsupported command version 9"),
        (bytes((1, 4)) + bytes(4), "unknown command flags"),
        (bytes((1, 1)) + b"\xff\xff\xff\x7f" + b"x", "impossible size"),
        (bytes((1, 1)) + b"\x10\x00\x00\x00" + b"garbage", "corrupt lz4"),
        (bytes((1, 0)) + b"\x00\x00\x00\x01" + b"\x63\x00\x00\x00\x00", "unknown operation type 99"),
        (bytes((1, 0)) + b"\x00\x00\x00\x01" + b"\x07\x00\x00\x00\x08" + bytes(4), "truncated"),
        (bytes((1, 0)) + b"\x00\x00\x00\x00" + b"x", "trailing"),
        (bytes((1, 0)) + b"\xff\xff\xff\xff", "operation count"),
    ],
)
def test_malformed_commands_are_rejected(data: bytes, reason: str) -> None:
    with pytest.raises(CommandError, match=reason):
        decode_command(data)


@settings(derandomize=True, max_examples=500)
@given(commands, st.data())
def test_mutations_only_raise_command_error(command: Command, data: st.DataObject) -> None:
    encoded = bytearray(encode_command(command, compress=data.draw(st.booleans())))
    if len(encoded) > 2:
        position = data.draw(st.integers(2, len(encoded) - 1))
        encoded[position] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(encoded)))
    with contextlib.suppress(CommandError):
        decode_command(bytes(encoded[:cut]))


@settings(derandomize=True, max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_command_error(data: bytes) -> None:
    with contextlib.suppress(CommandError):
        decode_command(data)


def test_every_truncation_of_a_messages_command_is_refused() -> None:
    batch = tuple(
        MessageInput("Topic", i, 0, 0, i, bytes(8 if i % 2 else 20), 7, 0, 0, bytes([i]) * (i * 13), b"K\x01v\x02")
        for i in range(6)
    )
    encoded = encode_command(Command((Messages(batch),)), compress=False)
    assert decode_command(encoded) == Command((Messages(batch),))
    for cut in range(len(encoded)):
        with pytest.raises(CommandError):
            decode_command(encoded[:cut])


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("bodies", ["random", "text", "tiny"])
def test_a_records_command_after_a_prefix_is_the_prefix_and_the_command(compress: bool, bodies: str) -> None:
    # one join for prefix, frame, operation and records: the same bytes as a Records operation encoded by
    # encode_command, prefixed; compressed or not alike, and it decodes to the batch
    import random

    from commitlog.records import RecordBuilder
    from tests.commitlog.helpers import message

    rng = random.Random(11)
    makers: dict[str, Callable[[], bytes]] = {"random": lambda: rng.randbytes(1000),
                                               "text": lambda: b"hello world " * 80, "tiny": lambda: b"x"}
    body = makers[bodies]
    builder = RecordBuilder(bytes(8), 1 << 30, 4 << 20)
    batch = builder.build([message(n, topic=f"T{n % 3}", body=body(), keys=f"k{n}") for n in range(200)],
                          1_700_000_000_000)
    assert batch is not None
    for prefix in (b"", b"\x00\xfe"):
        encoded = encode_records_command(batch, compress=compress, prefix=prefix)
        assert encoded == prefix + encode_command(Command((batch,)), compress)
        assert decode_command(encoded[len(prefix):]) == Command((batch,))
    flags = encode_records_command(batch, compress)[1]
    if not compress:
        assert not flags & FLAG_LZ4
    elif bodies == "text":
        assert flags & FLAG_LZ4


def test_records_with_an_ipv6_store_host_travel_as_an_operation_of_their_own() -> None:
    """RECORDS keeps its 8-byte store host (IPv4 groups write what they always did); a group whose store host
    is [IPv6]:port sends RECORDS_STORE_HOST_V6, whose head carries the 20 bytes."""
    import struct

    from commitlog.hosts import encode_address
    from commitlog.records import RecordBuilder
    from dledger.command import OpType
    from tests.commitlog.helpers import message

    batch = [message(n, keys=f"k{n}", born_host=bytes(range(16)) + bytes(4) if n % 2 else message(0).born_host)
             for n in range(5)]
    for store_host, op_type in ((encode_address("10.1.2.3:10911"), 10), (encode_address("[fd00::3]:10911"), 16)):
        records = RecordBuilder(store_host, 1 << 30, 4 << 20).build(batch, 1_700_000_000_000)
        assert records is not None and records.store_host == store_host
        encoded = encode_records_command(records, compress=False)
        assert encoded == encode_command(Command((records,)), compress=False)
        assert encoded[6] == op_type == (OpType.RECORDS if len(store_host) == 8 else OpType.RECORDS_STORE_HOST_V6)
        count, store_timestamp = struct.unpack_from(">Iq", encoded, 11)
        assert (count, store_timestamp) == (5, 1_700_000_000_000) and encoded[23 : 23 + len(store_host)] == store_host
        assert decode_command(encoded) == Command((records,))
        assert decode_command(encode_records_command(records)) == Command((records,))  # compressed too
        for cut in range(0, 40):
            with pytest.raises(CommandError):
                decode_command(encoded[:cut])
        with pytest.raises(ValueError, match="8 or 20 bytes"):
            encode_records_command(records._replace(store_host=store_host[:4]))
