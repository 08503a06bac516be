"""``raftmq topic|send|consume|msg|group|bench``: what users do with a running cluster, through client/.

Every command takes ``--namesrv HOST:PORT[;HOST:PORT]`` (or ``RAFTMQ_NAMESRV``), and for a broker group
with access control the ACL credentials: ``--access-key`` / ``--secret-key`` (or ``RAFTMQ_ACCESS_KEY`` /
``RAFTMQ_SECRET_KEY``, or a TOML file with ``access_key`` / ``secret_key`` named by ``--credentials-file``
or ``RAFTMQ_CREDENTIALS_FILE``); ``--tls`` (and ``--tls-ca-file``) for brokers serving TLS. Expected failures
(broker errors, unreachable name servers) print ``Error: ...`` and exit with 1; usage errors and input
refused as invalid (MESSAGE_ILLEGAL, by the client or the broker) exit with 2; neither prints a traceback.
"""

from __future__ import annotations

import array
import asyncio
import dataclasses
import datetime
import io
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from client.admin import (
    RESET_TO_EARLIEST,
    RESET_TO_LATEST,
    AsyncAdmin,
    GroupOnlineError,
    GroupSettings,
    GroupSummary,
    QueueReset,
    TopicSettings,
    check_group,
    is_system_topic,
)
from client.config import (
    ACCESS_KEY_ENV,
    CREDENTIALS_FILE_ENV,
    SECRET_KEY_ENV,
    ClientConfig,
    ConfigError,
    ConsumeFromWhere,
    ConsumerConfig,
    ProducerConfig,
    load_credentials,
)
from client.errors import MessageValidationError, MQClientError
from client.figures import percentile
from client.lite_pull_consumer import AsyncLitePullConsumer
from client.message import Message, MessageExt, MessageQueue, PullStatus, SendResult, check_topic
from client.producer import AsyncProducer
from client.pull_consumer import AsyncPullConsumer
from client.running_info import ConsumerRunningInfo
from dledger import stages as stage_counts
from protocol import event_loop
from protocol.codes import ResponseCode
from protocol.route_data import PERM_READ, PERM_WRITE

T = TypeVar("T")
NAMESRV_ENV: Final = "RAFTMQ_NAMESRV"
DEFAULT_PRODUCER_GROUP: Final = "raftmq-cli-producer"
PERMS: Final = {"rw": PERM_READ | PERM_WRITE, "r": PERM_READ, "w": PERM_WRITE, "none": 0}
CONTEXT: Final = {"help_option_names": ["-h", "--help"]}

_namesrv_only = click.option(
    "--namesrv",
    envvar=NAMESRV_ENV,
    required=True,
    metavar="HOST:PORT",
    help=f"Name server address(es), ';'-separated (env {NAMESRV_ENV}).",
)
TLS_ENV: Final = "RAFTMQ_TLS"
TLS_CA_FILE_ENV: Final = "RAFTMQ_TLS_CA_FILE"
_CONNECTION_META: Final = "raftmq.connection"


def _remember(context: click.Context, parameter: click.Parameter, value: object) -> object:
    """Keep a connection option for :func:`client_config` (not passed to the command function)."""
    context.meta.setdefault(_CONNECTION_META, {})[parameter.name] = value
    return value


_connection_options = [
    click.option("--access-key", default=None, expose_value=False, callback=_remember, metavar="KEY",
                 help=f"ACL access key (env {ACCESS_KEY_ENV}; or --credentials-file)."),
    click.option("--secret-key", default=None, expose_value=False, callback=_remember, metavar="SECRET",
                 help=f"ACL secret key (env {SECRET_KEY_ENV}, which keeps it out of the process list)."),
    click.option("--credentials-file", default=None, expose_value=False, callback=_remember, metavar="FILE",
                 help=f"TOML file with access_key and secret_key (env {CREDENTIALS_FILE_ENV})."),
    click.option("--tls", is_flag=True, envvar=TLS_ENV, expose_value=False, callback=_remember,
                 help=f"Connect to brokers with TLS (env {TLS_ENV})."),
    click.option("--tls-ca-file", default=None, envvar=TLS_CA_FILE_ENV, expose_value=False, callback=_remember,
                 metavar="FILE", help=f"CA certificate(s) the brokers' certificates are checked against (env {TLS_CA_FILE_ENV})."),
]


def namesrv_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--namesrv`` plus the connection options (ACL credentials, TLS) every command takes."""
    for option in reversed([_namesrv_only, *_connection_options]):
        function = option(function)
    return function


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


# ------------------------------------------------------------------------------------------ helpers


def client_config(namesrv: str) -> ClientConfig:
    try:
        config = ClientConfig.of(namesrv)
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint="'--namesrv'") from None
    context = click.get_current_context(silent=True)
    options: dict[str, Any] = context.meta.get(_CONNECTION_META, {}) if context is not None else {}
    try:
        credentials = load_credentials(options.get("access_key"), options.get("secret_key"),
                                       options.get("credentials_file"))
        return dataclasses.replace(
            config, access_key=credentials[0] if credentials else None,
            secret_key=credentials[1] if credentials else None, tls=bool(options.get("tls")),
            tls_ca_file=options.get("tls_ca_file"))
    except ConfigError as error:
        raise click.UsageError(str(error)) from None


class BadInputError(click.ClickException):
    """Input refused as invalid (MESSAGE_ILLEGAL): ``Error: ...`` and exit code 2, like a usage error."""

    exit_code = 2


def run(coroutine: Awaitable[T]) -> T:
    """Run the command's coroutine; expected failures become ``Error: ...`` and exit code 1."""

    async def main() -> T:
        return await coroutine

    try:
        return event_loop.run(main())
    except MQClientError as error:
        if error.code == ResponseCode.MESSAGE_ILLEGAL:
            raise BadInputError(str(error)) from None  # refused input, by the client or the broker
        raise click.ClickException(str(error)) from None
    except (ConfigError, OSError) as error:
        raise click.ClickException(str(error)) from None
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None


def echo_json(value: object) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def echo_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(value) for value in row] for row in rows]
    widths = [max([len(column), *(len(row[index]) for row in cells)]) for index, column in enumerate(columns)]
    click.echo("  ".join(column.ljust(widths[index]) for index, column in enumerate(columns)).rstrip())
    for row in cells:
        click.echo("  ".join(value.ljust(widths[index]) for index, value in enumerate(row)).rstrip())


def perm_value(text: str) -> int:
    if text in PERMS:
        return PERMS[text]
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text)
    raise click.BadParameter(f"use rw, r, w, none or 0..7, got {text!r}", param_hint="'--perm'")


def perm_text(perm: int) -> str:
    return ("r" if perm & PERM_READ else "-") + ("w" if perm & PERM_WRITE else "-")


_RELATIVE: Final = re.compile(r"^\+(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_deliver_at(text: str, now_ms: int | None = None) -> int:
    """Epoch milliseconds from ``1767225600000``, ``2026-01-01T10:00:00[+01:00]`` (local time when no
    offset is given) or ``+30s`` / ``+5m`` / ``+1h`` (from now)."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    text = text.strip()
    relative = _RELATIVE.match(text)
    if relative:
        return now + int(float(relative.group(1)) * _UNIT_MS[relative.group(2)])
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"use epoch ms, an ISO time (2026-01-01T10:00:00) or +30s/+5m/+1h, got {text!r}",
            param_hint="'--deliver-at'",
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return int(moment.timestamp() * 1000)


def parse_properties(items: Sequence[str]) -> dict[str, str]:
    properties: dict[str, str] = {}
    for item in items:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise click.BadParameter(f"use NAME=VALUE, got {item!r}", param_hint="'--property'")
        properties[name] = value
    return properties


def message_json(message: MessageExt) -> dict[str, object]:
    return message.to_json_object()


# -------------------------------------------------------------------------------------------- topic


@click.group(context_settings=CONTEXT)
def topic() -> None:
    """Create, change, delete, list and describe topics."""


def _topic_options(function: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--queues", type=click.IntRange(1, 1024), default=None,
                         help="Read and write queue count (default 4)."),
            click.option("--read-queues", type=click.IntRange(0, 1024), default=None, help="Read queue count."),
            click.option("--write-queues", type=click.IntRange(0, 1024), default=None, help="Write queue count."),
            click.option("--perm", default="rw", show_default=True, help="rw, r, w, none, or RocketMQ's 0..7."),
            click.option("--order", is_flag=True, help="Mark the topic as ordered."),
            click.option("--cluster", default=None, help="Only the broker groups of this cluster (default: all)."),
        ]
    ):
        function = option(function)
    return function


def _queue_counts(queues: int | None, read: int | None, write: int | None, current: tuple[int, int]) -> tuple[int, int]:
    if queues is not None and (read is not None or write is not None):
        raise click.UsageError("use --queues or --read-queues/--write-queues, not both")
    if queues is not None:
        return queues, queues
    return (current[0] if read is None else read, current[1] if write is None else write)


def _valid(check: Callable[[], object]) -> None:
    """Run a client-side check before connecting: refused input is ``Error: ...`` and exit code 2."""
    try:
        check()
    except MessageValidationError as error:
        raise BadInputError(error.remark) from None


@topic.command("create", context_settings=CONTEXT)
@click.argument("name")
@_topic_options
@namesrv_option
def topic_create(name: str, queues: int | None, read_queues: int | None, write_queues: int | None, perm: str,
                 order: bool, cluster: str | None, namesrv: str) -> None:
    """Create topic NAME on every broker group's leader (or update it if it exists).

    \b
    Examples:
      raftmq topic create Orders --queues 8
      raftmq topic create Audit --read-queues 4 --write-queues 4 --perm rw --namesrv 127.0.0.1:9876
    """
    read, write = _queue_counts(queues, read_queues, write_queues, (4, 4))
    perm_number = perm_value(perm)
    config = client_config(namesrv)

    async def create() -> list[str]:
        async with AsyncAdmin(config) as admin:
            return await admin.create_topic(name, read_queue_nums=read, write_queue_nums=write,
                                            perm=perm_number, order=order, cluster=cluster)

    groups = run(create())
    click.echo(f"topic {name}: {read} read / {write} write queues, perm {perm_text(perm_number)}"
               f"{', ordered' if order else ''} on {', '.join(groups)}")


def _echo_settings(settings: TopicSettings) -> None:
    click.echo(f"topic {settings.topic} on {settings.broker_name}: {settings.read_queue_nums} read / "
               f"{settings.write_queue_nums} write queues, perm {perm_text(settings.perm)}"
               f"{', ordered' if settings.order else ''}")


@topic.command("update", context_settings=CONTEXT)
@click.argument("name")
@click.option("--queues", type=click.IntRange(1, 1024), default=None, help="Read and write queue count.")
@click.option("--read-queues", type=click.IntRange(0, 1024), default=None, help="Read queue count.")
@click.option("--write-queues", type=click.IntRange(0, 1024), default=None, help="Write queue count.")
@click.option("--perm", default=None, help="rw, r, w, none, or RocketMQ's 0..7.")
@click.option("--order/--no-order", default=None, help="Mark the topic as ordered, or not.")
@click.option("--cluster", default=None, help="Only the broker groups of this cluster (default: all that have it).")
@namesrv_option
def topic_update(name: str, queues: int | None, read_queues: int | None, write_queues: int | None,
                 perm: str | None, order: bool | None, cluster: str | None, namesrv: str) -> None:
    """Change what is given of topic NAME; everything else keeps the value each broker group has.

    Fewer write queues: producers stop writing to the others, consumers still read them. Fewer read
    queues would leave messages where no consumer reads them: refused while a consumer group still has
    messages to consume in the queues removed, or when fewer read than write queues would remain. To
    shrink, lower --write-queues first, let the groups catch up, then lower --read-queues.

    \b
    Examples:
      raftmq topic update Orders --queues 16
      raftmq topic update Orders --perm r        # stop writes, keep reads
      raftmq topic update Orders --write-queues 4 && raftmq topic update Orders --read-queues 4
    """
    if queues is not None and (read_queues is not None or write_queues is not None):
        raise click.UsageError("use --queues or --read-queues/--write-queues, not both")
    if queues is None and read_queues is None and write_queues is None and perm is None and order is None:
        raise click.UsageError("nothing to change: give --queues, --read-queues, --write-queues, --perm or "
                               "--order/--no-order")
    read = queues if queues is not None else read_queues
    write = queues if queues is not None else write_queues
    perm_number = None if perm is None else perm_value(perm)
    _valid(lambda: check_topic(name))
    config = client_config(namesrv)

    async def update() -> dict[str, TopicSettings]:
        async with AsyncAdmin(config) as admin:
            groups = await admin.update_topic(name, read_queue_nums=read, write_queue_nums=write, perm=perm_number,
                                              order=order, cluster=cluster)
            return await admin.topic_settings(name, groups)

    for settings in run(update()).values():
        _echo_settings(settings)


@topic.command("delete", context_settings=CONTEXT)
@click.argument("name")
@click.option("--cluster", default=None, help="Only the broker groups of this cluster (default: all that have it).")
@namesrv_option
def topic_delete(name: str, cluster: str | None, namesrv: str) -> None:
    """Delete topic NAME (mqadmin deleteTopic): from each broker group's replicated state, with every
    consumer group's offsets of it, then from every name server's routes. Its messages are no longer
    served; they stay in the commit log until retention deletes them. System topics are refused.

    \b
    Examples:
      raftmq topic delete Orders
      raftmq topic delete Orders --cluster DefaultCluster --namesrv 127.0.0.1:9876
    """
    _valid(lambda: check_topic(name))
    if is_system_topic(name):
        raise BadInputError(f"{name} is a system topic: the broker's own, it cannot be deleted")
    config = client_config(namesrv)

    async def delete() -> list[str]:
        async with AsyncAdmin(config) as admin:
            return await admin.delete_topic(name, cluster=cluster)

    click.echo(f"topic {name} deleted from {', '.join(run(delete()))}")


@topic.command("list", context_settings=CONTEXT)
@click.option("--system", is_flag=True, help="Include system topics (TBW102, SCHEDULE_TOPIC_XXXX, ...).")
@json_option
@namesrv_option
def topic_list(system: bool, as_json: bool, namesrv: str) -> None:
    """List the topics the name servers route.

    \b
    Example:
      raftmq topic list --namesrv 127.0.0.1:9876
    """
    config = client_config(namesrv)

    async def fetch() -> list[str]:
        async with AsyncAdmin(config) as admin:
            return await admin.list_topics(include_system=system)

    topics = run(fetch())
    if as_json:
        echo_json(topics)
        return
    for name in topics:
        click.echo(name)


@topic.command("describe", context_settings=CONTEXT)
@click.argument("name")
@json_option
@namesrv_option
def topic_describe(name: str, as_json: bool, namesrv: str) -> None:
    """Show a topic's broker groups (leader and followers) and each queue's offsets.

    \b
    Example:
      raftmq topic describe Orders
    """
    config = client_config(namesrv)

    async def describe() -> dict[str, Any]:
        async with AsyncAdmin(config) as admin:
            route = await admin.describe_topic(name)
            offsets = await admin.topic_offsets(name)
        return {
            "topic": name,
            "brokers": [
                {"brokerName": broker, "cluster": route.broker_clusters.get(broker, ""),
                 "addresses": {str(broker_id): address for broker_id, address in addresses.items()}}
                for broker, addresses in sorted(route.broker_addresses.items())
            ],
            "queueDatas": [
                {"brokerName": q.broker_name, "readQueueNums": q.read_queue_nums,
                 "writeQueueNums": q.write_queue_nums, "perm": q.perm}
                for q in route.data.queue_datas
            ],
            "queues": [
                {"brokerName": entry.queue.broker_name, "queueId": entry.queue.queue_id,
                 "minOffset": entry.min_offset, "maxOffset": entry.max_offset}
                for entry in offsets
            ],
        }

    info = run(describe())
    if as_json:
        echo_json(info)
        return
    click.echo(f"topic {name}")
    for broker in info["brokers"]:
        addresses = ", ".join(
            f"{'leader' if broker_id == '0' else 'follower ' + broker_id} {address}"
            for broker_id, address in sorted(broker["addresses"].items())
        )
        click.echo(f"  {broker['brokerName']} ({broker['cluster']}): {addresses}")
    for data in info["queueDatas"]:
        click.echo(f"  {data['brokerName']}: {data['readQueueNums']} read / {data['writeQueueNums']} write queues, "
                   f"perm {perm_text(data['perm'])}")
    echo_table(["broker", "queue", "min offset", "max offset", "messages"],
               [[q["brokerName"], q["queueId"], q["minOffset"], q["maxOffset"], q["maxOffset"] - q["minOffset"]]
                for q in info["queues"]])


# --------------------------------------------------------------------------------------------- send


def _read_body(body: str | None, file: Path | None) -> bytes:
    if body is not None and file is not None:
        raise click.UsageError("give the body as an argument or with --file, not both")
    if body is not None:
        return body.encode("utf-8")
    if file is not None:
        try:
            return file.read_bytes()
        except OSError as error:
            raise click.BadParameter(str(error), param_hint="'--file'") from None
    stdin = sys.stdin.buffer
    if stdin.isatty():
        raise click.UsageError("no body: give it as an argument, with --file, or on stdin")
    return stdin.read()


@click.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="TOPIC")
@click.argument("body", required=False)
@click.option("--file", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Read the body from a file.")
@click.option("--tags", default=None, help="The message tag (consumers filter on it).")
@click.option("--keys", multiple=True, help="A key to index the message by (repeatable).")
@click.option("--property", "properties", multiple=True, metavar="NAME=VALUE", help="A user property (repeatable).")
@click.option("--delay-level", type=click.IntRange(0, 18), default=0, help="1..18 = 1s 5s 10s 30s 1m ... 2h.")
@click.option("--deliver-at", default=None, help="Epoch ms, an ISO time, or +30s / +5m / +1h.")
@click.option("--sharding-key", default=None, help="Send orderly: one key always goes to the same queue.")
@click.option("--group", default=DEFAULT_PRODUCER_GROUP, show_default=True, help="Producer group.")
@json_option
@namesrv_option
def send(topic_name: str, body: str | None, file: Path | None, tags: str | None, keys: tuple[str, ...],
         properties: tuple[str, ...], delay_level: int, deliver_at: str | None, sharding_key: str | None, group: str,
         as_json: bool, namesrv: str) -> None:
    """Send one message to TOPIC; the body comes from BODY, --file, or stdin.

    \b
    Examples:
      raftmq send Orders 'order 42 paid' --tags paid --keys order-42
      raftmq send Orders --file order.json --delay-level 3
      echo hello | raftmq send Orders --deliver-at +30s
      raftmq send Orders 'step 2' --sharding-key order-42
    """
    if delay_level and deliver_at is not None:
        raise click.UsageError("--delay-level and --deliver-at are exclusive")
    message = Message(
        topic_name,
        _read_body(body, file),
        tags=tags,
        keys=keys,
        properties=parse_properties(properties),
        delay_level=delay_level,
        deliver_at_ms=parse_deliver_at(deliver_at) if deliver_at is not None else None,
        sharding_key=sharding_key,
    )
    config = client_config(namesrv)
    try:
        producer_config = ProducerConfig(group=group)
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint="'--group'") from None

    async def deliver() -> SendResult:
        from client.selector import select_by_sharding_key

        async with AsyncProducer(config, producer_config) as producer:
            if sharding_key is not None:
                return await producer.send_orderly(message, select_by_sharding_key)
            return await producer.send(message)

    result = run(deliver())
    summary = {
        "status": result.status.value,
        "msgId": result.msg_id,
        "offsetMsgId": result.offset_msg_id,
        "topic": result.message_queue.topic,
        "brokerName": result.message_queue.broker_name,
        "queueId": result.message_queue.queue_id,
        "queueOffset": result.queue_offset,
    }
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"{result.status.value} msgId={result.msg_id} queue={result.message_queue.broker_name}/"
                   f"{result.message_queue.queue_id} offset={result.queue_offset}")


# ------------------------------------------------------------------------------------------ consume


@click.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="TOPIC")
@click.option("--group", required=True, help="Consumer group (its offsets are committed on the broker).")
@click.option("--from", "start", type=click.Choice(["first", "last"]), default="last", show_default=True,
              help="Where a group without committed offsets starts.")
@click.option("--tags", "expression", default="*", show_default=True, help="Tag filter: '*' or 'TagA || TagB'.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after this many messages.")
@click.option("--wait", type=click.FloatRange(min=0.1), default=None,
              help="Stop when no message arrived for this many seconds (default: wait forever).")
@click.option("--base64", "as_base64", is_flag=True, help="Print bodies as base64 instead of text.")
@namesrv_option
def consume(topic_name: str, group: str, start: str, expression: str, count: int | None, wait: float | None,
            as_base64: bool, namesrv: str) -> None:
    """Consume TOPIC as a member of GROUP, one JSON line per message on stdout.

    Offsets of the messages printed are committed when the command ends, so the next run of the
    same group continues after them. Note: a new group on a queue that still starts at offset 0
    reads from the beginning even with --from last (RocketMQ brokers answer 0 for it).

    \b
    Examples:
      raftmq consume Orders --group audit --from first --count 10
      raftmq consume Orders --group audit --tags 'paid || refunded' --wait 5 | jq .body
    """
    config = client_config(namesrv)
    try:
        consumer_config = ConsumerConfig(
            group=group,
            consume_from_where=(
                ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET if start == "first" else ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
            ),
            suspend_timeout_seconds=min(5.0, wait or 5.0),
            pull_backoff_seconds=0.2,
        )
    except ConfigError as error:
        raise click.BadParameter(str(error), param_hint="'--group'") from None

    async def consume_messages() -> int:
        consumer = AsyncLitePullConsumer(config, consumer_config, auto_commit=False)
        consumer.subscribe(topic_name, expression)
        printed = 0
        commits: dict[MessageQueue, int] = {}
        async with consumer:
            idle_since = time.monotonic()
            try:
                while count is None or printed < count:
                    remaining = None if wait is None else wait - (time.monotonic() - idle_since)
                    if remaining is not None and remaining <= 0:
                        break
                    messages = await consumer.poll(min(1.0, remaining) if remaining is not None else 1.0)
                    if messages:
                        idle_since = time.monotonic()
                    for message in messages:
                        if count is not None and printed >= count:
                            break
                        echo_json(message.to_json_object(body_as_text=not as_base64))
                        commits[message.message_queue] = message.queue_offset + 1
                        printed += 1
            finally:
                # what was printed is consumed, even when interrupted (Ctrl-C cancels this task)
                if commits:
                    try:
                        await consumer.commit(commits)
                    except MQClientError as error:
                        click.echo(f"warning: offsets not committed, the next run repeats them: {error}", err=True)
        return printed

    printed = run(consume_messages())
    click.echo(f"consumed {printed} messages", err=True)


# -------------------------------------------------------------------------------------------- msg


@click.group(context_settings=CONTEXT)
def msg() -> None:
    """Look messages up by key or id."""


@msg.command("query", context_settings=CONTEXT)
@click.option("--key", default=None, help="A key the message was sent with (needs --topic).")
@click.option("--id", "msg_id", default=None, help="A message id: store-based (offsetMsgId) or client (msgId, with --topic).")
@click.option("--topic", "topic_name", default=None, help="The topic (required with --key).")
@click.option("--max", "max_num", type=click.IntRange(1, 64), default=32, show_default=True)
@json_option
@namesrv_option
def msg_query(key: str | None, msg_id: str | None, topic_name: str | None, max_num: int, as_json: bool,
              namesrv: str) -> None:
    """Find messages by --key or --id and print them.

    \b
    Examples:
      raftmq msg query --topic Orders --key order-42
      raftmq msg query --id 7F0000010000BDBF0000000000000000
      raftmq msg query --topic Orders --id 7F000001059CDBEBABBA6D754E47D51F --json
    """
    if (key is None) == (msg_id is None):
        raise click.UsageError("give exactly one of --key and --id")
    if key is not None and topic_name is None:
        raise click.UsageError("--key needs --topic")
    config = client_config(namesrv)

    async def query() -> list[MessageExt]:
        async with AsyncAdmin(config) as admin:
            if key is not None:
                assert topic_name is not None
                return await admin.query_messages_by_key(topic_name, key, max_num=max_num)
            assert msg_id is not None
            return [await admin.query_message_by_id(msg_id, topic_name)]

    messages = run(query())
    if not messages:
        raise click.ClickException(f"no message with key {key!r} in {topic_name}")
    for message in messages:
        if as_json:
            echo_json(message_json(message))
            continue
        stored = datetime.datetime.fromtimestamp(message.store_timestamp_ms / 1000).isoformat(timespec="milliseconds")
        click.echo(f"msgId={message.msg_id} offsetMsgId={message.offset_msg_id} topic={message.topic} "
                   f"queue={message.broker_name}/{message.queue_id} offset={message.queue_offset} stored={stored}")
        click.echo(f"  tags={message.tags} keys={' '.join(message.keys)} properties={message.user_properties}")
        preview = message.body[:200].decode("utf-8", "replace")
        click.echo(f"  body ({len(message.body)} bytes): {preview}")


# ------------------------------------------------------------------------------------------- group


@click.group(context_settings=CONTEXT)
def group() -> None:
    """Consumer groups: list them, their progress and members, configure or delete them, reset their offsets."""


@group.command("progress", context_settings=CONTEXT)
@click.argument("name")
@click.option("--topic", "topics", multiple=True, help="Only these topics (default: every topic the group committed on).")
@json_option
@namesrv_option
def group_progress(name: str, topics: tuple[str, ...], as_json: bool, namesrv: str) -> None:
    """Show GROUP's committed offset and lag on every queue, its live members, and how fast it consumed
    over the last minute (messages per second its pulls were served).

    \b
    Examples:
      raftmq group progress audit
      raftmq group progress audit --topic Orders --json
    """
    config = client_config(namesrv)

    async def fetch() -> tuple[Any, float]:
        async with AsyncAdmin(config) as admin:
            progress = await admin.consumer_progress(name, list(topics) or None)
            if topics:
                rates = [await admin.consume_tps(name, topic) for topic in topics]
                return progress, sum(rates)
            return progress, await admin.consume_tps(name)

    progress, consume_tps = run(fetch())
    rows = [
        {"topic": row.queue.topic, "brokerName": row.queue.broker_name, "queueId": row.queue.queue_id,
         "brokerOffset": row.broker_offset, "consumerOffset": row.consumer_offset, "lag": row.lag}
        for row in progress.queues
    ]
    if as_json:
        echo_json({"group": name, "consumers": list(progress.consumer_ids), "totalLag": progress.total_lag,
                   "consumeTps": round(consume_tps, 3), "queues": rows})
        return
    click.echo(f"group {name}: {len(progress.consumer_ids)} live consumer(s) {', '.join(progress.consumer_ids)}".rstrip())
    echo_table(["topic", "broker", "queue", "broker offset", "consumer offset", "lag"],
               [[r["topic"], r["brokerName"], r["queueId"], r["brokerOffset"],
                 "-" if r["consumerOffset"] is None else r["consumerOffset"], r["lag"]] for r in rows])
    click.echo(f"total lag: {progress.total_lag}, consumed over the last minute: {consume_tps:.1f} msgs/s")


def _clock(ms: object) -> str:
    """A wall-clock millisecond timestamp as local time, or "-" for none."""
    try:
        value = int(str(ms))
    except ValueError:
        return "-"
    if value <= 0:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(value / 1000).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):  # the C++ client leaves some of them uninitialized
        return str(value)


def _echo_running_info(info: ConsumerRunningInfo) -> None:
    props = info.properties
    click.echo(f"consumer {info.client_id}")
    click.echo(f"  {props.get('PROP_CONSUME_TYPE', '?')}, orderly {props.get('PROP_CONSUMEORDERLY', '?')}, "
               f"{props.get('messageModel', '?')}, threads {props.get('PROP_THREADPOOL_CORE_SIZE', '?')}, "
               f"started {_clock(props.get('PROP_CONSUMER_START_TIMESTAMP'))}, "
               f"client {props.get('PROP_CLIENT_VERSION', '?')}")
    subscriptions = ", ".join(f"{entry.get('topic')} ({entry.get('subString') or '*'})" for entry in info.subscriptions)
    click.echo(f"  subscriptions: {subscriptions or '-'}")
    if info.status:
        echo_table(["  topic", "pull TPS", "pull RT ms", "consume OK TPS", "failed TPS", "consume RT ms",
                    "failed (1 h)"],
                   [[f"  {topic}", values.get("pullTPS", "-"), values.get("pullRT", "-"), values.get("consumeOKTPS", "-"),
                     values.get("consumeFailedTPS", "-"), values.get("consumeRT", "-"),
                     values.get("consumeFailedMsgs", "-")] for topic, values in sorted(info.status.items())])
    if not info.queues:
        click.echo("  holds no queue")
        return
    echo_table(["  topic", "broker", "queue", "commit offset", "cached", "cached offsets", "locked", "last pull",
                "last consume"],
               [[f"  {queue.topic}", queue.broker_name, queue.queue_id, row.get("commitOffset", "-"),
                 row.get("cachedMsgCount", "-"),
                 f"{row.get('cachedMsgMinOffset', '-')}..{row.get('cachedMsgMaxOffset', '-')}"
                 if row.get("cachedMsgCount") else "-",
                 "yes" if row.get("locked") else "no", _clock(row.get("lastPullTimestamp")),
                 _clock(row.get("lastConsumeTimestamp"))]
                for queue, row in sorted(info.queues.items())])


@group.command("status", context_settings=CONTEXT)
@click.argument("name")
@click.option("--client", "client_ids", multiple=True, metavar="CLIENT_ID",
              help="Only this member (default: every live member of the group).")
@click.option("--jstack", is_flag=True, help="Include each member's thread and task stacks.")
@json_option
@namesrv_option
def group_status(name: str, client_ids: tuple[str, ...], jstack: bool, as_json: bool, namesrv: str) -> None:
    """Show what each live member of GROUP reports about itself (mqadmin consumerStatus).

    Asked through the broker each member is connected to (GET_CONSUMER_RUNNING_INFO): its
    subscriptions, the queues it holds with their commit offsets, cached messages and locks, and its
    pull and consume rates over the last minute. Exits 1 if a member could not be asked.

    \b
    Examples:
      raftmq group status audit
      raftmq group status audit --client 127.0.0.1@4242#1700000000000 --json
    """
    config = client_config(namesrv)

    async def fetch() -> tuple[list[ConsumerRunningInfo], list[tuple[str, str]]]:
        async with AsyncAdmin(config) as admin:
            members = list(client_ids) or await admin.consumer_ids(name)
            if not members:
                raise click.ClickException(f"group {name} has no live consumer")
            found: list[ConsumerRunningInfo] = []
            failed: list[tuple[str, str]] = []
            for client_id in members:
                try:
                    found.append(await admin.consumer_running_info(name, client_id, jstack=jstack))
                except MQClientError as error:
                    failed.append((client_id, str(error)))
            return found, failed

    found, failed = run(fetch())
    if as_json:
        echo_json({"group": name, "consumers": [info.to_json_object() for info in found],
                   "errors": [{"clientId": client_id, "error": error} for client_id, error in failed]})
    else:
        for info in found:
            _echo_running_info(info)
            if info.jstack:
                click.echo(info.jstack)
    for client_id, error in failed:
        click.echo(f"Error: {client_id}: {error}", err=True)
    if failed:
        sys.exit(1)


@group.command("list", context_settings=CONTEXT)
@json_option
@namesrv_option
def group_list(as_json: bool, namesrv: str) -> None:
    """List the consumer groups the broker groups know (those with committed offsets, configured ones and
    those with live consumers), with their live members, the topics they consume, their total lag and
    their consume rate over the last minute (mqadmin consumerProgress without a group).

    \b
    Examples:
      raftmq group list
      raftmq group list --json | jq '.[] | select(.totalLag > 1000)'
    """
    config = client_config(namesrv)

    async def fetch() -> list[GroupSummary]:
        async with AsyncAdmin(config) as admin:
            return await admin.list_groups()

    groups = run(fetch())
    if as_json:
        echo_json([{"group": entry.group, "consumers": list(entry.consumer_ids), "online": len(entry.consumer_ids),
                    "topics": list(entry.topics), "totalLag": entry.total_lag,
                    "consumeTps": round(entry.consume_tps, 3)} for entry in groups])
        return
    echo_table(["group", "online", "topics", "lag", "consume TPS"],
               [[entry.group, len(entry.consumer_ids), ",".join(entry.topics) or "-", entry.total_lag,
                 f"{entry.consume_tps:.1f}"] for entry in groups])


def _echo_group_settings(settings: GroupSettings) -> None:
    flags = [flag for flag, on in (("orderly", settings.consume_orderly), ("consume disabled", not settings.consume_enable),
                                   ("broadcast disabled", not settings.consume_broadcast_enable)) if on]
    click.echo(f"group {settings.group} on {settings.broker_name}: retry max {settings.retry_max_times}, "
               f"broker id {settings.broker_id}{''.join(', ' + flag for flag in flags)}")


@group.command("update", context_settings=CONTEXT)
@click.argument("name")
@click.option("--retry-max", type=click.IntRange(0, 2**31 - 2), default=None,
              help="Redeliveries before a message goes to the group's dead-letter queue %DLQ%NAME.")
@click.option("--orderly/--no-orderly", default=None, help="A FIFO group (5.x clients: each queue in order), or not.")
@click.option("--consume-enable/--no-consume-enable", default=None, help="Whether the group may consume.")
@click.option("--broadcast/--no-broadcast", default=None, help="Whether the group may consume in broadcast mode.")
@click.option("--broker-id", type=click.IntRange(0, 2**31 - 2), default=None, help="The broker id it reads from.")
@click.option("--cluster", default=None, help="Only the broker groups of this cluster (default: all).")
@namesrv_option
def group_update(name: str, retry_max: int | None, orderly: bool | None, consume_enable: bool | None,
                 broadcast: bool | None, broker_id: int | None, cluster: str | None, namesrv: str) -> None:
    """Create consumer group NAME's configuration or change what is given of it (mqadmin updateSubGroup);
    everything else keeps the value each broker group has (the broker's defaults for a new group).
    Replicated through Raft: every member applies it.

    \b
    Examples:
      raftmq group update Billing --retry-max 3
      raftmq group update Ledger --orderly
    """
    if retry_max is None and orderly is None and consume_enable is None and broadcast is None and broker_id is None:
        raise click.UsageError("nothing to change: give --retry-max, --orderly/--no-orderly, "
                               "--consume-enable/--no-consume-enable, --broadcast/--no-broadcast or --broker-id")
    _valid(lambda: check_group(name))
    config = client_config(namesrv)

    async def update() -> dict[str, GroupSettings]:
        async with AsyncAdmin(config) as admin:
            names = await admin.update_group(name, retry_max_times=retry_max, consume_orderly=orderly,
                                             consume_enable=consume_enable, consume_broadcast_enable=broadcast,
                                             broker_id=broker_id, cluster=cluster)
            return await admin.group_settings(name, names)

    for settings in run(update()).values():
        _echo_group_settings(settings)


@group.command("delete", context_settings=CONTEXT)
@click.argument("name")
@click.option("--cluster", default=None, help="Only the broker groups of this cluster (default: all).")
@namesrv_option
def group_delete(name: str, cluster: str | None, namesrv: str) -> None:
    """Delete consumer group NAME's configuration (mqadmin deleteSubGroup): it consumes with the broker's
    defaults again. Its committed offsets stay; its 5.x pop state (messages in flight) is dropped.

    \b
    Examples:
      raftmq group delete Billing
    """
    _valid(lambda: check_group(name))
    config = client_config(namesrv)

    async def delete() -> list[str]:
        async with AsyncAdmin(config) as admin:
            return await admin.delete_group(name, cluster=cluster)

    click.echo(f"group {name} deleted from {', '.join(run(delete()))}")


def parse_reset_time(text: str) -> int:
    """Epoch milliseconds from ``1767225600000`` or an ISO time ``2026-01-01T10:00:00[+01:00]`` (local time
    when no offset is given)."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        value = int(text)
    else:
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise click.BadParameter(f"use epoch ms or an ISO time (2026-01-01T10:00:00), got {text!r}",
                                     param_hint="'--to-time'") from None
        if moment.tzinfo is None:
            moment = moment.astimezone()
        value = int(moment.timestamp() * 1000)
    if not 0 <= value <= RESET_TIME_MAX_MS:
        raise click.BadParameter(f"{text!r} is outside 1970..9999", param_hint="'--to-time'")
    return value


#: 9999-12-31T23:59:59.999Z: a later epoch-ms value is a typo
RESET_TIME_MAX_MS: Final = 253_402_300_799_999


@group.command("reset-offset", context_settings=CONTEXT)
@click.argument("name", metavar="GROUP")
@click.option("--topic", "topic_name", required=True, metavar="TOPIC", help="The topic whose offsets move.")
@click.option("--to-time", default=None, metavar="ISO|EPOCH_MS",
              help="To the first message stored at or after this time.")
@click.option("--to", "to_position", type=click.Choice(["earliest", "latest"]), default=None,
              help="To the first stored message, or past the last one.")
@click.option("--force", is_flag=True,
              help="Reset even while the group has live consumers of the topic (they may commit over it).")
@json_option
@namesrv_option
def group_reset_offset(name: str, topic_name: str, to_time: str | None, to_position: str | None, force: bool,
                       as_json: bool, namesrv: str) -> None:
    """Move GROUP's committed offset of every queue of TOPIC (mqadmin resetOffsetByTime), forward or
    back, through Raft like every offset commit.

    Stop the group's consumers first: RocketMQ's broker tells live consumers to move, raftmq's does not,
    and a live consumer commits the position it holds over the reset, within seconds or when it shuts
    down. A group with live consumers of TOPIC is refused unless --force (for members the brokers still
    list that no longer consume, e.g. cut off until their heartbeats expire).

    \b
    Examples:
      raftmq group reset-offset audit --topic Orders --to earliest
      raftmq group reset-offset audit --topic Orders --to-time 2026-01-01T10:00:00
      raftmq group reset-offset audit --topic Orders --to latest --json
    """
    if (to_time is None) == (to_position is None):
        raise click.UsageError("give one of --to-time or --to")
    if to_time is not None:
        timestamp = parse_reset_time(to_time)
    else:
        timestamp = RESET_TO_EARLIEST if to_position == "earliest" else RESET_TO_LATEST
    _valid(lambda: check_group(name))
    _valid(lambda: check_topic(topic_name))
    if is_system_topic(topic_name):
        raise BadInputError(f"{topic_name} is a system topic: its offsets are the broker's own")
    config = client_config(namesrv)

    async def reset() -> list[QueueReset]:
        async with AsyncAdmin(config) as admin:
            try:
                return await admin.reset_offset(name, topic_name, timestamp, while_online=force)
            except GroupOnlineError as error:
                raise BadInputError(f"{error.remark}; or pass --force") from None

    resets = run(reset())
    rows = [{"topic": entry.queue.topic, "brokerName": entry.queue.broker_name, "queueId": entry.queue.queue_id,
             "previousOffset": entry.previous_offset, "offset": entry.offset} for entry in resets]
    if as_json:
        echo_json({"group": name, "topic": topic_name, "queues": rows})
        return
    click.echo(f"group {name}: offsets of {topic_name} reset")
    echo_table(["broker", "queue", "previous offset", "offset"],
               [[row["brokerName"], row["queueId"], "-" if row["previousOffset"] is None else row["previousOffset"],
                 row["offset"]] for row in rows])


# ------------------------------------------------------------------------------------------- bench


@dataclass
class BenchStats:
    """Latencies in seconds, counts, and the wall time of a run."""

    latencies: list[float] = field(default_factory=list)
    messages: int = 0
    payload_bytes: int = 0
    errors: int = 0
    first_error: str = ""
    seconds: float = 0.0
    #: wall-clock time (time.time()) the sends began: how --clients lines up its processes' spans
    started_at: float = field(default_factory=time.time)

    def percentile_ms(self, fraction: float) -> float:
        if not self.latencies:
            return 0.0
        return percentile(self.latencies, fraction) * 1000

    def summary(self) -> dict[str, float | int | str]:
        seconds = max(self.seconds, 1e-9)
        result: dict[str, float | int | str] = {
            "started_at": round(self.started_at, 6),
            "messages": self.messages,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "msgs_per_s": round(self.messages / seconds, 1),
            "MB_per_s": round(self.payload_bytes / seconds / 1e6, 3),
            "p50_ms": round(self.percentile_ms(0.50), 3),
            "p99_ms": round(self.percentile_ms(0.99), 3),
            "max_ms": round(max(self.latencies, default=0.0) * 1000, 3),
        }
        if self.first_error:
            result["first_error"] = self.first_error
        return result


def report(stats: BenchStats, as_json: bool, latency_of: str,
           stages: list[dict[str, object]] | None = None) -> None:
    summary = stats.summary()
    if as_json:
        echo_json({**summary, **({"stages": stages} if stages is not None else {})})
    else:
        echo_table(["metric", "value"], [
            ["messages", summary["messages"]], ["errors", summary["errors"]], ["seconds", summary["seconds"]],
            ["msgs/s", summary["msgs_per_s"]], ["MB/s", summary["MB_per_s"]],
            [f"p50 ms ({latency_of})", summary["p50_ms"]], [f"p99 ms ({latency_of})", summary["p99_ms"]],
            [f"max ms ({latency_of})", summary["max_ms"]],
        ])
        if stages is not None:
            click.echo("send path on the leader (per send unless noted; stages overlap: leader_fsync runs "
                       "during replication):")
            echo_table(["stage", "per", "count", "p50 ms", "p99 ms"],
                       [[row["stage"], row["per"], row["count"], row["p50_ms"], row["p99_ms"]] for row in stages])
        if stats.first_error:
            click.echo(f"first error: {stats.first_error}", err=True)
    if stats.errors:
        sys.exit(1)


@click.group(context_settings=CONTEXT)
def bench() -> None:
    """Measure throughput and latency against a running cluster."""


#: messages ``bench produce`` sends without --count; with --duration it sends until the time is up
DEFAULT_BENCH_COUNT: Final = 10_000
UNCAPPED_BENCH_COUNT: Final = 1 << 62


@bench.command("produce", context_settings=CONTEXT)
@click.option("--topic", "topic_name", default="BenchTopic", show_default=True)
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Messages to send, over every client (default 10000; with --duration: no cap).")
@click.option("--duration", type=click.FloatRange(min=0.1), default=None,
              help="Send for this many seconds instead of COUNT messages.")
@click.option("--size", type=click.IntRange(1, 4 * 1024 * 1024), default=1024, show_default=True, help="Body bytes.")
@click.option("--inflight", type=click.IntRange(1, 10_000), default=64, show_default=True,
              help="Concurrent unacknowledged sends (per client).")
@click.option("--clients", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Client processes sending at once (each with INFLIGHT sends outstanding).")
@click.option("--stages", "show_stages", is_flag=True,
              help="Also print where the send path's time went on each group's leader, stage by stage.")
@click.option("--group", default="raftmq-bench-producer", show_default=True, help="Producer group.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random bodies.")
@click.option("--coalesce/--no-coalesce", default=True, show_default=True,
              help="Let the producer send concurrent sends to one queue as one batch request, each with its "
                   "own result (the SDK's default); --no-coalesce sends one request per message, as stock "
                   "clients do.")
@click.option("--latency-file", type=click.Path(dir_okay=False, path_type=Path), default=None, hidden=True,
              help="(for --clients) write each send's latency here, as native doubles")
@json_option
@namesrv_option
def bench_produce(topic_name: str, count: int | None, duration: float | None, size: int, inflight: int, clients: int,
                  show_stages: bool, group: str, seed: int, coalesce: bool, latency_file: Path | None,
                  as_json: bool, namesrv: str) -> None:
    """Send COUNT messages (or for --duration seconds) of SIZE random bytes with INFLIGHT sends
    outstanding, from one or --clients processes; print msgs/s, MB/s and send latency (p50/p99/max), and
    with --stages the latency of each stage of the send path as each group's leader recorded it. Exit
    code 1 if any send failed.

    \b
    Examples:
      raftmq bench produce --count 100000 --size 1024 --inflight 256
      raftmq bench produce --duration 30 --clients 4 --inflight 64 --stages
      raftmq bench produce --topic Bench --count 5000 --json
    """
    config = client_config(namesrv)
    if count is None:
        count = DEFAULT_BENCH_COUNT if duration is None else UNCAPPED_BENCH_COUNT
    before = run(leader_stages(config)) if show_stages else {}
    if clients > 1:
        stats = produce_from_processes(config, topic_name, count, duration, size, inflight, clients, group, seed,
                                       coalesce)
    else:
        stats = run(produce_here(config, topic_name, count, duration, size, inflight, group, seed,
                                 progress=latency_file is None, coalesce=coalesce))
    if latency_file is not None:
        latency_file.write_bytes(array.array("d", stats.latencies).tobytes())
    stages = stage_rows(before, run(leader_stages(config))) if show_stages else None
    report(stats, as_json, "send", stages)


async def produce_here(config: ClientConfig, topic_name: str, count: int, duration: float | None, size: int,
                       inflight: int, group: str, seed: int, progress: bool = True,
                       coalesce: bool = True) -> BenchStats:
    """One client's sends: COUNT messages, or as many as fit in ``duration`` seconds (at most COUNT)."""
    body = random.Random(seed).randbytes(size)
    stats = BenchStats()
    remaining = count
    producer_config = ProducerConfig(group=group, inflight_sends_max=max(inflight, 1), compress_body_over_bytes=0,
                                     coalesce_sends=coalesce)
    async with AsyncProducer(config, producer_config) as producer:
        length = count if duration is None else max(1, round(duration * 10))
        with click.progressbar(length=length, label="produce", file=sys.stderr if progress else io.StringIO(),
                               update_min_steps=max(1, length // 200)) as bar:
            started = time.perf_counter()
            stats.started_at = time.time()
            stop_at = started + duration if duration is not None else math.inf
            shown = 0

            async def worker() -> None:
                nonlocal remaining, shown
                while remaining > 0 and time.perf_counter() < stop_at:
                    remaining -= 1
                    sent = time.perf_counter()
                    try:
                        await producer.send(Message(topic_name, body))
                    except MQClientError as error:
                        stats.errors += 1
                        stats.first_error = stats.first_error or str(error)
                    else:
                        stats.latencies.append(time.perf_counter() - sent)
                        stats.messages += 1
                        stats.payload_bytes += size
                    if duration is None:
                        bar.update(1)
                    elif (now := min(length, int((time.perf_counter() - started) * 10))) > shown:
                        bar.update(now - shown)
                        shown = now

            await asyncio.gather(*(worker() for _ in range(min(inflight, count))))
            if duration is not None:
                bar.update(length - shown)
            stats.seconds = time.perf_counter() - started
    return stats


def produce_from_processes(config: ClientConfig, topic_name: str, count: int, duration: float | None, size: int,
                           inflight: int, clients: int, group: str, seed: int, coalesce: bool = True) -> BenchStats:
    """``clients`` processes of ``raftmq bench produce`` at once, COUNT split among them; their sends and
    latencies merged. Throughput is every message over the span from the first start to the last end."""
    environment = {**os.environ, NAMESRV_ENV: ";".join(config.namesrv_addresses)}
    if config.access_key is not None and config.secret_key is not None:
        environment.update({ACCESS_KEY_ENV: config.access_key, SECRET_KEY_ENV: config.secret_key})
    if config.tls:
        environment[TLS_ENV] = "1"
    if config.tls_ca_file:
        environment[TLS_CA_FILE_ENV] = str(config.tls_ca_file)
    with tempfile.TemporaryDirectory(prefix="raftmq-bench-") as directory:
        processes: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            for index in range(clients):
                share = count // clients + (1 if index < count % clients else 0)
                latency_file = Path(directory) / f"client-{index}.latencies"
                command = [sys.executable, "-m", "cli.main", "bench", "produce", "--topic", topic_name,
                           "--count", str(max(1, share)), "--size", str(size), "--inflight", str(inflight),
                           "--group", group, "--seed", str(seed + index), "--json",
                           "--coalesce" if coalesce else "--no-coalesce",
                           "--latency-file", str(latency_file)]
                if duration is not None:
                    command += ["--duration", str(duration)]
                processes.append((subprocess.Popen(command, env=environment, stdout=subprocess.PIPE,
                                                   stderr=subprocess.DEVNULL), latency_file))
            stats = BenchStats()
            spans: list[tuple[float, float]] = []
            for process, latency_file in processes:
                output, _ = process.communicate()
                try:
                    child = json.loads(output.decode().strip().splitlines()[-1])
                except (ValueError, IndexError):
                    raise click.ClickException(f"a client process failed (exit code {process.returncode})") from None
                stats.messages += int(child["messages"])
                stats.errors += int(child["errors"])
                stats.first_error = stats.first_error or str(child.get("first_error", ""))
                stats.payload_bytes += int(child["messages"]) * size
                spans.append((float(child["started_at"]), float(child["started_at"]) + float(child["seconds"])))
                latencies = array.array("d")
                latencies.frombytes(latency_file.read_bytes())
                stats.latencies.extend(latencies)
        finally:
            for process, _ in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    stats.seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    return stats


async def leader_stages(config: ClientConfig) -> dict[str, dict[str, list[int]]]:
    """Each broker group's send-path stage counts (dledger.stages), from its leader."""
    found: dict[str, dict[str, list[int]]] = {}
    async with AsyncAdmin(config) as admin:
        for name in await admin.broker_names():
            table, address = await admin.runtime_info(name)
            try:
                found[name] = stage_counts.decode(table.get("sendStages", ""))
            except ValueError as exc:
                raise click.ClickException(f"unreadable send stages from {address}: {exc}") from None
    return found


def stage_rows(before: dict[str, dict[str, list[int]]],
               after: dict[str, dict[str, list[int]]]) -> list[dict[str, object]]:
    """The stages of the run (``after`` less ``before``), every group's counts added up."""
    total = {stage: [0] * stage_counts.BUCKETS for stage in stage_counts.STAGES}
    for name, counts in after.items():
        run_counts = stage_counts.difference(counts, before.get(name, {}))
        for stage, values in run_counts.items():
            total[stage] = [a + b for a, b in zip(total[stage], values, strict=True)]
    return stage_counts.summary(total)


@bench.command("consume", context_settings=CONTEXT)
@click.option("--topic", "topic_name", default="BenchTopic", show_default=True)
@click.option("--count", type=click.IntRange(min=1), default=10_000, show_default=True, help="Messages to read.")
@click.option("--batch", type=click.IntRange(1, 1024), default=32, show_default=True, help="Messages per pull.")
@click.option("--wait", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Give up when no message arrived for this many seconds.")
@click.option("--group", default="raftmq-bench-consumer", show_default=True, help="Consumer group (nothing is committed).")
@json_option
@namesrv_option
def bench_consume(topic_name: str, count: int, batch: int, wait: float, group: str, as_json: bool,
                  namesrv: str) -> None:
    """Read COUNT messages of TOPIC from the start of every queue, one puller per queue; print msgs/s,
    MB/s and pull latency (p50/p99/max). Exit code 1 if fewer than COUNT arrived.

    \b
    Examples:
      raftmq bench produce --topic Bench --count 100000 && raftmq bench consume --topic Bench --count 100000
      raftmq bench consume --topic Bench --count 5000 --json
    """
    config = client_config(namesrv)

    async def read() -> BenchStats:
        stats = BenchStats()
        consumer = AsyncPullConsumer(config, ConsumerConfig(group=group))
        async with consumer:
            queues = await consumer.fetch_subscribe_queues(topic_name)
            last_message = time.monotonic()
            with click.progressbar(length=count, label="consume", file=sys.stderr,
                                   update_min_steps=max(1, count // 200)) as bar:

                finished = asyncio.Event()

                async def puller(queue: MessageQueue) -> None:
                    nonlocal last_message
                    try:
                        offset = await consumer.min_offset(queue)
                    except MQClientError as error:
                        stats.errors += 1
                        stats.first_error = stats.first_error or str(error)
                        finished.set()
                        return
                    while stats.messages < count and time.monotonic() - last_message < wait:
                        started = time.perf_counter()
                        try:
                            result = await consumer.pull(queue, "*", offset, batch, block_seconds=min(wait, 2.0))
                        except MQClientError as error:
                            stats.errors += 1
                            stats.first_error = stats.first_error or str(error)
                            await asyncio.sleep(0.1)
                            continue
                        offset = result.next_begin_offset
                        if result.status is PullStatus.FOUND and result.messages:
                            # only pulls that returned data: a long poll on an empty queue is no latency
                            stats.latencies.append(time.perf_counter() - started)
                            last_message = time.monotonic()
                            taken = min(len(result.messages), count - stats.messages)
                            stats.messages += taken
                            stats.payload_bytes += sum(len(m.body) for m in result.messages[:taken])
                            bar.update(taken)
                    finished.set()

                started = time.perf_counter()
                pullers = [asyncio.ensure_future(puller(queue)) for queue in queues]
                try:
                    if pullers:
                        # the first puller to see the count (or the idle limit) ends the run: the
                        # others may sit in a long poll on an empty queue
                        await finished.wait()
                finally:
                    for task in pullers:
                        task.cancel()
                    await asyncio.gather(*pullers, return_exceptions=True)
                stats.seconds = time.perf_counter() - started
        if stats.messages < count:
            stats.errors += 1
            stats.first_error = stats.first_error or f"only {stats.messages} of {count} messages arrived"
        return stats

    report(run(read()), as_json, "pull")


COMMANDS: list[click.Command] = [topic, send, consume, msg, group, bench]
