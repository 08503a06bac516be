"""The authenticated Raft transport: the sans-IO wire protocol first, then real member processes."""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import socket
import struct
import time
import types
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj import SyncObj, SyncObjConf

from dledger.secure_channel import (
    DIGEST_MIN_BYTES,
    FRAME_HEADER,
    HELLO,
    PROOF_BYTES,
    PROTOCOL_MAGIC,
    PROTOCOL_VERSION,
    ChannelState,
    DigestCache,
    FrameError,
    FrameTooLargeError,
    HandshakeError,
    ProtocolError,
    ReceiveBuffer,
    Role,
    SecureChannel,
    part_digest,
)
from dledger.transport import (
    OUT_OF_BAND_MIN_BYTES,
    AuthenticatedTcpTransport,
    TransportSettings,
    decode_message,
    encode_message,
    encode_message_parts,
    transport_class,
)
from dledger.tuning import entry_size_max_bytes, tuned_conf
from protocol.invariant import InvariantError
from tests.dledger.member_group import MemberGroup, running_group

SECRET = b"raftmq test secret: 32 bytes ok!"
FRAME_LIMIT_BYTES = 1 << 20


def make_channel(role: Role, secret: bytes = SECRET, seed: int = 0) -> SecureChannel:
    return SecureChannel(
        role, secret, frame_size_max_bytes=FRAME_LIMIT_BYTES, random_bytes=random.Random(seed).randbytes
    )


def feed_in_chunks(receiver: SecureChannel, data: bytes, chunk_sizes: list[int]) -> list[bytes | list[bytes]]:
    """Feed ``data`` in pieces of the given sizes (cycled) and collect every frame that completes."""
    frames: list[bytes | list[bytes]] = []
    position = 0
    index = 0
    while position < len(data):
        size = chunk_sizes[index % len(chunk_sizes)]
        index += 1
        receiver.receive_data(data[position : position + size])
        position += size
        while (frame := receiver.next_frame()) is not None:
            frames.append(frame)
    return frames


def handshake(initiator: SecureChannel, acceptor: SecureChannel, chunk_sizes: list[int]) -> None:
    for _ in range(3):  # HELLOs, then the initiator's proof, then the acceptor's proof
        to_acceptor = initiator.data_to_send()
        to_initiator = acceptor.data_to_send()
        assert feed_in_chunks(acceptor, to_acceptor, chunk_sizes) == []
        assert feed_in_chunks(initiator, to_initiator, chunk_sizes) == []
    assert initiator.established and acceptor.established


def encode_frames(sender: SecureChannel, payloads: list[bytes]) -> bytes:
    return b"".join(sender.encode_frame(payload) + payload for payload in payloads)


# -- (d) the sans-IO wire protocol ---------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    to_acceptor=st.lists(st.binary(max_size=3000), max_size=12),
    to_initiator=st.lists(st.binary(max_size=3000), max_size=12),
    chunk_sizes=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=20),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_handshake_and_frames_survive_any_split_of_the_byte_stream(
    to_acceptor: list[bytes], to_initiator: list[bytes], chunk_sizes: list[int], seed: int
) -> None:
    initiator = make_channel(Role.INITIATOR, seed=seed)
    acceptor = make_channel(Role.ACCEPTOR, seed=seed + 1)
    handshake(initiator, acceptor, chunk_sizes)
    assert feed_in_chunks(acceptor, encode_frames(initiator, to_acceptor), chunk_sizes) == to_acceptor
    assert feed_in_chunks(initiator, encode_frames(acceptor, to_initiator), chunk_sizes) == to_initiator
    assert acceptor.buffered_bytes == 0 and initiator.buffered_bytes == 0


def test_frames_sent_right_behind_the_last_proof_are_parsed_after_establishing() -> None:
    initiator = make_channel(Role.INITIATOR, seed=1)
    acceptor = make_channel(Role.ACCEPTOR, seed=2)
    acceptor.receive_data(initiator.data_to_send())
    initiator.receive_data(acceptor.data_to_send())
    acceptor.receive_data(initiator.data_to_send())
    # The acceptor's proof and its first frames reach the initiator in one read.
    initiator.receive_data(acceptor.data_to_send() + encode_frames(acceptor, [b"first", b"second"]))
    assert initiator.next_frame() == b"first"
    assert initiator.next_frame() == b"second"
    assert initiator.next_frame() is None


def test_acceptor_reveals_no_keyed_value_before_the_initiator_proved_itself() -> None:
    acceptor = make_channel(Role.ACCEPTOR, seed=1)
    acceptor_hello = acceptor.data_to_send()
    assert len(acceptor_hello) == HELLO.size
    attacker = make_channel(Role.INITIATOR, secret=b"not the secret", seed=2)
    acceptor.receive_data(attacker.data_to_send())
    assert acceptor.data_to_send() == b""  # no proof computed over the attacker's nonce
    attacker.receive_data(acceptor_hello)
    with pytest.raises(HandshakeError, match="secret"):
        acceptor.receive_data(attacker.data_to_send())
    assert acceptor.state is ChannelState.FAILED
    assert acceptor.data_to_send() == b""
    with pytest.raises(FrameError):
        acceptor.next_frame()


def test_initiator_rejects_an_acceptor_with_another_secret() -> None:
    initiator = make_channel(Role.INITIATOR, seed=1)
    impostor = make_channel(Role.ACCEPTOR, secret=b"another secret", seed=2)
    initiator.receive_data(impostor.data_to_send())
    with pytest.raises(HandshakeError):
        impostor.receive_data(initiator.data_to_send())  # the initiator's HELLO, then its proof
    # The impostor has no valid proof to answer with; forged bytes fail.
    with pytest.raises(HandshakeError):
        initiator.receive_data(os.urandom(PROOF_BYTES))
    assert not initiator.established


@pytest.mark.parametrize(
    "first_bytes",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 20, id="http"),
        pytest.param(struct.pack("i", 11) + zlib.compress(pickle.dumps("127.0.0.1:1", 2), 3) + b"\x00" * 40, id="stock"),
        pytest.param(HELLO.pack(PROTOCOL_MAGIC, PROTOCOL_VERSION + 1, b"\x00" * 32), id="version"),
        # version 2 covered large parts by SHA-256: its tags would not verify, so it is refused at HELLO
        pytest.param(HELLO.pack(PROTOCOL_MAGIC, 2, b"\x00" * 32), id="version-2"),
    ],
)
def test_wrong_protocol_is_rejected_on_the_first_hello(first_bytes: bytes) -> None:
    acceptor = make_channel(Role.ACCEPTOR)
    with pytest.raises(HandshakeError):
        acceptor.receive_data(first_bytes)


def test_a_reflected_hello_is_rejected() -> None:
    initiator = make_channel(Role.INITIATOR)
    hello = initiator.data_to_send()
    with pytest.raises(HandshakeError, match="echoed"):
        initiator.receive_data(hello)


def established_pair() -> tuple[SecureChannel, SecureChannel]:
    initiator = make_channel(Role.INITIATOR, seed=3)
    acceptor = make_channel(Role.ACCEPTOR, seed=4)
    handshake(initiator, acceptor, [4096])
    return initiator, acceptor


@pytest.mark.parametrize("flipped_byte", [0, 3, 4, 19, 20, 25])
def test_a_modified_frame_is_rejected_and_nothing_is_delivered(flipped_byte: int) -> None:
    initiator, acceptor = established_pair()
    frame = bytearray(encode_frames(initiator, [b"append_entries payload"]))
    frame[flipped_byte] ^= 0x01
    # A following frame completes whatever length the modified header claims.
    acceptor.receive_data(bytes(frame) + encode_frames(initiator, [b"next" * 10]))
    with pytest.raises(ProtocolError):
        assert acceptor.next_frame() is None
        acceptor.receive_data(encode_frames(initiator, [b"more" * 10]))
        acceptor.next_frame()


def test_replayed_and_reordered_frames_are_rejected() -> None:
    initiator, acceptor = established_pair()
    first = encode_frames(initiator, [b"one"])
    second = encode_frames(initiator, [b"two"])
    acceptor.receive_data(first)
    assert acceptor.next_frame() == b"one"
    acceptor.receive_data(first)
    with pytest.raises(FrameError, match="tag"):
        acceptor.next_frame()
    _, other_acceptor = established_pair()
    other_acceptor.receive_data(second)
    with pytest.raises(FrameError, match="tag"):
        other_acceptor.next_frame()


def test_a_frame_from_the_other_direction_is_rejected() -> None:
    initiator, acceptor = established_pair()
    # A frame the acceptor made, reflected back to the acceptor.
    acceptor.receive_data(encode_frames(acceptor, [b"reflected"]))
    with pytest.raises(FrameError):
        acceptor.next_frame()
    del initiator


def test_frame_size_limit_is_checked_on_the_header_before_the_payload_arrives() -> None:
    initiator, acceptor = established_pair()
    acceptor.receive_data(FRAME_HEADER.pack(FRAME_LIMIT_BYTES + 1, b"\x00" * 16))
    with pytest.raises(FrameError, match="limit"):
        acceptor.next_frame()
    with pytest.raises(FrameTooLargeError):
        initiator.encode_frame(b"\x00" * (FRAME_LIMIT_BYTES + 1))


def test_frames_cannot_be_encoded_before_the_handshake() -> None:
    with pytest.raises(InvariantError):
        make_channel(Role.INITIATOR).encode_frame(b"too early")


@pytest.mark.parametrize("secret", [b"", "text secret"])
def test_the_secret_must_be_non_empty_bytes(secret: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        transport_class(secret)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError)):
        SecureChannel(Role.INITIATOR, secret, frame_size_max_bytes=1024)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(operations=st.lists(st.tuples(st.binary(max_size=5000), st.integers(min_value=0, max_value=6000))))
def test_receive_buffer_returns_bytes_in_order(operations: list[tuple[bytes, int]]) -> None:
    """Appended and received-into bytes come out in order, whatever the reads and takes."""
    buffer = ReceiveBuffer()
    model = bytearray()
    for data, take in operations:
        if take % 2:
            buffer.append(data)
        else:  # as socket.recv_into: write what there is, up to the room offered
            def receive(view: memoryview, data: bytes = data) -> int:
                view[: len(data)] = data
                return len(data)

            assert buffer.receive_into(receive, len(data) + take % 7) == len(data)
        model += data
        size = min(take, len(model))
        assert buffer.take(size) == bytes(model[:size])
        del model[:size]
        assert len(buffer) == len(model)


def test_receive_buffer_compacts_without_losing_bytes() -> None:
    buffer = ReceiveBuffer()
    chunk = bytes(range(256)) * 4096  # 1 MiB
    buffer.append(chunk)
    buffer.append(chunk)
    assert buffer.take(len(chunk) + 10) == chunk + chunk[:10]
    buffer.append(b"tail")  # compacts: the consumed 1 MiB + 10 bytes are at least half the buffer
    assert buffer.take(len(buffer)) == chunk[10:] + b"tail"


def test_receive_buffer_reuses_its_storage_and_drops_a_large_one() -> None:
    buffer = ReceiveBuffer()
    frame = bytes(range(256)) * 1024
    for _ in range(50):  # steady traffic: one frame in, one frame out
        buffer.append(frame)
        assert buffer.take(len(frame)) == frame
    assert len(buffer._buffer) == len(frame)  # reused, never grown past a frame
    buffer.append(bytes(9 << 20))  # a snapshot-sized frame
    buffer.take(9 << 20)
    buffer.append(b"next")
    assert len(buffer._buffer) < 9 << 20 and buffer.take(4) == b"next"


class CreatesMarkerFile:
    """Unpickling this opens (creates) a file: what an attacker would send to a pickle endpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def malicious_pickle(marker: Path) -> bytes:
    return pickle.dumps({"type": "append_entries", "term": 99, "evil": CreatesMarkerFile(marker)}, protocol=2)


def test_the_malicious_pickle_is_live_and_authenticated_frames_still_cannot_run_it(tmp_path: Path) -> None:
    control = tmp_path / "control-marker"
    unpickled = pickle.loads(malicious_pickle(control))  # proves the payload works against plain pickle
    unpickled["evil"].close()
    assert control.exists()
    marker = tmp_path / "marker"
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        decode_message(malicious_pickle(marker))
    assert not marker.exists()
    message = {"type": "append_entries", "entries": [(b"\x00\xff" * 10, 5, 2)], "term": 2, "flag": True}
    assert decode_message(encode_message(message)) == message


def test_large_commands_travel_out_of_band_and_come_back_as_bytes() -> None:
    big = random.Random(2).randbytes(OUT_OF_BAND_MIN_BYTES + 7)
    message = {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": 4, "prevLogTerm": 3,
               "entries": [(big, 5, 3), (b"small", 6, 3), (big[::-1], 7, 3)]}
    parts = encode_message_parts(message)
    assert len(parts) == 3  # pickle, two buffers
    assert isinstance(parts[1], memoryview) and parts[1].obj is big  # a view of the entry's own bytes: not copied before the socket
    initiator, acceptor = established_pair()
    acceptor.receive_data(initiator.encode_parted_frame(parts) + b"".join(parts))
    received = acceptor.next_frame()
    assert isinstance(received, list) and len(received) == 3
    decoded = decode_message(received)
    assert decoded == message
    assert isinstance(decoded, dict) and all(type(entry[0]) is bytes for entry in decoded["entries"])
    # anything else stays one plain pickle, as before
    for plain in ({"type": "append_entries", "entries": [(b"x" * 10, 1, 1)]}, {"type": "request_vote"}, 7):
        (only,) = encode_message_parts(plain)
        assert only[:1] == b"\x80" and decode_message(bytes(only)) == plain


def test_out_of_band_parts_with_wrong_buffers_or_globals_are_refused(tmp_path: Path) -> None:
    big = b"b" * OUT_OF_BAND_MIN_BYTES
    skeleton, buffer = encode_message_parts({"type": "append_entries", "entries": [(big, 1, 1)]})
    for broken in ([bytes(skeleton)], [bytes(skeleton)[:-1], bytes(buffer)]):
        with pytest.raises((ValueError, struct.error, pickle.UnpicklingError, EOFError)):
            decode_message(broken)
    evil = pickle.dumps({"type": "append_entries", "evil": CreatesMarkerFile(tmp_path / "marker")}, protocol=5)
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        decode_message([evil, bytes(buffer)])
    assert not (tmp_path / "marker").exists()


def test_a_frame_in_parts_carries_the_tag_of_the_joined_payload() -> None:
    initiator, acceptor = established_pair()
    parts: list[bytes | memoryview] = [b"head", memoryview(b"middle part"), b"tail"]
    header = initiator.encode_frame_parts(parts)
    acceptor.receive_data(header + b"".join(parts))
    assert acceptor.next_frame() == b"headmiddle parttail"


def parted_frame(parts: list[bytes], cache: DigestCache | None = None) -> tuple[SecureChannel, bytes]:
    initiator, acceptor = established_pair()
    head = initiator.encode_parted_frame(parts) if cache is None else initiator.encode_parted_frame(parts, cache.digest)
    return acceptor, head + b"".join(parts)


def test_parted_frames_arrive_as_their_parts_in_any_chunking() -> None:
    rng = random.Random(11)
    parts = [b"skeleton", rng.randbytes(DIGEST_MIN_BYTES), b"", rng.randbytes(DIGEST_MIN_BYTES - 1), rng.randbytes(70_000)]
    cache = DigestCache()
    cache.remember(parts[4])
    for digests in (None, cache):
        acceptor, wire = parted_frame(parts, digests)
        assert feed_in_chunks(acceptor, wire, [1, 7, 4096, 100_000]) == [parts]


def test_a_tampered_parted_frame_is_refused() -> None:
    """Every byte of a parted frame counts: a bit flipped in a hashed part, in a part hashed whole, in the
    part table, or a part moved across a boundary (same bytes, other lengths) fails the tag."""
    rng = random.Random(12)
    parts = [b"skeleton pickle", rng.randbytes(DIGEST_MIN_BYTES + 10), rng.randbytes(100)]
    _, wire = parted_frame(parts)
    header = FRAME_HEADER.size
    table = 4 + 4 * len(parts)
    for position in (header + table + 3, header + table + len(parts[0]) + 2000, len(wire) - 1, header + 4 + 3):
        acceptor, wire = parted_frame(parts)
        broken = bytearray(wire)
        broken[position] ^= 0x01
        acceptor.receive_data(bytes(broken))
        with pytest.raises(FrameError):
            acceptor.next_frame()
    # the same bytes cut differently: move a byte from the second part to the first
    acceptor, wire = parted_frame(parts)
    moved = bytearray(wire)
    struct.pack_into(">II", moved, header + 4, len(parts[0]) + 1, len(parts[1]) - 1)
    acceptor.receive_data(bytes(moved))
    with pytest.raises(FrameError, match="tag"):
        acceptor.next_frame()


def test_a_parted_frame_whose_table_does_not_add_up_is_refused() -> None:
    parts = [b"a" * 10, b"b" * 20]
    for count, lengths in ((2, (10, 21)), (2, (9, 20)), (1_000_000, (10, 20))):
        acceptor, wire = parted_frame(parts)
        broken = bytearray(wire)
        struct.pack_into(">III", broken, FRAME_HEADER.size, count, *lengths)
        acceptor.receive_data(bytes(broken))
        with pytest.raises(FrameError):
            acceptor.next_frame()


def test_the_digest_cache_answers_only_for_the_very_bytes_it_hashed() -> None:
    cache = DigestCache(capacity=2)
    first, second, third = (bytes([n]) * DIGEST_MIN_BYTES for n in range(3))
    for data in (first, second, third):
        cache.remember(data)
    for data in (first, second, third):  # the first fell out: computed again, equal all the same
        assert cache.digest(data) == cache.digest(memoryview(data)) == part_digest(data)
    assert cache.digest(memoryview(third)[1:]) == part_digest(third[1:])  # a slice is not the entry
    assert cache.digest(bytes(third)) == part_digest(third)  # an equal copy: hashed, same digest


def test_large_parts_are_covered_by_their_blake3_digest() -> None:
    """The wire format (protocol version 3): BLAKE3's published digests of the empty input and of "abc"."""
    assert PROTOCOL_VERSION == 3
    assert part_digest(b"").hex() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert part_digest(memoryview(b"abc")).hex() == (
        "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85")


def test_the_digest_cache_is_bounded_by_bytes_too() -> None:
    size = DIGEST_MIN_BYTES
    cache = DigestCache(capacity=64, capacity_bytes=size * 5 // 2)
    entries = [bytes([n]) * size for n in range(4)]
    for data in entries:
        cache.remember(data)
        cache.remember(data)  # the same entry twice counts once
    assert cache.held_bytes == 2 * size  # the two newest
    huge = b"h" * (size * 3)
    cache.remember(huge)
    assert cache.held_bytes == len(huge)  # alone over the bound: still held until the next one
    assert cache.digest(huge) == part_digest(huge)


# -- dledger.tuning ------------------------------------------------------------------------------------


def test_tuned_conf_keeps_entries_clear_of_the_chunking_trap() -> None:
    conf = tuned_conf(entry_size_max_bytes=300_000, journal_file="/tmp/journal", extra={"dynamicMembershipChange": True})
    assert conf.appendEntriesBatchSizeBytes == 600_000
    assert entry_size_max_bytes(conf) == 300_000 < conf.appendEntriesBatchSizeBytes
    assert conf.journalFile == "/tmp/journal" and conf.dynamicMembershipChange
    assert conf.sendBufferSize == conf.recvBufferSize == 4 * 1024 * 1024
    assert 0.002 <= conf.appendEntriesPeriod <= 0.010 and conf.autoTickPeriod == 0.001
    assert conf.password is None


@pytest.mark.parametrize(
    "arguments",
    [
        {"append_entries_period_seconds": 0.1},
        {"raft_min_timeout_seconds": 2.0, "raft_max_timeout_seconds": 1.0},
        {"extra": {"noSuchKey": 1}},
        {"extra": {"password": "x"}},
        {"extra": {"appendEntriesBatchSizeBytes": 1}},
    ],
)
def test_tuned_conf_rejects_bad_combinations(arguments: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        tuned_conf(**arguments)  # type: ignore[arg-type]


def test_the_transport_refuses_to_listen_on_a_wildcard_address() -> None:
    with pytest.raises(ValueError, match="wildcard"):
        SyncObj("0.0.0.0:4321", [], conf=tuned_conf(), transportClass=transport_class(SECRET))


def test_the_transport_refuses_pysyncobj_password_encryption() -> None:
    sync_object = types.SimpleNamespace(conf=SyncObjConf(password="stock encryption"))
    with pytest.raises(ValueError, match="password"):
        AuthenticatedTcpTransport(sync_object, None, [], secret=SECRET)


def test_transport_settings_validate() -> None:
    with pytest.raises(ValueError):
        TransportSettings(handshake_timeout_seconds=0).validate()
    with pytest.raises(ValueError):
        transport_class(SECRET, TransportSettings(read_budget_bytes=1))


# -- real member processes on 127.0.0.1 ------------------------------------------------------------------


@pytest.fixture
def group(tmp_path: Path) -> Iterator[MemberGroup]:
    with running_group(tmp_path, secret=SECRET) as started:
        yield started


def propose(group: MemberGroup, count: int, size: int, seed: int) -> None:
    leader = group.wait_for_leader()
    result = leader.request("propose", timeout_seconds=40, count=count, size=size, seed=seed, timeout=30)
    assert result == {"acked": count, "errors": {}, "in_flight": 0}


@pytest.mark.slow
def test_three_members_replicate_thousands_of_entries_identically(group: MemberGroup) -> None:
    propose(group, count=3000, size=700, seed=1)
    statuses = group.wait_for_identical_state(3000)
    assert len({status["chain"] for status in statuses}) == 1
    assert {status["payload_bytes"] for status in statuses} == {3000 * 700}
    for member in group.members:
        assert "Traceback" not in member.log_text()


@pytest.mark.slow
def test_entries_up_to_the_recommended_maximum_replicate(group: MemberGroup) -> None:
    leader = group.wait_for_leader()
    targets = {
        # the recommended maximum, and the hard limit just below appendEntriesBatchSizeBytes
        "recommended": 256 * 1024,
        "hard limit": 2 * 256 * 1024 - 1,
    }
    for seed, (name, command_size) in enumerate(targets.items()):
        result = leader.request("propose_sized", timeout_seconds=40, command_size=command_size, seed=seed, timeout=30)
        assert result["acked"] == 1, (name, result)
        assert command_size - 64 <= result["command_size"] <= command_size, (name, result)
        assert result["entry_size_max"] == 256 * 1024 and result["batch_size"] == 512 * 1024
    statuses = group.wait_for_identical_state(len(targets))
    assert len({status["chain"] for status in statuses}) == 1
    for member in group.members:
        assert "truncated" not in member.log_text()


def read_until_closed(connection: socket.socket, timeout_seconds: float) -> bytes:
    """Everything the member sends until it closes the connection; fails if it stays open."""
    received = bytearray()
    deadline = time.monotonic() + timeout_seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the member kept the connection open (received {len(received)} bytes)")
        connection.settimeout(remaining)
        try:
            data = connection.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return bytes(received)
        except TimeoutError:
            continue
        if not data:
            return bytes(received)
        received += data


@contextlib.contextmanager
def connected(port: int) -> Iterator[socket.socket]:
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        yield connection
    finally:
        connection.close()


def send_ignoring_reset(connection: socket.socket, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        connection.sendall(data)


@pytest.mark.slow
def test_a_peer_without_the_secret_achieves_nothing(group: MemberGroup, tmp_path: Path) -> None:
    marker = tmp_path / "marker-file"
    evil = malicious_pickle(marker)
    stock_frame = zlib.compress(evil, 3)
    leader = group.wait_for_leader()
    follower = next(member for member in group.members if member is not leader)
    propose(group, count=50, size=1000, seed=2)
    for target in (leader, follower):
        # Garbage bytes.
        with connected(target.port) as connection:
            send_ignoring_reset(connection, os.urandom(8192))
            read_until_closed(connection, 5)
        # What the stock pysyncobj transport would unpickle: length prefix, zlib, pickle protocol 2.
        with connected(target.port) as connection:
            send_ignoring_reset(connection, struct.pack("i", len(stock_frame)) + stock_frame)
            read_until_closed(connection, 5)
        # The bare pickle, and the pickle behind a well-formed HELLO, dressed as a frame.
        with connected(target.port) as connection:
            send_ignoring_reset(connection, evil)
            read_until_closed(connection, 5)
        with connected(target.port) as connection:
            hello = HELLO.pack(PROTOCOL_MAGIC, PROTOCOL_VERSION, os.urandom(32))
            send_ignoring_reset(connection, hello + FRAME_HEADER.pack(len(evil), b"\x00" * 16) + evil)
            read_until_closed(connection, 5)
        # A complete handshake with the wrong secret: the member sends its HELLO and never a proof.
        with connected(target.port) as connection:
            impostor = make_channel(Role.INITIATOR, secret=b"wrong secret", seed=7)
            connection.sendall(impostor.data_to_send())
            member_hello = b""
            while len(member_hello) < HELLO.size:
                member_hello += connection.recv(HELLO.size - len(member_hello))
            impostor.receive_data(member_hello)
            send_ignoring_reset(connection, impostor.data_to_send() + struct.pack(">I16s", len(evil), b"") + evil)
            assert read_until_closed(connection, 5) == b""
        # Stalled handshakes: silence, and half a HELLO.
        with connected(target.port) as silent, connected(target.port) as half:
            half.sendall(HELLO.pack(PROTOCOL_MAGIC, PROTOCOL_VERSION, os.urandom(32))[:20])
            assert len(read_until_closed(silent, 5)) == HELLO.size
            assert len(read_until_closed(half, 5)) == HELLO.size
    propose(group, count=50, size=1000, seed=3)
    statuses = group.wait_for_identical_state(100)
    assert len({status["chain"] for status in statuses}) == 1
    assert not marker.exists()


@pytest.mark.slow
def test_a_paused_follower_catches_up(tmp_path: Path) -> None:
    # A 256 KiB output limit makes the leader defer (not pickle) most of what the paused follower cannot
    # take, and pickle it as the follower drains after it resumes.
    with running_group(tmp_path, secret=SECRET, output_buffer_max_bytes=256 * 1024) as group:
        leader = group.wait_for_leader()
        follower = next(member for member in group.members if member is not leader)
        follower.process.send_signal(signal.SIGSTOP)
        try:
            # ~26 MB: more than the kernel's socket buffers hold, committed by the other two members.
            result = leader.request("propose", timeout_seconds=40, count=400, size=64 * 1024, seed=4, timeout=30)
            assert result["acked"] == 400
        finally:
            follower.process.send_signal(signal.SIGCONT)
        statuses = group.wait_for_identical_state(400, timeout_seconds=30)
        assert len({status["chain"] for status in statuses}) == 1
        assert "deferring the encoding" in leader.log_text()
