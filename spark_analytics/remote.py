"""Replicas read over the network (:mod:`broker.replica_files`): a consistent cut of a live group, and the
reads the data sources and the driver make through it.

A :class:`RemoteCut` is taken once, at the start of a job: every member's positions and file listing, and
the cut, the smallest applied end of the commit log among the members that answered. Every member has
applied everything below it, so below the cut the replicas must be identical, whatever they do meanwhile.
The cut travels to Spark's planning worker as the data sources' ``path`` (:func:`RemoteCut.encode`), and
each file as a path ``raftmq://HOST:PORT/MEMBER/KIND/...?below=CUT``; what lies at or past the cut is left
out of every read (a segment ends at the cut; consume-queue units and key-index entries pointing at or past
it are dropped), so each check sees the prefix, as if the group had stopped there.

Credentials never appear in a path (paths end up in reports): partitions carry them as
:attr:`RemoteCut.access` and install them in the Python worker before reading (:func:`install_access`).
Without ACL they are an audit key (HMAC of the group secret over an expiry), never the secret itself.
"""

from __future__ import annotations

import base64
import contextlib
import json
import mmap
import socket
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker.replica_files import (
    DIGEST_RANGE_BYTES_MAX,
    KIND_COMMIT_LOG,
    KIND_CONSUME_QUEUE,
    KIND_INDEX,
    KIND_STATE,
    RANGE_BYTES_MAX,
    REPLICA_FILES_DIGESTS,
    REPLICA_FILES_READ,
    REPLICA_FILES_STATUS,
    DigestRequest,
    DigestResult,
    FileName,
    ReadRequest,
    ReadResult,
    ReplicaFilesError,
    audit_key,
    block_bounds,
    parse_digest_response,
    parse_read_response,
    sign_request,
)
from commitlog.consume_queue import CQ_UNIT, UNIT_BYTES
from commitlog.key_index import ENTRY, HEADER, HEADER_BYTES
from protocol.codec import FrameDecoder, encode_frame
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_request
from protocol.signature import sign_fields
from spark_analytics.layout import CUT_PREFIX

SCHEME: Final = "raftmq://"
#: how long the audit key handed to executors stays valid
AUDIT_KEY_LIFETIME_SECONDS: Final = 6 * 3600
CONNECT_TIMEOUT_SECONDS: Final = 5.0
REQUEST_TIMEOUT_SECONDS: Final = 60.0
#: how long the cut waits for a member's status before leaving it out as unreachable
STATUS_TIMEOUT_SECONDS: Final = 10.0
#: bytes asked for per read (the member's bound)
READ_BYTES: Final = RANGE_BYTES_MAX


class RemoteError(Exception):
    """A member did not answer, refused, or answered something unreadable; the message names it."""


# ---------------------------------------------------------------------------------------------- credentials


@dataclass(frozen=True, slots=True)
class Access:
    """How requests are signed: an audit key (hex) and its expiry, or an ACL account (admin)."""

    audit_key_hex: str = ""
    expiry_seconds: int = 0
    access_key: str = ""
    secret_key: str = ""

    @classmethod
    def from_secret(cls, secret: bytes, now_seconds: float | None = None,
                    lifetime_seconds: int = AUDIT_KEY_LIFETIME_SECONDS) -> Access:
        expiry = int(now_seconds if now_seconds is not None else time.time()) + lifetime_seconds
        return cls(audit_key(secret, expiry).hex(), expiry)

    def sign(self, fields: Mapping[str, str]) -> dict[str, str]:
        signed = dict(fields)
        if self.audit_key_hex:
            signed = sign_request(signed, bytes.fromhex(self.audit_key_hex), self.expiry_seconds)
        if self.access_key:
            signed = sign_fields(signed, b"", self.access_key, self.secret_key)
        return signed

    def encode(self) -> str:
        return json.dumps([self.audit_key_hex, self.expiry_seconds, self.access_key, self.secret_key])

    @classmethod
    def decode(cls, text: str) -> Access:
        key, expiry, access_key, secret_key = json.loads(text)
        return cls(str(key), int(expiry), str(access_key), str(secret_key))

    def __repr__(self) -> str:  # never print keys
        return "Access(...)"


_access: Access | None = None
_connections: dict[str, MemberClient] = {}
_connections_lock = threading.Lock()


def install_access(text: str | None) -> None:
    """Make ``text`` (:meth:`Access.encode`) the credentials of this process's reads (idempotent)."""
    global _access
    if text:
        access = Access.decode(text)
        if access != _access:
            _access = access
            close_connections()


def close_connections() -> None:
    with _connections_lock:
        for client in _connections.values():
            client.close()
        _connections.clear()


# ---------------------------------------------------------------------------------------------- the client


class MemberClient:
    """One blocking connection to a member's remoting port (for executors and the driver; one request at a
    time). Reconnects once when a request fails on a connection that was already open."""

    def __init__(self, address: str, access: Access | None,
                 timeout_seconds: float = REQUEST_TIMEOUT_SECONDS) -> None:
        self.address = address
        self.access = access
        self.timeout_seconds = timeout_seconds
        self._socket: socket.socket | None = None
        self._decoder = FrameDecoder()
        self._opaque = 0

    def close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
            self._socket = None

    def _connect(self) -> socket.socket:
        host, _, port = self.address.rpartition(":")
        try:
            connection = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SECONDS)
        except (OSError, ValueError) as exc:
            raise RemoteError(f"cannot connect to {self.address}: {exc}") from None
        connection.settimeout(self.timeout_seconds)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._decoder = FrameDecoder()
        return connection

    def request(self, code: int, fields: Mapping[str, str]) -> RemotingCommand:
        fresh = self._socket is None
        try:
            return self._request(code, fields)
        except (OSError, RemoteError):
            self.close()
            if fresh:
                raise
        return self._request(code, fields)

    def _request(self, code: int, fields: Mapping[str, str]) -> RemotingCommand:
        if self._socket is None:
            self._socket = self._connect()
        self._opaque = (self._opaque + 1) & 0x7FFFFFFF
        signed = self.access.sign(fields) if self.access is not None else dict(fields)
        frame = encode_frame(make_request(code, self._opaque, signed))
        try:
            self._socket.sendall(frame)
            while True:
                response = self._decoder.next_frame()
                if response is not None:
                    if response.opaque == self._opaque and response.is_response:
                        return response
                    continue
                chunk = self._socket.recv(4 << 20)
                if not chunk:
                    raise RemoteError(f"{self.address} closed the connection")
                self._decoder.feed(chunk)
        except TimeoutError:
            raise RemoteError(f"{self.address} did not answer within {self.timeout_seconds} s") from None

    def status(self) -> dict[str, Any]:
        response = self.request(REPLICA_FILES_STATUS, {})
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(f"{self.address} refused the status request: {response.remark} (code {response.code})")
        try:
            document: dict[str, Any] = json.loads(response.body)
        except ValueError as exc:
            raise RemoteError(f"{self.address} sent an unreadable status: {exc}") from None
        return document

    def read(self, file: FileName, offset: int, length: int) -> ReadResult:
        response = self.request(REPLICA_FILES_READ, ReadRequest(file, offset, length).fields())
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(f"{self.address} refused to read {file.relative_path()} at {offset}: "
                              f"{response.remark} (code {response.code})")
        try:
            return parse_read_response(response.ext_fields, response.body)
        except ReplicaFilesError as exc:
            raise RemoteError(f"{self.address}, {file.relative_path()}: {exc}") from None

    def digests(self, request: DigestRequest) -> DigestResult:
        response = self.request(REPLICA_FILES_DIGESTS, request.fields())
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(f"{self.address} refused to hash {request.file.relative_path()} at {request.offset}: "
                              f"{response.remark} (code {response.code})")
        try:
            return parse_digest_response(request, response.ext_fields, response.body)
        except ReplicaFilesError as exc:
            raise RemoteError(f"{self.address}, {request.file.relative_path()}: {exc}") from None

    def digest_span(self, file: FileName, start: int, end: int, block_size: int,
                    digest: str) -> list[tuple[int, int, bytes]]:
        """(local offset, bytes hashed, digest) of every block of ``[start, end)`` of a segment
        (:func:`broker.replica_files.block_bounds`), hashed by the member in bounded requests that end on
        block boundaries; fewer when the member's servable bytes end first."""
        segment_start = int(file.name)
        rows: list[tuple[int, int, bytes]] = []
        position = start
        while position < end:
            bounds = block_bounds(segment_start, position, min(end, position + DIGEST_RANGE_BYTES_MAX), block_size)
            if len(bounds) > 1 and bounds[-1][1] < end:
                bounds.pop()  # a block cut by the request's bound would hash differently from the whole block
            want = bounds[-1][1] - position
            result = self.digests(DigestRequest(file, position, want, block_size, digest))
            hashed = block_bounds(segment_start, position, position + result.hashed_bytes, block_size)
            rows.extend((low, high - low, value) for (low, high), value in zip(hashed, result.digests, strict=True))
            position += result.hashed_bytes
            if result.hashed_bytes < want:
                break
        return rows

    def read_span(self, file: FileName, start: int, end: int | None) -> tuple[bytes, int]:
        """Bytes ``[start, end)`` (to the readable end when ``end`` is None) in bounded reads, and the
        readable end the first read reported."""
        parts: list[bytes] = []
        readable_end = self.copy_span(file, start, end, parts.append)
        return b"".join(parts), readable_end

    def copy_span(self, file: FileName, start: int, end: int | None, sink: Callable[[bytes], object]) -> int:
        """:meth:`read_span`, each read's bytes handed to ``sink`` in order; returns the readable end."""
        position = start
        readable_end: int | None = None
        while end is None or position < end:
            want = READ_BYTES if end is None else min(READ_BYTES, end - position)
            result = self.read(file, position, want)
            if readable_end is None:
                readable_end = result.readable_end
            sink(result.data)
            position += len(result.data)
            if len(result.data) < want:
                break
        return readable_end if readable_end is not None else start


def client(address: str) -> MemberClient:
    """This process's connection to ``address`` (with the installed credentials)."""
    if _access is None:
        raise RemoteError("no credentials installed for reading replica files (install_access)")
    with _connections_lock:
        found = _connections.get(address)
        if found is None:
            found = _connections[address] = MemberClient(address, _access)
        return found


# ---------------------------------------------------------------------------------------------- paths


@dataclass(frozen=True, slots=True)
class RemotePath:
    address: str
    member: str
    file: FileName
    below: int

    def text(self) -> str:
        return f"{SCHEME}{self.address}/{self.member}/{self.file.relative_path()}?below={self.below}"

    @classmethod
    def parse(cls, text: str) -> RemotePath:
        if not text.startswith(SCHEME):
            raise RemoteError(f"not a replica-file path: {text}")
        rest, _, query = text[len(SCHEME):].partition("?below=")
        parts = rest.split("/")
        if len(parts) < 3 or not query.isdigit():
            raise RemoteError(f"not a replica-file path: {text}")
        address, member, kind = parts[0], parts[1], parts[2]
        if kind == KIND_CONSUME_QUEUE and len(parts) == 6:
            file = FileName(kind, parts[5], parts[3], int(parts[4]))
        elif kind in (KIND_COMMIT_LOG, KIND_INDEX) and len(parts) == 4:
            file = FileName(kind, parts[3])
        elif len(parts) == 3:
            file = FileName(KIND_STATE, kind)
        else:
            raise RemoteError(f"not a replica-file path: {text}")
        return cls(address, member, file, int(query))


def is_remote(path: str) -> bool:
    return path.startswith(SCHEME)


def read_path(path: str, low: int = 0, high: int | None = None) -> bytes:
    """What a reader sees of a remote file (see the module docstring): a segment's bytes ``[low, high)``
    below the cut; a consume-queue file's written units, those pointing at or past the cut zeroed; a key-
    index file's consistent image (header, slots, entries); a state file whole."""
    remote = RemotePath.parse(path)
    member = client(remote.address)
    file = remote.file
    if file.kind == KIND_COMMIT_LOG:
        limit = max(0, remote.below - int(file.name))
        end = limit if high is None else min(high, limit)
        return member.read_span(file, low, end)[0] if end > low else b""
    if file.kind == KIND_CONSUME_QUEUE:
        return _units_below(member.read_span(file, 0, None)[0], remote.below)
    if file.kind == KIND_INDEX:
        return _index_image(member, file)
    return member.read_span(file, 0, None)[0]


def digest_path(path: str, low: int, high: int, block_size: int, digest: str) -> list[tuple[int, int, bytes]]:
    """(physical block offset, bytes hashed, digest) of a remote segment's bytes ``[low, high)`` below the
    cut, each block hashed by the member that holds it (:meth:`MemberClient.digest_span`): the same rows
    hashing :func:`read_path`'s bytes would give."""
    remote = RemotePath.parse(path)
    if remote.file.kind != KIND_COMMIT_LOG:
        raise RemoteError(f"members hash commit-log segments only, not {path}")
    start = int(remote.file.name)
    end = min(high, max(0, remote.below - start))
    if end <= low:
        return []
    rows = client(remote.address).digest_span(remote.file, low, end, block_size, digest)
    return [(start + offset, size, value) for offset, size, value in rows]


@contextlib.contextmanager
def mapped_path(path: str) -> Iterator[bytes | mmap.mmap]:
    """:func:`read_path`'s bytes for a reader that wants the whole file. A segment (up to a GiB) is copied
    into an unnamed temporary file and mapped, so a task holds pages of the page cache, not the segment in
    its heap; other files (small, or read whole anyway) are returned as bytes."""
    remote = RemotePath.parse(path)
    if remote.file.kind != KIND_COMMIT_LOG:
        yield read_path(path)
        return
    end = max(0, remote.below - int(remote.file.name))
    with tempfile.TemporaryFile(prefix="raftmq-segment-") as spill:
        size = 0
        if end > 0:
            client(remote.address).copy_span(remote.file, 0, end, spill.write)
            spill.flush()
            size = spill.tell()
        if size == 0:
            yield b""
            return
        mapped = mmap.mmap(spill.fileno(), size, access=mmap.ACCESS_READ)
        try:
            yield mapped
        finally:
            with contextlib.suppress(BufferError):  # an export still alive goes with its last reference
                mapped.close()


def _units_below(raw: bytes, below: int) -> bytes:
    """``raw`` with every unit at or past physical offset ``below`` zeroed (an empty unit)."""
    data = bytearray(raw[: len(raw) // UNIT_BYTES * UNIT_BYTES])
    for number, (physical_offset, _, _) in enumerate(CQ_UNIT.iter_unpack(data)):
        if physical_offset >= below:
            data[number * UNIT_BYTES :] = bytes(len(data) - number * UNIT_BYTES)
            break
    return bytes(data)


def _index_image(member: MemberClient, file: FileName) -> bytes:
    """One consistent image of a key-index file being written: entries never change once written, slots
    and the header's count do. The header is read again after the slots, so its count covers every entry a
    slot read points at; entries are read up to that count."""
    first, readable_end = member.read_span(file, 0, None)
    if len(first) < HEADER_BYTES:
        return first
    first_count = HEADER.unpack_from(first, 0)[-1]
    entries_base = readable_end - first_count * ENTRY.size
    header = member.read(file, 0, HEADER_BYTES).data
    if len(header) < HEADER_BYTES or not HEADER_BYTES <= entries_base <= len(first):
        return first
    count = HEADER.unpack_from(header, 0)[-1]
    wanted = entries_base + count * ENTRY.size
    more = member.read_span(file, len(first), wanted)[0] if wanted > len(first) else b""
    return header + first[HEADER_BYTES:wanted] + more


# ---------------------------------------------------------------------------------------------- the cut


@dataclass(frozen=True, slots=True)
class MemberState:
    """What one member said at the start of the job (``problem`` set when it did not answer)."""

    name: str
    address: str
    status: Mapping[str, Any] | None
    problem: str | None = None

    @property
    def applied_end(self) -> int:
        return int(self.status["applied_end"]) if self.status is not None else -1


@dataclass(frozen=True, slots=True)
class RemoteCut:
    """The members, what each said, and the cut: the smallest applied end among those that answered."""

    members: tuple[MemberState, ...]
    cut: int
    access: str
    taken_at: float
    #: audit only segments holding bytes at or after this offset (a continuous audit's previous cut): the
    #: replicas are read as if retention had deleted the segments before
    since: int = 0

    @property
    def answered(self) -> tuple[MemberState, ...]:
        return tuple(member for member in self.members if member.status is not None)

    def encode(self) -> str:
        document = {"cut": self.cut, "access": self.access, "taken_at": self.taken_at, "since": self.since,
                    "members": [[m.name, m.address, m.status, m.problem] for m in self.members]}
        return CUT_PREFIX + base64.urlsafe_b64encode(zlib.compress(json.dumps(document).encode())).decode()

    @classmethod
    def decode(cls, text: str) -> RemoteCut:
        document = json.loads(zlib.decompress(base64.urlsafe_b64decode(text[len(CUT_PREFIX):])))
        members = tuple(MemberState(name, address, status, problem)
                        for name, address, status, problem in document["members"])
        return cls(members, int(document["cut"]), str(document["access"]), float(document["taken_at"]),
                   int(document.get("since", 0)))

    def __repr__(self) -> str:
        return f"RemoteCut(cut={self.cut}, members={[m.name for m in self.members]})"


def is_cut(text: str) -> bool:
    return text.startswith(CUT_PREFIX)


def take_cut(addresses: list[str], access: Access, since: int = 0,
             timeout_seconds: float = STATUS_TIMEOUT_SECONDS) -> RemoteCut:
    """Ask every member for its positions and files, at once, and freeze the cut (the smallest applied
    end among those that answered within ``timeout_seconds``). ``since``: see :attr:`RemoteCut.since`."""
    install_access(access.encode())
    results: dict[str, MemberState] = {}

    def ask(address: str) -> None:
        try:
            status = MemberClient(address, access, timeout_seconds=timeout_seconds).status()
        except (RemoteError, OSError) as exc:
            results[address] = MemberState(address, address, None, str(exc))
            return
        results[address] = MemberState(str(status.get("member", address)), address, status)

    threads = [threading.Thread(target=ask, args=(address,)) for address in addresses]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    members = tuple(sorted((results[address] for address in addresses), key=lambda m: m.name))
    answered = [member.applied_end for member in members if member.status is not None]
    return RemoteCut(members, min(answered, default=0), access.encode(), time.time(), since)


def member_files(member: MemberState, kind: str) -> Iterator[list[Any]]:
    """The listing entries of one kind a member gave."""
    files = (member.status or {}).get("files", {})
    yield from files.get(kind, [])


def store_path(member: MemberState) -> str:
    """What stands for the member's store directory (``Replica.store_dir``)."""
    return f"{SCHEME}{member.address}/{member.name}"


def state_path(store_dir: str, name: str) -> str:
    """The path of a state file (the checkpoint) of the member at ``store_dir`` (:func:`store_path`)."""
    return f"{store_dir}/{name}?below=0"
