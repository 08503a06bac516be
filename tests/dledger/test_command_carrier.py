"""Commands reach pysyncobj's log as raw bytes; entries of the older int carrier still apply.

Three members in this process: one command proposed each way, both applied in order on every member (the
leader's own entry from its remembered decoded form), and the stores byte-identical."""

from __future__ import annotations

import threading
from pathlib import Path

from commitlog.hosts import encode_host
from commitlog.message import MessageInput
from dledger.apply import ApplyResult
from dledger.command import encode_messages_command
from dledger.journal import SegmentedJournal
from dledger.raft_node import RAW_COMMAND_PREFIX, encode_payload
from tests.dledger.group import SECRET
from tests.support.in_process_group import running_members
from tests.support.process_group import member_configs
from tests.support.waiting import wait_for


def message(sequence: int) -> MessageInput:
    return MessageInput("Carrier", 0, 0, 0, sequence, encode_host("127.0.0.1", 1), 0, 0, 0, bytes([sequence]) * 300,
                        b"UNIQ_KEY\x01carrier-%d\x02" % sequence)


def test_raw_and_int_carried_commands_both_apply_in_order(tmp_path: Path) -> None:
    # small files: the defaults preallocate a 1 GiB segment and large index files per member
    store = {"segment_size_bytes": 2097152, "body_size_max_bytes": 1048576, "consume_queue_units_per_file": 1000,
             "index_slot_count": 1000, "index_entry_capacity": 4000}
    configs = member_configs(tmp_path, 3, secret=SECRET, sections={"store": store})
    with running_members([config.path for config in configs]) as members:
        leader = wait_for(lambda: next((m for m in members if m.is_leader), None), "a leader",
                          timeout_seconds=60)
        applied: list[tuple[ApplyResult | None, int]] = []
        done = threading.Event()

        def on_result(result: ApplyResult | None, reason: int) -> None:
            applied.append((result, reason))
            done.set()

        older = encode_messages_command([message(1)], store_timestamp=1_000)
        leader.raft.apply_command(encode_payload(older), callback=on_result)  # as earlier versions proposed
        assert done.wait(30)
        (result,) = leader.append([message(2)]).result(timeout=30)  # the raw path, with the own shortcut
        assert [reason for _, reason in applied] == [0]
        first = applied[0][0]
        assert first is not None and first.message_results and first.message_results[0][0].queue_offset == 0
        assert result.queue_offset == 1
        end = leader.store.max_physical_offset
        wait_for(lambda: all(m.store.max_physical_offset == end for m in members),
                 "every member to apply both", timeout_seconds=30)
        for member in members:  # followers decoded both carriers to the same records
            stored = [member.store.read_message(r.physical_offset) for r in (first.message_results[0][0], result)]
            assert [m.body for m in stored] == [bytes([1]) * 300, bytes([2]) * 300]
            assert member.store.read_committed(0, end) == leader.store.read_committed(0, end)
        assert RAW_COMMAND_PREFIX[0] == 0  # pysyncobj's REGULAR command type: its own checks pass it through
        assert all(isinstance(m.raft._SyncObj__raftLog, SegmentedJournal) for m in members)  # ours, not pysyncobj's
