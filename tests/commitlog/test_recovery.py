"""Recovery: process crashes at every step of an append, torn tails, damaged checkpoints, deleted derived
files. Nothing that was reported appended may be lost after a process crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commitlog.errors import CorruptionError, StoreError
from commitlog.outcomes import GetStatus
from commitlog.record_codec import decode_record
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, small_config, tree_bytes

REPO = Path(__file__).resolve().parents[2]


def run_child(directory: Path, crash_point: str, crash_after: int, seed: int) -> list[tuple[int, int, int, int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, "-m", "tests.commitlog.crash_child", str(directory), crash_point, str(crash_after), str(seed)],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO,
    )
    assert completed.returncode == -9, completed.stderr
    return [tuple(map(int, line.split())) for line in completed.stdout.splitlines()]  # type: ignore[misc]


def all_records(store: MessageStore) -> dict[int, bytes]:
    """Physical offset -> raw record, through every consume queue."""
    found = {}
    for topic, queue_id in store.queue_ids():
        offset = store.min_queue_offset(topic, queue_id)
        while True:
            got = store.get_messages(topic, queue_id, offset, 64)
            if got.status is not GetStatus.FOUND:
                break
            for raw in got.messages:
                found[decode_record(raw).physical_offset] = raw
            offset = got.next_begin_offset
    return found


@pytest.mark.parametrize(
    ("crash_point", "crash_after", "seed"),
    [("between", 30, 1), ("after-write", 25, 2), ("before-marker", 40, 3), ("between", 3, 4), ("after-write", 0, 5)],
)
def test_process_crash_loses_nothing_reported(tmp_path: Path, crash_point: str, crash_after: int, seed: int) -> None:
    directory = tmp_path / "store"
    reported = run_child(directory, crash_point, crash_after, seed)
    store = MessageStore(small_config(directory))
    last_reported_index = max((row[0] for row in reported), default=0)
    # the crashed append was never reported: it is cut, and Raft would replay it
    assert store.applied_raft_index == last_reported_index
    records = all_records(store)
    assert set(records) == {row[1] for row in reported}
    for raft_index, physical, queue_offset, size in reported:
        decoded = decode_record(records[physical])
        assert (decoded.queue_offset, decoded.total_size) == (queue_offset, size)
        assert decoded.born_timestamp // 1000 - 1_700_000_000 == raft_index
    # queues continue without gaps
    next_offsets = {key: store.max_queue_offset(*key) for key in store.queue_ids()}
    outcome = store.append(store.applied_raft_index + 1, [message(1, queue_id=q) for q in range(4)])
    for result, queue_id in zip(outcome.results, range(4), strict=True):
        assert result.queue_offset == next_offsets.get(("TopicTest", queue_id), 0)
    # and a second crash-free reopen agrees
    store.close()
    again = MessageStore(small_config(directory))
    assert set(all_records(again)) == set(records) | {r.physical_offset for r in outcome.results}


def fill(directory: Path, batches: int, flush_every: int = 0) -> MessageStore:
    store = MessageStore(small_config(directory))
    for index in range(1, batches + 1):
        store.append(index, [message(index * 100 + j, queue_id=j % 3, body=os.urandom(700)) for j in range(5)])
        if flush_every and index % flush_every == 0:
            store.flush()
    return store


def test_corrupted_tail_falls_back_to_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    store = fill(directory, 40, flush_every=30)  # checkpoint at index 30, marker at 40
    durable_end = 30 * 5
    last = store.read_message(max(all_records(store)))
    segment = store.config.segment_size_bytes
    path = directory / "commitlog" / f"{last.physical_offset - last.physical_offset % segment:020d}"
    with open(path, "r+b") as handle:  # a power loss left garbage in an unflushed page
        handle.seek(last.physical_offset % segment + 100)
        handle.write(b"\xde\xad")
    store.abandon()  # a crash: no flush, no close
    recovered = MessageStore(small_config(directory))
    assert recovered.applied_raft_index == 30
    assert len(all_records(recovered)) == durable_end
    assert sum(recovered.max_queue_offset("TopicTest", q) for q in range(3)) == durable_end
    # Raft replays 31..40 and the replica converges on the same content
    replay = fill(tmp_path / "clean", 40)
    for index in range(31, 41):
        assert recovered.append(index, [message(index * 100 + j, queue_id=j % 3, body=b"r") for j in range(5)]).applied
    assert sum(recovered.max_queue_offset("TopicTest", q) for q in range(3)) == 200
    replay.close()


def test_zeroed_tail_falls_back_to_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    store = fill(directory, 25, flush_every=10)  # checkpoint at 20, marker at 25
    end = store.max_physical_offset
    durable = 20 * 5
    records = sorted(all_records(store))
    start = records[durable]
    segment = store.config.segment_size_bytes
    for offset in range(start - start % segment, end, segment):  # pages that never reached the disk
        path = directory / "commitlog" / f"{offset:020d}"
        with open(path, "r+b") as handle:
            local = max(start, offset) - offset
            handle.seek(local)
            handle.write(bytes(min(segment, end - offset) - local))
    store.abandon()  # a crash: no flush, no close
    recovered = MessageStore(small_config(directory))
    assert recovered.applied_raft_index == 20 and len(all_records(recovered)) == durable


def test_damaged_checkpoint_is_repaired_from_the_marker(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    store = fill(directory, 30, flush_every=10)
    expected = all_records(store)
    store.close()
    raw = bytearray((directory / "checkpoint").read_bytes())
    raw[10] ^= 0xFF
    (directory / "checkpoint").write_bytes(bytes(raw))
    recovered = MessageStore(small_config(directory))
    assert recovered.applied_raft_index == 30 and all_records(recovered) == expected
    recovered.close()
    (directory / "checkpoint").write_bytes(b"garbage")
    (directory / "apply.pos").unlink()
    with pytest.raises(CorruptionError, match="wipe this replica's data directory"):
        MessageStore(small_config(directory))


def test_missing_checkpoint_with_marker_validates_everything(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    store = fill(directory, 12, flush_every=5)
    expected = all_records(store)
    (directory / "checkpoint").unlink()
    store.abandon()  # a crash: no flush, no close
    recovered = MessageStore(small_config(directory))
    assert recovered.applied_raft_index == 12 and all_records(recovered) == expected


@pytest.mark.parametrize("victim", ["consumequeue", "index", "one-queue-file", "both"])
def test_deleted_derived_files_are_rebuilt_identically(tmp_path: Path, victim: str) -> None:
    directory = tmp_path / "s"
    store = fill(directory, 120)
    store.close()
    before = tree_bytes(directory)
    queue_files = sorted((directory / "consumequeue" / "TopicTest" / "1").iterdir())
    assert len(queue_files) > 2 and len(list((directory / "index").iterdir())) > 2
    if victim in ("consumequeue", "both"):
        shutil.rmtree(directory / "consumequeue")
    if victim in ("index", "both"):
        shutil.rmtree(directory / "index")
    if victim == "one-queue-file":
        queue_files[1].unlink()
    rebuilt = MessageStore(small_config(directory))
    rebuilt.close()
    after = tree_bytes(directory)
    derived = {k: v for k, v in before.items() if k.startswith(("consumequeue", "index"))}
    assert {k: v for k, v in after.items() if k.startswith(("consumequeue", "index"))} == derived
    reopened = MessageStore(small_config(directory))
    assert len(reopened.query_by_key("TopicTest", "key-5003", 2)) == 1


def test_short_segment_file_is_a_clear_error(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    fill(directory, 3).close()
    segment = directory / "commitlog" / f"{0:020d}"
    os.truncate(segment, 1000)
    with pytest.raises(StoreError, match="has 1000 bytes, expected"):
        MessageStore(small_config(directory))


def test_clean_reopen_does_not_scan_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "s"
    fill(directory, 50).close()
    scanned: list[int] = []
    from commitlog import commit_log, record_codec

    original = record_codec.decode_record

    def counting(*args: object, **kwargs: object) -> object:
        scanned.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(commit_log, "decode_record", counting)
    MessageStore(small_config(directory))
    assert scanned == []
