"""An authenticated, binary-safe replacement for pysyncobj's TCP transport.

Use it through pysyncobj's public ``transportClass`` parameter::

    from dledger.transport import transport_class
    from dledger.tuning import tuned_conf

    member = MySyncObj(
        "10.0.0.1:7001", ["10.0.0.2:7001", "10.0.0.3:7001"],
        conf=tuned_conf(journal_file=..., full_dump_file=...),
        transportClass=transport_class(secret),
    )

Every member of a group must use this transport and the same secret; it does not interoperate with the
stock transport (a stock peer fails the handshake and is disconnected).

What it changes against pysyncobj 0.3.17's ``TcpConnection``/``TcpServer`` (which capped throughput):

* Frames are length-prefixed and carry pickle protocol 5 (bytes stay bytes), without zlib.
* Output is a deque of buffers written with ``sendmsg`` (scatter/gather): no ``bytes +=``, no slicing of
  a growing buffer; input is a ``bytearray`` with a read offset (``dledger.secure_channel.ReceiveBuffer``).
* Write interest is registered with the poller while output is pending, so a partly sent message is
  flushed as soon as the socket drains, not on the next send.
* Output is bounded: above ``TransportSettings.output_buffer_max_bytes`` of encoded bytes, further
  messages wait *unencoded* (they reference journal entries, so they cost no copy) and are pickled when
  the socket drains; more than ``deferred_messages_max`` waiting messages means the peer is not keeping
  up at all and the connection is closed like a dead one.
* Idle connections send an empty keepalive frame, so "nothing read for ``connectionTimeout``" really
  means a dead peer. The stock connection only checks that timeout when an event or a send happens, so
  an idle follower-to-follower connection was dropped the moment an election used it.
* Handshakes have a deadline, and at most ``handshakes_pending_max`` may be in progress.
* The listening socket binds to the node's own address (or an explicit ``bindAddress``), never to a
  wildcard address; the stock transport binds 0.0.0.0 when ``bindAddress`` is unset.
* Addresses may be host names or ``[IPv6]:port``; a peer's name is resolved again on every connection
  attempt (``dledger.addresses.Resolver``, which never holds the tick thread for long), where the stock
  transport caches names for ``dnsCacheTime`` and prefers IPv4 even when told ``ipv6``.
* Given a :class:`~dledger.group_clock.GroupClock`, it tells each connected member its wall clock (a tiny
  message on connecting and every ``CLOCK_SAMPLE_INTERVAL_SECONDS``) and hands the readings it receives to
  that clock instead of pysyncobj: the group's time is a majority's clocks (``dledger.group_clock``).
  pysyncobj ignores a message of a type it does not know, so a member without this is not disturbed.

Kept as pysyncobj does it: the ``TCPTransport`` logic itself (who connects to whom, reconnect every
``connectionRetryTime``, the node-identification message after connecting, read-only nodes, utility
messages, the connected/disconnected/message callbacks), socket options, and "no data read for
``connectionTimeout`` means dead".

Security
--------
Protects against anyone who can reach the Raft port but does not hold the shared secret (another
process or user on the host, a port scanner, a misconfigured client, a stock pysyncobj node, an attacker
on the network):

* no byte they send is ever deserialized: each side must prove knowledge of the secret with an
  HMAC-SHA256 challenge-response over fresh random nonces from both sides (constant-time compare) before
  any frame is parsed, and a failed or stalled handshake closes the connection;
* they cannot join the group, vote, impersonate a member, or replay a recorded handshake or frame;
* every frame after the handshake carries an HMAC tag under per-connection, per-direction keys with an
  implicit sequence number, so an on-path attacker cannot inject, modify, reorder, replay or drop frames
  without the connection being closed;
* even authenticated frames are unpickled by an unpickler that refuses every global (pysyncobj's Raft
  messages are plain dicts, lists, tuples, bytes, str, int, bool and None), so a frame can build data but
  never call anything.

Does not protect against:

* eavesdropping: there is no encryption; message bodies cross the network in clear. Run the group on
  loopback or a trusted, private network (or a VPN / WireGuard between hosts);
* a member, or anyone holding the secret: members trust each other completely;
* denial of service: anyone who can reach the port can open connections and use up the pending handshake
  slots (the oldest is evicted) or bandwidth, or reset TCP connections;
* traffic analysis, and guessing a weak secret offline from a recorded handshake: use at least 32 random
  bytes (``secrets.token_bytes(32)``).

The admin utility of pysyncobj (``syncobj_admin``) speaks the stock protocol and is rejected like any other
client without the secret; read the status from inside the process (``SyncObj.getStatus()``).

Threading: everything here runs on pysyncobj's tick thread, like the stock transport.
"""

from __future__ import annotations

import functools
import io
import itertools
import logging
import os
import pickle
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, set_keepalive
from pysyncobj.transport import TCPTransport, TransportNotReadyError

from dledger.addresses import AddressError, Resolver, lookup, split_host_port
from dledger.group_clock import CLOCK_SAMPLE_INTERVAL_SECONDS, GroupClock, clock_message, clock_reading
from dledger.secure_channel import (
    ENTRY_DIGESTS,
    FRAME_SIZE_LIMIT_BYTES,
    ProtocolError,
    Role,
    SecureChannel,
    validate_secret,
)

logger = logging.getLogger(__name__)

#: pickle protocol for frame payloads: 5 keeps bytes as raw bytes (protocol 2 turns bytes >= 0x80 into
#: two bytes) and is the fastest the standard library has
PAYLOAD_PICKLE_PROTOCOL: Final = 5
#: command bytes of at least this size in append-entries messages are sent out of band: pickling copied
#: each entry once per follower, holding the leader's GIL
OUT_OF_BAND_MIN_BYTES: Final = 16 * 1024
#: buffers handed to one ``sendmsg``; Linux' IOV_MAX is 1024, fewer keep the list building cheap
SEND_BUFFERS_PER_CALL_MAX: Final = 64
#: payloads below this are joined with their header (one small copy) instead of taking a second iovec
JOIN_PAYLOAD_BELOW_BYTES: Final = 16 * 1024
#: how often the tick checks handshake deadlines, dead connections and keepalives
TIMER_CHECK_INTERVAL_SECONDS: Final = 0.05
#: host strings that would bind every interface
WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::", "*"})

_READ: Final[int] = POLL_EVENT_TYPE.READ
_WRITE: Final[int] = POLL_EVENT_TYPE.WRITE
_ERROR: Final[int] = POLL_EVENT_TYPE.ERROR
_DISCONNECTED: Final[int] = CONNECTION_STATE.DISCONNECTED
_CONNECTING: Final[int] = CONNECTION_STATE.CONNECTING
_CONNECTED: Final[int] = CONNECTION_STATE.CONNECTED


class Poller(Protocol):
    """The part of pysyncobj's poller the transport uses."""

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None: ...

    def unsubscribe(self, descr: int) -> None: ...


@dataclass(frozen=True)
class TransportSettings:
    """Limits of the transport itself; the socket sizes and timeouts come from ``SyncObjConf``.

    ``frame_size_max_bytes`` None derives the limit from the conf: pysyncobj's largest message is an
    ``append_entries`` holding entries that add up to less than ``appendEntriesBatchSizeBytes`` plus one
    more entry, each entry itself below that size (see ``dledger.tuning``), or one chunk of a snapshot
    (``logCompactionBatchSize``); four times the larger setting leaves ample room for pickle overhead.
    """

    handshake_timeout_seconds: float = 2.0
    handshakes_pending_max: int = 32
    frame_size_max_bytes: int | None = None
    output_buffer_max_bytes: int = 32 * 1024 * 1024
    deferred_messages_max: int = 1_000_000
    receive_chunk_bytes: int = 256 * 1024
    read_budget_bytes: int = 8 * 1024 * 1024
    listen_backlog: int = 64

    def validate(self) -> None:
        if not self.handshake_timeout_seconds > 0:
            raise ValueError("handshake_timeout_seconds must be positive")
        if self.handshakes_pending_max < 1:
            raise ValueError("handshakes_pending_max must be at least 1")
        if self.frame_size_max_bytes is not None and not 0 < self.frame_size_max_bytes <= FRAME_SIZE_LIMIT_BYTES:
            raise ValueError(f"frame_size_max_bytes must be in 1..{FRAME_SIZE_LIMIT_BYTES}")
        if self.output_buffer_max_bytes < 1:
            raise ValueError("output_buffer_max_bytes must be positive")
        if self.deferred_messages_max < 1:
            raise ValueError("deferred_messages_max must be positive")
        if self.receive_chunk_bytes < 4096:
            raise ValueError("receive_chunk_bytes must be at least 4096")
        if self.read_budget_bytes < self.receive_chunk_bytes:
            raise ValueError("read_budget_bytes must be at least receive_chunk_bytes")
        if self.listen_backlog < 1:
            raise ValueError("listen_backlog must be at least 1")


def derived_frame_size_max_bytes(conf: Any) -> int:
    """The frame limit used when ``TransportSettings.frame_size_max_bytes`` is None (see there)."""
    largest_setting = max(int(conf.appendEntriesBatchSizeBytes), int(conf.logCompactionBatchSize))
    return min(FRAME_SIZE_LIMIT_BYTES, 4 * largest_setting + 1024 * 1024)


@dataclass(frozen=True)
class ConnectionOptions:
    """Everything one connection needs, resolved from ``SyncObjConf`` and :class:`TransportSettings`."""

    secret: bytes
    connection_timeout_seconds: float
    keepalive_interval_seconds: float
    handshake_timeout_seconds: float
    send_buffer_bytes: int
    receive_buffer_bytes: int
    tcp_keepalive: tuple[int, int, int] | None
    frame_size_max_bytes: int
    output_buffer_max_bytes: int
    deferred_messages_max: int
    receive_chunk_bytes: int
    read_budget_bytes: int

    @classmethod
    def from_conf(cls, conf: Any, secret: bytes, settings: TransportSettings) -> ConnectionOptions:
        connection_timeout_seconds = float(conf.connectionTimeout)
        frame_size_max_bytes = settings.frame_size_max_bytes
        if frame_size_max_bytes is None:
            frame_size_max_bytes = derived_frame_size_max_bytes(conf)
        return cls(
            secret=secret,
            connection_timeout_seconds=connection_timeout_seconds,
            # Four keepalives per timeout: a healthy peer is never mistaken for a dead one even if a
            # couple of ticks run late.
            keepalive_interval_seconds=connection_timeout_seconds / 4,
            handshake_timeout_seconds=settings.handshake_timeout_seconds,
            send_buffer_bytes=int(conf.sendBufferSize),
            receive_buffer_bytes=int(conf.recvBufferSize),
            tcp_keepalive=conf.tcp_keepalive,
            frame_size_max_bytes=frame_size_max_bytes,
            output_buffer_max_bytes=settings.output_buffer_max_bytes,
            deferred_messages_max=settings.deferred_messages_max,
            receive_chunk_bytes=settings.receive_chunk_bytes,
            read_budget_bytes=settings.read_budget_bytes,
        )


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Builds plain data only: any global (class, function) in the stream is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} refused: Raft messages carry plain data only")


def encode_message(message: object) -> bytes:
    """One plain pickle of ``message`` (large byte strings in band)."""
    return pickle.dumps(message, protocol=PAYLOAD_PICKLE_PROTOCOL)


def encode_message_parts(message: object) -> list[bytes | memoryview]:
    """The frame payload for ``message``: one plain pickle, or several parts, sent as a parted frame
    (``dledger.secure_channel``): a pickle followed by the commands of an append-entries message, out of band
    (protocol 5 buffers), as views of the entries' own bytes: nothing copies them before the socket does."""
    buffers: list[pickle.PickleBuffer] = []
    skeleton = pickle.dumps(_commands_out_of_band(message), protocol=PAYLOAD_PICKLE_PROTOCOL,
                            buffer_callback=buffers.append)
    return [skeleton, *(buffer.raw() for buffer in buffers)]


def _commands_out_of_band(message: object) -> object:
    """pysyncobj's append-entries message with its large commands wrapped for out-of-band pickling."""
    if not isinstance(message, dict) or message.get("type") != "append_entries":
        return message
    entries = message.get("entries")
    if not isinstance(entries, list) or not any(
            isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], bytes)
            and len(entry[0]) >= OUT_OF_BAND_MIN_BYTES for entry in entries):
        return message
    wrapped = [(pickle.PickleBuffer(entry[0]), entry[1], entry[2])
               if isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], bytes)
               and len(entry[0]) >= OUT_OF_BAND_MIN_BYTES else entry for entry in entries]
    return {**message, "entries": wrapped}


def decode_message(payload: bytes | list[bytes]) -> object:
    """Unpickle an authenticated frame payload (a parted frame's parts: the pickle, then its out-of-band
    buffers, which come back as ``bytes``), refusing globals (defence in depth, see module doc)."""
    if isinstance(payload, bytes):
        return _NoGlobalsUnpickler(io.BytesIO(payload)).load()
    skeleton, *buffers = payload
    return _NoGlobalsUnpickler(io.BytesIO(skeleton), buffers=buffers).load()


def _address_family(host: str) -> socket.AddressFamily:
    try:
        socket.inet_pton(socket.AF_INET, host)
        return socket.AF_INET
    except OSError:
        pass
    try:
        socket.inet_pton(socket.AF_INET6, host)
        return socket.AF_INET6
    except OSError:
        raise ValueError(f"not an IP address: {host!r}") from None


def _configure_socket(sock: socket.socket, options: ConnectionOptions) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, options.send_buffer_bytes)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, options.receive_buffer_bytes)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if options.tcp_keepalive is not None:
        set_keepalive(sock, *options.tcp_keepalive)
    sock.setblocking(False)


class FramedConnection:
    """One authenticated connection; implements the part of pysyncobj's ``TcpConnection`` that
    ``TCPTransport`` uses (the camelCase names are that interface).

    States follow pysyncobj: DISCONNECTED, CONNECTING (TCP connect or handshake in progress) and CONNECTED
    (authenticated). The connected callback runs once the handshake has succeeded; messages are delivered
    only in CONNECTED, in the order they were sent.
    """

    def __init__(
        self,
        poller: Poller,
        options: ConnectionOptions,
        *,
        role: Role,
        accepted_socket: socket.socket | None = None,
        clock: Callable[[], float] = time.monotonic,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if (role is Role.ACCEPTOR) != (accepted_socket is not None):
            raise ValueError("an accepted socket is an acceptor's, and only an acceptor's")
        self._poller = poller
        self._options = options
        self._role = role
        self._clock = clock
        self._random_bytes = random_bytes
        self._on_connected: Callable[[], None] | None = None
        self._on_message: Callable[[object], None] | None = None
        self._on_disconnected: Callable[[], None] | None = None
        self._socket: socket.socket | None = None
        self._fileno: int | None = None
        self._state = _DISCONNECTED
        self._tcp_connected = False
        self._channel: SecureChannel | None = None
        self._output: deque[bytes | memoryview] = deque()
        self._output_bytes = 0
        self._deferred: deque[object] = deque()
        self._interest = 0
        self._handshake_deadline: float | None = None
        self._last_read_time = 0.0
        self._last_enqueue_time = 0.0
        self.peer_description = ""
        # Read by TCPTransport only when SyncObjConf.password is set, which this transport refuses.
        self.encryptor: None = None
        self.sendRandKey: None = None
        self.recvRandKey: None = None
        if accepted_socket is not None:
            self._start(accepted_socket, tcp_connected=True)

    # -- the TcpConnection interface -------------------------------------------------------------------

    def setOnConnectedCallback(self, callback: Callable[[], None] | None) -> None:
        self._on_connected = callback

    def setOnMessageReceivedCallback(self, callback: Callable[[object], None] | None) -> None:
        self._on_message = callback

    def setOnDisconnectedCallback(self, callback: Callable[[], None] | None) -> None:
        self._on_disconnected = callback

    @property
    def state(self) -> int:
        return self._state

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:
        return self._output_bytes

    def connect(self, host: str | None, port: int) -> bool:
        """Start a non-blocking connect; the handshake follows when the socket becomes writable."""
        if self._role is not Role.INITIATOR:
            raise ValueError("only an initiator connects")
        if host is None:
            return False
        if self._state != _DISCONNECTED:
            self.disconnect()
        try:
            sock = socket.socket(_address_family(host), socket.SOCK_STREAM)
        except (OSError, ValueError):
            logger.warning("cannot create a socket for %s:%s", host, port)
            return False
        try:
            _configure_socket(sock, self._options)
            sock.connect((host, port))
        except (BlockingIOError, InterruptedError):
            pass  # EINPROGRESS: completion is reported by the poller
        except OSError:
            sock.close()
            return False
        self.peer_description = f"{host}:{port}"
        self._start(sock, tcp_connected=False)
        return True

    def send(self, message: object) -> None:
        """Queue a message; nothing is sent on a connection that has not authenticated its peer."""
        if self._state != _CONNECTED:
            return
        if self._deferred or self._output_bytes >= self._options.output_buffer_max_bytes:
            if not self._deferred:
                logger.info(
                    "output to %s exceeds %d bytes: deferring the encoding of further messages",
                    self.peer_description,
                    self._options.output_buffer_max_bytes,
                )
            self._deferred.append(message)
            if len(self._deferred) > self._options.deferred_messages_max:
                logger.warning(
                    "closing the connection to %s: %d messages wait for a peer that does not read",
                    self.peer_description,
                    len(self._deferred),
                )
                self.disconnect()
            return
        was_idle = not self._output
        self._encode_and_queue(message)
        if was_idle:
            # Low latency when idle: the socket is very likely writable now. When output is already
            # pending, write interest is registered and the poller flushes everything in one call.
            self._flush()
        self._update_interest()

    def disconnect(self) -> None:
        """Close the socket and drop everything queued; runs the disconnected callback once."""
        notify = self._on_disconnected is not None and self._state != _DISCONNECTED
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._state = _DISCONNECTED
        self._tcp_connected = False
        self._channel = None
        self._output.clear()
        self._output_bytes = 0
        self._deferred.clear()
        self._interest = 0
        self._handshake_deadline = None
        if notify and self._on_disconnected is not None:
            self._on_disconnected()

    # -- timers (called from the transport's tick) ------------------------------------------------------

    def check_timers(self, now: float) -> None:
        """Close a stalled handshake or a dead connection; send a keepalive on an idle one."""
        if self._state == _DISCONNECTED:
            return
        if self._handshake_deadline is not None:
            if now >= self._handshake_deadline:
                logger.warning("closing %s: handshake not completed in time", self.peer_description)
                self.disconnect()
            return
        if now - self._last_read_time > self._options.connection_timeout_seconds:
            logger.info("closing %s: nothing received for %.1f s", self.peer_description, now - self._last_read_time)
            self.disconnect()
            return
        if not self._output and now - self._last_enqueue_time >= self._options.keepalive_interval_seconds:
            self._queue_frame(b"")
            self._flush()
            self._update_interest()

    # -- internals ------------------------------------------------------------------------------------

    def _start(self, sock: socket.socket, *, tcp_connected: bool) -> None:
        now = self._clock()
        self._socket = sock
        self._fileno = sock.fileno()
        self._state = _CONNECTING
        self._tcp_connected = tcp_connected
        self._channel = SecureChannel(
            self._role,
            self._options.secret,
            frame_size_max_bytes=self._options.frame_size_max_bytes,
            random_bytes=self._random_bytes,
        )
        self._handshake_deadline = now + self._options.handshake_timeout_seconds
        self._last_read_time = now
        self._last_enqueue_time = now
        self._queue_raw(self._channel.data_to_send())
        self._interest = 0
        self._update_interest()

    def _update_interest(self) -> None:
        if self._fileno is None:
            return
        interest = _READ | _ERROR
        if self._output or not self._tcp_connected:
            interest |= _WRITE
        if interest != self._interest:
            self._interest = interest
            self._poller.subscribe(self._fileno, self._on_poll_event, interest)

    def _queue_raw(self, data: bytes | memoryview) -> None:
        if data:
            self._output.append(data)
            self._output_bytes += len(data)

    def _queue_frame(self, payload: bytes) -> None:
        self._queue_frame_parts([payload])

    def _queue_frame_parts(self, parts: list[bytes | memoryview]) -> None:
        channel = self._channel
        if channel is None:
            return
        header = (channel.encode_frame_parts(parts) if len(parts) == 1
                  else channel.encode_parted_frame(parts, ENTRY_DIGESTS.digest))
        if sum(len(part) for part in parts) < JOIN_PAYLOAD_BELOW_BYTES:
            self._queue_raw(b"".join([header, *parts]))
        else:
            self._queue_raw(header)
            for part in parts:
                self._queue_raw(part)
        self._last_enqueue_time = self._clock()

    def _encode_and_queue(self, message: object) -> None:
        self._queue_frame_parts(encode_message_parts(message))

    def _refill_from_deferred(self) -> None:
        while self._deferred and self._output_bytes < self._options.output_buffer_max_bytes:
            self._encode_and_queue(self._deferred.popleft())

    def _flush(self) -> None:
        """Write as much queued output as the socket takes now; encode deferred messages as it drains."""
        sock = self._socket
        if sock is None or not self._tcp_connected:
            return
        while self._output:
            if len(self._output) == 1:
                buffers: list[bytes | memoryview] = [self._output[0]]
            else:
                buffers = list(itertools.islice(self._output, SEND_BUFFERS_PER_CALL_MAX))
            try:
                sent = sock.sendmsg(buffers)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                logger.info("closing %s: send failed: %s", self.peer_description, error)
                self.disconnect()
                return
            offered = sum(len(buffer) for buffer in buffers)
            self._consume_output(sent)
            if sent < offered:
                return  # the socket buffer is full; write interest stays registered
            self._refill_from_deferred()

    def _consume_output(self, sent: int) -> None:
        self._output_bytes -= sent
        while sent:
            head = self._output[0]
            size = len(head)
            if size <= sent:
                self._output.popleft()
                sent -= size
            else:
                self._output[0] = memoryview(head)[sent:]
                sent = 0

    def _on_poll_event(self, descriptor: int, event: int) -> None:
        if descriptor != self._fileno:
            # A stale registration of a closed socket (pysyncobj's TcpConnection does the same).
            self._poller.unsubscribe(descriptor)
            return
        if event & _ERROR:
            self.disconnect()
            return
        if not self._tcp_connected:
            if not event & (_READ | _WRITE):
                return
            sock = self._socket
            if sock is None or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            self._tcp_connected = True
        if event & _WRITE:
            self._flush()
            if self._state == _DISCONNECTED:
                return
        if event & _READ:
            self._read()
            if self._state == _DISCONNECTED:
                return
        self._update_interest()

    def _read(self) -> None:
        sock = self._socket
        channel = self._channel
        if sock is None or channel is None:
            return
        budget = self._options.read_budget_bytes
        chunk = self._options.receive_chunk_bytes
        while budget > 0:
            try:
                received = channel.receive_into(sock.recv_into, chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                logger.info("closing %s: receive failed: %s", self.peer_description, error)
                self.disconnect()
                return
            except ProtocolError as error:
                logger.warning("closing %s: %s", self.peer_description, error)
                self.disconnect()
                return
            if not received:
                self.disconnect()
                return
            self._last_read_time = self._clock()
            budget -= received
            if self._state == _CONNECTED:
                # frames as they complete: the receive buffer then holds about a chunk and a frame, not a
                # whole read budget (which it would grow to, then drop, then grow to again)
                self._deliver_frames(channel)
                if self._channel is not channel or self._state != _CONNECTED:
                    return
            if received < chunk:
                break  # drained: skip the syscall that would only say EAGAIN
        handshake_bytes = channel.data_to_send()
        if handshake_bytes:
            self._queue_raw(handshake_bytes)
            self._flush()
            if self._state == _DISCONNECTED:
                return
        if self._state == _CONNECTING and channel.established:
            self._state = _CONNECTED
            self._handshake_deadline = None
            # State is CONNECTED before the callback so that TCPTransport can send from inside it.
            if self._on_connected is not None:
                self._on_connected()
            if self._channel is not channel:
                return  # closed (and perhaps reconnected) by the callback
        if self._state == _CONNECTED:
            self._deliver_frames(channel)

    def _deliver_frames(self, channel: SecureChannel) -> None:
        while True:
            try:
                payload = channel.next_frame()
            except ProtocolError as error:
                logger.warning("closing %s: %s", self.peer_description, error)
                self.disconnect()
                return
            if payload is None:
                return
            if not payload:
                continue  # keepalive
            try:
                message = decode_message(payload)
            except Exception as error:  # unpickling raises many types; any of them means a broken peer
                logger.error("closing %s: undecodable authenticated frame: %r", self.peer_description, error)
                self.disconnect()
                return
            if self._on_message is not None:
                self._on_message(message)
            if self._channel is not channel:
                # Closed by the callback, and TCPTransport may already have reconnected this object:
                # frames left in the old channel belong to the old connection.
                return


class AuthenticatedServer:
    """The listening socket. Accepted connections are handed to the transport only once authenticated;
    until then the server owns them, at most ``handshakes_pending_max`` at a time (the oldest is evicted)."""

    def __init__(
        self,
        poller: Poller,
        host: str,
        port: int,
        *,
        options: ConnectionOptions,
        settings: TransportSettings,
        on_authenticated: Callable[[FramedConnection], None],
        clock: Callable[[], float] = time.monotonic,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._poller = poller
        self._host = host
        self._port = port
        self._family = _address_family(host)
        self._options = options
        self._settings = settings
        self._on_authenticated = on_authenticated
        self._clock = clock
        self._random_bytes = random_bytes
        self._socket: socket.socket | None = None
        self._fileno: int | None = None
        # Insertion-ordered, so the first key is the oldest pending handshake.
        self._pending: dict[FramedConnection, None] = {}

    @property
    def pending_handshakes(self) -> int:
        return len(self._pending)

    def bind(self) -> None:
        """Bind and listen; raises OSError if the address is taken (TCPTransport retries)."""
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._options.send_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._options.receive_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((self._host, self._port))
            sock.listen(self._settings.listen_backlog)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self._fileno = sock.fileno()
        self._poller.subscribe(self._fileno, self._on_listen_event, _READ | _ERROR)

    def unbind(self) -> None:
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        for connection in list(self._pending):
            connection.disconnect()
        self._pending.clear()

    def check_timers(self, now: float) -> None:
        for connection in list(self._pending):
            connection.check_timers(now)

    def _on_listen_event(self, descriptor: int, event: int) -> None:
        if descriptor != self._fileno or self._socket is None:
            return
        if event & _ERROR:
            logger.error("the Raft listening socket on %s:%d failed; closing it", self._host, self._port)
            self.unbind()
            return
        if event & _READ:
            self._accept(self._socket)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(self._settings.listen_backlog):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                # EMFILE and the like: keep listening, the backlog is retried on the next event.
                logger.warning("accept failed on %s:%d: %s", self._host, self._port, error)
                return
            try:
                _configure_socket(sock, self._options)
            except OSError:
                sock.close()
                continue
            if len(self._pending) >= self._settings.handshakes_pending_max:
                oldest = next(iter(self._pending))
                logger.warning("too many pending handshakes: evicting %s", oldest.peer_description)
                oldest.disconnect()
            connection = FramedConnection(
                self._poller,
                self._options,
                role=Role.ACCEPTOR,
                accepted_socket=sock,
                clock=self._clock,
                random_bytes=self._random_bytes,
            )
            connection.peer_description = f"{address[0]}:{address[1]}"
            connection.setOnConnectedCallback(functools.partial(self._on_handshake_done, connection))
            connection.setOnDisconnectedCallback(functools.partial(self._pending.pop, connection, None))
            self._pending[connection] = None

    def _on_handshake_done(self, connection: FramedConnection) -> None:
        self._pending.pop(connection, None)
        connection.setOnConnectedCallback(None)
        connection.setOnDisconnectedCallback(None)
        self._on_authenticated(connection)


class AuthenticatedTcpTransport(TCPTransport):  # type: ignore[misc]  # pysyncobj ships no type hints
    """pysyncobj's ``TCPTransport`` on :class:`FramedConnection` and :class:`AuthenticatedServer`.

    Constructed by ``SyncObj`` as ``transportClass(syncObj, selfNode, otherNodes)``; bind ``secret`` (and
    optionally ``settings``) first with :func:`transport_class`. The camelCase overrides are pysyncobj's
    names.
    """

    def __init__(
        self,
        syncObj: Any,
        selfNode: Any,
        otherNodes: Iterable[Any],
        *,
        secret: bytes,
        settings: TransportSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        random_bytes: Callable[[int], bytes] = os.urandom,
        group_clock: GroupClock | None = None,
    ) -> None:
        validate_secret(secret)
        settings = settings if settings is not None else TransportSettings()
        settings.validate()
        conf = syncObj.conf
        if conf.password is not None:
            raise ValueError(
                "SyncObjConf.password must be None: this transport authenticates with its own secret "
                "and does not use pysyncobj's encryptor"
            )
        # Set before TCPTransport.__init__, which calls addNode and _createServer below.
        self._settings = settings
        self._connection_options = ConnectionOptions.from_conf(conf, secret, settings)
        self._clock = clock
        self._random_bytes = random_bytes
        self._next_timer_check = 0.0
        self._group_clock = group_clock
        self._next_clock_send = 0.0
        #: peers' and the bind address's names, resolved at each connection attempt (dledger.addresses)
        self._resolver = Resolver()
        super().__init__(syncObj, selfNode, otherNodes)

    @property
    def connection_options(self) -> ConnectionOptions:
        return self._connection_options

    def _createServer(self) -> None:
        conf = self._syncObj.conf
        address = conf.bindAddress if conf.bindAddress is not None else self._selfNode.address
        try:
            host_port = split_host_port(address)
        except AddressError as error:
            raise ValueError(f"the Raft address {address!r} {error}") from None
        if host_port.host in WILDCARD_HOSTS:
            raise ValueError(
                f"refusing to bind the Raft port to the wildcard address {address!r}: "
                "configure the node's own address (or an explicit bindAddress)"
            )
        # a name is resolved once, here (while the member starts, not on the tick thread): the socket binds to
        # one address for the member's life
        try:
            _, resolved = lookup(host_port.host)[0]
        except (OSError, UnicodeError) as error:
            raise TransportNotReadyError(f"cannot resolve the bind address {host_port.host!r}: {error}") from None
        self._server = AuthenticatedServer(
            self._syncObj._poller,
            resolved,
            host_port.port,
            options=self._connection_options,
            settings=self._settings,
            on_authenticated=self._onNewIncomingConnection,
            clock=self._clock,
            random_bytes=self._random_bytes,
        )

    def _connectIfNecessarySingle(self, node: Any) -> bool:
        # TCPTransport._connectIfNecessarySingle, resolving the peer's host on every connection attempt
        # (pysyncobj caches names for dnsCacheTime, prefers IPv4 whatever it is told, and cannot read
        # "[v6]:port"): a peer that comes back under a new address is reached there on the next attempt.
        connection = self._connections.get(node)
        if connection is not None and connection.state != _DISCONNECTED:
            return True
        if not self._shouldConnect(node):
            return False
        now = time.monotonic()  # pysyncobj's own clock for connectionRetryTime (its monotonic is this one)
        last_attempt = self._lastConnectAttempt.get(node)
        if last_attempt is not None and now - last_attempt < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = now
        try:
            host_port = split_host_port(node.address)
        except AddressError:
            logger.warning("cannot connect to %s: not a host:port address", node.address)
            return False
        ip = self._resolver.resolve(host_port.host)
        if ip is None:
            error = self._resolver.last_error.get(host_port.host)
            if error is not None:
                logger.warning("cannot resolve %s (peer %s): %s", host_port.host, node.address, error)
            return False
        return bool(self._connections[node].connect(ip, host_port.port))

    def addNode(self, node: Any) -> None:
        # TCPTransport.addNode, with a FramedConnection instead of a TcpConnection.
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            connection = FramedConnection(
                self._syncObj._poller,
                self._connection_options,
                role=Role.INITIATOR,
                clock=self._clock,
                random_bytes=self._random_bytes,
            )
            connection.peer_description = node.address
            connection.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, connection))
            connection.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            connection.setOnDisconnectedCallback(functools.partial(self._onDisconnected, connection))
            self._connections[node] = connection

    def _onIncomingMessageReceived(self, conn: FramedConnection, message: object) -> None:
        # The first message identifies the peer: a node address, 'readonly' or a utility command list.
        # A member never sends anything else; refuse it here rather than fail deep inside TCPTransport
        # (an unhashable message would raise in the tick thread).
        identifies = isinstance(message, str) or (
            isinstance(message, list) and bool(message) and isinstance(message[0], str)
        )
        if not identifies:
            logger.warning("closing %s: first message does not identify a node", conn.peer_description)
            self._unknownConnections.discard(conn)
            conn.disconnect()
            return
        super()._onIncomingMessageReceived(conn, message)

    def _onNodeConnected(self, node: Any) -> None:
        self._send_clock(node)  # before anything else the member sends: a new leader needs it at once
        super()._onNodeConnected(node)

    def _onMessageReceived(self, node: Any, message: object) -> None:
        if self._group_clock is not None and node in self._nodes:
            reading = clock_reading(message)
            if reading is not None:
                self._group_clock.record(str(node.id), reading)
                return
        super()._onMessageReceived(node, message)

    def _send_clock(self, node: Any) -> None:
        if self._group_clock is not None:
            self.send(node, clock_message(self._group_clock.wall_clock_ms()))

    def _onTick(self) -> None:
        super()._onTick()
        now = self._clock()
        if self._group_clock is not None and now >= self._next_clock_send:
            self._next_clock_send = now + CLOCK_SAMPLE_INTERVAL_SECONDS
            for node in list(self._connections):
                if node in self._nodes:
                    self._send_clock(node)
        if now < self._next_timer_check:
            return
        self._next_timer_check = now + TIMER_CHECK_INTERVAL_SECONDS
        for connection in list(self._connections.values()) + list(self._unknownConnections):
            connection.check_timers(now)
        if self._server is not None:
            self._server.check_timers(now)


TransportFactory = Callable[[Any, Any, Iterable[Any]], AuthenticatedTcpTransport]


def transport_class(secret: bytes, settings: TransportSettings | None = None,
                    group_clock: GroupClock | None = None) -> TransportFactory:
    """What to pass as ``SyncObj(..., transportClass=...)``: the transport with ``secret`` bound (and the
    member's group clock, which it feeds with the peers' clocks).

    Raises at once (not later in pysyncobj's thread) for an empty or non-bytes secret or bad settings.
    """
    validate_secret(secret)
    if settings is not None:
        settings.validate()
    return functools.partial(AuthenticatedTcpTransport, secret=secret, settings=settings, group_clock=group_clock)
