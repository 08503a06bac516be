"""The replicated ACL document: its operation in the command format, its apply, its state section
(version 4) and the older state versions it must keep reading."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from dledger.command import (
    AclDocument,
    Command,
    CommandError,
    ConsumerOffset,
    ConsumerOffsets,
    OpType,
    decode_command,
    encode_command,
)
from dledger.state import STATE_VERSION, ReplicatedState, StateError
from tests.dledger.test_apply import machine

DOCUMENT = b'{"format":"raftmq-acl-1","accounts":[],"globalWhiteRemoteAddresses":["10.0.0.*"]}'


@pytest.mark.parametrize("document", [b"", DOCUMENT, bytes(range(256)) * 40])
def test_command_round_trip(document: bytes) -> None:
    command = Command((AclDocument(document), ConsumerOffsets((ConsumerOffset("g", "t", 0, 1),))))
    for compress in (False, True):
        assert decode_command(encode_command(command, compress)) == command


def test_operation_layout_is_type_9_with_a_length_prefixed_document() -> None:
    encoded = encode_command(Command((AclDocument(b"abc"),)), compress=False)
    assert int(OpType.ACL_DOCUMENT) == 9
    assert encoded == bytes((1, 0)) + struct.pack(">I", 1) + struct.pack(">BI", 9, 7) + struct.pack(">I", 3) + b"abc"


def test_truncated_or_padded_document_operation_is_rejected() -> None:
    good = encode_command(Command((AclDocument(b"abc"),)), compress=False)
    truncated = good[:-1]
    padded = good[:6] + struct.pack(">BI", 9, 8) + struct.pack(">I", 3) + b"abc!"
    for bad in (truncated, padded):
        with pytest.raises(CommandError):
            decode_command(bad)


def test_apply_sets_the_document_once_per_index(tmp_path: Path) -> None:
    sm = machine(tmp_path / "a")
    sm.apply(1, encode_command(Command((AclDocument(DOCUMENT),))))
    assert sm.state.acl_document == DOCUMENT
    sm.apply(2, encode_command(Command((AclDocument(b"newer"),))))
    assert sm.state.acl_document == b"newer"
    # a replayed older entry changes nothing (idempotent by index)
    sm.apply(1, encode_command(Command((AclDocument(DOCUMENT),))))
    assert sm.state.acl_document == b"newer"


def test_state_round_trip_with_the_document() -> None:
    state = ReplicatedState(applied_index=7, acl_document=DOCUMENT)
    state.apply_offsets((ConsumerOffset("g", "t", 1, 5),))
    decoded = ReplicatedState.decode(state.encode())
    assert decoded == state and STATE_VERSION >= 4
    assert ReplicatedState.decode(ReplicatedState().encode()).acl_document == b""


def as_version_3(encoded: bytes) -> bytes:
    """A version-6 snapshot of a state without ACL, byte configuration, groups or pop state, rewritten as
    version 3 wrote it (no ACL, byte-configuration or pop section)."""
    body = encoded[:-4]
    assert body.endswith(struct.pack(">III", 0, 0, 0))
    body = body[:4] + struct.pack(">H", 3) + body[6:-12]
    return body + struct.pack(">I", zlib.crc32(body))


def test_older_state_versions_stay_readable() -> None:
    state = ReplicatedState(applied_index=3)
    state.apply_offsets((ConsumerOffset("g", "t", 0, 9),))
    state.transactions_resolved[4] = 1
    old = as_version_3(state.encode())
    decoded = ReplicatedState.decode(old)
    assert decoded == state and decoded.acl_document == b""


def test_a_document_running_past_the_snapshot_is_rejected() -> None:
    encoded = ReplicatedState(acl_document=b"abcdef").encode()
    body = encoded[:-4]
    # claims 15 bytes: its 6, the 8 of the (empty) byte-configuration and pop sections after it, and one more
    body = body[:-18] + struct.pack(">I", 15) + body[-14:]
    with pytest.raises(StateError):
        ReplicatedState.decode(body + struct.pack(">I", zlib.crc32(body)))
