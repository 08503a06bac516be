"""Messages this broker served to each consumer group, per topic, over the last minute: Java's
GROUP_GET_NUMS statistics (``BrokerStatsManager.incGroupGetNums`` on every pull that found messages), whose
per-minute rate GET_CONSUME_STATS sums over the topics it reports as ``consumeTps``
(``mqadmin consumerProgress``'s TPS column).

Counts go into 10-second buckets; the rate is the messages in the buckets of the last minute over the time
those buckets cover (at least one bucket's length, so one pull just after a quiet spell is not read as a
burst). Local to the member that served the pulls, like Java's: a new leader starts from zero.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

BUCKET_SECONDS: Final = 10.0
WINDOW_BUCKETS: Final = 6  # a minute
#: (group, topic) pairs tracked; past this, pairs with nothing in the window are dropped, then new pairs
#: are not counted until some go quiet (counts are statistics: losing some never affects delivery)
PAIRS_MAX: Final = 100_000


class PullRates:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        #: (group, topic) -> {bucket number: messages}
        self._buckets: dict[tuple[str, str], dict[int, int]] = {}
        #: pulls answered with messages, pulls answered without, and the messages served (Java's
        #: getMessageTimesTotalFound, getMessageTimesTotalMiss, getMessageTransferedMsgCount): broker.metrics
        self.pulls_found = 0
        self.pulls_missed = 0
        self.messages_served = 0

    def record_miss(self) -> None:
        """A pull answered without messages."""
        self.pulls_missed += 1

    def record(self, group: str, topic: str, messages: int) -> None:
        """``messages`` served to ``group`` from ``topic`` by one pull."""
        if messages <= 0:
            return
        self.pulls_found += 1
        self.messages_served += messages
        bucket = int(self.clock() // BUCKET_SECONDS)
        key = (group, topic)
        with self._lock:
            counts = self._buckets.get(key)
            if counts is None:
                if len(self._buckets) >= PAIRS_MAX:
                    self._drop_quiet(bucket)
                    if len(self._buckets) >= PAIRS_MAX:
                        return
                counts = self._buckets[key] = {}
            counts[bucket] = counts.get(bucket, 0) + messages
            if len(counts) > WINDOW_BUCKETS + 1:
                for old in [number for number in counts if number <= bucket - WINDOW_BUCKETS]:
                    del counts[old]

    def messages_per_second(self, group: str, topic: str) -> float:
        now = self.clock()
        current = int(now // BUCKET_SECONDS)
        first = current - WINDOW_BUCKETS + 1
        with self._lock:
            counts = self._buckets.get((group, topic))
            if not counts:
                return 0.0
            kept = {number: count for number, count in counts.items() if number >= first}
        if not kept:
            return 0.0
        covered = now - min(kept) * BUCKET_SECONDS
        return sum(kept.values()) / max(covered, BUCKET_SECONDS)

    def _drop_quiet(self, current: int) -> None:
        first = current - WINDOW_BUCKETS + 1
        for key in [key for key, counts in self._buckets.items() if max(counts, default=first - 1) < first]:
            del self._buckets[key]
