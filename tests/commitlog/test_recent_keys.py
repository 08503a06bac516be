"""The recent-keys filter never answers "no" for a key stored since the asked time (model check)."""

from __future__ import annotations

import random

from commitlog.recent_keys import RecentKeys


def test_no_false_negatives_across_rotations_against_a_model() -> None:
    rng = random.Random(11)
    recent = RecentKeys()
    stored: list[tuple[int, int]] = []  # (hash, stamp) in log order
    stamp = 1_000_000
    negatives = asked = 0
    for _ in range(3000):
        stamp += rng.choice((0, 0, 1, 7, 250))  # never decreasing, often equal
        batch = [(rng.getrandbits(32), 0, stamp) for _ in range(rng.randint(1, 5))]
        since = stamp - rng.choice((0, 1, 120, 600, 2000))
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
