"""Where a send's time goes on the leader: a histogram of durations for each stage of the send path.

The stages, in the order a send passes them (``raftmq bench produce --stages`` prints them):

* ``remoting``: the frame was read, until a worker of the event loop took it up;
* ``prepare``: header parsing and message building, until the group committer has it;
* ``batch_wait``: in the committer's queue, until the proposing thread (the tick thread, or the batcher)
  took it into an entry (recorded once per entry, weighted by its messages, as the mean over them: an
  approximation that costs no Python step per send);
* ``encode``: the proposing thread lays the entry out and proposes it;
* ``propose_wait``: proposed, until pysyncobj's tick thread appended it to the log and sent it;
* ``replication``: sent, until a majority holds it on disk (the commit index covers it);
* ``leader_fsync``: one fdatasync of the leader's journal (per flush, overlapping ``replication``);
* ``apply``: the entry applied to the store (per entry);
* ``complete``: applied, until the completion thread took the entry's futures up;
* ``answer``: futures completed, until the event loop resumed their senders.

Per send (weighted by messages) unless said per entry or per flush. Counts only grow: a reader takes
:meth:`StageHistograms.snapshot` before and after a run and looks at :func:`difference`; buckets are
log-spaced (4 per doubling, from 1 us), so a percentile is exact to within ~19%.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections.abc import Mapping
from typing import Final

STAGES: Final = ("remoting", "prepare", "batch_wait", "encode", "propose_wait", "replication", "leader_fsync",
                 "apply", "complete", "answer")
#: stages recorded once per entry or per flush, not per send
PER_ENTRY: Final = frozenset({"encode", "propose_wait", "replication", "apply", "complete"})
PER_FLUSH: Final = frozenset({"leader_fsync"})
BUCKETS_PER_DOUBLING: Final = 4
#: bucket 0 holds durations up to 1 us, bucket i those up to 2 ** (i / 4) us; the last one everything longer
BUCKETS: Final = 4 * 27  # ~134 s


def bucket_upper_seconds(index: int) -> float:
    return float(2 ** (index / BUCKETS_PER_DOUBLING)) / 1e6


#: each bucket's upper bound but the last's (a binary search in C finds a duration's bucket: cheaper per
#: send than a logarithm)
_UPPER_BOUNDS: Final = tuple(bucket_upper_seconds(index) for index in range(BUCKETS - 1))


def bucket_of(seconds: float) -> int:
    return bisect_left(_UPPER_BOUNDS, seconds)


class StageHistograms:
    """One counts list per stage. Recorded from several threads without a lock: each stage is recorded by
    one thread (the loop, the tick thread, the batcher, the completion thread), and a count lost to a race
    with a reader only makes the reader's figure a message older."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {stage: [0] * BUCKETS for stage in STAGES}

    def record(self, stage: str, seconds: float, weight: int = 1) -> None:
        self._counts[stage][bisect_left(_UPPER_BOUNDS, seconds)] += weight

    def snapshot(self) -> dict[str, list[int]]:
        return {stage: list(counts) for stage, counts in self._counts.items()}

    def encode(self) -> str:
        """The counts as compact JSON (stage -> {bucket: count}, non-zero buckets only)."""
        return json.dumps({stage: {str(index): count for index, count in enumerate(counts) if count}
                           for stage, counts in self._counts.items()}, separators=(",", ":"))


class DurationHistogram:
    """Durations of one kind (a journal's fsyncs, say) in the stages' buckets, and their sum. Recorded by one
    thread without a lock; a reader may see a count a step old."""

    def __init__(self) -> None:
        self.counts: list[int] = [0] * BUCKETS
        self.total_seconds = 0.0

    def record(self, seconds: float) -> None:
        self.counts[bisect_left(_UPPER_BOUNDS, seconds)] += 1
        self.total_seconds += seconds


def decode(text: str) -> dict[str, list[int]]:
    """:meth:`StageHistograms.encode`'s counts, every stage of :data:`STAGES` present; ValueError if
    ``text`` is not such an encoding."""
    raw = json.loads(text) if text else {}
    if not isinstance(raw, dict):
        raise ValueError("stage counts must be a JSON object")
    counts = {stage: [0] * BUCKETS for stage in STAGES}
    for stage, buckets in raw.items():
        if stage not in counts or not isinstance(buckets, dict):
            continue  # a stage of a newer broker: not ours to print
        for index, count in buckets.items():
            position = int(index)
            if not 0 <= position < BUCKETS or not isinstance(count, int) or count < 0:
                raise ValueError(f"bad bucket {index!r}: {count!r} of stage {stage}")
            counts[stage][position] = count
    return counts


def difference(after: Mapping[str, list[int]], before: Mapping[str, list[int]]) -> dict[str, list[int]]:
    return {stage: [max(0, a - b) for a, b in zip(after[stage], before.get(stage, [0] * BUCKETS), strict=True)]
            for stage in after}


def percentile_seconds(counts: list[int], fraction: float) -> float:
    """The upper bound of the bucket holding the ``fraction`` quantile (0.0 for no counts)."""
    total = sum(counts)
    if not total:
        return 0.0
    rank = max(1, math.ceil(fraction * total))
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return bucket_upper_seconds(index)
    return bucket_upper_seconds(BUCKETS - 1)


def summary(counts: Mapping[str, list[int]]) -> list[dict[str, object]]:
    """One row per stage, in send-path order: count, p50 and p99 in ms, and what a count is."""
    rows: list[dict[str, object]] = []
    for stage in STAGES:
        stage_counts = counts.get(stage, [0] * BUCKETS)
        unit = "entry" if stage in PER_ENTRY else "flush" if stage in PER_FLUSH else "send"
        rows.append({"stage": stage, "per": unit, "count": sum(stage_counts),
                     "p50_ms": round(percentile_seconds(stage_counts, 0.50) * 1000, 3),
                     "p99_ms": round(percentile_seconds(stage_counts, 0.99) * 1000, 3)})
    return rows
