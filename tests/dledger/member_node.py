"""A group member process for the replication tests: ``python -m tests.dledger.member_node CONFIG ACKLOG``.

A load thread submits messages whenever this member leads (``load on``) and appends one line per
acknowledged message to ACKLOG: ``producer sequence queue_id queue_offset physical_offset``, the producer
being ``<node id>.<pid>`` (each incarnation of a member is its own producer, with its own sequence). Control on
stdin, one command per line, answered with one JSON line on stdout: ``status``, ``load on``, ``load off``,
``latency`` (p50/p99 of acknowledgement latency since the last call, recorded while the load is paced by
RAFTMQ_TEST_RATE),
``large BYTES`` (append one message of that body size and wait), ``transfer``, ``stop``. It exits when
stdin closes, so it never outlives the test (the fixtures also kill it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path

from client.figures import percentile
from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult, AppendStatus
from dledger.config import NodeConfig
from dledger.future import AppendFuture
from dledger.group_commit import AppendError
from dledger.member import GroupMember
from dledger.tuning import tune_process_gc

QUEUES = 4
IN_FLIGHT_MAX = int(os.environ.get("RAFTMQ_TEST_IN_FLIGHT", "256"))
#: messages per request (a batch send); 1 = one send per message
REQUEST_MESSAGES = int(os.environ.get("RAFTMQ_TEST_REQUEST_MESSAGES", "1"))
#: whether each acknowledged message gets its ACKLOG line (the tests read them; benchmarks turn this off:
#: formatting and writing the lines cost the leader's process time per message, which no real caller pays)
ACK_LOG = os.environ.get("RAFTMQ_TEST_ACK_LOG", "1") != "0"
#: requests the load submits in a row once there is room for them
BURST_MAX = 64
#: messages per second the load submits (0: as fast as the in-flight bound allows)
RATE = float(os.environ.get("RAFTMQ_TEST_RATE", "0"))
#: random 1 KiB bodies (fixed seed), each entry's worth distinct: a batch does not compress (lz4's window is
#: 64 KiB), as with real payloads
_RANDOM = random.Random(7)
BODIES = tuple(_RANDOM.randbytes(1024) for _ in range(512))


BORN_HOST = encode_host("127.0.0.1", 1)


def message(node: str | bytes, sequence: int, body: bytes | None = None) -> MessageInput:
    # built the way a remoting decoder hands a send over: fields as they came, properties as encoded bytes
    return MessageInput("ReplicationTest", sequence % QUEUES, 0, 0, sequence, BORN_HOST, 0, 0, 0,
                        BODIES[sequence % len(BODIES)] if body is None else body,
                        b"UNIQ_KEY\x01%s-%d\x02TAGS\x01t\x02"
                        % (node.encode() if isinstance(node, str) else node, sequence))


def acknowledged(future: AppendFuture[tuple[AppendResult, ...]]) -> tuple[AppendResult, ...]:
    """The results of a done append (none when it failed), each checked to be stored."""
    try:
        results = future.result()
    except AppendError:
        return ()
    for result in results:
        if result.status is not AppendStatus.OK:
            raise AssertionError(f"an acknowledged append has status {result.status}")
    return results


class Load:
    def __init__(self, member: GroupMember, log_path: Path) -> None:
        self.member = member
        self.node = f"{member.config.id}.{os.getpid()}"  # a restarted member is a new producer
        self.node_bytes = self.node.encode()
        # Buffered: a SIGKILL can lose the last lines, so the tests check fewer acknowledged messages,
        # never ones that were not acknowledged. Flushed on every status request and at stop.
        self.log = open(log_path, "a", buffering=1 << 16)  # noqa: SIM115 - lives as long as the process
        self.enabled = threading.Event()
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # notified when the load waits for in-flight room
        self.waiting = False
        self.in_flight = 0  # requests submitted and not answered
        self.sequence = 0
        self.next_send = time.monotonic()
        self.acked = 0
        self.failed = 0
        self.latencies: list[float] = []  # seconds from submit to acknowledgement, since the last read
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        while True:
            self.enabled.wait()
            if not self.member.is_leader:
                time.sleep(0.005)  # a load generator polling for leadership, not a test waiting
                continue
            with self.room:
                while self.in_flight >= IN_FLIGHT_MAX:
                    self.waiting = True
                    self.room.wait()
                # Room for several requests: taken at once, so the lock is not taken per request. Each
                # request is still its own append with its own future, as concurrent callers make them.
                burst = 1 if RATE else min(IN_FLIGHT_MAX - self.in_flight, BURST_MAX)
                self.in_flight += burst
            for submitted in range(burst):
                if RATE:
                    time.sleep(max(0.0, self.next_send - time.monotonic()))  # pacing the offered load
                    self.next_send = max(self.next_send, time.monotonic() - 1) + REQUEST_MESSAGES / RATE
                if not self.enabled.is_set() or not self.submit():
                    with self.room:
                        self.in_flight -= burst - submitted  # this one and the rest were not submitted
                    time.sleep(0.005)
                    break

    def submit(self) -> bool:
        sequence = self.sequence
        self.sequence += REQUEST_MESSAGES
        started = time.monotonic() if RATE else 0.0
        node = self.node_bytes
        # A throughput run (no ACKLOG, no pacing) needs neither the sequence nor the time in its callback:
        # then the callback is a bound method, not a partial with its own arguments per send.
        callback = functools.partial(self.done, sequence, started) if ACK_LOG or RATE else self.counted
        try:
            self.member.append([message(node, sequence + i) for i in range(REQUEST_MESSAGES)]
                               if REQUEST_MESSAGES > 1 else (message(node, sequence),), callback)
        except AppendError:
            with self.lock:
                self.failed += 1
            return False
        return True

    def counted(self, future: AppendFuture[tuple[AppendResult, ...]]) -> None:
        """``done`` for a throughput run: checks and counts, no lines, no latency."""
        results = acknowledged(future)
        with self.lock:
            self.in_flight -= 1
            if self.waiting:
                self.waiting = False
                self.room.notify()
            if results:
                self.acked += len(results)
            else:
                self.failed += REQUEST_MESSAGES

    def done(self, sequence: int, started: float, future: AppendFuture[tuple[AppendResult, ...]]) -> None:
        latency = time.monotonic() - started if RATE else 0.0
        results = acknowledged(future)
        lines = "".join([f"{self.node} {number} {number % QUEUES} {result.queue_offset} {result.physical_offset}\n"
                         for number, result in enumerate(results, start=sequence)]) if ACK_LOG else ""
        with self.lock:
            self.in_flight -= 1
            if self.waiting:
                self.waiting = False
                self.room.notify()
            if not results:
                self.failed += REQUEST_MESSAGES
                return
            if RATE and len(self.latencies) < 1_000_000:  # the latency run is a paced one
                self.latencies.append(latency)
            self.acked += len(results)
            if lines:
                self.log.write(lines)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dledger.member").setLevel(logging.INFO)  # role changes and catch-ups
    if "RAFTMQ_TEST_SWITCH_INTERVAL" in os.environ:
        sys.setswitchinterval(float(os.environ["RAFTMQ_TEST_SWITCH_INTERVAL"]))
    config = NodeConfig.from_toml(Path(sys.argv[1]))
    member = GroupMember(config)
    tune_process_gc()
    load = Load(member, Path(sys.argv[2]))
    for line in sys.stdin:
        command = line.split()
        reply: dict[str, object] = {}
        if command == ["status"]:
            with load.lock:
                load.log.flush()
            status = member.status()
            reply = {"role": status.role, "term": status.term, "leader": status.leader,
                     "commit_index": status.commit_index, "applied_index": status.applied_index,
                     "end": status.commit_log_max_offset, "acked": load.acked, "failed": load.failed,
                     "in_flight": load.in_flight,
                     "proposed_entries": member.committer.proposed_entries,
                     "proposed_messages": member.committer.proposed_messages,
                     "raft_applied": member.raft.raftLastApplied,
                     "entries_received": member.raft.entries_received,
                     "entries_already_held": member.raft.entries_already_held,
                     "append_entries_rounds": member.raft.append_entries_rounds,
                     "ticks": member.raft.ticks,
                     "journal_syncs": member.journal_syncs}
        elif command == ["load", "on"]:
            load.enabled.set()
        elif command == ["load", "off"]:
            load.enabled.clear()
        elif command[:1] == ["large"]:
            try:
                (result,) = member.append([message(load.node, 10**9, b"L" * int(command[1]))]).result(timeout=60)
                reply = {"status": result.status.value, "offset": result.physical_offset, "size": result.size}
            except AppendError as exc:
                reply = {"error": str(exc)}
        elif command == ["latency"]:
            with load.lock:
                latencies, load.latencies = load.latencies, []
            if latencies:
                reply = {"count": len(latencies), "p50_ms": 1000 * percentile(latencies, 0.50),
                         "p99_ms": 1000 * percentile(latencies, 0.99)}
        elif command == ["transfer"]:
            member.transfer_leadership()
        elif command == ["stop"]:
            load.enabled.clear()
            member.stop()
            with load.lock:
                load.log.flush()
            print(json.dumps({"stopped": True}), flush=True)
            return
        print(json.dumps(reply), flush=True)
    member.stop()


if __name__ == "__main__":
    main()
