"""A Raft group member for the transport tests, run as ``python -m tests.dledger.raft_member``.

It replicates a tiny state (entry count and a hash chain over every payload) with the authenticated
transport, and answers JSON-line requests on stdin with JSON lines on stdout. Logs go to stderr. It exits
when stdin closes, so a member never outlives the test that started it (the fixtures also kill it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import sys
import threading
import time
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj import SyncObj, replicated

from dledger.transport import TransportSettings, transport_class
from dledger.tuning import entry_size_max_bytes, tuned_conf

#: proposals one ``propose`` request keeps waiting for commit at once
IN_FLIGHT_ENTRIES_MAX = 32


class HashChainLog(SyncObj):  # type: ignore[misc]  # pysyncobj ships no type hints
    """Replicated state: how many entries were applied and a SHA-256 chain over their payloads."""

    def __init__(self, self_address: str, partner_addresses: list[str], conf: Any, transport: Any) -> None:
        super().__init__(self_address, partner_addresses, conf=conf, transportClass=transport)
        self.entry_count = 0
        self.payload_bytes = 0
        self.chain = b"\x00" * 32
        #: (entry_count, payload_bytes, chain) replaced in one assignment at the end of each apply, so the
        #: stdin thread never reads a count from one apply and a chain from the previous one
        self.published: tuple[int, int, bytes] = (0, 0, self.chain)

    @replicated  # type: ignore[untyped-decorator]
    def append(self, payload: bytes) -> int:
        self.entry_count += 1
        self.payload_bytes += len(payload)
        self.chain = hashlib.sha256(self.chain + payload).digest()
        self.published = (self.entry_count, self.payload_bytes, self.chain)
        return int(self.entry_count)

    def command_size_bytes(self, payload: bytes) -> int:
        """The length of the command pysyncobj stores for ``append(payload)``: type byte + pickle."""
        method_id = self._methodToID[self._getFuncName("append")]
        return 1 + len(pysyncobj_pickle.dumps((method_id, (payload,))))


class Proposer:
    """Proposes entries and waits for their callbacks, with a bounded number in flight."""

    def __init__(self, member: HashChainLog) -> None:
        self._member = member
        self._condition = threading.Condition()
        self._in_flight = 0
        self._acked = 0
        self._errors: dict[str, int] = {}

    def _on_result(self, result: Any, error: int) -> None:
        with self._condition:
            self._in_flight -= 1
            if error == 0:
                self._acked += 1
            else:
                self._errors[str(error)] = self._errors.get(str(error), 0) + 1
            self._condition.notify_all()

    def propose(self, payloads: list[bytes], timeout_seconds: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_seconds
        for payload in payloads:
            with self._condition:
                while self._in_flight >= IN_FLIGHT_ENTRIES_MAX:
                    if not self._condition.wait(timeout=max(0.0, deadline - time.monotonic())):
                        break
                self._in_flight += 1
            self._member.append(payload, callback=self._on_result)
        with self._condition:
            while self._in_flight > 0 and time.monotonic() < deadline:
                self._condition.wait(timeout=max(0.0, deadline - time.monotonic()))
            return {"acked": self._acked, "errors": dict(self._errors), "in_flight": self._in_flight}


def sized_payload(member: HashChainLog, command_size_bytes: int, seed: int) -> bytes:
    """Random binary payload whose stored command is as close to ``command_size_bytes`` as possible
    without exceeding it (protocol 2 stores a byte >= 0x80 as two, so the size is found by trimming)."""
    generator = random.Random(seed)
    payload = generator.randbytes(command_size_bytes)
    while (excess := member.command_size_bytes(payload) - command_size_bytes) > 0:
        payload = payload[: len(payload) - max(1, excess // 2)]
    return payload


def handle(member: HashChainLog, request: dict[str, Any]) -> dict[str, Any]:
    operation = request["op"]
    if operation == "status":
        entry_count, payload_bytes, chain = member.published
        status = member.getStatus()
        leader = status["leader"]
        return {
            "leader": None if leader is None else str(leader),
            "is_leader": status["state"] == 2,
            "has_quorum": bool(status["has_quorum"]),
            "entry_count": entry_count,
            "payload_bytes": payload_bytes,
            "chain": chain.hex(),
            "commit_index": status["commit_idx"],
            "last_applied": status["last_applied"],
            "ready": member.isReady(),
        }
    if operation == "propose":
        generator = random.Random(request["seed"])
        payloads = [generator.randbytes(request["size"]) for _ in range(request["count"])]
        return Proposer(member).propose(payloads, request["timeout"])
    if operation == "propose_sized":
        payload = sized_payload(member, request["command_size"], request["seed"])
        result = Proposer(member).propose([payload], request["timeout"])
        result["command_size"] = member.command_size_bytes(payload)
        result["entry_size_max"] = entry_size_max_bytes(member.conf)
        result["batch_size"] = member.conf.appendEntriesBatchSizeBytes
        return result
    raise ValueError(f"unknown op {operation!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--partner", dest="partners", action="append", default=[])
    parser.add_argument("--secret-hex", required=True)
    parser.add_argument("--entry-size-max", type=int, default=256 * 1024)
    parser.add_argument("--handshake-timeout", type=float, default=1.0)
    parser.add_argument("--output-buffer-max", type=int, default=TransportSettings().output_buffer_max_bytes)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    conf = tuned_conf(
        raft_min_timeout_seconds=0.3,
        raft_max_timeout_seconds=0.6,
        entry_size_max_bytes=arguments.entry_size_max,
        connection_retry_seconds=0.2,
    )
    settings = TransportSettings(
        handshake_timeout_seconds=arguments.handshake_timeout,
        output_buffer_max_bytes=arguments.output_buffer_max,
    )
    transport = transport_class(bytes.fromhex(arguments.secret_hex), settings)
    member = HashChainLog(arguments.self_address, arguments.partners, conf, transport)
    member.waitBinded()
    print(json.dumps({"started": arguments.self_address}), flush=True)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            if request["op"] == "quit":
                break
            print(json.dumps(handle(member, request)), flush=True)
    finally:
        member.destroy()


if __name__ == "__main__":
    main()
