"""This member's Prometheus metrics (``GET /metrics``, broker.http), read from live state at scrape time.

Nothing is counted for them on the send path beyond counters that exist anyway: the group committer's
entry and message counts, the stage histograms (dledger.stages), the journal's fsync histogram, the pull
counters (broker.pull_rates). A scrape reads them into a :class:`MetricsSnapshot` (:func:`read_snapshot`)
and :func:`metric_families` turns that into metric families (a pure function, tested with tables). Each
broker has a registry of its own (:func:`new_registry`), so several brokers in one process do not mix.

Metrics (all ``raftmq_``): role and term, commit / applied / durable / last log index, each follower's match
index and lag (on the leader), journal fsync seconds, messages put and pulled (totals and 10 s / 60 s /
600 s rates), group-commit entry sizes, send-path stage seconds, each consumer group's lag per topic,
connections and request queues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from broker.probes import raft_status
from broker.runtime_stats import TPS_WINDOWS_SECONDS, RuntimeStats
from dledger.group_commit import ENTRY_MESSAGES_BUCKETS
from dledger.raft_node import RAFT_STATES
from dledger.stages import BUCKETS, BUCKETS_PER_DOUBLING, STAGES, bucket_upper_seconds

#: what /metrics answers with (the Prometheus text format every scraper reads)
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
ROLES: Final = ("leader", "follower", "candidate")
#: (group, topic) lag series one scrape reports at most (the groups with the largest lag first)
GROUP_LAG_SERIES_MAX: Final = 5_000
#: duration histograms are reported with one bucket per doubling from this one (~11 us) on: the stages'
#: finer buckets, coarsened for a readable scrape
_FIRST_REPORTED_BUCKET: Final = 14
#: a bucket's geometric middle over its upper bound
_BUCKET_MIDDLE: Final = 2 ** (-0.5 / BUCKETS_PER_DOUBLING)


@dataclass(frozen=True, slots=True)
class DurationCounts:
    """A histogram in ``dledger.stages`` buckets, and the sum of its durations when known."""

    counts: tuple[int, ...]
    total_seconds: float | None = None

    def sum_seconds(self) -> float:
        """The sum when known, else estimated from the buckets (each count at its bucket's geometric middle:
        the stages keep no sum, which would cost a step per send)."""
        if self.total_seconds is not None:
            return self.total_seconds
        return sum(count * bucket_upper_seconds(index) * _BUCKET_MIDDLE for index, count in enumerate(self.counts)
                   if count)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    node_id: str
    broker_name: str
    role: str
    term: int
    commit_index: int
    applied_index: int
    #: the last index on this member's disk (None: the journal does not say)
    durable_index: int | None
    last_log_index: int
    #: on the leader: each follower's match index, by member id
    follower_match_index: Mapping[str, int] = field(default_factory=dict)
    damaged: bool = False
    commit_log_min_offset: int = 0
    commit_log_max_offset: int = 0
    journal_fsyncs: DurationCounts = DurationCounts((0,) * BUCKETS, 0.0)
    stages: Mapping[str, DurationCounts] = field(default_factory=dict)
    put_messages: int = 0
    put_bytes: int = 0
    pulls_found: int = 0
    pulls_missed: int = 0
    messages_served: int = 0
    #: window seconds -> messages per second
    put_tps: Mapping[int, float] = field(default_factory=dict)
    get_tps: Mapping[int, float] = field(default_factory=dict)
    proposed_entries: int = 0
    proposed_messages: int = 0
    entry_messages_counts: tuple[int, ...] = (0,) * ENTRY_MESSAGES_BUCKETS
    #: (group, topic) -> messages not consumed yet (the sum over the topic's queues)
    group_lag: Mapping[tuple[str, str], int] = field(default_factory=dict)
    connections: int = 0
    #: processor name -> (requests waiting, the queue's limit)
    request_queues: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def _duration_buckets(counts: DurationCounts) -> list[tuple[str, float]]:
    """Cumulative buckets, one per doubling, the finest ones folded into the first reported."""
    buckets: list[tuple[str, float]] = []
    running = sum(counts.counts[:_FIRST_REPORTED_BUCKET])
    for index in range(_FIRST_REPORTED_BUCKET, BUCKETS - 1):
        running += counts.counts[index]
        if (index - _FIRST_REPORTED_BUCKET) % BUCKETS_PER_DOUBLING == 0:
            buckets.append((repr(bucket_upper_seconds(index)), float(running)))
    buckets.append(("+Inf", float(sum(counts.counts))))
    return buckets


def metric_families(snapshot: MetricsSnapshot) -> list[Metric]:
    """The snapshot as Prometheus metric families."""
    families: list[Metric] = []

    def gauge(name: str, documentation: str, value: float) -> None:
        families.append(GaugeMetricFamily(name, documentation, value=value))

    def counter(name: str, documentation: str, value: float) -> None:
        families.append(CounterMetricFamily(name, documentation, value=value))

    info = GaugeMetricFamily("raftmq_member_info", "this member: its id and group (always 1)",
                             labels=["node_id", "broker_name"])
    info.add_metric([snapshot.node_id, snapshot.broker_name], 1)
    families.append(info)
    role = GaugeMetricFamily("raftmq_raft_role", "1 for this member's Raft role, 0 for the others", labels=["role"])
    for name in ROLES:
        role.add_metric([name], 1 if snapshot.role == name else 0)
    families.append(role)
    gauge("raftmq_raft_leader", "1 while this member is the Raft leader", 1 if snapshot.role == "leader" else 0)
    gauge("raftmq_raft_term", "the Raft term this member is in", snapshot.term)
    gauge("raftmq_raft_commit_index", "the highest Raft index this member knows committed", snapshot.commit_index)
    gauge("raftmq_raft_applied_index", "the highest Raft index applied to this member's store", snapshot.applied_index)
    gauge("raftmq_raft_last_log_index", "the last index in this member's Raft log", snapshot.last_log_index)
    if snapshot.durable_index is not None:
        gauge("raftmq_raft_durable_index", "the last Raft index on this member's disk (fsynced)",
              snapshot.durable_index)
    gauge("raftmq_member_damaged", "1 while this member found its durable state damaged (it does not vote)",
          1 if snapshot.damaged else 0)
    match = GaugeMetricFamily("raftmq_raft_follower_match_index", "each follower's match index (on the leader)",
                              labels=["peer"])
    lag = GaugeMetricFamily("raftmq_raft_follower_lag_entries",
                            "entries of the leader's log each follower does not hold yet (on the leader)",
                            labels=["peer"])
    for peer, index in sorted(snapshot.follower_match_index.items()):
        match.add_metric([peer], index)
        lag.add_metric([peer], max(0, snapshot.last_log_index - index))
    families += [match, lag]
    gauge("raftmq_commit_log_min_offset_bytes", "the commit log's first physical offset", snapshot.commit_log_min_offset)
    gauge("raftmq_commit_log_max_offset_bytes", "the commit log's end physical offset", snapshot.commit_log_max_offset)

    fsync = HistogramMetricFamily("raftmq_journal_fsync_seconds", "fdatasync of the Raft journal, each flush")
    fsync.add_metric([], _duration_buckets(snapshot.journal_fsyncs), snapshot.journal_fsyncs.sum_seconds())
    families.append(fsync)
    stages = HistogramMetricFamily("raftmq_send_stage_seconds",
                                   "where a send's time goes on the leader, by stage (dledger.stages; per send, "
                                   "per entry or per flush by stage; the sum is estimated from the buckets)",
                                   labels=["stage"])
    for stage in STAGES:
        if stage in snapshot.stages:
            stages.add_metric([stage], _duration_buckets(snapshot.stages[stage]), snapshot.stages[stage].sum_seconds())
    families.append(stages)

    counter("raftmq_messages_put", "messages this member stored and acknowledged as leader", snapshot.put_messages)
    counter("raftmq_message_put_bytes", "bytes of the messages this member acknowledged as leader", snapshot.put_bytes)
    pulls = CounterMetricFamily("raftmq_pull_requests", "pulls this member answered, with messages or without",
                                labels=["result"])
    pulls.add_metric(["found"], snapshot.pulls_found)
    pulls.add_metric(["missed"], snapshot.pulls_missed)
    families.append(pulls)
    counter("raftmq_messages_pulled", "messages this member served to pulls", snapshot.messages_served)
    put_tps = GaugeMetricFamily("raftmq_put_messages_per_second", "messages put per second over a window",
                                labels=["window"])
    get_tps = GaugeMetricFamily("raftmq_pulled_messages_per_second", "messages served per second over a window",
                                labels=["window"])
    for window in TPS_WINDOWS_SECONDS:
        put_tps.add_metric([f"{window}s"], snapshot.put_tps.get(window, 0.0))
        get_tps.add_metric([f"{window}s"], snapshot.get_tps.get(window, 0.0))
    families += [put_tps, get_tps]

    entries = HistogramMetricFamily("raftmq_group_commit_entry_messages", "messages per Raft entry this leader proposed")
    running = 0
    entry_buckets: list[tuple[str, float]] = []
    for index, count in enumerate(snapshot.entry_messages_counts[:-1]):
        running += count
        entry_buckets.append((str(float(2**index)), float(running)))
    entry_buckets.append(("+Inf", float(sum(snapshot.entry_messages_counts))))
    entries.add_metric([], entry_buckets, float(snapshot.proposed_messages))
    families.append(entries)

    group_lag = GaugeMetricFamily("raftmq_consumer_group_lag_messages",
                                  "messages of a topic a consumer group has not committed yet (all its queues)",
                                  labels=["group", "topic"])
    for (group, topic), value in sorted(snapshot.group_lag.items()):
        group_lag.add_metric([group, topic], value)
    families.append(group_lag)
    gauge("raftmq_connections", "open remoting connections", snapshot.connections)
    queue_depth = GaugeMetricFamily("raftmq_request_queue_depth", "requests waiting for a processor",
                                    labels=["processor"])
    queue_limit = GaugeMetricFamily("raftmq_request_queue_limit", "requests that may wait for a processor",
                                    labels=["processor"])
    for name, (waiting, limit) in sorted(snapshot.request_queues.items()):
        queue_depth.add_metric([name], waiting)
        queue_limit.add_metric([name], limit)
    families += [queue_depth, queue_limit]
    return families


class BrokerCollector(Collector):
    """Reads a snapshot at every scrape."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        return metric_families(self._snapshot())

    def describe(self) -> Iterable[Metric]:
        return []  # (not collected at registration: the member may not be up yet)


def new_registry(snapshot: Callable[[], MetricsSnapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(snapshot))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


# ------------------------------------------------------------------ reading live state


def group_lags(offsets: Mapping[tuple[str, str, int], int], max_queue_offset: Callable[[str, int], int],
               series_max: int = GROUP_LAG_SERIES_MAX) -> dict[tuple[str, str], int]:
    """Each (group, topic)'s messages not committed yet, summed over the queues it committed on; the
    ``series_max`` largest."""
    lags: dict[tuple[str, str], int] = {}
    for (group, topic, queue_id), offset in offsets.items():
        key = (group, topic)
        lags[key] = lags.get(key, 0) + max(0, max_queue_offset(topic, queue_id) - offset)
    if len(lags) > series_max:
        lags = dict(sorted(lags.items(), key=lambda item: -item[1])[:series_max])
    return lags


def _stage_counts(snapshot: Mapping[str, list[int]]) -> dict[str, DurationCounts]:
    return {stage: DurationCounts(tuple(counts)) for stage, counts in snapshot.items()}


def read_snapshot(node_id: str, broker_name: str, member: Any, stats: RuntimeStats, rates: Any, server: Any,
                  raft_ids: Mapping[str, str]) -> MetricsSnapshot:
    """The snapshot of a live member (``dledger.member.GroupMember``), its runtime stats, pull counters
    (``broker.pull_rates.PullRates``) and remoting server; ``raft_ids`` names the members by Raft address."""
    raft = member.raft
    status = raft_status(raft)
    role_name = RAFT_STATES.get(int(status.get("state") or 0), "unknown")
    journal = raft.journal()
    durable = getattr(journal, "durable_index", None)
    last_index = getattr(journal, "last_index", None)
    commit_index = int(status.get("commit_idx") or 0)
    follower_match: dict[str, int] = {}
    if role_name == "leader":
        prefix = "match_idx_server_"
        for key, value in status.items():
            if key.startswith(prefix):
                address = key[len(prefix):]
                follower_match[raft_ids.get(address, address)] = int(value)
    store = member.store
    committer = member.committer
    fsyncs = raft.journal_fsyncs
    state = member.state
    return MetricsSnapshot(
        node_id=node_id,
        broker_name=broker_name,
        role=role_name,
        term=int(status.get("raft_term") or 0),
        commit_index=commit_index,
        applied_index=int(member.machine.applied_index),
        durable_index=int(durable) if durable is not None else None,
        last_log_index=int(last_index) if last_index is not None else commit_index,
        follower_match_index=follower_match,
        damaged=raft.damage is not None,
        commit_log_min_offset=int(store.commit_log.min_offset),
        commit_log_max_offset=int(store.max_physical_offset),
        journal_fsyncs=DurationCounts(tuple(fsyncs.counts), fsyncs.total_seconds),
        stages=_stage_counts(member.stages.snapshot()),
        put_messages=int(committer.stored_messages),
        put_bytes=int(committer.stored_bytes),
        pulls_found=int(rates.pulls_found),
        pulls_missed=int(rates.pulls_missed),
        messages_served=int(rates.messages_served),
        put_tps={window: stats.put_tps(window) for window in TPS_WINDOWS_SECONDS},
        get_tps={window: stats.get_tps(window) for window in TPS_WINDOWS_SECONDS},
        proposed_entries=int(committer.proposed_entries),
        proposed_messages=int(committer.proposed_messages),
        entry_messages_counts=tuple(committer.entry_messages_counts),
        group_lag=group_lags(dict(state.consumer_offsets), store.max_queue_offset),
        connections=len(server.connections),
        request_queues=server.queue_depths(),
    )
