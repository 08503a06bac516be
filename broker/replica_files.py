"""Replica files over the network: a read-only member API for audits (``raftmq verify --namesrv``).

Two request codes on the broker's remoting server:

* ``REPLICA_FILES_STATUS``: the member's positions (Raft commit and applied index; the commit log's
  applied end, durable end and first offset) and its file listing (commit-log segments, consume queues,
  key-index files, the checkpoint with the replicated state), as a JSON body.
* ``REPLICA_FILES_READ``: ``length`` bytes (at most :data:`RANGE_BYTES_MAX`) from ``offset`` of one
  named file, with the CRC-32 of those bytes in ``crc32``. Files are named by kind and offset, never by
  path (``kind`` = commitlog | consumequeue (with ``topic`` and ``queueId``) | index | state).
* ``REPLICA_FILES_DIGESTS``: the digest (SHA-256) of every block of ``[offset, offset + length)`` of a
  commit-log segment (at most :data:`DIGEST_RANGE_BYTES_MAX`), blocks cut at physical offsets that are
  multiples of ``blockSize`` and at the ends of the range (:func:`block_bounds`). The member reads the bytes
  from its segment file when asked and hashes them (nothing is cached or precomputed), so a byte-equality
  audit compares every byte of every member while only digests travel; the auditor then reads the bytes of
  blocks whose digests differ, to name the byte and the record.

What a read may return, and why it is safe while the member appends:

* a commit-log segment: only bytes below the applied end (read after the end is taken, under the store
  lock). Applied bytes are committed and never change, so they are read without the lock;
* consume-queue and key-index files: copied under the store lock, so no unit or entry is half written.
  Units and entries are written once and never moved; key-index slots and the header change, so a
  reader that wants one consistent image reads slots first and the header after (its count then covers
  every entry a slot it read points at), then the entries;
* the checkpoint: replaced atomically (rename), so one read sees one version.

Authentication: with ACL on, the Admission check in front of every processor requires an admin
account's signature for these codes (:data:`broker.acl.permissions.ADMIN_CODES`). Otherwise a request
carries a signature made with an *audit key*: HMAC-SHA256 of the group secret over the key's expiry
(:func:`audit_key`), so the secret itself never leaves the host that runs ``verify`` (the key goes to Spark
executors, and expires). The signed content is the request's fields (as RocketMQ's ACL signs them).
Replaying a signed request reads the same bytes again; nothing can be written through this API.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from broker.remoting.server import RequestContext
from commitlog.consume_queue import CQ_UNIT
from commitlog.key_index import ENTRY
from commitlog.record_codec import crc32  # ISA-L's CRC-32: zlib's values, several times faster
from commitlog.store import MessageStore
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.signature import signature_content

#: raftmq's own request codes (RocketMQ 4.x uses none above 1000)
REPLICA_FILES_STATUS: Final = 7801
REPLICA_FILES_READ: Final = 7802
REPLICA_FILES_DIGESTS: Final = 7803
REPLICA_FILES_CODES: Final = (REPLICA_FILES_STATUS, REPLICA_FILES_READ, REPLICA_FILES_DIGESTS)

#: the most bytes one read returns (a frame is at most 16 MiB; locked reads hold apply off for this long)
RANGE_BYTES_MAX: Final = 4 << 20
#: the most bytes one digest request hashes (a worker thread of the member reads and hashes them at once)
DIGEST_RANGE_BYTES_MAX: Final = 64 << 20
#: bounds of a digest block (the smallest bounds the digests one answer holds: 16,384 of 32 bytes)
DIGEST_BLOCK_BYTES_MIN: Final = 4096
DIGEST_BLOCK_BYTES_MAX: Final = 1 << 30
#: the digests a member computes (hashlib names)
DIGEST_NAMES: Final = ("sha256",)
#: bytes read from a segment at a time while hashing (one buffer per request being served)
DIGEST_READ_BYTES: Final = 4 << 20
#: digest requests one member hashes at once (each keeps a core busy: an audit must not take them all);
#: the others wait in the processor's queue
DIGESTS_AT_ONCE_MAX: Final = 2
#: files one listing names at most (a larger store is listed as an error, not truncated silently)
FILES_LISTED_MAX: Final = 200_000
#: the longest an audit key may be valid for
AUDIT_KEY_LIFETIME_MAX_SECONDS: Final = 7 * 24 * 3600

KIND_COMMIT_LOG: Final = "commitlog"
KIND_CONSUME_QUEUE: Final = "consumequeue"
KIND_INDEX: Final = "index"
KIND_STATE: Final = "state"
KINDS: Final = (KIND_COMMIT_LOG, KIND_CONSUME_QUEUE, KIND_INDEX, KIND_STATE)
#: the replicated-state files a member serves (names inside its store directory)
STATE_FILES: Final = ("checkpoint",)

FIELD_EXPIRY: Final = "auditExpiry"
FIELD_SIGNATURE: Final = "auditSignature"
FILE_NAME: Final = re.compile(r"^\d{20}$")
#: topic names as RocketMQ allows them (no path separators, no dots)
TOPIC_NAME: Final = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")


class ReplicaFilesError(Exception):
    """A request that cannot be served (bad field, unknown file, out of range); the message says why."""


# ------------------------------------------------------------------------------------ authentication


def audit_key(secret: bytes, expiry_seconds: int) -> bytes:
    """The key audit requests are signed with until ``expiry_seconds`` (Unix time)."""
    return hmac.new(secret, f"raftmq-audit|{expiry_seconds}".encode(), hashlib.sha256).digest()


def sign_request(fields: Mapping[str, str], key: bytes, expiry_seconds: int) -> dict[str, str]:
    """``fields`` plus the expiry and the signature over all of them."""
    signed = {name: value for name, value in fields.items() if name != FIELD_SIGNATURE}
    signed[FIELD_EXPIRY] = str(expiry_seconds)
    content = signature_content(signed, b"", excluded=(FIELD_SIGNATURE,))
    signed[FIELD_SIGNATURE] = hmac.new(key, content, hashlib.sha256).hexdigest()
    return signed


def signature_problem(fields: Mapping[str, str], secret: bytes, now_seconds: float) -> str | None:
    """Why a request's audit signature is not valid, or None."""
    expiry_text = fields.get(FIELD_EXPIRY, "")
    signature = fields.get(FIELD_SIGNATURE)
    if signature is None or not expiry_text.isdigit():
        return "replica files need an audit signature (auditExpiry, auditSignature) or, with ACL, an admin account"
    expiry = int(expiry_text)
    if expiry < now_seconds:
        return "the audit key expired"
    if expiry > now_seconds + AUDIT_KEY_LIFETIME_MAX_SECONDS:
        return "the audit key is valid for too long"
    content = signature_content(fields, b"", excluded=(FIELD_SIGNATURE,))
    expected = hmac.new(audit_key(secret, expiry), content, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return "the audit signature does not match"
    return None


# ------------------------------------------------------------------------------------ typed requests


@dataclass(frozen=True, slots=True)
class FileName:
    """One file of a member's store, by kind and name (never a path)."""

    kind: str
    name: str
    topic: str = ""
    queue_id: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ReplicaFilesError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == KIND_STATE:
            if self.name not in STATE_FILES:
                raise ReplicaFilesError(f"state files are {', '.join(STATE_FILES)}, got {self.name!r}")
        elif not FILE_NAME.match(self.name):
            raise ReplicaFilesError(f"a file name is 20 digits, got {self.name!r}")
        if self.kind == KIND_CONSUME_QUEUE:
            if not TOPIC_NAME.match(self.topic):
                raise ReplicaFilesError(f"not a topic name: {self.topic!r}")
            if not 0 <= self.queue_id < 1 << 16:
                raise ReplicaFilesError(f"queue id out of range: {self.queue_id}")

    def relative_path(self) -> str:
        if self.kind == KIND_CONSUME_QUEUE:
            return f"{KIND_CONSUME_QUEUE}/{self.topic}/{self.queue_id}/{self.name}"
        if self.kind == KIND_STATE:
            return self.name
        return f"{self.kind}/{self.name}"

    def fields(self) -> dict[str, str]:
        fields = {"kind": self.kind, "name": self.name}
        if self.kind == KIND_CONSUME_QUEUE:
            fields.update(topic=self.topic, queueId=str(self.queue_id))
        return fields


def _number_field(fields: Mapping[str, str], name: str, default: str | None = None) -> int:
    text = fields.get(name, default)
    if text is None or not text.isdigit() or len(text) > 19:
        raise ReplicaFilesError(f"field {name} must be a non-negative integer, got {text!r}")
    return int(text)


def _file_field(fields: Mapping[str, str]) -> FileName:
    return FileName(fields.get("kind", ""), fields.get("name", ""), fields.get("topic", ""),
                    _number_field(fields, "queueId", "0"))


@dataclass(frozen=True, slots=True)
class ReadRequest:
    file: FileName
    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ReplicaFilesError(f"offset must not be negative, got {self.offset}")
        if not 0 <= self.length <= RANGE_BYTES_MAX:
            raise ReplicaFilesError(f"length must be in 0..{RANGE_BYTES_MAX}, got {self.length}")

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> ReadRequest:
        return cls(_file_field(fields), _number_field(fields, "offset"), _number_field(fields, "length"))

    def fields(self) -> dict[str, str]:
        return {**self.file.fields(), "offset": str(self.offset), "length": str(self.length)}


@dataclass(frozen=True, slots=True)
class ReadResult:
    """``data`` from ``offset``; ``readable_end``: where this file's servable bytes ended at the read."""

    offset: int
    data: bytes
    readable_end: int

    def fields(self) -> dict[str, str]:
        return {"offset": str(self.offset), "readableEnd": str(self.readable_end),
                "crc32": str(crc32(self.data))}


def block_bounds(segment_start: int, low: int, high: int, block_size: int) -> list[tuple[int, int]]:
    """The blocks of ``[low, high)`` (offsets in a segment starting at physical offset ``segment_start``):
    cut where the physical offset is a multiple of ``block_size``, and at ``low`` and ``high``."""
    bounds = []
    position = low
    while position < high:
        end = min(high, (segment_start + position) // block_size * block_size + block_size - segment_start)
        bounds.append((position, end))
        position = end
    return bounds


@dataclass(frozen=True, slots=True)
class DigestRequest:
    """The digests of the blocks of ``[offset, offset + length)`` of a commit-log segment."""

    file: FileName
    offset: int
    length: int
    block_size: int
    digest: str = DIGEST_NAMES[0]

    def __post_init__(self) -> None:
        if self.file.kind != KIND_COMMIT_LOG:
            raise ReplicaFilesError(f"digests are served for commit-log segments only, not {self.file.kind}")
        if self.offset < 0:
            raise ReplicaFilesError(f"offset must not be negative, got {self.offset}")
        if not 0 <= self.length <= DIGEST_RANGE_BYTES_MAX:
            raise ReplicaFilesError(f"length must be in 0..{DIGEST_RANGE_BYTES_MAX}, got {self.length}")
        if not DIGEST_BLOCK_BYTES_MIN <= self.block_size <= DIGEST_BLOCK_BYTES_MAX:
            raise ReplicaFilesError(f"blockSize must be in {DIGEST_BLOCK_BYTES_MIN}..{DIGEST_BLOCK_BYTES_MAX}, "
                                    f"got {self.block_size}")
        if self.digest not in DIGEST_NAMES:
            raise ReplicaFilesError(f"digest must be one of {', '.join(DIGEST_NAMES)}, got {self.digest!r}")

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> DigestRequest:
        return cls(_file_field(fields), _number_field(fields, "offset"), _number_field(fields, "length"),
                   _number_field(fields, "blockSize"), fields.get("digest", ""))

    def fields(self) -> dict[str, str]:
        return {**self.file.fields(), "offset": str(self.offset), "length": str(self.length),
                "blockSize": str(self.block_size), "digest": self.digest}


@dataclass(frozen=True, slots=True)
class DigestResult:
    """The digests of the blocks of ``[offset, offset + hashed_bytes)`` (:func:`block_bounds`), in order;
    ``hashed_bytes`` is shorter than asked when the servable bytes (``readable_end``) end first."""

    offset: int
    hashed_bytes: int
    readable_end: int
    digests: tuple[bytes, ...]

    def body(self) -> bytes:
        return b"".join(self.digests)

    def fields(self) -> dict[str, str]:
        return {"offset": str(self.offset), "hashedBytes": str(self.hashed_bytes),
                "readableEnd": str(self.readable_end), "crc32": str(crc32(self.body()))}


def parse_digest_response(request: DigestRequest, fields: Mapping[str, str], body: bytes) -> DigestResult:
    """The client's side: the digests, their count and CRC checked against the request."""
    try:
        offset, hashed, readable_end = int(fields["offset"]), int(fields["hashedBytes"]), int(fields["readableEnd"])
        crc = int(fields["crc32"])
    except (KeyError, ValueError) as exc:
        raise ReplicaFilesError(f"a digest response without its fields: {exc}") from None
    if crc32(body) != crc:
        raise ReplicaFilesError(f"CRC mismatch on the digests from offset {offset}")
    if offset != request.offset or not 0 <= hashed <= request.length:
        raise ReplicaFilesError(f"digests of [{offset}, +{hashed}) for a request of [{request.offset}, "
                                f"+{request.length})")
    size = hashlib.new(request.digest).digest_size
    count = len(block_bounds(int(request.file.name), offset, offset + hashed, request.block_size))
    if len(body) != count * size:
        raise ReplicaFilesError(f"{len(body)} bytes of digests for {count} blocks of {size} bytes")
    return DigestResult(offset, hashed, readable_end, tuple(body[i : i + size] for i in range(0, len(body), size)))


def parse_read_response(fields: Mapping[str, str], body: bytes) -> ReadResult:
    """The client's side: the result, its CRC checked (a mismatch is :class:`ReplicaFilesError`)."""
    try:
        offset, readable_end, crc = int(fields["offset"]), int(fields["readableEnd"]), int(fields["crc32"])
    except (KeyError, ValueError) as exc:
        raise ReplicaFilesError(f"a read response without its fields: {exc}") from None
    if crc32(body) != crc:
        raise ReplicaFilesError(f"CRC mismatch on {len(body)} bytes from offset {offset}")
    return ReadResult(offset, body, readable_end)


# ------------------------------------------------------------------------------------ the member side


class StoreView:
    """What the API reads from a member: its store directory, under the store's lock where needed."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.root = Path(store.root)

    def positions(self) -> dict[str, int]:
        store = self.store
        with store.lock:  # the three together, as of one moment
            return {
                "applied_end": int(store.commit_log.end_offset),
                "durable_end": int(store.flushed_end),
                "min_offset": int(store.commit_log.min_offset),
                "applied_raft_index": int(store.applied_raft_index),
                "segment_size_bytes": int(store.config.segment_size_bytes),
            }

    def listing(self) -> dict[str, list[list[Any]]]:
        """Names and sizes (bytes) of every data file: ``commitlog``: [start, size]; ``consumequeue``:
        [topic, queue id, start byte, size]; ``index``: [begin, size]; ``state``: [name, size]."""
        listed: dict[str, list[list[Any]]] = {kind: [] for kind in KINDS}
        count = 0

        def add(kind: str, entry: list[Any]) -> None:
            nonlocal count
            count += 1
            if count > FILES_LISTED_MAX:
                raise ReplicaFilesError(f"the store holds more than {FILES_LISTED_MAX} files")
            listed[kind].append(entry)

        for kind in (KIND_COMMIT_LOG, KIND_INDEX):
            for name, size in _data_files(self.root / kind):
                add(kind, [int(name), size])
        queue_root = self.root / KIND_CONSUME_QUEUE
        for topic in sorted(_names(queue_root)):
            if not TOPIC_NAME.match(topic):
                continue
            for queue in sorted((name for name in _names(queue_root / topic) if name.isdigit()), key=int):
                for name, size in _data_files(queue_root / topic / queue):
                    add(KIND_CONSUME_QUEUE, [topic, int(queue), int(name), size])
        for name in STATE_FILES:
            with contextlib.suppress(FileNotFoundError):
                add(KIND_STATE, [name, (self.root / name).stat().st_size])
        return listed

    def read(self, request: ReadRequest) -> ReadResult:
        file = request.file
        path = self.root / file.relative_path()
        store = self.store
        if file.kind == KIND_STATE:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise ReplicaFilesError(f"no {file.name} file") from None
            return ReadResult(request.offset, data[request.offset : request.offset + request.length], len(data))
        try:
            handle = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ReplicaFilesError(f"no file {file.relative_path()} (deleted by retention?)") from None
        try:
            if file.kind == KIND_COMMIT_LOG:
                return _pread(handle, request, self._segment_readable_end(handle, file))
            with store.lock:  # units and entries are written under it: none is read half written
                return _pread(handle, request, min(os.fstat(handle).st_size, self._used_bytes(file)))
        finally:
            os.close(handle)

    def digests(self, request: DigestRequest) -> DigestResult:
        """Read the segment's bytes of the request's range (below the applied end) from the file now and
        hash each block: never a stored or cached digest, so the answer vouches for the bytes on disk."""
        file = request.file
        try:
            handle = os.open(self.root / file.relative_path(), os.O_RDONLY)
        except FileNotFoundError:
            raise ReplicaFilesError(f"no file {file.relative_path()} (deleted by retention?)") from None
        try:
            readable_end = self._segment_readable_end(handle, file)
            end = max(request.offset, min(readable_end, request.offset + request.length))
            digests = _hash_blocks(handle, block_bounds(int(file.name), request.offset, end, request.block_size),
                                   request.digest)
        finally:
            os.close(handle)
        return DigestResult(request.offset, end - request.offset, readable_end, digests)

    def _segment_readable_end(self, handle: int, file: FileName) -> int:
        """Where a segment's servable bytes end: its applied bytes (committed, never changed again)."""
        size = os.fstat(handle).st_size
        with self.store.lock:
            applied_end = int(self.store.commit_log.end_offset)
        return max(0, min(size, applied_end - int(file.name)))

    def _used_bytes(self, file: FileName) -> int:
        """Where the written part of a consume-queue or key-index file ends (they are preallocated, mostly
        zeros): the rest is not served. Store lock held."""
        store = self.store
        start = int(file.name)
        if file.kind == KIND_CONSUME_QUEUE:
            queue = store.queues.get((file.topic, file.queue_id))
            if queue is None:
                return 1 << 62
            return max(0, (int(queue.max_offset) - start // CQ_UNIT.size) * CQ_UNIT.size)
        for index_file in store.index.files:
            if index_file.name_begin == start:
                return int(index_file.entries_base + index_file.entry_count * ENTRY.size)
        return 1 << 62


def _pread(handle: int, request: ReadRequest, readable_end: int) -> ReadResult:
    end = min(readable_end, request.offset + request.length)
    data = os.pread(handle, end - request.offset, request.offset) if end > request.offset else b""
    return ReadResult(request.offset, data, readable_end)


def _hash_blocks(handle: int, bounds: list[tuple[int, int]], digest_name: str) -> tuple[bytes, ...]:
    """The digest of each block ``[start, end)`` of the file (``bounds`` back to back), read through one
    bounded buffer (reads and hashlib release the GIL: other requests and the event loop go on)."""
    if not bounds:
        return ()
    range_end = bounds[-1][1]
    buffer = bytearray(min(DIGEST_READ_BYTES, range_end - bounds[0][0]))
    digests = []
    hasher = hashlib.new(digest_name)
    block = 0
    position = bounds[0][0]
    with memoryview(buffer) as view:
        while position < range_end:
            got = os.preadv(handle, [view[: min(len(buffer), range_end - position)]], position)
            if got == 0:
                raise ReplicaFilesError(f"the file ended at {position}, before its applied end")
            used = 0
            while used < got:
                take = min(got - used, bounds[block][1] - position - used)
                hasher.update(view[used : used + take])
                used += take
                if position + used == bounds[block][1]:
                    digests.append(hasher.digest())
                    hasher = hashlib.new(digest_name)
                    block += 1
            position += got
    return tuple(digests)


def _names(directory: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(directory)]
    except FileNotFoundError:
        return []


def _data_files(directory: Path) -> list[tuple[str, int]]:
    files = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        if FILE_NAME.match(entry.name):
            try:
                files.append((entry.name, entry.stat().st_size))
            except FileNotFoundError:  # deleted by retention meanwhile
                continue
    return sorted(files)


class ReplicaFilesProcessor:
    """The processor of :data:`REPLICA_FILES_CODES`. ``member`` is the node's
    :class:`dledger.member.GroupMember`; ``acl_enabled`` tells whether the Admission check already
    required an admin account; ``secret`` is the group secret audit keys derive from."""

    def __init__(self, member: Any, secret: bytes, acl_enabled: Callable[[], bool],
                 clock: Callable[[], float] = time.time) -> None:
        self.member = member
        self.view = StoreView(member.store)
        self.secret = secret
        self.acl_enabled = acl_enabled
        self.clock = clock
        self._hashing = asyncio.Semaphore(DIGESTS_AT_ONCE_MAX)

    async def __call__(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        if not self.acl_enabled():
            problem = signature_problem(request.ext_fields, self.secret, self.clock())
            if problem is not None:
                return make_response(request, ResponseCode.NO_PERMISSION, problem)
        loop = asyncio.get_running_loop()
        try:
            if request.code == REPLICA_FILES_STATUS:
                body = await loop.run_in_executor(None, self._status)
                return make_response(request, ResponseCode.SUCCESS, body=body)
            if request.code == REPLICA_FILES_READ:
                read = ReadRequest.parse(request.ext_fields)
                result = await loop.run_in_executor(None, self.view.read, read)
                return make_response(request, ResponseCode.SUCCESS, ext_fields=result.fields(), body=result.data)
            if request.code == REPLICA_FILES_DIGESTS:
                asked = DigestRequest.parse(request.ext_fields)
                async with self._hashing:
                    digests = await loop.run_in_executor(None, self.view.digests, asked)
                return make_response(request, ResponseCode.SUCCESS, ext_fields=digests.fields(), body=digests.body())
        except ReplicaFilesError as exc:
            return make_response(request, ResponseCode.QUERY_NOT_FOUND, str(exc))
        return make_response(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not a replica-files request")

    def _status(self) -> bytes:
        status = self.member.status()
        document = {
            "member": status.node_id,
            "role": status.role,
            "commit_index": status.commit_index,
            "applied_index": status.applied_index,
            **self.view.positions(),
            "files": self.view.listing(),
        }
        return json.dumps(document, separators=(",", ":")).encode()
