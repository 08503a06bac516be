"""The recent-keys filter never answers "no" for a key stored since the asked time (model check)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from commitlog.key_index import index_columns
from commitlog.recent_keys import RecentKeys
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, retry_of, small_config


def test_no_false_negatives_across_rotations_against_a_model() -> None:
    rng = random.Random(11)
    recent = RecentKeys()
    stored: list[tuple[int, int]] = []  # (hash, stamp) in log order
    store_timestamp = 1_000_000
    negatives = asked = 0
    for _ in range(3000):
        store_timestamp += rng.choice((0, 0, 1, 7, 250))  # never decreasing, often equal
        batch = [(rng.getrandbits(32), 0, store_timestamp) for _ in range(rng.randint(1, 5))]
        since = store_timestamp - rng.choice((0, 1, 120, 600, 2000))
        if recent.authoritative(since):
            for key_hash, key_stamp in stored[-600:]:
                if key_stamp >= since:
                    assert recent.maybe(key_hash), (key_hash, key_stamp, since)
            asked += 1
            probe = rng.getrandbits(32)
            if not recent.maybe(probe):
                negatives += 1
        recent.add(batch)
        stored.extend((key_hash, key_stamp) for key_hash, _, key_stamp in batch)
    # it does answer "no" for keys never stored (it saves lookups), once the asked times move past rotations
    assert asked > 1000 and negatives > 0.95 * asked, (asked, negatives)


def test_keys_from_before_the_filter_started_are_never_denied() -> None:
    recent = RecentKeys()
    assert not recent.authoritative(10**12)  # nothing added yet: the store may hold anything
    recent.add([(1, 0, 5_000)])
    assert not recent.authoritative(5_000)  # keys stored before opening may carry the first stamp
    assert recent.authoritative(5_001)
    assert recent.maybe(1)


def test_the_store_finds_retried_sends_across_a_reopen_and_after_it(tmp_path: Path) -> None:
    first = message(1)._replace(store_timestamp=1_000_000)
    store = MessageStore(small_config(tmp_path))
    store.append(1, [first])
    assert store.index.newest_timestamp() == 1_000_000
    store.close()
    store = MessageStore(small_config(tmp_path))
    try:
        # stored before the reopen: not in the filter, found through the index all the same
        found = store.find_recent_send(*retry_of(first), 999_000)
        assert found is not None and found.physical_offset == 0
        # after the newest stored stamp the filter answers; a send stored after the reopen is found
        second = message(2)._replace(store_timestamp=1_000_500)
        store.append(2, [second])
        assert store.find_recent_send(*retry_of(second), 1_000_001) is not None
        assert store.find_recent_send("TopicTest", b"never-sent", 0, b"", 1_000_001) is None
        assert store.find_recent_send(*retry_of(first), 1_000_001) is None  # older than asked
    finally:
        store.close()


def test_many_answers_at_once_equal_single_answers() -> None:
    rng = random.Random(5)
    recent = RecentKeys()
    recent.add([(rng.getrandbits(32), 0, 1_000 + n) for n in range(20_000)])
    asked = {name: rng.getrandbits(32) for name in range(5_000)}
    asked.update({5_000 + n: key_hash for n, (key_hash, _, _) in enumerate([(7, 0, 0)])})
    recent.add([(7, 0, 30_000)])
    assert recent.maybe_many(asked) == [name for name, key_hash in asked.items() if recent.maybe(key_hash)]
    assert 5_000 in recent.maybe_many(asked)
    mask = recent.maybe_mask(np.array(list(asked.values()), dtype=np.uint32))
    assert [name for name, maybe in zip(asked, mask.tolist(), strict=True) if maybe] == recent.maybe_many(asked)
    # keys added column-wise answer as keys added one by one
    columns = RecentKeys()
    columns.add(index_columns([(key_hash, 0, 1_000) for key_hash in asked.values()]))
    assert all(columns.maybe(key_hash) for key_hash in asked.values())


def test_the_store_names_every_key_when_the_filter_cannot_answer(tmp_path: Path) -> None:
    store = MessageStore(small_config(tmp_path))
    store.append(1, [message(1)._replace(store_timestamp=1_000_000)])
    uniq_hash = store.index.files[0].entry(0)[0]
    # the filter answers
    assert store.recently_stored_mask(np.array([uniq_hash, uniq_hash ^ 1], dtype=np.uint32), 1_000_000).tolist() == [True, False]
    store.close()
    store = MessageStore(small_config(tmp_path))
    try:
        # reopened: the filter is seeded with the keys of the last dedupe window before the index's newest
        # stamp (from second 880 on); asking about a time not after that names every key (each must be
        # looked up), and asking about a later one answers without the index
        assert store.recently_stored_mask(np.array([11, 12], dtype=np.uint32), 879_999).tolist() == [True, True]
        assert store.recently_stored_mask(np.array([11, 12], dtype=np.uint32), 880_000).tolist() == [False, False]
        assert store.recently_stored_mask(np.array([uniq_hash, 12], dtype=np.uint32), 1_000_000).tolist() == [True, False]
    finally:
        store.close()
