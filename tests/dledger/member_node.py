"""A group member process for the replication tests: ``python -m tests.dledger.member_node CONFIG ACKLOG``.

A load thread submits messages whenever this member leads (``load on``) and appends one line per
acknowledged message to ACKLOG: ``producer sequence queue_id queue_offset physical_offset``, the producer
being ``<node id>.<pid>`` (each incarnation of a member is its own producer, with its own sequence). Control on
stdin, one command per line, answered with one JSON line on stdout: ``status``, ``load on``, ``load off``,
``large BYTES`` (append one message of that body size and wait), ``transfer``, ``stop``. It exits when
stdin closes, so it never outlives the test (the fixtures also kill it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from commitlog.message import MessageInput, encode_host, encode_properties
from commitlog.store import AppendResult, AppendStatus
from dledger.config import NodeConfig
from dledger.group_commit import AppendError
from dledger.member import GroupMember

QUEUES = 4
IN_FLIGHT_MAX = 256
BODY = bytes(range(256)) * 4  # 1 KiB


def message(node: str, sequence: int, body: bytes = BODY) -> MessageInput:
    return MessageInput(
        topic="ReplicationTest", queue_id=sequence % QUEUES, flag=0, sys_flag=0, born_timestamp=sequence,
        born_host=encode_host("127.0.0.1", 1), store_timestamp=0, reconsume_times=0, prepared_transaction_offset=0,
        body=body, properties=encode_properties({"UNIQ_KEY": f"{node}-{sequence}", "TAGS": "t"}),
    )


class Load:
    def __init__(self, member: GroupMember, log_path: Path) -> None:
        self.member = member
        self.node = f"{member.config.id}.{os.getpid()}"  # a restarted member is a new producer
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self.enabled = threading.Event()
        self.slots = threading.BoundedSemaphore(IN_FLIGHT_MAX)
        self.lock = threading.Lock()
        self.sequence = 0
        self.acked = 0
        self.failed = 0
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        while True:
            self.enabled.wait()
            if not self.member.is_leader:
                time.sleep(0.005)  # a load generator polling for leadership, not a test waiting
                continue
            self.slots.acquire()
            sequence = self.sequence
            self.sequence += 1
            try:
                future = self.member.append([message(self.node, sequence)])
            except AppendError:
                self.slots.release()
                with self.lock:
                    self.failed += 1
                time.sleep(0.005)
                continue
            future.add_done_callback(functools.partial(self.done, sequence))

    def done(self, sequence: int, future: Future[tuple[AppendResult, ...]]) -> None:
        self.slots.release()
        try:
            (result,) = future.result()
        except AppendError:
            with self.lock:
                self.failed += 1
            return
        assert result.status is AppendStatus.OK
        with self.lock:
            self.acked += 1
            self.log.write(f"{self.node} {sequence} {sequence % QUEUES} {result.queue_offset} {result.physical_offset}\n")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dledger.member").setLevel(logging.INFO)  # role changes and catch-ups
    config = NodeConfig.from_toml(Path(sys.argv[1]))
    member = GroupMember(config)
    load = Load(member, Path(sys.argv[2]))
    for line in sys.stdin:
        command = line.split()
        reply: dict[str, object] = {}
        if command == ["status"]:
            status = member.status()
            reply = {"role": status.role, "term": status.term, "leader": status.leader,
                     "commit_index": status.commit_index, "applied_index": status.applied_index,
                     "end": status.commit_log_max_offset, "acked": load.acked, "failed": load.failed,
                     "in_flight": load.sequence - load.acked - load.failed,
                     "raft_applied": member.raft.raftLastApplied}
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
        elif command == ["transfer"]:
            member.transfer_leadership()
        elif command == ["stop"]:
            load.enabled.clear()
            member.stop()
            print(json.dumps({"stopped": True}), flush=True)
            return
        print(json.dumps(reply), flush=True)
    member.stop()


if __name__ == "__main__":
    main()
