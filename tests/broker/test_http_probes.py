"""The member's HTTP port (broker.http, broker.probes), its metrics (broker.metrics) and Java's runtime
statistics (broker.runtime_stats): units first, then a real three-member group whose leader is killed."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.config import BrokerConfig
from broker.http import (
    HttpError,
    HttpLimits,
    HttpRequest,
    HttpResponse,
    HttpServer,
    encode_response,
    parse_request_head,
    probe_routes,
)
from broker.metrics import CONTENT_TYPE, DurationCounts, MetricsSnapshot, group_lags, new_registry, render
from broker.probes import READY_APPLY_LAG_ENTRIES_MAX, Probes, ProbeState, read_probe_state, readiness_problem
from broker.runtime_stats import (
    QueueFacts,
    RuntimeStats,
    StoreFacts,
    Totals,
    format_runtime,
    human_readable_bytes,
    java_double,
    put_time_distribution,
)
from cli.cluster import CLUSTER_FILE, LocalCluster, node_status, parse_setting
from commitlog.config import ConfigError
from dledger.stages import BUCKETS, bucket_of
from protocol.codes import RequestCode, ResponseCode
from tests.broker import wire
from tests.support.stores import small_store
from tests.support.waiting import wait_for

# ------------------------------------------------------------------ request parsing (sans-IO)


@pytest.mark.parametrize(("head", "expected"), [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", HttpRequest("GET", "/healthz", {}, True)),
    (b"GET /readyz?role=leader HTTP/1.1\r\n\r\n", HttpRequest("GET", "/readyz", {"role": "leader"}, True)),
    (b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", HttpRequest("HEAD", "/metrics", {}, False)),
    (b"GET /healthz HTTP/1.0\r\n\r\n", HttpRequest("GET", "/healthz", {}, False)),
    (b"GET /healthz HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", HttpRequest("GET", "/healthz", {}, True)),
    (b"GET /ready%7A?role=leader&x= HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
     HttpRequest("GET", "/readyz", {"role": "leader", "x": ""}, True)),
])
def test_request_heads_that_parse(head: bytes, expected: HttpRequest) -> None:
    assert parse_request_head(head) == expected


@pytest.mark.parametrize(("head", "status"), [
    (b"POST /metrics HTTP/1.1\r\n\r\n", HTTPStatus.METHOD_NOT_ALLOWED),
    (b"GET /metrics HTTP/2.0\r\n\r\n", HTTPStatus.HTTP_VERSION_NOT_SUPPORTED),
    (b"GET /metrics SPDY\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET  /metrics HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET http://x/metrics HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /a\x01b HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"G(T /metrics HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"\x00\xff\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /%ff HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /metrics HTTP/1.1\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * 65 + b"\r\n", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
    (b"GET /metrics HTTP/1.1\r\nX-A: " + b"b" * 9000 + b"\r\n\r\n", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
])
def test_request_heads_that_are_refused(head: bytes, status: HTTPStatus) -> None:
    with pytest.raises(HttpError) as caught:
        parse_request_head(head)
    assert caught.value.status == status


def test_response_encoding() -> None:
    response = HttpResponse(HTTPStatus.SERVICE_UNAVAILABLE, b"not the leader\n")
    assert encode_response(response) == (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8"
                                         b"\r\nContent-Length: 15\r\nCache-Control: no-store\r\nConnection: close\r\n"
                                         b"\r\nnot the leader\n")
    head_only = encode_response(response, head_only=True, keep_alive=True)
    assert head_only.endswith(b"Content-Length: 15\r\nCache-Control: no-store\r\nConnection: keep-alive\r\n\r\n")


class _Probes:
    def __init__(self) -> None:
        self.health_problem: str | None = None
        self.roles: dict[str | None, str | None] = {None: None, "leader": "not the leader", "follower": None}

    def health(self) -> str | None:
        return self.health_problem

    def readiness(self, role: str | None = None) -> str | None:
        return self.roles[role]


def test_routes() -> None:
    probes = _Probes()
    route = probe_routes(probes, lambda: b"raftmq_up 1\n", CONTENT_TYPE)

    def get(target: str) -> HttpResponse:
        return route(parse_request_head(f"GET {target} HTTP/1.1\r\n\r\n".encode()))

    assert get("/healthz") == HttpResponse(200, b"ok\n")
    assert get("/readyz") == HttpResponse(200, b"ok\n")
    assert get("/readyz?role=leader") == HttpResponse(503, b"not the leader\n")
    assert get("/readyz?role=follower").status == 200
    assert get("/readyz?role=primary").status == 400
    assert get("/metrics") == HttpResponse(200, b"raftmq_up 1\n", CONTENT_TYPE)
    assert get("/").status == 404
    probes.health_problem = "stopping"
    assert get("/healthz") == HttpResponse(503, b"stopping\n")


# ------------------------------------------------------------------ the server on a socket


async def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, half-close, read everything until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        writer.write_eof()
        await writer.drain()
        return await asyncio.wait_for(reader.read(-1), 5)
    finally:
        writer.close()


def _serve(route: Callable[[HttpRequest], HttpResponse], limits: HttpLimits | None,
           body: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        server = HttpServer("127.0.0.1", 0, route, limits)
        await server.start()
        try:
            await body(server.port)
        finally:
            await server.stop()

    asyncio.run(main())


def test_server_answers_keeps_alive_and_survives_bad_requests() -> None:
    calls: list[str] = []

    def route(request: HttpRequest) -> HttpResponse:
        calls.append(request.path)
        if request.path == "/boom":
            raise RuntimeError("broken")
        return HttpResponse(200, request.path.encode())

    async def body(port: int) -> None:
        two = await _exchange(port, b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert two.count(b"HTTP/1.1 200 OK") == 2 and two.endswith(b"/b")
        assert b"Connection: keep-alive" in two and b"Connection: close" in two
        head = await _exchange(port, b"HEAD /a HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
        assert (await _exchange(port, b"GET /boom HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 500")
        assert (await _exchange(port, b"BREW /pot HTCPCP/1.0\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert (await _exchange(port, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 431")
        assert await _exchange(port, b"GET /half") == b""  # closed mid-head: nothing to answer
        assert (await _exchange(port, b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n")).endswith(b"/c")

    _serve(route, None, body)
    assert calls == ["/a", "/b", "/a", "/boom", "/c"]


def test_server_limits_connections_time_and_requests() -> None:
    limits = HttpLimits(head_timeout_seconds=0.2, connections_max=1, requests_per_connection_max=2)

    async def body(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # holds the only slot, silent
        try:
            await asyncio.sleep(0.05)
            refused = await _exchange(port, b"GET /a HTTP/1.1\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 503")
            assert await asyncio.wait_for(reader.read(-1), 5) == b""  # dropped after the head timeout
        finally:
            writer.close()
        three = await _exchange(port, b"GET /a HTTP/1.1\r\n\r\n" * 3)
        assert three.count(b"HTTP/1.1 200") == 2 and three.endswith(b"Connection: close\r\n\r\n/a")

    _serve(lambda request: HttpResponse(200, request.path.encode()), limits, body)


# ------------------------------------------------------------------ probe decisions

HEALTHY_LEADER = ProbeState(serving=True, stopping=False, raft_running=True, damage=None, snapshot_load_failed=False,
                            write_refusal=None, has_quorum=True, leader_known=True, applied_index=100,
                            leader_commit_index=100)
FOLLOWER = replace(HEALTHY_LEADER, write_refusal="not the leader")


@pytest.mark.parametrize(("state", "any_role", "leader", "follower"), [
    (HEALTHY_LEADER, None, None, "the leader"),
    (FOLLOWER, None, "not the leader", None),
    (replace(HEALTHY_LEADER, has_quorum=False), None, "the leader does not hear a majority", "the leader"),
    (replace(HEALTHY_LEADER, write_refusal="handing leadership over"), None, "handing leadership over", None),
    (replace(FOLLOWER, leader_known=False), "no leader known", "not the leader", "no leader known"),
    (replace(FOLLOWER, applied_index=100 - READY_APPLY_LAG_ENTRIES_MAX), None, "not the leader", None),
    (replace(FOLLOWER, applied_index=99 - READY_APPLY_LAG_ENTRIES_MAX),
     f"applying: {READY_APPLY_LAG_ENTRIES_MAX + 1} committed entries behind", "not the leader",
     f"applying: {READY_APPLY_LAG_ENTRIES_MAX + 1} committed entries behind"),
    (replace(HEALTHY_LEADER, stopping=True), "stopping", "stopping", "stopping"),
    (replace(HEALTHY_LEADER, serving=False), "the remoting server is not serving", "the remoting server is not serving",
     "the remoting server is not serving"),
    (replace(HEALTHY_LEADER, raft_running=False), "the Raft thread is not running", "the Raft thread is not running",
     "the Raft thread is not running"),
])
def test_readiness(state: ProbeState, any_role: str | None, leader: str | None, follower: str | None) -> None:
    assert readiness_problem(state) == any_role
    assert readiness_problem(state, "leader") == leader
    assert readiness_problem(state, "follower") == follower


def test_damage_makes_a_member_unhealthy() -> None:
    problem = readiness_problem(replace(HEALTHY_LEADER, damage="torn record"), "leader")
    assert problem is not None and "torn record" in problem
    with pytest.raises(ValueError, match="unknown role"):
        readiness_problem(HEALTHY_LEADER, "primary")


# ------------------------------------------------------------------ Java's formats


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0.0"), (12.0, "12.0"), (12.5, "12.5"), (0.1, "0.1"), (1 / 3, "0.3333333333333333"), (0.001, "0.001"),
    (0.0001, "1.0E-4"), (1.5e-7, "1.5E-7"), (9999999.0, "9999999.0"), (1e7, "1.0E7"), (12345678.9, "1.23456789E7"),
    (-2.5, "-2.5"), (float("nan"), "NaN"),
])
def test_java_double(value: float, text: str) -> None:
    assert java_double(value) == text


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 << 30, "5.0 GiB"), (3 << 40, "3.0 TiB"),
])
def test_human_readable_bytes(count: int, text: str) -> None:
    assert human_readable_bytes(count) == text


def test_runtime_text() -> None:
    assert format_runtime(0) == "[ 0 days, 0 hours, 0 minutes, 0 seconds ]"
    assert format_runtime(((2 * 24 + 3) * 3600 + 4 * 60 + 5) * 1000 + 999) == "[ 2 days, 3 hours, 4 minutes, 5 seconds ]"


def test_put_time_distribution() -> None:
    counts = [0] * BUCKETS
    counts[bucket_of(0.002)] += 3  # 2 ms
    counts[bucket_of(0.070)] += 2  # 70 ms
    counts[bucket_of(30.0)] += 1
    text, longest_ms = put_time_distribution(counts)
    assert text.startswith("[<=0ms]:0 [0~10ms]:3 [10~50ms]:0 [50~100ms]:2 ")
    assert text.endswith("[5~10s]:0 [10s~]:1 ")
    assert 30_000 <= longest_ms < 40_000


class _Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


def _stats(clock: _Clock, totals: list[Totals]) -> RuntimeStats:
    return RuntimeStats(lambda: totals[-1], wall_clock_ms=clock, day_of=lambda ms: ms // 86_400_000)


def test_tps_windows_and_daily_totals() -> None:
    clock = _Clock()
    totals = [Totals()]
    stats = _stats(clock, totals)
    for second in range(1, 601):  # 10 messages a second for 9 minutes, then 100 a second
        clock.now_ms += 1000
        previous = totals[-1]
        rate = 10 if second <= 540 else 100
        totals.append(Totals(previous.put_messages + rate, previous.put_bytes + 100 * rate, previous.pulls_found + 1,
                             previous.pulls_missed, previous.messages_served + rate))
        stats.sample()
    assert stats.put_tps(10) == 100.0 and stats.put_tps(60) == 100.0 and stats.put_tps(600) == 19.0
    fields = stats.fields(StoreFacts(0, 4096, 1_700_000_000_000, 0, 1 << 30, 1 << 29), {"send": QueueFacts(3, 10_000)},
                          [0] * BUCKETS)
    assert fields["putTps"] == "100.0 100.0 19.0"
    assert fields["getTransferedTps"] == "100.0 100.0 19.0"
    assert fields["getFoundTps"] == "1.0 1.0 1.0" and fields["getMissTps"] == "0.0 0.0 0.0"
    assert fields["msgPutTotalTodayNow"] == str(totals[-1].put_messages)
    assert fields["sendThreadPoolQueueSize"] == "3" and fields["sendThreadPoolQueueCapacity"] == "10000"
    assert fields["commitLogDiskRatio"] == "0.5" and fields["remainHowManyDataToFlush"] == "0 B"
    assert fields["runtime"] == "[ 0 days, 0 hours, 10 minutes, 0 seconds ]"
    before_midnight = int(fields["msgPutTotalTodayNow"])
    assert fields["msgPutTotalTodayMorning"] == "0"
    clock.now_ms += 86_400_000  # the next day
    stats.sample()
    assert stats.fields(StoreFacts(0, 0, -1, 0, -1, -1), {}, [])["msgPutTotalTodayMorning"] == str(before_midnight)


def test_fields_parse_as_the_exporter_parses_them() -> None:
    """rocketmq-exporter's BrokerRuntimeStats reads these keys and fails on a missing or unparsable one."""
    stats = _stats(_Clock(), [Totals()])  # one sample only: every rate must still be a number
    fields = stats.fields(StoreFacts(0, 0, -1, 12345, 100 << 30, 40 << 30), {}, [0] * BUCKETS)
    longs = ["msgPutTotalTodayNow", "sendThreadPoolQueueHeadWaitTimeMills", "queryThreadPoolQueueHeadWaitTimeMills",
             "msgGetTotalTodayNow", "queryThreadPoolQueueSize", "bootTimestamp", "msgPutTotalYesterdayMorning",
             "msgGetTotalYesterdayMorning", "pullThreadPoolQueueSize", "commitLogMinOffset",
             "pullThreadPoolQueueHeadWaitTimeMills", "dispatchMaxBuffer", "brokerVersion", "pageCacheLockTimeMills",
             "commitLogMaxOffset", "getMessageEntireTimeMax", "msgPutTotalTodayMorning", "putMessageTimesTotal",
             "msgGetTotalTodayMorning", "sendThreadPoolQueueSize", "startAcceptSendRequestTimeStamp",
             "putMessageEntireTimeMax", "earliestMessageTimeStamp", "remainTransientStoreBufferNumbs",
             "queryThreadPoolQueueCapacity", "dispatchBehindBytes", "putMessageSizeTotal",
             "sendThreadPoolQueueCapacity", "pullThreadPoolQueueCapacity"]
    for name in longs:
        assert re.fullmatch(r"-?\d+", fields[name]), name
    for name in ("consumeQueueDiskRatio", "commitLogDiskRatio", "putMessageAverageSize"):
        float(fields[name])
    for name in ("putTps", "getMissTps", "getTransferedTps", "getTotalTps", "getFoundTps"):
        assert [float(part) for part in fields[name].split(" ")] == [0.0, 0.0, 0.0], name
    number, unit = fields["remainHowManyDataToFlush"].split(" ")
    assert float(number) * 1024 ** ("KMGTPE".index(unit[0]) + 1) == pytest.approx(12345, rel=0.01)
    words = fields["commitLogDirCapacity"].split(" ")
    assert words[:2] == ["Total", ":"] and f"{words[2]} {words[3][:-1]}" == "100.0 GiB"
    assert f"{words[6]} {words[7][:-1]}" == "40.0 GiB"
    for part in fields["putMessageDistributeTime"].split(" "):
        if part:
            label, count = part.split(":")
            assert label.startswith("[") and int(count) == 0
    assert fields["brokerVersionDesc"] == "V4_9_4" and fields["runtime"].startswith("[ 0 days")


# ------------------------------------------------------------------ metrics


def _snapshot(**changes: object) -> MetricsSnapshot:
    fsyncs = [0] * BUCKETS
    fsyncs[bucket_of(0.004)] = 5
    base = MetricsSnapshot(node_id="n0", broker_name="broker-a", role="leader", term=3, commit_index=40,
                           applied_index=39, durable_index=41, last_log_index=41,
                           follower_match_index={"n1": 41, "n2": 30},
                           journal_fsyncs=DurationCounts(tuple(fsyncs), 0.02),
                           stages={"replication": DurationCounts(tuple(fsyncs))},
                           put_messages=1000, put_bytes=64_000, pulls_found=7, pulls_missed=2, messages_served=900,
                           put_tps={10: 12.5, 60: 3.0, 600: 0.5}, proposed_entries=3, proposed_messages=70,
                           entry_messages_counts=(1, 0, 0, 0, 0, 1, 1) + (0,) * 9,
                           group_lag={("g", "Orders"): 17}, connections=4, request_queues={"send": (2, 10_000)})
    return replace(base, **changes)  # type: ignore[arg-type]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_render_and_parse() -> None:
    snapshots = [_snapshot()]
    registry = new_registry(lambda: snapshots[-1])
    samples = _samples(render(registry).decode())
    assert samples[("raftmq_raft_leader", ())] == 1
    assert samples[("raftmq_raft_role", (("role", "leader"),))] == 1
    assert samples[("raftmq_raft_role", (("role", "follower"),))] == 0
    assert samples[("raftmq_raft_term", ())] == 3
    assert samples[("raftmq_raft_durable_index", ())] == 41
    assert samples[("raftmq_raft_follower_lag_entries", (("peer", "n2"),))] == 11
    assert samples[("raftmq_raft_follower_lag_entries", (("peer", "n1"),))] == 0
    assert samples[("raftmq_journal_fsync_seconds_count", ())] == 5
    assert samples[("raftmq_journal_fsync_seconds_sum", ())] == pytest.approx(0.02)
    assert samples[("raftmq_send_stage_seconds_count", (("stage", "replication"),))] == 5
    assert samples[("raftmq_messages_put_total", ())] == 1000
    assert samples[("raftmq_pull_requests_total", (("result", "missed"),))] == 2
    assert samples[("raftmq_put_messages_per_second", (("window", "10s"),))] == 12.5
    assert samples[("raftmq_group_commit_entry_messages_bucket", (("le", "1.0"),))] == 1
    assert samples[("raftmq_group_commit_entry_messages_bucket", (("le", "32.0"),))] == 2
    assert samples[("raftmq_group_commit_entry_messages_count", ())] == 3
    assert samples[("raftmq_group_commit_entry_messages_sum", ())] == 70
    assert samples[("raftmq_consumer_group_lag_messages", (("group", "g"), ("topic", "Orders")))] == 17
    assert samples[("raftmq_connections", ())] == 4
    assert samples[("raftmq_request_queue_depth", (("processor", "send"),))] == 2
    buckets = sorted((float(dict(labels)["le"]), value) for (name, labels), value in samples.items()
                     if name == "raftmq_journal_fsync_seconds_bucket")
    assert [value for _, value in buckets] == sorted(value for _, value in buckets)  # cumulative
    assert buckets[-1] == (float("inf"), 5.0)
    # read at every scrape; another broker's registry is its own
    snapshots.append(_snapshot(role="follower", term=4, follower_match_index={}, durable_index=None))
    other = new_registry(lambda: _snapshot(node_id="n9"))
    samples = _samples(render(registry).decode())
    assert samples[("raftmq_raft_leader", ())] == 0 and samples[("raftmq_raft_term", ())] == 4
    assert ("raftmq_raft_durable_index", ()) not in samples
    assert not any(name == "raftmq_raft_follower_lag_entries" for name, _ in samples)
    assert ("raftmq_member_info", (("broker_name", "broker-a"), ("node_id", "n9"))) in _samples(render(other).decode())


def test_group_lags() -> None:
    max_offsets = {("A", 0): 10, ("A", 1): 5, ("B", 0): 3}
    offsets = {("g1", "A", 0): 4, ("g1", "A", 1): 5, ("g1", "B", 0): 3, ("g2", "A", 0): 12}
    assert group_lags(offsets, lambda topic, queue: max_offsets[(topic, queue)]) == {
        ("g1", "A"): 6, ("g1", "B"): 0, ("g2", "A"): 0}
    assert group_lags(offsets, lambda topic, queue: max_offsets[(topic, queue)], series_max=1) == {("g1", "A"): 6}


class _FlakyRaft:
    """pysyncobj as a reader on another thread may see it: a dict changing size under ``getStatus``."""

    def __init__(self, status: dict[str, object], failures: int) -> None:
        self.status = status
        self.failures = failures
        self.damage: str | None = None

    def getStatus(self) -> dict[str, object]:  # (pysyncobj's name)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("dictionary changed size during iteration")
        return self.status

    def tick_thread(self) -> None:
        return None


class _Member:
    def __init__(self, raft: _FlakyRaft, refusal: str | None) -> None:
        self.raft = raft
        self.snapshot_load_failed = False
        self.machine = SimpleNamespace(applied_index=90)
        self._refusal = refusal

    def write_refusal(self) -> str | None:
        return self._refusal


def test_probe_state_is_read_again_when_pysyncobj_changes_under_it() -> None:
    raft = _FlakyRaft({"leader": "127.0.0.1:1", "has_quorum": True, "leader_commit_idx": 100}, failures=2)
    state = read_probe_state(_Member(raft, None), serving=True, stopping=False)
    assert state == replace(HEALTHY_LEADER, applied_index=90)
    assert Probes(lambda: state).readiness("leader") is None
    fresh = _FlakyRaft({"leader": None, "has_quorum": False, "leader_commit_idx": None}, failures=0)
    state = read_probe_state(_Member(fresh, "not the leader"), serving=True, stopping=False)
    assert not state.leader_known and state.leader_commit_index == 0
    assert Probes(lambda: state).readiness() == "no leader known"


# ------------------------------------------------------------------ configuration


def test_http_address_is_checked() -> None:
    assert BrokerConfig.from_mapping({"listen_address": "127.0.0.1:10911"}).http_address == ""
    config = BrokerConfig.from_mapping({"listen_address": "127.0.0.1:10911", "http_address": "0.0.0.0:9100"})
    assert config.http_address == "0.0.0.0:9100"
    for bad in ("9100", "127.0.0.1:99999", 9100):
        with pytest.raises(ConfigError, match="http_address"):
            BrokerConfig.from_mapping({"listen_address": "127.0.0.1:10911", "http_address": bad})
    with pytest.raises(ValueError, match="set by `raftmq cluster up`"):
        parse_setting("broker.http_address=127.0.0.1:1")


# ------------------------------------------------------------------ a real group


def _get(address: str, target: str) -> tuple[int, str]:
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return 0, ""
    finally:
        connection.close()


def _leader_checks(cluster: LocalCluster) -> dict[str, int]:
    return {node.id: _get(node.http_address, "/readyz?role=leader")[0] for node in cluster.info.nodes}


def _metrics(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(address, "/metrics")
    assert status == 200
    return _samples(text)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(tmp_path_factory.mktemp("probes"), overrides=small_store()) as started:
        yield started


@pytest.mark.slow
def test_probes_and_metrics_follow_the_leader(cluster: LocalCluster) -> None:
    assert all(node.metrics_url == f"http://{node.http_address}/metrics" for node in cluster.info.nodes)
    listed = json.loads((Path(cluster.info.data_dir) / CLUSTER_FILE).read_text())["nodes"]
    assert [node["metrics_url"] for node in listed] == [node.metrics_url for node in cluster.info.nodes]
    def one_leader() -> dict[str, int] | None:
        checks = _leader_checks(cluster)
        return checks if sorted(checks.values()) == [200, 503, 503] else None

    checks = wait_for(one_leader, "exactly one member passing the leader check", timeout_seconds=30)
    leader_id = next(node_id for node_id, status in checks.items() if status == 200)
    leader = cluster.info.node(leader_id)
    assert (node_status(leader) or {}).get("brokerRole") == "LEADER"
    for node in cluster.info.nodes:
        assert _get(node.http_address, "/healthz") == (200, "ok\n")
        wait_for(lambda: _get(node.http_address, "/readyz")[0] == 200, f"{node.id} ready",  # noqa: B023
                 timeout_seconds=30)
        if node.id != leader_id:
            assert _get(node.http_address, "/readyz?role=leader") == (503, "not the leader\n")
    assert _get(leader.http_address, "/readyz?role=primary")[0] == 400
    assert _get(leader.http_address, "/nowhere")[0] == 404

    wire.create_topic(leader.broker_address, "Probed")
    for number in range(20):
        code, _, remark = wire.send(leader.broker_address, "Probed", f"m{number}".encode())
        assert code == ResponseCode.SUCCESS, remark
    samples = _metrics(leader.http_address)
    assert samples[("raftmq_raft_leader", ())] == 1
    assert samples[("raftmq_messages_put_total", ())] >= 20
    assert samples[("raftmq_group_commit_entry_messages_count", ())] >= 1
    term = samples[("raftmq_raft_term", ())]
    assert {labels for name, labels in samples if name == "raftmq_raft_follower_lag_entries"} == {
        (("peer", node.id),) for node in cluster.info.nodes if node.id != leader_id}
    code, _, body = wire.call(leader.broker_address, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert code == ResponseCode.SUCCESS
    table = wire.json_body(body)["table"]
    assert re.fullmatch(r"\d+\.\d+(E-?\d+)? \d+\.\d+(E-?\d+)? \d+\.\d+(E-?\d+)?", table["putTps"])
    assert int(table["msgPutTotalTodayNow"]) >= 20 and table["brokerRole"] == "LEADER"

    cluster.kill(leader_id)
    survivors = [node for node in cluster.info.nodes if node.id != leader_id]

    def new_leader() -> str | None:
        statuses = {node.id: _get(node.http_address, "/readyz?role=leader")[0] for node in survivors}
        passing = [node_id for node_id, status in statuses.items() if status == 200]
        return passing[0] if len(passing) == 1 and sorted(statuses.values()) == [200, 503] else None

    moved = wait_for(new_leader, "the leader check passing on one survivor", timeout_seconds=60)
    assert _get(leader.http_address, "/readyz?role=leader")[0] == 0  # killed: no answer at all
    samples = _metrics(cluster.info.node(moved).http_address)
    assert samples[("raftmq_raft_leader", ())] == 1 and samples[("raftmq_raft_term", ())] > term
    for node in survivors:
        if node.id != moved:
            follower = _metrics(node.http_address)
            assert follower[("raftmq_raft_role", (("role", "follower"),))] == 1
            assert follower[("raftmq_raft_term", ())] > term
    cluster.restart(leader_id)
    wait_for(lambda: _get(leader.http_address, "/readyz")[0] == 200, "the old leader back and ready",
             timeout_seconds=60)
    assert _leader_checks(cluster)[leader_id] == 503
