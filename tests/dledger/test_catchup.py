"""The catch-up protocol's queue-starts request (dledger/catchup.py): answered for an offset inside the
peer's commit log, "below retention" or "not yet" outside it, refused for an unknown kind or version; a
malformed answer is a CatchupError and leaves the asking store without anything of it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from commitlog.store import MessageStore
from dledger.catchup import (
    KIND_QUEUE_STARTS,
    KIND_REQUEST,
    QUEUE_START,
    QUEUE_STARTS_HEADER,
    QUEUE_STARTS_MAX,
    QUEUE_STARTS_VERSION,
    REQUEST_BY_KIND,
    RESPONSE,
    STATUS_BELOW_RETENTION,
    STATUS_NOT_YET,
    STATUS_OK,
    STATUS_REFUSED,
    U32,
    CatchupError,
    CatchupServer,
    _request,
    decode_queue_starts,
    encode_queue_starts,
    fetch,
    fetch_queue_starts,
)
from tests.commitlog.helpers import message, small_config, store_past_retention

SECRET = b"catch-up test secret"
LONG = ("TopicTest", 0)
LONE = ("TopicTest", 1)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[MessageStore]:
    """Queue 1's only message lies in a segment retention deleted; queue 0 goes on past it."""
    store = store_past_retention(tmp_path / "source")
    yield store
    store.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[MessageStore]:
    """An empty store, as a wiped replica's."""
    store = MessageStore(small_config(tmp_path / "target"))
    yield store
    store.close()


@contextlib.contextmanager
def serving(store: MessageStore, server_class: type[CatchupServer] = CatchupServer) -> Iterator[CatchupServer]:
    server = server_class(("127.0.0.1", 0), SECRET, store)
    try:
        yield server
    finally:
        server.listener.shutdown(socket.SHUT_RDWR)  # wakes its accept at once: close waits for a timeout
        server.close()


@pytest.fixture
def server(source: MessageStore) -> Iterator[CatchupServer]:
    with serving(source) as server:
        yield server


def entry(topic: bytes, queue_id: int, start: int) -> bytes:
    return bytes((len(topic),)) + topic + QUEUE_START.pack(queue_id, start)


def body(*entries: bytes, count: int | None = None) -> bytes:
    return QUEUE_STARTS_HEADER.pack(len(entries) if count is None else count) + b"".join(entries)


def test_queue_starts_are_served_for_the_retention_point_and_after(source: MessageStore,
                                                                  server: CatchupServer) -> None:
    low, end = source.commit_log.min_offset, source.max_physical_offset
    status, peer_low, peer_end, starts = fetch_queue_starts(server.address, SECRET, low)
    assert (status, peer_low, peer_end) == (STATUS_OK, low, end)
    assert starts == {LONG: source.min_queue_offset(*LONG), LONE: 1}
    status, _, _, starts = fetch_queue_starts(server.address, SECRET, end)
    assert (status, starts) == (STATUS_OK, {LONG: source.max_queue_offset(*LONG), LONE: 1})


def test_queue_starts_outside_the_commit_log_answer_where_it_is(source: MessageStore, server: CatchupServer) -> None:
    low, end = source.commit_log.min_offset, source.max_physical_offset
    assert fetch_queue_starts(server.address, SECRET, 0) == (STATUS_BELOW_RETENTION, low, end, {})
    assert fetch_queue_starts(server.address, SECRET, end + 1) == (STATUS_NOT_YET, low, end, {})


@pytest.mark.parametrize(("kind", "version"), [(KIND_QUEUE_STARTS, QUEUE_STARTS_VERSION + 1), (9, 1)])
def test_an_unknown_kind_or_version_is_refused(source: MessageStore, server: CatchupServer, kind: int,
                                               version: int) -> None:
    request = KIND_REQUEST.pack(kind, version, source.commit_log.min_offset)
    with _request(server.address, SECRET, REQUEST_BY_KIND, 0, request) as (_, status, low, end):
        assert (status, low, end) == (STATUS_REFUSED, source.commit_log.min_offset, source.max_physical_offset)


def test_queue_starts_need_the_secret(server: CatchupServer, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConnectionError):  # the server hangs up before it proves itself
        fetch_queue_starts(server.address, b"another secret", 0)
    assert "failed authentication" in caplog.text


def test_the_codec_leaves_out_queues_that_start_at_0() -> None:
    starts = {("TopicB", 2): 5, ("TopicA", 7): 0, ("TopicA", 1): 2**40}
    encoded = encode_queue_starts(starts)
    assert encoded == body(entry(b"TopicA", 1, 2**40), entry(b"TopicB", 2, 5))
    assert decode_queue_starts(encoded) == {("TopicA", 1): 2**40, ("TopicB", 2): 5}
    assert encode_queue_starts({("T", number): 1 for number in range(QUEUE_STARTS_MAX + 1)}) is None


@pytest.mark.parametrize(("data", "problem"), [
    (b"\x00\x00", "cut short"),
    (body(count=1), "cut short"),
    (body(entry(b"TopicA", 1, 5))[:-1], "cut short"),
    (body(entry(b"TopicA", 1, 5)) + b"\x00", "1 bytes follow"),
    (body(count=QUEUE_STARTS_MAX + 1), "over the limit"),
    (body(entry(b"../etc", 1, 5)), "refuses"),
    (body(entry(b"", 1, 5)), "refuses"),
    (body(entry(b"Topic\xff", 1, 5)), "not UTF-8"),
    (body(entry(b"TopicA", -1, 5)), "cannot start"),
    (body(entry(b"TopicA", 1, 0)), "cannot start"),
    (body(entry(b"TopicA", 1, -5)), "cannot start"),
    (body(entry(b"TopicB", 1, 5), entry(b"TopicA", 1, 5)), "out of order or repeated"),
    (body(entry(b"TopicA", 1, 5), entry(b"TopicA", 1, 6)), "out of order or repeated"),
])
def test_a_malformed_answer_is_refused(data: bytes, problem: str) -> None:
    with pytest.raises(CatchupError, match=problem):
        decode_queue_starts(data)


class LyingServer(CatchupServer):
    """Serves the commit log as it is, and queue starts that name a topic no store accepts."""

    def _serve_by_kind(self, connection: socket.socket) -> None:
        KIND_REQUEST.unpack(connection.recv(KIND_REQUEST.size, socket.MSG_WAITALL))
        answer = body(entry(b"../outside", 0, 3))
        connection.sendall(RESPONSE.pack(STATUS_OK, self.store.commit_log.min_offset,
                                       self.store.max_physical_offset) + U32.pack(len(answer)) + answer)


def test_a_copy_past_retention_takes_the_queue_starts_from_the_peer(source: MessageStore, server: CatchupServer,
                                                                    target: MessageStore) -> None:
    fetch([server.address], SECRET, target, source.max_physical_offset, source.applied_raft_index,
          source.min_physical_offset)
    for key in (LONG, LONE):
        assert (target.min_queue_offset(*key), target.max_queue_offset(*key)) == (
            source.min_queue_offset(*key), source.max_queue_offset(*key))
    assert target.append(source.applied_raft_index + 1, [message(99, queue_id=1)]).results[0].queue_offset == 1


def test_a_malformed_answer_leaves_nothing_in_the_store(source: MessageStore, target: MessageStore,
                                                        tmp_path: Path) -> None:
    with serving(source, LyingServer) as lying, pytest.raises(CatchupError, match="refuses"):
        fetch([lying.address], SECRET, target, source.max_physical_offset, source.applied_raft_index,
          source.min_physical_offset)
    assert target.applied_raft_index == 0 and target.queue_ids() == []
    assert target.max_physical_offset == source.commit_log.min_offset  # reset to the peer's retention point
    assert not (tmp_path / "target" / "outside").exists()


def test_a_store_reset_to_a_retention_point_the_peer_moved_past_resets_again(source: MessageStore,
                                                                             server: CatchupServer,
                                                                             target: MessageStore) -> None:
    """A replica reset to an earlier retention point (a copy that stopped, then a restart) asks for the queue
    starts there: the peer answers "below retention" with its own point, and the copy starts again from it."""
    target.reset_to(source.commit_log.min_offset - source.config.segment_size_bytes)
    fetch([server.address], SECRET, target, source.max_physical_offset, source.applied_raft_index,
          source.min_physical_offset)
    assert target.commit_log.min_offset == source.commit_log.min_offset
    assert target.max_queue_offset(*LONE) == 1


def test_a_copy_that_would_begin_past_the_snapshots_commit_log_is_refused_before_anything_changes(
        source: MessageStore, server: CatchupServer, target: MessageStore) -> None:
    """A snapshot taken before the peer's last retention: the entries after it need the records retention
    deleted, so the copy is refused, the store is not reset, and a newer snapshot is asked for."""
    target.append(1, [message(0)])
    end, applied = target.max_physical_offset, target.applied_raft_index
    older_snapshot_min = source.min_physical_offset - source.config.segment_size_bytes
    with pytest.raises(CatchupError, match="a newer snapshot is needed"):
        fetch([server.address], SECRET, target, source.max_physical_offset, source.applied_raft_index,
              older_snapshot_min)
    assert (target.max_physical_offset, target.applied_raft_index, target.min_physical_offset) == (end, applied, 0)


class MemberBeforeQueueStarts(CatchupServer):
    """Answers a request by kind as a member from before them does: its offset looks negative."""

    def _serve_by_kind(self, connection: socket.socket) -> None:
        connection.sendall(RESPONSE.pack(STATUS_BELOW_RETENTION, self.store.commit_log.min_offset,
                                       self.store.max_physical_offset))


def test_a_member_from_before_queue_starts_cannot_serve_a_copy_past_retention(source: MessageStore,
                                                                             target: MessageStore) -> None:
    with (serving(source, MemberBeforeQueueStarts) as older,
          pytest.raises(CatchupError, match="cannot tell where the queues continue")):
        fetch([older.address], SECRET, target, source.max_physical_offset, source.applied_raft_index,
          source.min_physical_offset)
    assert target.applied_raft_index == 0 and target.queue_ids() == []
