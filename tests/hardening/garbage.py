"""Seeded garbage for a remoting port: what a fuzzer, a port scanner or a broken client sends.

Each connection gets one kind of garbage (:data:`KINDS`), drawn from a seeded ``random.Random``, so a
failing run can be replayed from its seed. Kinds: random bytes (mostly an absurd length prefix: the
broker must drop the connection), frames with random header bytes, well-framed JSON requests with
random codes, fields and bodies (they reach the processors), corpus frames with a few bytes changed,
a frame cut short then a half-close, and a connection closed at once.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Final

from protocol.codes import RequestCode
from tests.remoting import read_corpus

KINDS: Final = ("random", "random_header", "random_request", "mutated_corpus", "cut_short", "connect_only")
#: request codes the broker serves, plus some it does not: random requests aim at the processors
CODES: Final = [int(code) for code in RequestCode] + [0, -1, 9999, 32767]
FIELD_NAMES: Final = ["topic", "consumerGroup", "producerGroup", "queueId", "queueOffset", "maxMsgNums", "sysFlag",
                      "bornTimestamp", "properties", "batch", "offset", "commitOffset", "key", "msgId", "group",
                      "a", "b", "c", "d", "e", "f", "g", "h", "i", "m", "AccessKey", "Signature", "readQueueNums",
                      "writeQueueNums", "perm", "timestamp", "suspendTimeoutMillis", "subscription"]
#: topics and groups garbage may name: never the workload's
GARBAGE_NAMES: Final = ["garbage", "TBW102", "%RETRY%garbage", "%DLQ%garbage", "RMQ_SYS_TRANS_HALF_TOPIC",
                        "SCHEDULE_TOPIC_XXXX", "", " ", "x" * 300]
READ_TIMEOUT_SECONDS: Final = 0.2


def _text(rng: random.Random) -> str:
    choice = rng.random()
    if choice < 0.3:
        return rng.choice(GARBAGE_NAMES)
    if choice < 0.6:
        return str(rng.choice([0, -1, 1, 2**31, -(2**63), 2**64, rng.randrange(-1000, 1000)]))
    return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(0, 40)))


def random_request(rng: random.Random) -> bytes:
    header: dict[str, object] = {"code": rng.choice(CODES), "language": rng.choice(["JAVA", "CPP", "X", 3]),
                                 "version": rng.randrange(0, 500), "opaque": rng.randrange(0, 2**31),
                                 "flag": rng.choice([0, 0, 0, 2, 1, 7]),
                                 "extFields": {rng.choice(FIELD_NAMES): _text(rng) for _ in range(rng.randrange(0, 12))}}
    if rng.random() < 0.2:
        del header[rng.choice(list(header))]
    body_kind = rng.random()
    if body_kind < 0.4:
        body = rng.randbytes(rng.randrange(0, 600))
    elif body_kind < 0.8:
        body = json.dumps({"clientID": _text(rng), "consumerGroup": _text(rng),
                           "consumerDataSet": [{"groupName": _text(rng), "subscriptionDataSet": [{"topic": _text(rng)}]}],
                           "mqSet": [{"topic": _text(rng), "brokerName": _text(rng), "queueId": rng.randrange(-3, 9)}]
                           }).encode()
    else:
        body = b""
    encoded = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(encoded) + len(body), len(encoded)) + encoded + body


def random_header(rng: random.Random) -> bytes:
    header = rng.randbytes(rng.randrange(0, 200))
    serialize = rng.choice([0, 1, 2, 255])
    body = rng.randbytes(rng.randrange(0, 100))
    return struct.pack(">iI", 4 + len(header) + len(body), serialize << 24 | len(header)) + header + body


_CORPUS_FRAMES: list[bytes] = []


def mutated_corpus(rng: random.Random) -> bytes:
    if not _CORPUS_FRAMES:
        _CORPUS_FRAMES.extend(entry.data for entry in read_corpus())
    data = bytearray(rng.choice(_CORPUS_FRAMES))
    for _ in range(rng.randrange(1, 6)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def payload(kind: str, rng: random.Random) -> bytes:
    if kind == "random":
        return rng.randbytes(rng.randrange(1, 4096))
    if kind == "random_header":
        return b"".join(random_header(rng) for _ in range(rng.randrange(1, 8)))
    if kind == "random_request":
        return b"".join(random_request(rng) for _ in range(rng.randrange(1, 16)))
    if kind == "mutated_corpus":
        return b"".join(mutated_corpus(rng) for _ in range(rng.randrange(1, 8)))
    if kind == "cut_short":
        frame = random_request(rng)
        return frame[: rng.randrange(1, len(frame))]
    return b""


@dataclass
class GarbageSender:
    """Threads that keep opening connections to ``addresses`` and sending garbage until :meth:`stop`."""

    addresses: list[str]
    seed: int
    threads: int = 4
    connections: int = 0
    bytes_sent: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(random.Random(self.seed * 1000 + index),),
                                      name=f"garbage-{index}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=10)
        assert not any(worker.is_alive() for worker in self._workers), "a garbage thread did not stop"

    def _run(self, rng: random.Random) -> None:
        while not self._stop.is_set():
            address = rng.choice(self.addresses)
            kind = rng.choice(KINDS)
            data = payload(kind, rng)
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=2.0) as connection:
                    if data:
                        connection.sendall(data)
                    if kind == "cut_short":
                        connection.shutdown(socket.SHUT_WR)
                    connection.settimeout(READ_TIMEOUT_SECONDS)
                    with contextlib.suppress(OSError):  # timeouts and resets are what garbage gets
                        while connection.recv(65536):
                            pass
            except OSError:
                pass  # refused or reset: the broker may drop garbage however it likes
            with self._lock:
                self.connections += 1
                self.bytes_sent += len(data)
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
