"""The main job (``raftmq demo`` / ``make demo``): a three-node group as users run it, every kind of
message, a leader killed in the middle, and proof that nothing acknowledged was lost.

Steps: start the cluster; create topics; send normal messages while SIGKILLing the leader halfway (the
client rides out the election); send ordered messages by sharding key, transactional messages (half
committed, half rolled back), delay-level and timed messages; consume everything with push consumers and
check it (every acknowledged message exactly once per group, order per sharding key, no rolled-back
message, no delayed one early); restart the killed node, wait until it caught up, stop the cluster, and
run the Spark consistency check over the replicas. Exit code 0 only when every check holds.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from cli.cluster import LocalCluster
from client import (
    AsyncAdmin,
    AsyncProducer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    ClientConfig,
    ConsumeFromWhere,
    ConsumerConfig,
    LocalTransactionState,
    Message,
    MessageExt,
    ProducerConfig,
    select_by_sharding_key,
)

NORMAL, ORDERED, TRANSACTIONAL, DELAYED = "DemoNormal", "DemoOrdered", "DemoTransactional", "DemoDelayed"
CONSUME_TIMEOUT_SECONDS = 60.0


@dataclass
class Report:
    steps: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def step(self, text: str) -> None:
        self.steps.append(text)
        click.echo(f"* {text}")

    def check(self, ok: bool, text: str) -> None:
        click.echo(f"  {'ok' if ok else 'FAILED'}: {text}")
        if not ok:
            self.failures.append(text)


class _Listener:
    """Demo transactions: even numbers commit, odd ones roll back; a check-back answers the same way."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return self._decide(message.body)

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return self._decide(message.body)

    @staticmethod
    def _decide(body: bytes) -> LocalTransactionState:
        number = int(body.split(b"-")[-1])
        return LocalTransactionState.COMMIT_MESSAGE if number % 2 == 0 else LocalTransactionState.ROLLBACK_MESSAGE


async def _produce(cluster: LocalCluster, report: Report, count: int) -> dict[str, dict[str, int]]:
    """Send everything; return, per topic, UNIQ_KEY -> what was acknowledged (with its due time or 0)."""
    config = ClientConfig(namesrv_addresses=(cluster.namesrv,), route_refresh_interval_seconds=5.0)
    acked: dict[str, dict[str, int]] = defaultdict(dict)
    async with AsyncAdmin(config) as admin:
        for topic, queues in ((NORMAL, 4), (ORDERED, 4), (TRANSACTIONAL, 2), (DELAYED, 2)):
            await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
    report.step(f"created topics {NORMAL}, {ORDERED}, {TRANSACTIONAL}, {DELAYED}")
    producer = await AsyncProducer(config, ProducerConfig(group="demo-producer", send_timeout_seconds=30)).start()
    try:
        killed_at = first_ack_after = 0.0
        leader_before = cluster.leader_id()
        with click.progressbar(length=count, label=f"sending {count} messages (the leader dies halfway)") as bar:
            for number in range(count):
                if number == count // 2:
                    killed = cluster.leader_node()
                    assert killed is not None
                    cluster.kill(killed.id, signal.SIGKILL)
                    killed_at = time.monotonic()
                    report.figures["killed_leader"] = killed.id
                message = Message(NORMAL, f"normal-{number}".encode(), tags="demo", keys=(f"order-{number}",))
                await producer.send(message)
                if killed_at and not first_ack_after:
                    first_ack_after = time.monotonic()
                assert message.unique_id is not None
                acked[NORMAL][message.unique_id] = 0
                bar.update(1)
        report.figures["unavailable_seconds_after_kill"] = round(first_ack_after - killed_at, 3)
        leader_after = cluster.leader_id()
        report.step(f"leader {leader_before} killed after {count // 2} acks; new leader {leader_after}; "
                    f"the next ack came {report.figures['unavailable_seconds_after_kill']} s after the kill")
        for number in range(200):
            key = f"customer-{number % 10}"
            message = Message(ORDERED, f"{key}-{number}".encode(), sharding_key=key)
            await producer.send_orderly(message, select_by_sharding_key, key)
            assert message.unique_id is not None
            acked[ORDERED][message.unique_id] = 0
        report.step("sent 200 ordered messages over 10 sharding keys")
        now_ms = int(time.time() * 1000)
        for number in range(20):
            message = Message(DELAYED, f"level-{number}".encode(), delay_level=1 + number % 2)
            await producer.send(message)
            assert message.unique_id is not None
            acked[DELAYED][message.unique_id] = now_ms + (1000 if number % 2 == 0 else 5000)
        for number in range(10):
            due = now_ms + 3000 + 100 * number
            message = Message(DELAYED, f"timed-{number}".encode(), deliver_at_ms=due)
            await producer.send(message)
            assert message.unique_id is not None
            acked[DELAYED][message.unique_id] = due
        report.step("sent 20 delay-level messages (1 s and 5 s) and 10 timed messages (3 s ahead)")
    finally:
        await producer.close()
    transactions = await AsyncTransactionProducer(config, ProducerConfig(group="demo-tx-producer"),
                                                  listener=_Listener()).start()
    try:
        for number in range(20):
            message = Message(TRANSACTIONAL, f"tx-{number}".encode())
            await transactions.send_message_in_transaction(message)
            if number % 2 == 0:
                assert message.unique_id is not None
                acked[TRANSACTIONAL][message.unique_id] = 0
        report.step("sent 20 transactional messages: 10 committed, 10 rolled back")
    finally:
        await transactions.close()
    return acked


async def _consume(cluster: LocalCluster, acked: dict[str, dict[str, int]]) -> dict[str, list[MessageExt]]:
    config = ClientConfig(namesrv_addresses=(cluster.namesrv,))
    received: dict[str, list[MessageExt]] = defaultdict(list)
    expected = {topic: set(keys) for topic, keys in acked.items()}
    done = asyncio.Event()

    def listener_for(topic: str) -> Callable[[list[MessageExt], object], bool]:
        def listener(messages: list[MessageExt], context: object) -> bool:
            received[topic].extend(messages)
            if all(expected[t] <= {m.msg_id for m in received[t]} for t in expected):
                done.set()
            return True
        return listener

    consumers = []
    for topic in expected:
        consumer = AsyncPushConsumer(config, ConsumerConfig(
            group=f"demo-{topic.lower()}", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET),
            listener=listener_for(topic), orderly=topic == ORDERED)
        consumer.subscribe(topic)
        consumers.append(await consumer.start())
    try:
        await asyncio.wait_for(done.wait(), CONSUME_TIMEOUT_SECONDS)
    except TimeoutError:
        pass
    finally:
        for consumer in consumers:
            await consumer.close()
    return received


def _check(report: Report, acked: dict[str, dict[str, int]], received: dict[str, list[MessageExt]]) -> None:
    for topic, keys in acked.items():
        ids = [message.msg_id for message in received.get(topic, [])]
        missing = set(keys) - set(ids)
        duplicates = len(ids) - len(set(ids))
        unexpected = set(ids) - set(keys)
        report.check(not missing, f"{topic}: all {len(keys)} acknowledged messages consumed (missing {len(missing)})")
        report.check(not duplicates, f"{topic}: none consumed twice (duplicates {duplicates})")
        report.check(not unexpected, f"{topic}: nothing consumed that was not acknowledged ({len(unexpected)}"
                     + (" rolled-back or unknown)" if topic == TRANSACTIONAL else ")"))
    order: dict[str, list[int]] = defaultdict(list)
    for message in received.get(ORDERED, []):
        key, _, number = message.body.decode().rpartition("-")
        order[key].append(int(number))
    report.check(all(numbers == sorted(numbers) for numbers in order.values()),
                 f"{ORDERED}: order kept for each of {len(order)} sharding keys")
    early = [m.msg_id for m in received.get(DELAYED, []) if m.store_timestamp_ms < int(acked[DELAYED].get(m.msg_id, 0))]
    report.check(not early, f"{DELAYED}: no delayed or timed message delivered before its time ({len(early)} early)")


def run_demo(data_dir: Path, count: int, verify: bool = True) -> int:
    report = Report()
    started = time.monotonic()
    cluster = LocalCluster.start(data_dir)
    try:
        report.step(f"three-node group up: namesrv={cluster.namesrv}, leader {cluster.leader_id()}")
        acked = asyncio.run(_produce(cluster, report, count))
        received = asyncio.run(_consume(cluster, acked))
        report.step(f"consumed {sum(len(v) for v in received.values())} messages")
        _check(report, acked, received)
        killed = str(report.figures.get("killed_leader", ""))
        if killed:
            cluster.restart(killed)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                rows = cluster.status()
                if all(row["alive"] and row["lag"] == 0 and row["role"] in ("leader", "follower") for row in rows):
                    break
                time.sleep(0.2)
            report.step(f"{killed} restarted and caught up: "
                        + ", ".join(f"{row['node']} {row['role']} {row['max_offset']}" for row in cluster.status()))
    finally:
        cluster.stop()
    report.step("cluster stopped")
    if verify:
        from spark_analytics.verify import verify as run_verify

        report.step("Spark consistency check of the three replicas")
        code = run_verify(data_dir, report_path=data_dir / "verify-report.json")
        report.check(code == 0, f"replicas byte-identical and intact (raftmq verify exit {code})")
    report.figures["seconds"] = round(time.monotonic() - started, 1)
    summary = {"ok": not report.failures, "failures": report.failures, **report.figures}
    (data_dir / "demo-report.json").write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(json.dumps(summary))
    return 0 if not report.failures else 1
