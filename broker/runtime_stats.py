"""This member's put and get statistics as Java's broker keeps them (``StoreStatsService``, ``BrokerStats``),
and GET_BROKER_RUNTIME_INFO's fields in Java's formats, which rocketmq-dashboard and rocketmq-exporter parse
(the exporter fails on a missing or unparsable one).

Totals only grow; once a second :meth:`RuntimeStats.sample` notes them (Java samples every second and keeps
ten minutes), and a rate over a window is the difference between the newest sample and the one ``window``
seconds older (the oldest sample while fewer are kept: Java writes nothing then, which the exporter cannot
parse). ``putTps`` and friends are the rates over 10, 60 and 600 seconds, separated by spaces, each as
Java's ``Double.toString`` writes it. At the first sample of each local day the totals are noted as "this
morning's" (Java's ``BrokerStats.record`` at midnight), the previous ones becoming "yesterday morning's".

Counts are local to this member, as Java's are to its broker: puts are the sends this member acknowledged
as leader, gets the pulls it served (a new leader starts from zero).
"""

from __future__ import annotations

import datetime
import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from broker.pull_rates import PullRates
from dledger.group_commit import GroupCommitter
from dledger.stages import BUCKETS, bucket_upper_seconds
from protocol.command import REMOTING_VERSION

#: samples kept: ten minutes of one a second, and the one before them (Java's MAX_RECORDS_OF_SAMPLING + 1)
SAMPLES_MAX: Final = 601
SAMPLE_PERIOD_SECONDS: Final = 1.0
#: the windows of ``putTps`` and friends, in this order
TPS_WINDOWS_SECONDS: Final = (10, 60, 600)
#: ``MQVersion.Version.values()[REMOTING_VERSION].name()``: what we say we are to tools that check versions
BROKER_VERSION_DESC: Final = "V4_9_4"
#: Java's ``putMessageDistributeTime`` ranges: (label, upper bound in ms, exclusive; None: no bound)
PUT_TIME_RANGES_MS: Final[tuple[tuple[str, float | None], ...]] = (
    ("[<=0ms]", 0.0), ("[0~10ms]", 10.0), ("[10~50ms]", 50.0), ("[50~100ms]", 100.0), ("[100~200ms]", 200.0),
    ("[200~500ms]", 500.0), ("[500ms~1s]", 1000.0), ("[1~2s]", 2000.0), ("[2~3s]", 3000.0), ("[3~4s]", 4000.0),
    ("[4~5s]", 5000.0), ("[5~10s]", 10000.0), ("[10s~]", None),
)
#: Java's ``TransientStorePool.availableBufferNums()`` when the pool is off (ours is always off)
NO_TRANSIENT_POOL: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Totals:
    """What this member counted since it started."""

    put_messages: int = 0
    put_bytes: int = 0
    pulls_found: int = 0
    pulls_missed: int = 0
    messages_served: int = 0


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """What GET_BROKER_RUNTIME_INFO tells of the store, read by the caller."""

    commit_log_min_offset: int
    commit_log_max_offset: int
    #: the store timestamp of the first message in the commit log; -1 when it has none (Java's)
    earliest_message_timestamp_ms: int
    unflushed_bytes: int
    #: the file system holding the store: its size and free bytes (-1 and -1 when unknown)
    disk_total_bytes: int
    disk_free_bytes: int


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """A processor's queue: requests waiting and its limit (Java's thread-pool queues)."""

    waiting: int = 0
    capacity: int = 0


def java_double(value: float) -> str:
    """``value`` as Java's ``Double.toString`` writes it: "0.0", "12.5", "1.0E-4", "1.2345678E7"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        text = repr(value)
        if "e" not in text:
            return text
        return format(Decimal(text), "f")  # (repr switches to exponents below 1e-4)
    sign, digits, _ = Decimal(repr(value)).as_tuple()
    figures = "".join(map(str, digits)).rstrip("0") or "0"
    exponent = Decimal(repr(value)).adjusted()
    return f"{'-' if sign else ''}{figures[0]}.{figures[1:] or '0'}E{exponent}"


def human_readable_bytes(count: int) -> str:
    """``MixAll.humanReadableByteCount(count, false)``: "512 B", "1.5 KiB", "3.0 GiB"."""
    unit = 1024
    if count < unit:
        return f"{count} B"
    exponent = min(int(math.log(count) / math.log(unit)), 6)
    return f"{count / unit**exponent:.1f} {'KMGTPE'[exponent - 1]}iB"


def format_runtime(elapsed_ms: int) -> str:
    """``StoreStatsService.getFormatRuntime``: "[ 0 days, 1 hours, 2 minutes, 3 seconds ]"."""
    seconds, _ = divmod(max(elapsed_ms, 0), 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"


def put_time_distribution(counts: list[int]) -> tuple[str, int]:
    """Stage counts (``dledger.stages`` buckets) in Java's ``putMessageDistributeTime`` ranges, and the
    longest duration seen in ms (the upper bound of the highest bucket that holds any)."""
    ranges = [0] * len(PUT_TIME_RANGES_MS)
    longest_ms = 0
    for index, count in enumerate(counts[:BUCKETS]):
        if not count:
            continue
        upper_ms = bucket_upper_seconds(index) * 1000
        longest_ms = max(longest_ms, math.ceil(upper_ms))
        # by the bucket's upper bound, as Java ranges a duration (no duration here is 0 ms or less)
        position = next(position for position, (_, bound) in enumerate(PUT_TIME_RANGES_MS)
                        if position > 0 and (bound is None or upper_ms < bound))
        ranges[position] += count
    text = "".join(f"{label}:{count} " for (label, _), count in zip(PUT_TIME_RANGES_MS, ranges, strict=True))
    return text, longest_ms


def local_day(wall_clock_ms: int) -> int:
    """The local calendar day of a wall-clock time (days since 0001-01-01): what "this morning" means."""
    return datetime.date.fromtimestamp(wall_clock_ms / 1000).toordinal()


class _Samples:
    """(timestamp ms, total) once a sampling period, the last :data:`SAMPLES_MAX`."""

    def __init__(self) -> None:
        self._samples: deque[tuple[int, int]] = deque(maxlen=SAMPLES_MAX)

    def add(self, timestamp_ms: int, total: int) -> None:
        self._samples.append((timestamp_ms, total))

    def rate(self, window_samples: int) -> float:
        """Per second between the newest sample and the one ``window_samples`` before it (or the oldest)."""
        samples = self._samples
        if len(samples) < 2:
            return 0.0
        newest = samples[-1]
        oldest = samples[-1 - min(window_samples, len(samples) - 1)]
        elapsed_ms = newest[0] - oldest[0]
        return (newest[1] - oldest[1]) * 1000 / elapsed_ms if elapsed_ms > 0 else 0.0


class RuntimeStats:
    """Samples this member's totals and turns them into Java's figures. Runs on the event loop: :meth:`sample`
    once a :data:`SAMPLE_PERIOD_SECONDS` (the node's sampling task), the readers whenever asked."""

    def __init__(self, totals: Callable[[], Totals], wall_clock_ms: Callable[[], int] | None = None,
                 day_of: Callable[[int], int] = local_day) -> None:
        self._totals = totals
        self._wall_clock_ms = wall_clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._day_of = day_of
        self.boot_timestamp_ms = self._wall_clock_ms()
        self._day = day_of(self.boot_timestamp_ms)
        self._put = _Samples()
        self._found = _Samples()
        self._missed = _Samples()
        self._served = _Samples()
        #: totals at the first sample of today and of yesterday (Java: 0 until the first midnight)
        self._today_morning = Totals()
        self._yesterday_morning = Totals()
        self.sample()

    def sample(self) -> None:
        now_ms = self._wall_clock_ms()
        totals = self._totals()
        self._put.add(now_ms, totals.put_messages)
        self._found.add(now_ms, totals.pulls_found)
        self._missed.add(now_ms, totals.pulls_missed)
        self._served.add(now_ms, totals.messages_served)
        day = self._day_of(now_ms)
        if day != self._day:
            self._day = day
            self._yesterday_morning, self._today_morning = self._today_morning, totals

    def put_tps(self, window_seconds: int) -> float:
        """Messages stored per second over the last ``window_seconds``."""
        return self._put.rate(self._window_samples(window_seconds))

    def get_tps(self, window_seconds: int) -> float:
        """Messages served to pulls per second over the last ``window_seconds`` (Java's transferred TPS)."""
        return self._served.rate(self._window_samples(window_seconds))

    @staticmethod
    def _window_samples(window_seconds: int) -> int:
        return max(1, round(window_seconds / SAMPLE_PERIOD_SECONDS))

    def _tps_text(self, rates: Callable[[int], float]) -> str:
        return " ".join(java_double(rates(self._window_samples(window))) for window in TPS_WINDOWS_SECONDS)

    def fields(self, store: StoreFacts, queues: Mapping[str, QueueFacts], apply_counts: list[int]) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's fields in Java's names and formats (``prepareRuntimeInfo``,
        ``DefaultMessageStore.getRuntimeInfo``, ``StoreStatsService.getRuntimeInfo``). ``queues`` by
        "send", "pull", "query" and "end-transaction"; ``apply_counts`` the apply stage's counts (the
        store's append time: Java's putMessageDistributeTime)."""
        totals = self._totals()
        now_ms = self._wall_clock_ms()
        put_times = max(totals.put_messages, 1)  # Java's: never 0 (it divides by it)
        distribution, longest_ms = put_time_distribution(apply_counts)
        if store.disk_total_bytes > 0:
            disk_ratio = (store.disk_total_bytes - store.disk_free_bytes) / store.disk_total_bytes
            capacity = (f"Total : {human_readable_bytes(store.disk_total_bytes)}, "
                        f"Free : {human_readable_bytes(store.disk_free_bytes)}.")
        else:
            disk_ratio = -1.0
            capacity = f"Total : {human_readable_bytes(0)}, Free : {human_readable_bytes(0)}."

        def found_and_missed(window: int) -> float:
            return self._found.rate(window) + self._missed.rate(window)

        fields = {
            "bootTimestamp": str(self.boot_timestamp_ms),
            "runtime": format_runtime(now_ms - self.boot_timestamp_ms),
            "brokerVersionDesc": BROKER_VERSION_DESC,
            "brokerVersion": str(REMOTING_VERSION),
            "putMessageEntireTimeMax": str(longest_ms),
            "putMessageTimesTotal": str(put_times),
            "putMessageSizeTotal": str(totals.put_bytes),
            "putMessageDistributeTime": distribution,
            "putMessageAverageSize": java_double(totals.put_bytes / put_times),
            "dispatchMaxBuffer": "0",
            "getMessageEntireTimeMax": "0",
            "putTps": self._tps_text(self._put.rate),
            "getFoundTps": self._tps_text(self._found.rate),
            "getMissTps": self._tps_text(self._missed.rate),
            "getTotalTps": self._tps_text(found_and_missed),
            "getTransferedTps": self._tps_text(self._served.rate),
            "msgPutTotalYesterdayMorning": str(self._yesterday_morning.put_messages),
            "msgPutTotalTodayMorning": str(self._today_morning.put_messages),
            "msgPutTotalTodayNow": str(totals.put_messages),
            "msgGetTotalYesterdayMorning": str(self._yesterday_morning.messages_served),
            "msgGetTotalTodayMorning": str(self._today_morning.messages_served),
            "msgGetTotalTodayNow": str(totals.messages_served),
            "commitLogDiskRatio": java_double(disk_ratio),
            "consumeQueueDiskRatio": java_double(disk_ratio),  # (one data directory holds both)
            "commitLogDirCapacity": capacity,
            "commitLogMinOffset": str(store.commit_log_min_offset),
            "commitLogMaxOffset": str(store.commit_log_max_offset),
            "remainHowManyDataToFlush": human_readable_bytes(store.unflushed_bytes),
            "remainTransientStoreBufferNumbs": str(NO_TRANSIENT_POOL),
            "dispatchBehindBytes": "0",  # dispatch happens in apply, with the append
            "pageCacheLockTimeMills": "0",
            "earliestMessageTimeStamp": str(store.earliest_message_timestamp_ms),
            "startAcceptSendRequestTimeStamp": "0",
        }
        for java_name, ours in (("send", "send"), ("pull", "pull"), ("query", "admin")):
            queue = queues.get(ours, QueueFacts())
            fields[f"{java_name}ThreadPoolQueueSize"] = str(queue.waiting)
            fields[f"{java_name}ThreadPoolQueueCapacity"] = str(queue.capacity)
            fields[f"{java_name}ThreadPoolQueueHeadWaitTimeMills"] = "0"
        end_transaction = queues.get("end-transaction", QueueFacts())
        fields["EndTransactionQueueSize"] = str(end_transaction.waiting)
        fields["EndTransactionThreadPoolQueueCapacity"] = str(end_transaction.capacity)
        return fields


def member_totals(committer: GroupCommitter, rates: PullRates) -> Callable[[], Totals]:
    """A member's totals: the group committer's acknowledged puts, the pull processor's counts."""
    def totals() -> Totals:
        return Totals(committer.stored_messages, committer.stored_bytes, rates.pulls_found, rates.pulls_missed,
                      rates.messages_served)

    return totals


def disk_space(path: str) -> tuple[int, int]:
    """(size, free bytes) of the file system holding ``path`` as Java's ``File.getTotalSpace`` and
    ``getFreeSpace`` count them (free blocks, the root-reserved ones included); (-1, -1) when unknown."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return -1, -1
    return stats.f_blocks * stats.f_frsize, stats.f_bfree * stats.f_frsize
