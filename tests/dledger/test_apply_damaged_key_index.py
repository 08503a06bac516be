"""Apply decides nothing from a key index it has not checked (issue #24): a key-index file with bytes gone bad
(an entry's offset or hash, a slot, a link between entries) never makes a retried send stored again on one
replica only, nor stops the member with a damaged record no peer can repair. Two replicas fed the same entries,
one with a damaged index file, end byte-identical, their index files included (the damaged file is rebuilt
from the commit log).

New names are reached through their modules, so that each test runs its replicas and fails on its assertions
where the checks are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from commitlog.message import MessageInput
from commitlog.records import RecordBuilder
from commitlog.store import MessageStore
from dledger.apply import StateMachine
from dledger.command import Command, Messages, encode_command, encode_records_command
from dledger.state import ReplicatedState
from tests.commitlog.helpers import data_bytes, small_config
from tests.commitlog.key_index_damage import (
    DAMAGES,
    MESSAGES,
    damage,
    entry_of,
    linked_entry,
    stored_message,
    uniq_key,
    with_newer_in_bucket,
    write_at,
)
from tests.support.apply_paths import both_apply_paths  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("both_apply_paths")

BASE_MS = 1_700_000_000_000


def machine(directory: Path) -> StateMachine:
    """A replica's apply over its store (reopened from what is on disk, state included)."""
    state = ReplicatedState()
    store = MessageStore(small_config(directory), extension_provider=lambda: state.encode(), background_flush=False)
    if store.extension:
        state = ReplicatedState.decode(store.extension)
    return StateMachine(store, state)


def sent(number: int) -> MessageInput:
    return stored_message(number)._replace(store_timestamp=BASE_MS + number * 10)


def filled(directory: Path) -> StateMachine:
    sm = machine(directory)
    for number in range(MESSAGES):
        sm.apply(number + 1, encode_command(Command((Messages((sent(number),)),))))
    return sm


def retried(stored: MessageInput, as_records: bool, tmp_path: Path) -> bytes:
    """A client's retry of ``stored`` (same UNIQ_KEY and content, a second later), as a follower receives it."""
    retry = stored._replace(store_timestamp=BASE_MS + MESSAGES * 10 + 1000, queue_id=1)
    if not as_records:
        return encode_command(Command((Messages((retry,)),)))
    config = small_config(tmp_path)
    records = RecordBuilder(config.store_host_bytes, config.segment_size_bytes,
                            config.body_size_max_bytes).build([retry], retry.store_timestamp)
    assert records is not None
    return encode_records_command(records)


def target(sm: StateMachine, kind: str) -> int:
    """The message whose index entries the damage is aimed at: one in an older file, not the newest."""
    return with_newer_in_bucket(sm.store.index) if kind == "next pointer" else 40


@pytest.mark.parametrize("as_records", [False, True], ids=["messages", "records"])
@pytest.mark.parametrize("kind", DAMAGES)
def test_a_retry_is_decided_as_on_a_healthy_replica_after_a_restart_with_a_damaged_index(
        tmp_path: Path, kind: str, as_records: bool) -> None:
    """Damage at rest (a member stopped, a byte gone bad, the member restarted): the retry of a message whose
    key the damage hides, or points elsewhere, is not stored again, and apply does not stop."""
    healthy, damaged = filled(tmp_path / "a"), filled(tmp_path / "b")
    number = target(damaged, kind)
    for sm in (healthy, damaged):
        sm.store.close()
    damage(damaged.store.index, number, kind)  # (the closed store's paths: the files on disk)
    healthy, damaged = machine(tmp_path / "a"), machine(tmp_path / "b")
    since = healthy.store.max_physical_offset
    retry = retried(sent(number), as_records, tmp_path)
    for sm in (healthy, damaged):
        sm.apply(MESSAGES + 1, retry)  # before the fix: stored again, or DamagedRecordError (entry offset)
        sm.store.flush()
    assert healthy.store.max_queue_offset("TopicTest", 1) == 0  # the retry was not stored again
    assert damaged.store.max_physical_offset == since  # nor on the damaged replica
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")  # the damaged file rebuilt as it was
    for sm in (healthy, damaged):
        sm.store.close()


@pytest.mark.parametrize("kind", ["entry offset", "slot past the entries", "link forward"])
def test_damage_a_running_replica_meets_in_a_lookup_is_repaired_before_apply_decides(tmp_path: Path, kind: str) -> None:
    """Damage while the member runs, that the lookup itself meets: an entry naming no record (before: a
    DamagedRecordError no peer could repair, at every replay), a slot naming an entry past the file's count
    (before: an empty bucket), an entry linking forward (before: the chain cut there). Each made the retry
    stored again, or stopped apply."""
    healthy, damaged = filled(tmp_path / "a"), filled(tmp_path / "b")
    index = damaged.store.index
    number = with_newer_in_bucket(index) if kind == "link forward" else 40
    ours = entry_of(index, uniq_key(number))
    if kind == "entry offset":
        damage(index, number, "entry offset")
    elif kind == "slot past the entries":
        write_at(ours.path, ours.slot_at, (index.entry_capacity + 7).to_bytes(4, "big"))
    else:  # the newer entry of its bucket that links to it links forward instead
        _, newer = linked_entry(index, number)
        write_at(newer.path, newer.entry_at + 16, (newer.number + 3).to_bytes(4, "big"))
    since = healthy.store.max_physical_offset
    retry = retried(sent(number), False, tmp_path)
    for sm in (healthy, damaged):
        sm.apply(MESSAGES + 1, retry)
        sm.store.flush()
    assert damaged.store.max_physical_offset == healthy.store.max_physical_offset == since
    assert data_bytes(tmp_path / "a") == data_bytes(tmp_path / "b")
    for sm in (healthy, damaged):
        sm.store.close()
