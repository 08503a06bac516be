"""The Raft transport's wire protocol, sans-IO: a mutual HMAC-SHA256 handshake, then authenticated frames.

No socket in sight, so it is tested without a network: :class:`SecureChannel` is fed received bytes with
:meth:`SecureChannel.receive_data`, hands back handshake bytes to send with
:meth:`SecureChannel.data_to_send`, yields verified frame payloads with :meth:`SecureChannel.next_frame`
and encodes outgoing frames with :meth:`SecureChannel.encode_frame`. ``dledger.transport`` is the thin
socket shell around it.

Wire format (all integers big-endian)::

    HELLO  = magic "RMQDLG" (6) | version u16 (2) | nonce (32)                      40 bytes, both sides
    PROOF  = HMAC-SHA256(secret, label | HELLO_initiator | HELLO_acceptor)            32 bytes
    FRAME  = payload length u32 | tag (16) | payload
    tag    = HMAC-SHA256(direction key, sequence u64 | payload length u32 | payload)[:16]
    direction key = HMAC-SHA256(secret, direction label | HELLO_initiator | HELLO_acceptor)

    PARTED FRAME = (payload length | 2^31) u32 | tag (16) | count u32 | part length u32 * count | parts
    tag    = HMAC-SHA256(direction key, sequence u64 | (payload length | 2^31) u32 | count | part lengths |
                         each part, or its BLAKE3 digest (32 bytes) when it is at least DIGEST_MIN_BYTES long)[:16]

A parted frame carries large parts (the Raft log entries of an append-entries message) beside a small one.
Its tag covers each large part through the part's BLAKE3 digest (hash-then-MAC: as strong as BLAKE3's
collision resistance, 128 bits), so a sender that sends one entry to several peers hashes it once, not once
per peer, and may hash it ahead of time (:class:`DigestCache`). Whether a part is hashed follows from its
length, which the tag covers like everything else. BLAKE3, not SHA-256: every member hashes every entry,
and on this product's hosts SHA-256 (even with the CPU's SHA extensions) took a large share of a
follower's CPU; BLAKE3 takes a fraction of that (version 3 of the protocol; version 2 used SHA-256).

Ordering: both sides send HELLO at once (a nonce reveals nothing). The initiator (the side that called
``connect``) sends its PROOF when it has the acceptor's HELLO. The acceptor verifies that PROOF before it
sends its own, so a peer that does not know the secret never obtains a keyed value computed over a nonce
it chose. The initiator verifies the acceptor's PROOF before it sends any frame. Every PROOF and key is
bound to both nonces and to a role or direction label, so a proof or a frame cannot be reflected back, replayed
on another connection or moved to the other direction. Frame tags cover an implicit per-direction sequence
number, so frames cannot be dropped, reordered or replayed inside a connection without detection.
Tags are compared in constant time (:func:`hmac.compare_digest`).

Nothing here deserializes anything: a frame payload is opaque bytes (a list of them for a parted frame),
returned only after its tag verified.
An empty payload is a keepalive; the socket shell sends one on idle connections and discards it on receipt.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final

from blake3 import blake3

from protocol.invariant import fail, invariant

PROTOCOL_MAGIC: Final = b"RMQDLG"
PROTOCOL_VERSION: Final = 3  # 2: parted frames; 3: their large parts by BLAKE3, not SHA-256
NONCE_BYTES: Final = 32
HELLO: Final = struct.Struct(">6sH32s")
invariant(HELLO.size == 40, "HELLO must be 40 bytes")
PROOF_BYTES: Final = 32
TAG_BYTES: Final = 16
FRAME_HEADER: Final = struct.Struct(">I16s")
invariant(FRAME_HEADER.size == 4 + TAG_BYTES, "frame header must be 20 bytes")
TAG_PREFIX: Final = struct.Struct(">QI")  # sequence number, payload length
#: the length field's top bit marks a parted frame; a configured frame limit above the rest is a programmer error
PARTED: Final = 1 << 31
FRAME_SIZE_LIMIT_BYTES: Final = PARTED - 1
#: parts of a parted frame at least this long enter its tag by their BLAKE3 digest
DIGEST_MIN_BYTES: Final = 4096
_COUNT: Final = struct.Struct(">I")

_LABEL_INITIATOR_PROOF: Final = b"raftmq/dledger/v1 proof initiator\x00"
_LABEL_ACCEPTOR_PROOF: Final = b"raftmq/dledger/v1 proof acceptor\x00"
_LABEL_INITIATOR_TO_ACCEPTOR_KEY: Final = b"raftmq/dledger/v1 key initiator->acceptor\x00"
_LABEL_ACCEPTOR_TO_INITIATOR_KEY: Final = b"raftmq/dledger/v1 key acceptor->initiator\x00"

#: a receive buffer larger than this is dropped once emptied (one that took a snapshot, say)
_KEEP_BYTES: Final = 8 << 20


class ProtocolError(Exception):
    """The peer broke the protocol: the connection must be closed and nothing it sent may be used."""


class HandshakeError(ProtocolError):
    """Wrong magic or version, or a proof that does not verify (the peer does not know the secret)."""


class FrameError(ProtocolError):
    """A received frame that is too large or fails its tag, or a channel used after it failed."""


class FrameTooLargeError(ValueError):
    """A local caller tried to send a frame above the limit: a configuration or programmer error."""


class Role(enum.Enum):
    """Which end of the TCP connection this channel is: the roles choose the proof and key labels."""

    INITIATOR = "initiator"
    ACCEPTOR = "acceptor"


class ChannelState(enum.Enum):
    AWAITING_HELLO = "awaiting hello"
    AWAITING_PROOF = "awaiting proof"
    ESTABLISHED = "established"
    FAILED = "failed"


def validate_secret(secret: bytes) -> None:
    """Operating error for a secret that cannot authenticate anything."""
    if not isinstance(secret, bytes):
        raise TypeError(f"the shared secret must be bytes, not {type(secret).__name__}")
    if not secret:
        raise ValueError("the shared secret must not be empty")


class ReceiveBuffer:
    """Received bytes with a read offset, in storage that is reused: consuming is O(1), receiving is
    amortized O(len(data)), and steady traffic allocates nothing.

    Bytes live in ``_buffer[_offset:_end]``. Room for the next receive is made at the end: the unread tail
    is moved to the front when that frees enough and it is at most an eighth of the storage, else the
    storage doubles (up to :data:`_KEEP_BYTES`, past which the tail is always moved). It is dropped once
    emptied while larger than :data:`_KEEP_BYTES` (after a snapshot, say), and reused otherwise:
    reallocating per read cost a follower a large share of its CPU. ``receive_into`` lets the socket write
    into it directly.
    """

    __slots__ = ("_buffer", "_end", "_offset")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._offset = 0
        self._end = 0

    def __len__(self) -> int:
        return self._end - self._offset

    def _reserve(self, size: int) -> None:
        """Make room for ``size`` more bytes after the end."""
        if self._offset == self._end:
            self._offset = self._end = 0
            if len(self._buffer) > _KEEP_BYTES and size <= _KEEP_BYTES:
                self._buffer = bytearray()
        if self._end + size <= len(self._buffer):
            return
        unread = self._end - self._offset
        if self._offset and unread + size <= len(self._buffer) and (
                unread * 8 <= len(self._buffer) or len(self._buffer) >= _KEEP_BYTES):
            # moving at most an eighth of the storage per fill (or, once it is large, whatever is unread)
            self._buffer[:unread] = self._buffer[self._offset : self._end]  # same length: moved in place
            self._offset, self._end = 0, unread
            return
        self._buffer += bytes(max(self._end + size, 2 * len(self._buffer)) - len(self._buffer))

    def append(self, data: bytes) -> None:
        self._reserve(len(data))
        self._buffer[self._end : self._end + len(data)] = data
        self._end += len(data)

    def receive_into(self, receive: Callable[[memoryview], int], size: int) -> int:
        """Let ``receive`` (``socket.recv_into``) write up to ``size`` bytes at the end; how many it wrote."""
        self._reserve(size)
        with memoryview(self._buffer)[self._end : self._end + size] as view:
            received = receive(view)
        invariant(0 <= received <= size, "a receive wrote within its room")
        self._end += received
        return received

    def peek_unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        invariant(len(self) >= layout.size, "peek beyond the received bytes")
        return layout.unpack_from(self._buffer, self._offset)

    def take(self, size: int) -> bytes:
        """The next ``size`` bytes as one copy, consumed."""
        invariant(0 <= size <= len(self), "take beyond the received bytes")
        start = self._offset
        self._offset += size
        # A memoryview slice copies once; it is released at once because a live export would stop the
        # bytearray from resizing on the next append.
        with memoryview(self._buffer) as view:
            return bytes(view[start : start + size])

    def skip(self, size: int) -> None:
        invariant(0 <= size <= len(self), "skip beyond the received bytes")
        self._offset += size


def part_digest(part: bytes | memoryview) -> bytes:
    """What a parted frame's tag covers of a large part: its BLAKE3 digest (GIL released while hashing)."""
    return blake3(part).digest()


def _keyed_digest(secret: bytes, label: bytes, transcript: bytes) -> bytes:
    return hmac.digest(secret, label + transcript, hashlib.sha256)


class SecureChannel:
    """One connection's protocol state: handshake, then authenticated frames in both directions.

    ``random_bytes`` is injected so tests can make nonces deterministic; production uses
    :func:`os.urandom`. Any :class:`ProtocolError` leaves the channel ``FAILED`` for good.
    """

    def __init__(
        self,
        role: Role,
        secret: bytes,
        *,
        frame_size_max_bytes: int,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        validate_secret(secret)
        if not 0 < frame_size_max_bytes <= FRAME_SIZE_LIMIT_BYTES:
            raise ValueError(f"frame_size_max_bytes must be in 1..{FRAME_SIZE_LIMIT_BYTES}")
        nonce = random_bytes(NONCE_BYTES)
        invariant(len(nonce) == NONCE_BYTES, "random_bytes returned the wrong length")
        self._role = role
        self._secret = secret
        self._frame_size_max_bytes = frame_size_max_bytes
        self._own_hello = HELLO.pack(PROTOCOL_MAGIC, PROTOCOL_VERSION, nonce)
        self._peer_hello = b""
        self._state = ChannelState.AWAITING_HELLO
        self._received = ReceiveBuffer()
        self._outgoing_handshake: list[bytes] = [self._own_hello]
        self._send_mac: hmac.HMAC | None = None
        self._receive_mac: hmac.HMAC | None = None
        self._send_sequence = 0
        self._receive_sequence = 0

    @property
    def state(self) -> ChannelState:
        return self._state

    @property
    def established(self) -> bool:
        return self._state is ChannelState.ESTABLISHED

    @property
    def role(self) -> Role:
        return self._role

    @property
    def buffered_bytes(self) -> int:
        """Received bytes not consumed yet (a partial handshake message or frame)."""
        return len(self._received)

    def data_to_send(self) -> bytes:
        """Handshake bytes produced so far and not yet taken; empty once nothing is pending."""
        pending = b"".join(self._outgoing_handshake)
        self._outgoing_handshake.clear()
        return pending

    def receive_data(self, data: bytes) -> None:
        """Buffer received bytes and advance the handshake as far as they allow.

        Handshake messages are processed here, eagerly, so a peer without the secret is rejected after at
        most one read; frames are only parsed by :meth:`next_frame`.
        """
        if self._state is ChannelState.FAILED:
            raise ProtocolError("the channel already failed")
        self._received.append(data)
        self._after_receive()

    def receive_into(self, receive: Callable[[memoryview], int], size: int) -> int:
        """:meth:`receive_data` with ``receive`` (``socket.recv_into``) writing up to ``size`` bytes straight
        into the buffer; how many it wrote (0: the peer closed). Errors of ``receive`` propagate."""
        if self._state is ChannelState.FAILED:
            raise ProtocolError("the channel already failed")
        received = self._received.receive_into(receive, size)
        if received:
            self._after_receive()
        return received

    def _after_receive(self) -> None:
        try:
            self._advance_handshake()
        except ProtocolError:
            self._fail()
            raise

    def next_frame(self) -> bytes | list[bytes] | None:
        """The next verified frame payload (the parts of a parted frame), or None if a whole frame has not
        arrived yet."""
        if self._state is not ChannelState.ESTABLISHED:
            if self._state is ChannelState.FAILED:
                raise FrameError("the channel already failed")
            return None
        try:
            return self._parse_frame()
        except ProtocolError:
            self._fail()
            raise

    def encode_frame(self, payload: bytes) -> bytes:
        """The header (length and tag) to send right before ``payload``; the caller sends both in order.

        Each call consumes one sequence number, so headers must be sent in the order they were made.
        """
        return self.encode_frame_parts((payload,))

    def encode_frame_parts(self, parts: Sequence[bytes | memoryview]) -> bytes:
        """:meth:`encode_frame` for a payload given as parts sent back to back (not joined first)."""
        send_mac = self._established_send_mac()
        length = sum(len(part) for part in parts)
        self._check_length(length)
        mac = send_mac.copy()
        mac.update(TAG_PREFIX.pack(self._send_sequence, length))
        for part in parts:
            mac.update(part)
        self._send_sequence += 1
        return FRAME_HEADER.pack(length, mac.digest()[:TAG_BYTES])

    def encode_parted_frame(self, parts: Sequence[bytes | memoryview],
                            digest_of: Callable[[bytes | memoryview], bytes] = part_digest
                            ) -> bytes:
        """The header and part table to send right before ``parts`` (then the parts, in order): a parted
        frame, whose receiver gets the parts back as a list. ``digest_of`` gives a large part's digest
        (a :class:`DigestCache` may know it already)."""
        send_mac = self._established_send_mac()
        table = _COUNT.pack(len(parts)) + struct.pack(f">{len(parts)}I", *(len(part) for part in parts))
        length = len(table) + sum(len(part) for part in parts)
        self._check_length(length)
        mac = send_mac.copy()
        mac.update(TAG_PREFIX.pack(self._send_sequence, length | PARTED))
        mac.update(table)
        for part in parts:
            mac.update(part if len(part) < DIGEST_MIN_BYTES else digest_of(part))
        self._send_sequence += 1
        return FRAME_HEADER.pack(length | PARTED, mac.digest()[:TAG_BYTES]) + table

    def _established_send_mac(self) -> Any:
        send_mac = self._send_mac
        if self._state is not ChannelState.ESTABLISHED or send_mac is None:
            fail("frames can only be sent on an established channel")
        return send_mac

    def _check_length(self, length: int) -> None:
        if length > self._frame_size_max_bytes:
            raise FrameTooLargeError(
                f"frame of {length} bytes exceeds the limit of {self._frame_size_max_bytes}"
            )

    def _fail(self) -> None:
        self._state = ChannelState.FAILED
        self._send_mac = None
        self._receive_mac = None
        self._outgoing_handshake.clear()

    def _transcript(self) -> bytes:
        if self._role is Role.INITIATOR:
            return self._own_hello + self._peer_hello
        return self._peer_hello + self._own_hello

    def _advance_handshake(self) -> None:
        if self._state is ChannelState.AWAITING_HELLO:
            if len(self._received) < HELLO.size:
                return
            magic, version, _nonce = self._received.peek_unpack(HELLO)
            if magic != PROTOCOL_MAGIC:
                raise HandshakeError("the peer does not speak the raftmq Raft protocol (bad magic)")
            if version != PROTOCOL_VERSION:
                raise HandshakeError(f"unsupported protocol version {version}")
            self._peer_hello = self._received.take(HELLO.size)
            if self._peer_hello == self._own_hello:
                # Our own HELLO came back: someone is reflecting the connection onto itself.
                raise HandshakeError("the peer echoed our nonce")
            self._state = ChannelState.AWAITING_PROOF
            if self._role is Role.INITIATOR:
                self._outgoing_handshake.append(
                    _keyed_digest(self._secret, _LABEL_INITIATOR_PROOF, self._transcript())
                )
        if self._state is ChannelState.AWAITING_PROOF:
            if len(self._received) < PROOF_BYTES:
                return
            proof = self._received.take(PROOF_BYTES)
            transcript = self._transcript()
            peer_label = _LABEL_ACCEPTOR_PROOF if self._role is Role.INITIATOR else _LABEL_INITIATOR_PROOF
            expected = _keyed_digest(self._secret, peer_label, transcript)
            if not hmac.compare_digest(proof, expected):
                raise HandshakeError("the peer's proof does not verify: it does not know the shared secret")
            if self._role is Role.ACCEPTOR:
                self._outgoing_handshake.append(
                    _keyed_digest(self._secret, _LABEL_ACCEPTOR_PROOF, transcript)
                )
            initiator_to_acceptor = _keyed_digest(self._secret, _LABEL_INITIATOR_TO_ACCEPTOR_KEY, transcript)
            acceptor_to_initiator = _keyed_digest(self._secret, _LABEL_ACCEPTOR_TO_INITIATOR_KEY, transcript)
            if self._role is Role.INITIATOR:
                send_key, receive_key = initiator_to_acceptor, acceptor_to_initiator
            else:
                send_key, receive_key = acceptor_to_initiator, initiator_to_acceptor
            # Keyed base objects are copied per frame: the key schedule is computed once per connection.
            self._send_mac = hmac.new(send_key, digestmod=hashlib.sha256)
            self._receive_mac = hmac.new(receive_key, digestmod=hashlib.sha256)
            self._state = ChannelState.ESTABLISHED

    def _parse_frame(self) -> bytes | list[bytes] | None:
        if len(self._received) < FRAME_HEADER.size:
            return None
        length_field, tag = self._received.peek_unpack(FRAME_HEADER)
        length = length_field & ~PARTED
        if length > self._frame_size_max_bytes:
            raise FrameError(f"frame of {length} bytes exceeds the limit of {self._frame_size_max_bytes}")
        if len(self._received) < FRAME_HEADER.size + length:
            return None
        receive_mac = self._receive_mac
        if receive_mac is None:
            fail("an established channel has a receive key")
        self._received.skip(FRAME_HEADER.size)
        mac = receive_mac.copy()
        mac.update(TAG_PREFIX.pack(self._receive_sequence, length_field))
        payload: bytes | list[bytes]
        if not length_field & PARTED:
            payload = self._received.take(length)
            mac.update(payload)
        else:
            payload = self._take_parts(length, mac)
        if not hmac.compare_digest(mac.digest()[:TAG_BYTES], tag):
            raise FrameError("frame tag does not verify (tampered, reordered or replayed)")
        self._receive_sequence += 1
        return payload

    def _take_parts(self, length: int, mac: Any) -> list[bytes]:
        """The parts of a parted frame of ``length`` bytes (all received), fed to ``mac`` as the tag covers
        them. A table that does not add up to the frame fails the channel before anything is hashed."""
        if length < _COUNT.size:
            raise FrameError(f"parted frame of {length} bytes has no part table")
        (count,) = self._received.peek_unpack(_COUNT)
        if _COUNT.size * (count + 1) > length:
            raise FrameError(f"parted frame of {length} bytes cannot hold {count} part lengths")
        table = self._received.take(_COUNT.size * (count + 1))
        lengths = struct.unpack_from(f">{count}I", table, _COUNT.size)
        if sum(lengths) != length - len(table):
            raise FrameError(f"parts of {sum(lengths)} bytes in a parted frame of {length - len(table)}")
        mac.update(table)
        parts = []
        for part_length in lengths:
            part = self._received.take(part_length)
            mac.update(part if part_length < DIGEST_MIN_BYTES else part_digest(part))
            parts.append(part)
        return parts


class DigestCache:
    """Digests (:func:`part_digest`) of large byte strings, by identity, computed ahead of sending: the
    leader digests each entry as it proposes it (its group-commit thread), and the Raft thread finds the
    digest for every follower it sends the entry to. Bounded: an entry sent later (a follower catching up)
    is hashed then."""

    def __init__(self, capacity: int = 64, capacity_bytes: int = 16 << 20) -> None:
        self._capacity = capacity
        #: the cache holds the entries themselves: past what pysyncobj's log holds, after a compaction, its
        #: bytes are memory of its own (a full cache of large entries is tens of megabytes of a member's)
        self._capacity_bytes = capacity_bytes
        self._bytes = 0
        self._entries: OrderedDict[int, tuple[bytes, bytes]] = OrderedDict()  # id -> (the bytes, digest)
        self._lock = threading.Lock()

    def remember(self, data: bytes) -> None:
        digest = part_digest(data)
        with self._lock:
            previous = self._entries.pop(id(data), None)
            if previous is not None:
                self._bytes -= len(previous[0])
            self._entries[id(data)] = (data, digest)  # held, so the id stays this object's
            self._bytes += len(data)
            while len(self._entries) > 1 and (len(self._entries) > self._capacity
                                              or self._bytes > self._capacity_bytes):
                _, (evicted, _) = self._entries.popitem(last=False)
                self._bytes -= len(evicted)

    @property
    def held_bytes(self) -> int:
        """The bytes of the entries held."""
        with self._lock:
            return self._bytes

    def digest(self, part: bytes | memoryview) -> bytes:
        whole = part.obj if isinstance(part, memoryview) else part
        if isinstance(whole, bytes) and len(whole) == len(part):
            with self._lock:
                found = self._entries.get(id(whole))
            if found is not None and found[0] is whole:
                return found[1]
        return part_digest(part)


#: the process's digests of proposed entries (one Raft node per process)
ENTRY_DIGESTS: Final = DigestCache()
