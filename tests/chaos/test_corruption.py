"""chaos.corruption on a member directory laid out by hand: which files each kind finds, what each damage does
to a file (and reports), roll-backs from saved copies, and that a seed replays the same damage."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos import corruption
from chaos.corruption import (
    BIT_FLIP,
    DAMAGE_KINDS,
    FILE_KINDS,
    ROLL_BACK,
    TRUNCATE,
    RollbackArchive,
    bytes_match,
    damage_file,
    differing_range,
    files_of_kind,
    used_bytes,
)

SEGMENT_BYTES = 4096
#: one file of each kind, as a member lays them out (relative path -> contents)
LAYOUT: dict[str, bytes] = {
    "raft/journal.d/00000000000000000001.seg": b"RMQJSEG1" + bytes(range(256)) * 4,
    "raft/journal.d/00000000000000000900.seg": b"RMQJSEG1" + b"\x07" * 100,
    "raft/journal.d/manifest": b"RMQJMAN1" + b"\x01" * 60,
    "raft/journal.d/meta": b"RMQJMET1" + b"\x02" * 44,
    "raft/snapshot": b"RMSN" + b"\x03" * 200,
    "store/commitlog/00000000000000000000": b"\x11" * 3000 + bytes(SEGMENT_BYTES - 3000),
    "store/commitlog/00000000000000004096": b"\x12" * 10 + bytes(SEGMENT_BYTES - 10),
    "store/consumequeue/ChaosTopic/0/00000000000000000000": b"\x13" * 200 + bytes(1848),
    "store/consumequeue/ChaosTopic/1/00000000000000000000": b"\x14" * 40 + bytes(2008),
    "store/index/00000000000000000000": b"RMIX" + b"\x15" * 500 + bytes(1544),
    "store/checkpoint": b"RMCP" + b"\x16" * 60,
    "store/apply.pos": b"RMAP" + b"\x17" * 30 + bytes(94),
}
EXPECTED_KINDS: dict[str, set[str]] = {
    corruption.JOURNAL_SEGMENT: {"raft/journal.d/00000000000000000001.seg", "raft/journal.d/00000000000000000900.seg"},
    corruption.JOURNAL_MANIFEST: {"raft/journal.d/manifest"},
    corruption.JOURNAL_META: {"raft/journal.d/meta"},
    corruption.SNAPSHOT: {"raft/snapshot"},
    corruption.COMMIT_LOG: {"store/commitlog/00000000000000000000", "store/commitlog/00000000000000004096"},
    corruption.CONSUME_QUEUE: {"store/consumequeue/ChaosTopic/0/00000000000000000000",
                               "store/consumequeue/ChaosTopic/1/00000000000000000000"},
    corruption.KEY_INDEX: {"store/index/00000000000000000000"},
    corruption.CHECKPOINT: {"store/checkpoint"},
    corruption.APPLY_MARKER: {"store/apply.pos"},
}


def make_member(root: Path, layout: dict[str, bytes] = LAYOUT) -> Path:
    for relative, data in layout.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    # what a member's directory holds besides: never damaged
    (root / "node.toml").write_text("[node]\n")
    (root / "broker.log").write_text("log\n")
    (root / "store" / "lock").write_bytes(b"")
    (root / "store" / "checkpoint.tmp").write_bytes(b"x")
    (root / "raft" / "journal.d" / "manifest.tmp").write_bytes(b"x")
    return root


def snapshot_of(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def changed_files(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def test_every_kind_finds_its_files_and_nothing_else(tmp_path: Path) -> None:
    member = make_member(tmp_path / "n0")
    assert set(FILE_KINDS) == set(EXPECTED_KINDS)
    for kind, expected in EXPECTED_KINDS.items():
        assert {str(path.relative_to(member)) for path in files_of_kind(member, kind)} == expected, kind
    assert files_of_kind(tmp_path / "empty", corruption.COMMIT_LOG) == []


def test_used_bytes_ends_at_the_last_non_zero_byte(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"\x01\x00\x02" + bytes(5000))
    assert used_bytes(path) == 3
    path.write_bytes(bytes(3 << 20) + b"\x09" + bytes(10))  # past one read chunk
    assert used_bytes(path) == (3 << 20) + 1
    path.write_bytes(bytes(100))
    assert used_bytes(path) == 0


def test_differing_range_spans_first_to_last_difference_and_length_changes(tmp_path: Path) -> None:
    left, right = tmp_path / "l", tmp_path / "r"
    base = bytearray(b"a" * 3_000_000)
    left.write_bytes(bytes(base))
    right.write_bytes(bytes(base))
    assert differing_range(left, right) is None
    base[10] = ord("b")
    base[2_500_000] = ord("c")
    right.write_bytes(bytes(base))
    assert differing_range(left, right) == (10, 2_500_001)
    right.write_bytes(b"a" * 100)
    assert differing_range(left, right) == (100, 3_000_000)


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_bit_flip_changes_a_few_used_bytes_of_one_file_of_the_kind(tmp_path: Path, kind: str) -> None:
    member = make_member(tmp_path / "n0")
    before = snapshot_of(member)
    damaged = damage_file(member, "n0", kind, BIT_FLIP, random.Random(7), RollbackArchive(tmp_path / "copies"))
    assert damaged is not None
    after = snapshot_of(member)
    assert changed_files(before, after) == [damaged.path]
    assert damaged.path in EXPECTED_KINDS[kind] and damaged.file_kind == kind and damaged.damage == BIT_FLIP
    old, new = before[damaged.path], after[damaged.path]
    assert len(old) == len(new) == damaged.size_before == damaged.size_after
    differing = [offset for offset in range(len(old)) if old[offset] != new[offset]]
    assert differing == list(damaged.offsets) and 1 <= len(differing) <= 4
    assert all(offset < len(old.rstrip(b"\0")) for offset in differing)  # never in preallocated zeros
    assert damaged.flips == tuple((old[offset], new[offset]) for offset in differing)
    assert f"byte {differing[0]} " in damaged.describe() and damaged.path in damaged.describe()


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_truncate_cuts_one_file_of_the_kind_inside_it(tmp_path: Path, kind: str) -> None:
    member = make_member(tmp_path / "n0")
    before = snapshot_of(member)
    damaged = damage_file(member, "n0", kind, TRUNCATE, random.Random(8), RollbackArchive(tmp_path / "copies"))
    assert damaged is not None
    after = snapshot_of(member)
    assert changed_files(before, after) == [damaged.path]
    cut = damaged.offsets[0]
    assert 0 <= cut < damaged.size_before == len(before[damaged.path])
    assert after[damaged.path] == before[damaged.path][:cut] and damaged.size_after == cut
    assert f"truncated at byte {cut} (was {damaged.size_before} bytes)" in damaged.describe()


def test_roll_back_puts_back_the_oldest_saved_copy_that_differs(tmp_path: Path) -> None:
    member = make_member(tmp_path / "n0")
    archive = RollbackArchive(tmp_path / "copies")
    checkpoint = member / "store" / "checkpoint"
    oldest = checkpoint.read_bytes()
    assert archive.save("n0", member, 1.5) == len(LAYOUT)
    checkpoint.write_bytes(b"RMCP" + b"\x20" * 70)
    middle = checkpoint.read_bytes()
    archive.save("n0", member, 9.0)
    checkpoint.write_bytes(b"RMCP" + b"\x21" * 80)
    current = checkpoint.read_bytes()
    before = snapshot_of(member)
    damaged = damage_file(member, "n0", corruption.CHECKPOINT, ROLL_BACK, random.Random(1), archive)
    assert damaged is not None and damaged.path == "store/checkpoint"
    assert checkpoint.read_bytes() == oldest and changed_files(before, snapshot_of(member)) == ["store/checkpoint"]
    assert (damaged.size_before, damaged.size_after, damaged.saved_at) == (len(current), len(oldest), 1.5)
    assert damaged.offsets == (4, len(current))
    assert "saved at 1.5 s" in damaged.describe()
    # a third save drops the oldest generation: the next roll-back finds the copy saved at 9.0 s
    archive.save("n0", member, 20.0)
    checkpoint.write_bytes(current)
    again = damage_file(member, "n0", corruption.CHECKPOINT, ROLL_BACK, random.Random(1), archive)
    assert again is not None and again.saved_at == 9.0 and checkpoint.read_bytes() == middle


def test_roll_back_needs_a_differing_copy_of_the_same_member(tmp_path: Path) -> None:
    first, second = make_member(tmp_path / "n0"), make_member(tmp_path / "n1")
    archive = RollbackArchive(tmp_path / "copies")
    assert damage_file(first, "n0", corruption.SNAPSHOT, ROLL_BACK, random.Random(1), archive) is None
    archive.save("n0", first, 1.0)
    assert damage_file(first, "n0", corruption.SNAPSHOT, ROLL_BACK, random.Random(1), archive) is None  # same bytes
    (second / "raft" / "snapshot").write_bytes(b"other")
    assert damage_file(second, "n1", corruption.SNAPSHOT, ROLL_BACK, random.Random(1), archive) is None  # n0's copy
    archive.remove()
    assert not archive.root.exists()


def test_a_kind_without_files_and_an_unknown_damage(tmp_path: Path) -> None:
    member = tmp_path / "n0"
    (member / "store").mkdir(parents=True)
    archive = RollbackArchive(tmp_path / "copies")
    for damage in DAMAGE_KINDS:
        assert damage_file(member, "n0", corruption.SNAPSHOT, damage, random.Random(1), archive) is None
    make_member(member)
    (member / "raft" / "snapshot").write_bytes(bytes(10))
    assert damage_file(member, "n0", corruption.SNAPSHOT, BIT_FLIP, random.Random(1), archive) is None  # all zero
    with pytest.raises(ValueError, match="no damage kind"):
        damage_file(member, "n0", corruption.SNAPSHOT, "melt", random.Random(1), archive)


def test_a_seed_replays_the_same_damage(tmp_path: Path) -> None:
    outcomes = []
    for run in ("a", "b"):
        member = make_member(tmp_path / run)
        archive = RollbackArchive(tmp_path / f"copies-{run}")
        rng = random.Random(42)
        done = [damage_file(member, run, kind, damage, rng, archive)
                for kind in FILE_KINDS for damage in (BIT_FLIP, TRUNCATE)]
        outcomes.append([(d.path, d.offsets, d.flips) if d is not None else None for d in done])
    assert outcomes[0] == outcomes[1]


def test_bytes_match_compares_a_range_of_two_files(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_bytes(b"abcdef")
    two.write_bytes(b"abXdef")
    assert bytes_match(one, two, 0, 2) and bytes_match(one, two, 3, 6)
    assert not bytes_match(one, two, 1, 4)
    assert not bytes_match(one, two, 4, 10)  # past the end of both
    assert not bytes_match(one, tmp_path / "missing", 0, 1)


def test_corrupt_minority_makes_every_damage_but_its_open_findings() -> None:
    assert len(corruption.EVERY_DAMAGE) == len(FILE_KINDS) * len(DAMAGE_KINDS) == 27
    assert set(corruption.OPEN_FINDINGS) <= set(corruption.EVERY_DAMAGE)
    assert set(corruption.SURVIVED_DAMAGE) == set(corruption.EVERY_DAMAGE) - set(corruption.OPEN_FINDINGS)
    assert all(reason for reason in corruption.OPEN_FINDINGS.values())
    # issue #24 (a key-index file bit-flipped) is fixed: corrupt-minority makes that damage too
    assert (corruption.KEY_INDEX, corruption.BIT_FLIP) in corruption.SURVIVED_DAMAGE


def test_damage_some_file_falls_back_to_a_choice_that_applies(tmp_path: Path) -> None:
    member = make_member(tmp_path / "n0")
    archive = RollbackArchive(tmp_path / "copies")
    choices = [(corruption.SNAPSHOT, ROLL_BACK), (corruption.JOURNAL_META, ROLL_BACK), (corruption.CHECKPOINT, TRUNCATE)]
    for seed in range(5):  # no saved copy yet: only the truncation applies, whatever the draw
        damaged = corruption.damage_some_file(member, "n0", choices, random.Random(seed), archive)
        assert damaged is not None and (damaged.file_kind, damaged.damage) == (corruption.CHECKPOINT, TRUNCATE)
        make_member(member)
    assert corruption.damage_some_file(member, "n0", choices[:2], random.Random(1), archive) is None
