"""``raftmq topic|send|consume|msg|group|bench`` through click's runner, against the in-process fake
broker group (tests/client/fake_broker.py) running on a background event loop."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli.client_commands import BenchStats, parse_deliver_at
from cli.cluster import LocalCluster, free_ports, request
from cli.main import main
from client import ClientConfig, ConsumerConfig, Message, MessageQueue, Producer, PushConsumer
from client.loop import EventLoopThread
from dledger.stages import STAGES
from protocol.codes import RequestCode, ResponseCode
from tests.client.fake_broker import FakeGroup
from tests.support.stores import small_store
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def group() -> Iterator[FakeGroup]:
    fake = FakeGroup()
    loop = EventLoopThread("fake-broker")
    try:
        loop.run(fake.start())
        yield fake
    finally:
        loop.run(fake.stop())
        loop.stop()


def raftmq(group: FakeGroup, *arguments: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(arguments), input=stdin, env={"RAFTMQ_NAMESRV": group.namesrv})


def json_lines(result: Result) -> list[dict[str, object]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize(
    "command",
    [
        ["topic", "create"], ["topic", "update"], ["topic", "delete"], ["topic", "list"], ["topic", "describe"],
        ["send"], ["consume"], ["msg", "query"], ["group", "list"], ["group", "progress"], ["group", "status"],
        ["group", "reset-offset"], ["group", "update"], ["group", "delete"], ["bench", "produce"], ["bench", "consume"],
    ],
)
def test_every_command_has_help_with_examples(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output and "--namesrv" in result.output


def test_missing_namesrv_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["topic", "list"], env={"RAFTMQ_NAMESRV": None})
    assert result.exit_code == 2 and "Missing option '--namesrv'" in result.output
    assert "Traceback" not in result.output


def test_unreachable_name_server_fails_cleanly() -> None:
    (port,) = free_ports(1)
    result = CliRunner().invoke(main, ["topic", "list", "--namesrv", f"127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert "Error:" in result.output and "NO_NAME_SERVER_EXCEPTION" in result.output
    assert "Traceback" not in result.output
    bad = CliRunner().invoke(main, ["topic", "list", "--namesrv", "nonsense"])
    assert bad.exit_code == 2 and "host:port" in bad.output


def test_topic_commands(group: FakeGroup) -> None:
    created = raftmq(group, "topic", "create", "CliTopic", "--queues", "3")
    assert created.exit_code == 0, created.output
    assert "3 read / 3 write queues" in created.stdout
    listed = raftmq(group, "topic", "list", "--json")
    assert "CliTopic" in json.loads(listed.stdout)
    described = raftmq(group, "topic", "describe", "CliTopic", "--json")
    info = json.loads(described.stdout)
    assert [queue["queueId"] for queue in info["queues"]] == [0, 1, 2]
    assert info["brokers"][0]["addresses"]["0"] == group.leader.address
    table = raftmq(group, "topic", "describe", "CliTopic")
    assert "leader" in table.stdout and "max offset" in table.stdout
    updated = raftmq(group, "topic", "update", "CliTopic", "--write-queues", "2", "--perm", "rw")
    assert updated.exit_code == 0, updated.output
    assert "3 read / 2 write" in updated.stdout
    nothing = raftmq(group, "topic", "update", "CliTopic")
    assert nothing.exit_code == 2 and "nothing to change" in nothing.output
    missing = raftmq(group, "topic", "update", "NoSuchTopic", "--queues", "2")
    assert missing.exit_code == 1 and "NOT_FOUND_TOPIC" in missing.output
    both = raftmq(group, "topic", "create", "X", "--queues", "2", "--read-queues", "1")
    assert both.exit_code == 2
    bad_perm = raftmq(group, "topic", "create", "X", "--perm", "rwx")
    assert bad_perm.exit_code == 2 and "--perm" in bad_perm.output


def test_topic_update_changes_only_what_it_is_given(group: FakeGroup) -> None:
    """Issue 26: ``topic update NAME --queues 16`` reset the permission to rw and the order flag."""
    created = raftmq(group, "topic", "create", "CliKeep", "--queues", "2", "--perm", "r", "--order")
    assert created.exit_code == 0, created.output
    grown = raftmq(group, "topic", "update", "CliKeep", "--queues", "6")
    assert grown.exit_code == 0, grown.output
    state = group.store.topics["CliKeep"]
    assert (state.read_queue_nums, state.write_queue_nums, state.perm, state.order) == (6, 6, 4, True)
    assert "6 read / 6 write queues, perm r-, ordered" in grown.stdout
    writable = raftmq(group, "topic", "update", "CliKeep", "--perm", "rw")
    assert writable.exit_code == 0 and "6 read / 6 write queues, perm rw, ordered" in writable.stdout
    unordered = raftmq(group, "topic", "update", "CliKeep", "--no-order", "--write-queues", "3")
    assert unordered.exit_code == 0 and "6 read / 3 write queues, perm rw" in unordered.stdout
    assert (state.read_queue_nums, state.write_queue_nums, state.perm, state.order) == (6, 3, 6, False)
    fewer_reads = raftmq(group, "topic", "update", "CliKeep", "--read-queues", "2")
    assert fewer_reads.exit_code == 2 and "would never be consumed" in fewer_reads.output
    assert state.read_queue_nums == 6  # nothing changed


def test_send_consume_and_continue_where_the_group_stopped(group: FakeGroup, tmp_path: Path) -> None:
    first = raftmq(group, "send", "CliMsgs", "hello", "--tags", "paid", "--keys", "order-1", "--keys", "order-2",
                   "--property", "color=red", "--json")
    assert first.exit_code == 0, first.output
    sent = json.loads(first.stdout)
    assert sent["status"] == "SEND_OK" and sent["topic"] == "CliMsgs"
    piped = raftmq(group, "send", "CliMsgs", stdin=b"from stdin")
    assert piped.exit_code == 0 and "SEND_OK" in piped.stdout
    body_file = tmp_path / "body.bin"
    body_file.write_bytes(b"from a file")
    assert raftmq(group, "send", "CliMsgs", "--file", str(body_file), "--delay-level", "2").exit_code == 0
    assert raftmq(group, "send", "CliMsgs", "later", "--deliver-at", "+1h").exit_code == 0
    assert raftmq(group, "send", "CliMsgs", "ordered", "--sharding-key", "order-1").exit_code == 0

    consumed = raftmq(group, "consume", "CliMsgs", "--group", "cli-g", "--from", "first", "--count", "3", "--wait", "5")
    assert consumed.exit_code == 0, consumed.output
    messages = json_lines(consumed)
    assert len(messages) == 3
    rest = raftmq(group, "consume", "CliMsgs", "--group", "cli-g", "--from", "first", "--wait", "1")
    more = json_lines(rest)
    assert len(more) == 2  # the group continues after what it printed; nothing twice
    bodies = sorted(str(message["body"]) for message in messages + more)
    assert bodies == ["from a file", "from stdin", "hello", "later", "ordered"]
    hello = next(message for message in messages + more if message["body"] == "hello")
    assert hello["tags"] == "paid" and hello["keys"] == ["order-1", "order-2"]
    assert hello["properties"] == {"color": "red"} and hello["msgId"] == sent["msgId"]

    progress = raftmq(group, "group", "progress", "cli-g", "--json")
    assert progress.exit_code == 0, progress.output
    report = json.loads(progress.stdout)
    assert report["totalLag"] == 0 and {row["topic"] for row in report["queues"]} == {"CliMsgs"}
    # served within the last minute: all 5 to the first consume (which printed 3), the last 2 again to the second
    assert 7 / 20 < report["consumeTps"] <= 7 / 10
    text = raftmq(group, "group", "progress", "cli-g").stdout
    assert "total lag: 0" in text and "consumed over the last minute: 0." in text

    by_key = raftmq(group, "msg", "query", "--topic", "CliMsgs", "--key", "order-2", "--json")
    assert [line["msgId"] for line in json_lines(by_key)] == [sent["msgId"]]
    by_id = raftmq(group, "msg", "query", "--id", str(sent["offsetMsgId"]))
    assert by_id.exit_code == 0 and "hello" in by_id.stdout
    by_unique_id = raftmq(group, "msg", "query", "--topic", "CliMsgs", "--id", str(sent["msgId"]), "--json")
    assert json_lines(by_unique_id)[0]["body"] == "hello"
    unknown = raftmq(group, "msg", "query", "--topic", "CliMsgs", "--key", "nothing")
    assert unknown.exit_code == 1 and "no message" in unknown.output


@pytest.mark.parametrize(
    "arguments",
    [
        ["send", "T", "body", "--file", "x"],
        ["send", "T", "body", "--delay-level", "2", "--deliver-at", "+5s"],
        ["send", "T", "body", "--deliver-at", "tomorrow"],
        ["send", "T", "body", "--property", "novalue"],
        ["send", "T", "body", "--delay-level", "19"],
        ["msg", "query", "--key", "k"],
        ["msg", "query", "--topic", "T"],
        ["consume", "T"],
        ["topic", "update", "T"],
        ["topic", "update", "T", "--queues", "2", "--read-queues", "1"],
        ["topic", "update", "T", "--perm", "rwx"],
        ["topic", "update", "bad topic!", "--queues", "2"],
        ["topic", "delete", "TBW102"],
        ["topic", "delete", "RMQ_SYS_TRANS_HALF_TOPIC"],
        ["topic", "delete", "SCHEDULE_TOPIC_XXXX"],
        ["topic", "delete", "bad topic!"],
        ["group", "reset-offset", "g", "--topic", "T"],
        ["group", "reset-offset", "g", "--topic", "T", "--to", "latest", "--to-time", "0"],
        ["group", "reset-offset", "g", "--topic", "T", "--to", "middle"],
        ["group", "reset-offset", "g", "--topic", "T", "--to-time", "yesterday"],
        ["group", "reset-offset", "g", "--topic", "T", "--to-time", "99999999999999999"],
        ["group", "reset-offset", "g", "--to", "latest"],
        ["group", "reset-offset", "bad group!", "--topic", "T", "--to", "latest"],
        ["group", "reset-offset", "g", "--topic", "bad topic!", "--to", "latest"],
        ["group", "reset-offset", "g", "--topic", "SCHEDULE_TOPIC_XXXX", "--to", "latest"],
    ],
)
def test_usage_errors_exit_2_without_traceback(group: FakeGroup, arguments: list[str]) -> None:
    result = raftmq(group, *arguments)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_a_refused_message_is_bad_input_not_a_traceback(group: FakeGroup) -> None:
    result = raftmq(group, "send", "bad topic!", "x")
    assert result.exit_code == 2 and "MESSAGE_ILLEGAL" in result.output
    assert "Traceback" not in result.output


def test_bench_produce_and_consume_report_json(group: FakeGroup) -> None:
    produced = raftmq(group, "bench", "produce", "--topic", "CliBench", "--count", "200", "--size", "100",
                      "--inflight", "8", "--json")
    assert produced.exit_code == 0, produced.output
    summary = json.loads(produced.stdout.strip().splitlines()[-1])
    assert summary["messages"] == 200 and summary["errors"] == 0
    assert {"msgs_per_s", "MB_per_s", "p50_ms", "p99_ms", "max_ms"} <= set(summary)
    assert summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    table = raftmq(group, "bench", "produce", "--topic", "CliBench", "--count", "20", "--inflight", "4")
    assert "msgs/s" in table.stdout and "p99 ms" in table.stdout
    # coalesced by default (concurrent sends to one queue as batch requests); --no-coalesce: one request each
    batches = group.leader.requests.count(RequestCode.SEND_BATCH_MESSAGE)
    assert batches > 0
    singles = raftmq(group, "bench", "produce", "--topic", "CliBench", "--count", "30", "--inflight", "8",
                     "--no-coalesce", "--json")
    assert json.loads(singles.stdout.strip().splitlines()[-1])["messages"] == 30
    assert group.leader.requests.count(RequestCode.SEND_BATCH_MESSAGE) == batches
    consumed = raftmq(group, "bench", "consume", "--topic", "CliBench", "--count", "250", "--json", "--wait", "2")
    assert consumed.exit_code == 0, consumed.output
    read = json.loads(consumed.stdout.strip().splitlines()[-1])
    assert read["messages"] == 250 and read["MB_per_s"] > 0
    short = raftmq(group, "bench", "consume", "--topic", "CliBench", "--count", "10000", "--json", "--wait", "0.5")
    assert short.exit_code == 1 and json.loads(short.stdout.strip().splitlines()[-1])["messages"] == 250


def test_deliver_at_parsing_and_percentiles() -> None:
    assert parse_deliver_at("+30s", now_ms=1000) == 31_000
    assert parse_deliver_at("+2m", now_ms=0) == 120_000
    assert parse_deliver_at("1767225600000") == 1_767_225_600_000
    assert parse_deliver_at("2026-01-01T00:00:00+00:00") == 1_767_225_600_000
    stats = BenchStats(latencies=[0.001 * value for value in range(1, 101)], messages=100, seconds=2.0,
                       payload_bytes=2_000_000)
    summary = stats.summary()
    assert summary["p50_ms"] == 50.0 and summary["p99_ms"] == 99.0 and summary["max_ms"] == 100.0
    assert summary["msgs_per_s"] == 50.0 and summary["MB_per_s"] == 1.0


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(tmp_path_factory.mktemp("cli-cluster"), overrides=small_store()) as started:
        yield started


@pytest.mark.slow
def test_group_status_asks_each_member_through_the_broker(real_cluster: LocalCluster) -> None:
    env = {"RAFTMQ_NAMESRV": real_cluster.namesrv}
    created = CliRunner().invoke(main, ["topic", "create", "CliInfo", "--queues", "2"], env=env)
    assert created.exit_code == 0, created.output
    config = ClientConfig((real_cluster.namesrv,), client_ip="127.0.0.1", request_timeout_seconds=2.0,
                          heartbeat_interval_seconds=2.0)
    received: list[object] = []
    consumer = PushConsumer(config, ConsumerConfig(group="cli-info", pull_backoff_seconds=0.1,
                                                   suspend_timeout_seconds=1.0, rebalance_interval_seconds=1.0),
                            listener=lambda messages, context: received.extend(messages))
    consumer.subscribe("CliInfo")
    with consumer:
        wait_for(lambda: len(consumer.assigned_queues()) == 3, "the consumer to hold its queues",
                 timeout_seconds=30.0)  # + retry
        for index in range(4):
            sent = CliRunner().invoke(main, ["send", "CliInfo", f"m{index}"], env=env)
            assert sent.exit_code == 0, sent.output
        wait_for(lambda: len(received) == 4, "4 consumed messages", timeout_seconds=30.0)
        result = CliRunner().invoke(main, ["group", "status", "cli-info", "--json"], env=env)
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        (member,) = report["consumers"]
        assert report["errors"] == [] and member["clientId"] == consumer.client_id
        assert sorted((queue["topic"], queue["queueId"]) for queue in member["queues"]) == [
            ("%RETRY%cli-info", 0), ("CliInfo", 0), ("CliInfo", 1)]
        assert member["status"]["CliInfo"]["consumeOKTPS"] > 0
        text = CliRunner().invoke(main, ["group", "status", "cli-info"], env=env)
        assert text.exit_code == 0, text.output
        assert f"consumer {consumer.client_id}" in text.stdout and "subscriptions: CliInfo (*)" in text.stdout
        assert "commit offset" in text.stdout and "consume OK TPS" in text.stdout
        missing = CliRunner().invoke(main, ["group", "status", "cli-info", "--client", "nobody@0"], env=env)
        assert missing.exit_code == 1 and "The Consumer <cli-info> <nobody@0> not online" in missing.output
        assert "Traceback" not in missing.output
    empty = CliRunner().invoke(main, ["group", "status", "no-such-group"], env=env)
    assert empty.exit_code == 1 and "group no-such-group has no live consumer" in empty.output
    assert "Traceback" not in empty.output


@pytest.mark.slow
def test_bench_produce_shows_the_stages_of_the_send_path_and_runs_several_clients(
        real_cluster: LocalCluster) -> None:
    env = {"RAFTMQ_NAMESRV": real_cluster.namesrv}
    # one request per message (a coalesced batch request is one send of the stages)
    staged = CliRunner().invoke(main, ["bench", "produce", "--topic", "CliStages", "--count", "300", "--size", "100",
                                       "--inflight", "8", "--stages", "--json", "--no-coalesce"], env=env)
    assert staged.exit_code == 0, staged.output
    summary = json.loads(staged.stdout.strip().splitlines()[-1])
    rows = {row["stage"]: row for row in summary["stages"]}
    assert list(rows) == list(STAGES)
    # every send of the run passed each per-send stage once (the counts are this run's: before and after)
    for stage in ("remoting", "prepare", "batch_wait", "answer"):
        assert rows[stage]["count"] == 300, rows[stage]
    # group commit: an entry carries one send or several; the first send of a new topic creates it first
    assert 1 <= rows["replication"]["count"] <= 300 + 2 and rows["apply"]["count"] == rows["replication"]["count"]
    assert all(0 <= row["p50_ms"] <= row["p99_ms"] for row in rows.values())
    table = CliRunner().invoke(main, ["bench", "produce", "--topic", "CliStages", "--count", "20", "--stages"], env=env)
    assert table.exit_code == 0 and "replication" in table.stdout and "leader_fsync" in table.stdout
    several = CliRunner().invoke(main, ["bench", "produce", "--topic", "CliStages", "--count", "301", "--size", "100",
                                        "--inflight", "4", "--clients", "3", "--json"], env=env)
    assert several.exit_code == 0, several.output
    merged = json.loads(several.stdout.strip().splitlines()[-1])
    assert merged["messages"] == 301 and merged["errors"] == 0 and merged["p50_ms"] <= merged["max_ms"]
    timed = CliRunner().invoke(main, ["bench", "produce", "--topic", "CliStages", "--duration", "0.5", "--size", "100",
                                      "--inflight", "4", "--json"], env=env)
    assert timed.exit_code == 0, timed.output
    ran = json.loads(timed.stdout.strip().splitlines()[-1])
    assert ran["messages"] > 0 and 0.5 <= ran["seconds"] < 30  # stops once the time is up (not at 10,000)


def topic_on_each_member(cluster: LocalCluster, topic: str) -> list[dict[str, Any] | None]:
    """GET_ALL_TOPIC_CONFIG asked of every member: the topic's config in each one's replicated state."""
    configs: list[dict[str, Any] | None] = []
    for node in cluster.info.nodes:
        code, remark, body = request(node.broker_address, RequestCode.GET_ALL_TOPIC_CONFIG, timeout_seconds=2.0)
        assert code == ResponseCode.SUCCESS, remark
        configs.append(json.loads(body)["topicConfigTable"].get(topic))
    return configs


@pytest.mark.slow
def test_topic_and_group_admin_against_a_real_group(real_cluster: LocalCluster) -> None:
    """Issue 26: update changes only what it is given, shrinking read queues waits for the groups, reset-offset
    moves a group through Raft and refuses a live one, group list, and delete leaves every member's state."""
    env = {"RAFTMQ_NAMESRV": real_cluster.namesrv}

    def cli(*arguments: str, exit_code: int = 0) -> Result:
        result = CliRunner().invoke(main, list(arguments), env=env)
        assert result.exit_code == exit_code, result.output
        assert "Traceback" not in result.output
        return result

    cli("topic", "create", "Admin26", "--queues", "2", "--perm", "r", "--order")
    updated = cli("topic", "update", "Admin26", "--queues", "4")
    assert "4 read / 4 write queues, perm r-, ordered" in updated.stdout  # perm and order kept (issue 26)
    assert wait_for(lambda: all(config and (config["perm"], config["order"], config["readQueueNums"]) == (4, True, 4)
                                for config in topic_on_each_member(real_cluster, "Admin26")), "every member",
                           timeout_seconds=20.0)
    cli("topic", "update", "Admin26", "--perm", "rw")
    broker_name = json.loads(cli("topic", "describe", "Admin26", "--json").stdout)["brokers"][0]["brokerName"]
    config = ClientConfig((real_cluster.namesrv,), client_ip="127.0.0.1", request_timeout_seconds=2.0)
    with Producer(config) as producer:
        for queue_id in range(4):
            producer.send(Message("Admin26", b"early"), queue=MessageQueue("Admin26", broker_name, queue_id))
        time.sleep(0.2)
        between_ms = time.time_ns() // 1_000_000
        time.sleep(0.2)
        for queue_id in range(4):
            producer.send(Message("Admin26", b"late"), queue=MessageQueue("Admin26", broker_name, queue_id))

    def offsets(result: Result) -> dict[int, int]:
        report = json.loads(result.stdout)
        assert report["group"] == "g26" and report["topic"] == "Admin26"
        return {row["queueId"]: row["offset"] for row in report["queues"]}

    by_time = cli("group", "reset-offset", "g26", "--topic", "Admin26", "--to-time", str(between_ms), "--json")
    assert offsets(by_time) == dict.fromkeys(range(4), 1)
    earliest = cli("group", "reset-offset", "g26", "--topic", "Admin26", "--to", "earliest")
    assert "previous offset" in earliest.stdout
    listed = {entry["group"]: entry for entry in json.loads(cli("group", "list", "--json").stdout)}
    assert listed["g26"]["topics"] == ["Admin26"] and listed["g26"]["totalLag"] == 8 and listed["g26"]["online"] == 0
    assert "g26" in cli("group", "list").stdout

    # shrinking: the write queues at once, the read queues once no group has messages left in them
    cli("topic", "update", "Admin26", "--write-queues", "2")
    refused = cli("topic", "update", "Admin26", "--read-queues", "2", exit_code=2)
    assert "g26 has 2 on" in refused.output and "queue 3" in refused.output
    below_writes = cli("topic", "update", "Admin26", "--read-queues", "1", exit_code=2)
    assert "would never be consumed" in below_writes.output
    latest = cli("group", "reset-offset", "g26", "--topic", "Admin26", "--to", "latest", "--json")
    assert offsets(latest) == dict.fromkeys(range(4), 2)
    assert "2 read / 2 write queues, perm rw, ordered" in cli("topic", "update", "Admin26", "--read-queues", "2").stdout

    # a live consumer of the topic: refused, nothing changed; --force resets anyway
    live = PushConsumer(config, ConsumerConfig(group="g26", pull_backoff_seconds=0.1),
                        listener=lambda messages, context: None)
    live.subscribe("Admin26")
    with live:
        online = cli("group", "reset-offset", "g26", "--topic", "Admin26", "--to", "earliest", exit_code=2)
        assert "live consumer" in online.output and live.client_id in online.output and "--force" in online.output
        assert {entry["group"]: entry["online"] for entry in json.loads(cli("group", "list", "--json").stdout)}["g26"] == 1
        cli("group", "reset-offset", "g26", "--topic", "Admin26", "--to", "latest", "--force")

    deleted = cli("topic", "delete", "Admin26")
    assert f"topic Admin26 deleted from {broker_name}" in deleted.stdout
    assert "Admin26" not in json.loads(cli("topic", "list", "--json").stdout)
    cli("topic", "describe", "Admin26", exit_code=1)
    wait_for(lambda: topic_on_each_member(real_cluster, "Admin26") == [None] * len(real_cluster.info.nodes),
             "the topic to leave every member's state",
             timeout_seconds=20.0)
    groups = {entry["group"]: entry for entry in json.loads(cli("group", "list", "--json").stdout)}
    assert "Admin26" not in groups.get("g26", {}).get("topics", [])  # its offsets went with the topic
    again = cli("topic", "delete", "Admin26", exit_code=1)
    assert "NOT_FOUND_TOPIC" in again.output


@pytest.mark.slow
def test_client_commands_against_a_real_group_across_a_leader_kill(real_cluster: LocalCluster) -> None:
    def cli(*arguments: str) -> Result:
        result = CliRunner().invoke(main, list(arguments), env={"RAFTMQ_NAMESRV": real_cluster.namesrv})
        assert result.exit_code == 0, result.output
        return result

    cli("topic", "create", "E2E", "--queues", "2")
    sent = [json.loads(cli("send", "E2E", f"before-{index}", "--json").stdout)["msgId"] for index in range(3)]
    first = json_lines(cli("consume", "E2E", "--group", "e2e", "--from", "first", "--count", "3", "--wait", "10"))
    assert sorted(str(line["msgId"]) for line in first) == sorted(sent)
    leader = real_cluster.leader_id()
    assert leader is not None

    def committed_on_the_followers() -> bool:
        """The group's offsets reach the leader as the consume command ends and go through Raft a moment later
        (a leader killed before that takes them along, and the group consumes those messages again)."""
        for node in real_cluster.info.nodes:
            if node.id == leader:
                continue
            total = 0
            for queue_id in (0, 1):
                code, fields, _ = request(node.broker_address, RequestCode.QUERY_CONSUMER_OFFSET,
                                          {"consumerGroup": "e2e", "topic": "E2E", "queueId": str(queue_id)})
                if code != ResponseCode.SUCCESS:
                    return False
                total += int(fields["offset"])
            if total != 3:
                return False
        return True

    wait_for(committed_on_the_followers, "the group's offsets on the followers", timeout_seconds=20.0)
    real_cluster.kill(leader, signal.SIGKILL)
    after = json.loads(cli("send", "E2E", "after the kill", "--json").stdout)
    assert after["status"] == "SEND_OK"
    rest = json_lines(cli("consume", "E2E", "--group", "e2e", "--count", "1", "--wait", "20"))
    assert [line["body"] for line in rest] == ["after the kill"]
    summary = json.loads(cli("bench", "produce", "--topic", "E2EBench", "--count", "100", "--inflight", "8",
                             "--json").stdout.strip().splitlines()[-1])
    assert summary["messages"] == 100 and summary["errors"] == 0
