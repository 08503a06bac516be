"""Catch-up: a member copies committed commit-log bytes from a peer.

Used when a follower installs a snapshot (pysyncobj sends it when the follower is behind the leader's
compacted log, e.g. after its data directory was wiped): the commit log is byte-identical across
replicas and only ever holds committed data, so the missing range ``[own end, snapshot end)`` is an
immutable prefix of any peer's commit log. The follower copies it, the store validates every record
(CRC) and dispatches it, and Raft continues after the snapshot.

Protocol (blocking TCP, one request per connection), after mutual authentication with the group secret::

    server -> client: nonce_s (32 bytes)
    client -> server: nonce_c (32) | HMAC-SHA256(secret, "catchup-client" | nonce_s | nonce_c)
    server -> client: HMAC-SHA256(secret, "catchup-server" | nonce_c | nonce_s)
    client -> server: from_offset i64 | to_offset i64
    server -> client: status u8 | min_offset i64 | end_offset i64
                      (status 0: serving; 1: from_offset below my retention point, restart from min_offset;
                       2: I do not have to_offset yet)
    server -> client: chunk* then u32 0, where chunk = u32 compressed length | lz4 block (size stored)

A digest request sends ``to_offset`` negated; the answer is the status line, then (status 0) the CRC-32 u32
of the committed bytes ``[from_offset, -to_offset)``: the scrubber compares replicas with it.

A negative ``from_offset`` (no offset is negative) asks for something else, named by the bytes after the
request line, and ``to_offset`` is 0::

    client -> server: kind u8 | version u8 | offset i64
    server -> client: status u8 | min_offset i64 | end_offset i64
                      (status 1: offset below my retention point; 2: offset past my end; 3: I do not serve
                       that kind and version, or the answer would be over its limit)

Kind 1, version 1, queue starts: where each queue continues for a copy that begins at ``offset``
(:mod:`commitlog.queue_starts`); status 0 is followed by u32 byte length | u32 count | count entries, each
``topic length u8 | topic | queue id i32 | start i64``, sorted by topic and queue id, only the queues that do
not start at 0. A member from before such requests answers "below retention" (the offset looks negative).

Nothing is read from an unauthenticated peer beyond the 64 handshake bytes; nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import Final

import lz4.block
from isal.isal_zlib import crc32

from commitlog.errors import StoreError
from commitlog.message import TOPIC_BYTES_MAX
from commitlog.queue_starts import QueueKey
from commitlog.store import MessageStore
from dledger.addresses import resolve_for_bind
from protocol.topics import check_topic_name

log = logging.getLogger(__name__)

NONCE_BYTES: Final = 32
MAC_BYTES: Final = 32
REQUEST = struct.Struct(">qq")
RESPONSE = struct.Struct(">Bqq")
U32 = struct.Struct(">I")
CHUNK_BYTES: Final = 4 << 20
#: a compressed chunk may not claim more than this
CHUNK_BYTES_MAX: Final = 2 * CHUNK_BYTES
CONNECTIONS_MAX: Final = 4
SOCKET_TIMEOUT_SECONDS: Final = 10.0

#: the longest range one digest request may cover
DIGEST_BYTES_MAX: Final = 64 << 20

STATUS_OK: Final = 0
STATUS_BELOW_RETENTION: Final = 1
STATUS_NOT_YET: Final = 2
STATUS_REFUSED: Final = 3

#: ``from_offset`` of a request named by the :data:`KIND_REQUEST` that follows it
REQUEST_BY_KIND: Final = -1
KIND_REQUEST = struct.Struct(">BBq")
KIND_QUEUE_STARTS: Final = 1
QUEUE_STARTS_VERSION: Final = 1
QUEUE_STARTS_HEADER = struct.Struct(">I")
QUEUE_START = struct.Struct(">iq")
#: the most queues one answer may name, and so its most bytes
QUEUE_STARTS_MAX: Final = 1 << 16
QUEUE_STARTS_BYTES_MAX: Final = QUEUE_STARTS_HEADER.size + QUEUE_STARTS_MAX * (1 + TOPIC_BYTES_MAX + QUEUE_START.size)


class CatchupError(Exception):
    """The copy could not be made from any peer (unreachable, refused, behind, or sent damaged data)."""


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class CatchupServer:
    """Serves this member's committed commit-log bytes to authenticated peers."""

    def __init__(self, address: tuple[str, int], secret: bytes, store: MessageStore) -> None:
        self.secret = secret
        self.store = store
        # a name binds to the first address it resolves to (IPv4 or IPv6), once, at start
        family, bind_address = resolve_for_bind(*address)
        self.listener = socket.create_server(bind_address, family=family, reuse_port=False)
        self.listener.settimeout(0.5)
        self.address = self.listener.getsockname()
        self._slots = threading.BoundedSemaphore(CONNECTIONS_MAX)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="catchup-server", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                connection.close()  # over the connection limit: the client tries another peer
                continue
            threading.Thread(target=self._serve, args=(connection,), name="catchup-conn", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            connection.settimeout(SOCKET_TIMEOUT_SECONDS)
            server_nonce = os.urandom(NONCE_BYTES)
            connection.sendall(server_nonce)
            hello = _receive_exactly(connection, NONCE_BYTES + MAC_BYTES)
            client_nonce, proof = hello[:NONCE_BYTES], hello[NONCE_BYTES:]
            if not hmac.compare_digest(proof, _mac(self.secret, b"catchup-client", server_nonce, client_nonce)):
                log.warning("catch-up connection failed authentication")
                return
            connection.sendall(_mac(self.secret, b"catchup-server", client_nonce, server_nonce))
            from_offset, to_offset = REQUEST.unpack(_receive_exactly(connection, REQUEST.size))
            if from_offset == REQUEST_BY_KIND:
                self._serve_by_kind(connection)
                return
            low, end = self.store.commit_log.min_offset, self.store.max_physical_offset
            if to_offset < 0:
                self._serve_digest(connection, from_offset, -to_offset, low, end)
                return
            if from_offset < low:
                connection.sendall(RESPONSE.pack(STATUS_BELOW_RETENTION, low, end))
                return
            if to_offset > end or from_offset > to_offset:
                connection.sendall(RESPONSE.pack(STATUS_NOT_YET, low, end))
                return
            connection.sendall(RESPONSE.pack(STATUS_OK, low, end))
            position = from_offset
            while position < to_offset:
                data = self.store.read_committed(position, min(CHUNK_BYTES, to_offset - position))
                compressed = lz4.block.compress(data, store_size=True)
                connection.sendall(U32.pack(len(compressed)) + compressed)
                position += len(data)
            connection.sendall(U32.pack(0))
        except (OSError, ConnectionError, StoreError, struct.error) as exc:
            log.info("catch-up connection ended: %s", exc)
        finally:
            connection.close()
            self._slots.release()

    def _serve_digest(self, connection: socket.socket, from_offset: int, to_offset: int, low: int, end: int) -> None:
        """A digest request (``to_offset`` sent negated): the CRC-32 of the committed bytes ``[from_offset,
        to_offset)``, for the scrubber's comparison of replicas. A member from before digests answers such a
        request "not yet" (its range looks reversed), which the asker takes as no answer."""
        if from_offset < low:
            connection.sendall(RESPONSE.pack(STATUS_BELOW_RETENTION, low, end))
            return
        if to_offset > end or from_offset > to_offset or to_offset - from_offset > DIGEST_BYTES_MAX:
            connection.sendall(RESPONSE.pack(STATUS_NOT_YET, low, end))
            return
        crc = 0
        position = from_offset
        while position < to_offset:
            data = self.store.read_committed(position, min(CHUNK_BYTES, to_offset - position))
            crc = crc32(data, crc)
            position += len(data)
        connection.sendall(RESPONSE.pack(STATUS_OK, low, end) + U32.pack(crc))

    def _serve_by_kind(self, connection: socket.socket) -> None:
        """A request named by its kind and version (the only one: queue starts)."""
        kind, version, offset = KIND_REQUEST.unpack(_receive_exactly(connection, KIND_REQUEST.size))
        if (kind, version) != (KIND_QUEUE_STARTS, QUEUE_STARTS_VERSION):
            connection.sendall(RESPONSE.pack(STATUS_REFUSED, self.store.commit_log.min_offset,
                                             self.store.max_physical_offset))
            return
        starts = self.store.queue_starts(offset)
        low, end = self.store.commit_log.min_offset, self.store.max_physical_offset
        if starts is None:
            connection.sendall(RESPONSE.pack(STATUS_BELOW_RETENTION if offset < low else STATUS_NOT_YET, low, end))
            return
        body = encode_queue_starts(starts)
        if body is None:
            log.warning("cannot tell a peer where queues start: more than %d queues", QUEUE_STARTS_MAX)
            connection.sendall(RESPONSE.pack(STATUS_REFUSED, low, end))
            return
        connection.sendall(RESPONSE.pack(STATUS_OK, low, end) + U32.pack(len(body)) + body)

    def close(self) -> None:
        self._stopped.set()
        self.listener.close()
        self._thread.join(timeout=5)


def encode_queue_starts(starts: dict[QueueKey, int]) -> bytes | None:
    """The body of a queue-starts answer (the queues that start at 0 left out), or None when it names more
    than :data:`QUEUE_STARTS_MAX` queues."""
    named = sorted((key, start) for key, start in starts.items() if start > 0)
    if len(named) > QUEUE_STARTS_MAX:
        return None
    parts = [QUEUE_STARTS_HEADER.pack(len(named))]
    for (topic, queue_id), start in named:
        encoded = topic.encode()
        parts.append(bytes((len(encoded),)) + encoded + QUEUE_START.pack(queue_id, start))
    return b"".join(parts)


def decode_queue_starts(body: bytes) -> dict[QueueKey, int]:
    """The queue starts a peer sent, each entry checked (a valid topic, a queue id and start in range, sorted
    without repeats, nothing left over); :class:`CatchupError` when one is not."""
    if len(body) < QUEUE_STARTS_HEADER.size:
        raise CatchupError("the queue starts are cut short")
    (count,) = QUEUE_STARTS_HEADER.unpack_from(body)
    if count > QUEUE_STARTS_MAX:
        raise CatchupError(f"the peer names {count} queues, over the limit of {QUEUE_STARTS_MAX}")
    starts: dict[QueueKey, int] = {}
    previous: QueueKey | None = None
    position = QUEUE_STARTS_HEADER.size
    for _ in range(count):
        if position >= len(body):
            raise CatchupError("the queue starts are cut short")
        length = body[position]
        end = position + 1 + length
        if end + QUEUE_START.size > len(body):
            raise CatchupError("the queue starts are cut short")
        try:
            topic = body[position + 1 : end].decode()
        except UnicodeDecodeError as exc:
            raise CatchupError("a queue start names a topic that is not UTF-8") from exc
        problem = check_topic_name(topic)
        if problem is not None:
            raise CatchupError(f"a queue start names a topic the store refuses: {problem}")
        queue_id, start = QUEUE_START.unpack_from(body, end)
        key = (topic, queue_id)
        if queue_id < 0 or start <= 0:
            raise CatchupError(f"queue {topic}/{queue_id} cannot start at {start}")
        if previous is not None and key <= previous:
            raise CatchupError(f"queue {topic}/{queue_id} is out of order or repeated in the queue starts")
        starts[key] = start
        previous = key
        position = end + QUEUE_START.size
    if position != len(body):
        raise CatchupError(f"{len(body) - position} bytes follow the queue starts")
    return starts


def fetch_queue_starts(peer: tuple[str, int], secret: bytes,
                       offset: int) -> tuple[int, int, int, dict[QueueKey, int]]:
    """Where each queue continues for a copy that begins at ``offset``, as ``peer`` tells: (status, the peer's
    min offset, its end offset, the starts of the queues that do not start at 0, empty unless status 0)."""
    request = KIND_REQUEST.pack(KIND_QUEUE_STARTS, QUEUE_STARTS_VERSION, offset)
    with _request(peer, secret, REQUEST_BY_KIND, 0, request) as (connection, status, low, end):
        if status != STATUS_OK:
            return status, low, end, {}
        (length,) = U32.unpack(_receive_exactly(connection, U32.size))
        if length > QUEUE_STARTS_BYTES_MAX:
            raise CatchupError(f"queue starts of {length} bytes are over the limit")
        return status, low, end, decode_queue_starts(_receive_exactly(connection, length))


def fetch(peers: Sequence[tuple[str, int]], secret: bytes, store: MessageStore, to_offset: int,
          raft_index: int, snapshot_min: int) -> None:
    """Make ``store`` hold the commit log up to ``to_offset`` (the snapshot's end) and mark ``raft_index``
    applied, copying from the first peer that can serve. Raises :class:`CatchupError` when none can.

    ``snapshot_min``: where the snapshot's commit log began. The copy never begins past it: the entries after
    the snapshot are replayed over the store, and the members that applied them held everything from there (a
    retried send's first copy that the dedupe finds, a transaction's half message, a popped message). A peer
    whose retention passed it since is refused before anything changes here; a newer snapshot (every member
    compacts its log after a retention) is installed instead."""
    errors = []
    for peer in peers:
        try:
            starts = _fetch_from(peer, secret, store, to_offset, snapshot_min)
            store.finish_ingest(raft_index, starts)
            return
        except (OSError, ConnectionError, CatchupError, StoreError, struct.error, lz4.block.LZ4BlockError) as exc:
            store.discard_ingest()
            errors.append(f"{peer[0]}:{peer[1]}: {exc}")
    raise CatchupError("no peer could serve the catch-up: " + "; ".join(errors))


def fetch_range(peers: Sequence[tuple[str, int]], secret: bytes, from_offset: int, to_offset: int) -> bytes:
    """The committed bytes ``[from_offset, to_offset)`` as the first peer that can serve holds them (to
    repair a damaged record in place). Raises :class:`CatchupError` when none can."""
    errors = []
    for peer in peers:
        try:
            with _request(peer, secret, from_offset, to_offset) as (connection, status, low, end):
                if status != STATUS_OK:
                    raise CatchupError(f"the peer holds [{low}, {end}), not [{from_offset}, {to_offset})")
                parts = []
                received = 0
                for part in _chunks(connection):
                    received += len(part)
                    if received > to_offset - from_offset:
                        raise CatchupError("the peer sent more than asked")
                    parts.append(part)
                if received != to_offset - from_offset:
                    raise CatchupError(f"the copy has {received} bytes, expected {to_offset - from_offset}")
                return b"".join(parts)
        except (OSError, ConnectionError, CatchupError, struct.error, lz4.block.LZ4BlockError) as exc:
            errors.append(f"{peer[0]}:{peer[1]}: {exc}")
    raise CatchupError("no peer could serve the range: " + "; ".join(errors))


def fetch_digest(peer: tuple[str, int], secret: bytes, from_offset: int, to_offset: int,
                 reasons: list[str] | None = None) -> int | None:
    """The CRC-32 of the peer's committed bytes ``[from_offset, to_offset)``, or None when it cannot say
    (unreachable, behind, past its retention point, or a member from before digests); why, appended to
    ``reasons`` when given."""
    try:
        with _request(peer, secret, from_offset, -to_offset) as (connection, status, low, end):
            if status != STATUS_OK:
                if reasons is not None and status != STATUS_NOT_YET:
                    reasons.append(f"{peer[0]}:{peer[1]} holds [{low}, {end})")
                return None
            (crc,) = U32.unpack(_receive_exactly(connection, U32.size))
            return int(crc)
    except (OSError, ConnectionError, CatchupError, struct.error) as exc:
        if reasons is not None:
            reasons.append(f"{peer[0]}:{peer[1]}: {exc}")
        return None


@contextlib.contextmanager
def _request(peer: tuple[str, int], secret: bytes, from_offset: int, to_offset: int,
             extra: bytes = b"") -> Iterator[tuple[socket.socket, int, int, int]]:
    """Connect, authenticate both ways, ask for ``[from_offset, to_offset)`` (``extra``: the bytes that
    follow the request line): (connection, status, the peer's min offset, its end offset)."""
    with socket.create_connection(peer, timeout=SOCKET_TIMEOUT_SECONDS) as connection:
        server_nonce = _receive_exactly(connection, NONCE_BYTES)
        client_nonce = os.urandom(NONCE_BYTES)
        connection.sendall(client_nonce + _mac(secret, b"catchup-client", server_nonce, client_nonce))
        proof = _receive_exactly(connection, MAC_BYTES)
        if not hmac.compare_digest(proof, _mac(secret, b"catchup-server", client_nonce, server_nonce)):
            raise CatchupError("the peer failed authentication")
        connection.sendall(REQUEST.pack(from_offset, to_offset) + extra)
        status, low, end = RESPONSE.unpack(_receive_exactly(connection, RESPONSE.size))
        yield connection, status, low, end


def _chunks(connection: socket.socket) -> Iterator[bytes]:
    """The served bytes, chunk by chunk, until the end marker (every length checked before reading)."""
    while True:
        (length,) = U32.unpack(_receive_exactly(connection, U32.size))
        if length == 0:
            return
        if length > CHUNK_BYTES_MAX:
            raise CatchupError(f"chunk of {length} bytes is over the limit")
        compressed = _receive_exactly(connection, length)
        if int.from_bytes(compressed[:4], "little") > CHUNK_BYTES:
            raise CatchupError("chunk claims an impossible size")
        yield bytes(lz4.block.decompress(compressed))


def _fetch_from(peer: tuple[str, int], secret: bytes, store: MessageStore, to_offset: int,
                snapshot_min: int) -> dict[QueueKey, int] | None:
    """Copy ``[own end, to_offset)`` from ``peer`` (after a reset to its retention point when it no longer
    holds our end, unless that point is past ``snapshot_min``). Returns where the queues continue when the
    copy begins on an empty commit log past offset 0 (after a reset, now or before a restart), else None."""
    for _ in range(2):  # the second round after a reset below the peer's retention point
        from_offset = store.max_physical_offset
        starts = None
        if 0 < from_offset == store.commit_log.min_offset:
            _refuse_past_snapshot(from_offset, snapshot_min, "this store, reset before,")
            status, low, end, starts = fetch_queue_starts(peer, secret, from_offset)
            if status == STATUS_BELOW_RETENTION and low > from_offset:
                _refuse_past_snapshot(low, snapshot_min, "the peer's retention point")
                store.reset_to(low)
                continue
            if status != STATUS_OK:
                raise CatchupError(f"the peer holds [{low}, {end}) and cannot tell where the queues continue at "
                                   f"{from_offset}")
        with _request(peer, secret, from_offset, to_offset) as (connection, status, low, end):
            if status == STATUS_BELOW_RETENTION:
                _refuse_past_snapshot(low, snapshot_min, "the peer's retention point")
                store.reset_to(low)
                continue
            if status != STATUS_OK:
                raise CatchupError(f"the peer holds [{low}, {end}), not up to {to_offset}")
            position = from_offset
            for data in _chunks(connection):
                store.ingest_raw(position, data)
                position += len(data)
            if position != to_offset:
                raise CatchupError(f"the copy stopped at {position}, expected {to_offset}")
            return starts
    raise CatchupError("the peer's retention point moved twice during the copy")


def _refuse_past_snapshot(begin: int, snapshot_min: int, what: str) -> None:
    if begin > snapshot_min:
        raise CatchupError(f"{what} ({begin}) is past where the snapshot's commit log began ({snapshot_min}): the "
                           "entries after the snapshot need the records in between; a newer snapshot is needed")
