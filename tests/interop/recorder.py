"""A recording stand-in for a name server plus one broker, to see what a stock client puts on the wire.

``python -m tests.interop.recorder --log FRAMES.jsonl`` prints ``{"event": "listening", "port": P}``
and serves until SIGTERM/SIGINT. Give ``127.0.0.1:P`` to a client as its name server: routes point
at the same port, so every frame the client sends (to the "name server" and to the "broker") passes
through one tap that logs the raw JSON header exactly as sent (so JSON types are visible: numbers
versus strings) and the answer, one JSON line per frame. Behind the tap a
:class:`~broker.remoting.server.RemotingServer` answers just enough for a client to run: an in-memory
store of four queues per topic, pulls with a short long-poll, offsets, locks, heartbeats.

It is a tool for writing ``tests/interop/README.md`` and for checking the driver without a cluster,
not a broker: no validation, no persistence, no tag filtering on the server.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from broker.remoting.server import Connection, RemotingServer, RequestContext
from commitlog.hosts import encode_host, encode_message_id
from commitlog.message import MessageInput
from commitlog.record_codec import encode_record
from protocol.batch import decode_batch
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.properties import encode_properties

HOST: Final = "127.0.0.1"
BROKER_NAME: Final = "recorder"
QUEUES_PER_TOPIC: Final = 4
LONG_POLL_SECONDS_MAX: Final = 1.0
#: topics with this prefix have no route (to see what a client does then)
MISSING_TOPIC_PREFIX: Final = "missing"
#: sends to topics with this prefix are answered SYSTEM_ERROR (to see how a client reports errors)
REJECTED_TOPIC_PREFIX: Final = "rejected"
#: SEND_MESSAGE_V2's short header names, in SendMessageRequestHeaderV2 order
V2_NAMES: Final = dict(zip("abcdefghijklmn", (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch",
    "brokerName",
), strict=True))
_FRAME_HEAD: Final = struct.Struct(">ii")


@dataclass
class _Queue:
    records: list[bytes] = field(default_factory=list)


@dataclass
class MemoryBroker:
    """The state behind the recorder: topics of four queues, offsets, consumer ids of each group."""

    port: int
    queues: dict[tuple[str, int], _Queue] = field(default_factory=dict)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    consumers: dict[str, dict[str, Connection]] = field(default_factory=dict)
    physical_offset: int = 0
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    def queue(self, topic: str, queue_id: int) -> _Queue:
        return self.queues.setdefault((topic, queue_id), _Queue())

    def store(self, topic: str, queue_id: int, flag: int, sys_flag: int, born: int, body: bytes,
              properties: bytes, born_host: bytes) -> tuple[str, int]:
        queue = self.queue(topic, queue_id)
        record = encode_record(
            MessageInput(topic, queue_id, flag, sys_flag, born, born_host, int(time.time() * 1000), 0, 0,
                         body, properties),
            len(queue.records), self.physical_offset, encode_host(HOST, self.port),
        )
        message_id = encode_message_id(encode_host(HOST, self.port), self.physical_offset)
        self.physical_offset += len(record)
        queue.records.append(record)
        return message_id, len(queue.records) - 1


def _fields(request: RemotingCommand) -> dict[str, str]:
    """Header fields with SEND_MESSAGE_V2's short names expanded."""
    if request.code == RequestCode.SEND_MESSAGE_V2:
        return {V2_NAMES.get(key, key): value for key, value in request.ext_fields.items()}
    return dict(request.ext_fields)


def build_processors(broker: MemoryBroker) -> dict[int, Callable[[RequestContext], object]]:
    async def route(context: RequestContext) -> RemotingCommand:
        request = context.request
        topic = request.ext_fields.get("topic", "")
        body: dict[str, object] = {
            "orderTopicConf": None,
            "queueDatas": [{"brokerName": BROKER_NAME, "readQueueNums": QUEUES_PER_TOPIC,
                            "writeQueueNums": QUEUES_PER_TOPIC, "perm": 6, "topicSysFlag": 0}],
            "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": BROKER_NAME,
                             "brokerAddrs": {"0": f"{HOST}:{broker.port}"}}],
            "filterServerTable": {},
        }
        if not topic or topic.startswith(MISSING_TOPIC_PREFIX):
            return make_response(request, ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}")
        return make_response(request, ResponseCode.SUCCESS, body=json.dumps(body).encode())

    async def send(context: RequestContext) -> RemotingCommand:
        request = context.request
        header = _fields(request)
        topic = header["topic"]
        if topic.startswith(REJECTED_TOPIC_PREFIX):
            return make_response(request, ResponseCode.SYSTEM_ERROR, f"the recorder rejects sends to {topic}")
        queue_id = int(header.get("queueId", "0"))
        if queue_id < 0:
            queue_id = 0
        born_host = encode_host(context.connection.remote_host, context.connection.remote_port)
        born = int(header.get("bornTimestamp", "0"))
        sys_flag = int(header.get("sysFlag", "0"))
        if header.get("batch") in ("1", "true"):
            ids, offsets = [], []
            for message in decode_batch(request.body):
                message_id, offset = broker.store(topic, queue_id, message.flag, sys_flag, born, message.body,
                                                  encode_properties(message.properties), born_host)
                ids.append(message_id)
                offsets.append(offset)
            message_id, first_offset = ",".join(ids), offsets[0]
        else:
            properties = header.get("properties", "").encode()
            message_id, first_offset = broker.store(topic, queue_id, int(header.get("flag", "0")),
                                                    sys_flag, born, request.body, properties, born_host)
        async with broker.arrived:
            broker.arrived.notify_all()
        return make_response(request, ResponseCode.SUCCESS, ext_fields={
            "msgId": message_id, "queueId": str(queue_id), "queueOffset": str(first_offset),
        })

    async def pull(context: RequestContext) -> RemotingCommand:
        request = context.request
        header = request.ext_fields
        group, topic, queue_id = header["consumerGroup"], header["topic"], int(header["queueId"])
        offset, count = int(header["queueOffset"]), int(header.get("maxMsgNums", "32"))
        if int(header.get("sysFlag", "0")) & 1:
            broker.offsets[(group, topic, queue_id)] = int(header.get("commitOffset", "0"))
        queue = broker.queue(topic, queue_id)
        wait = min(int(header.get("suspendTimeoutMillis", "0")) / 1000, LONG_POLL_SECONDS_MAX)
        if offset >= len(queue.records) and wait > 0:
            async with broker.arrived:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        broker.arrived.wait_for(lambda: offset < len(queue.records)), wait
                    )
        records = queue.records[offset:offset + count]
        reply = {"nextBeginOffset": str(offset + len(records)), "minOffset": "0",
                 "maxOffset": str(len(queue.records)), "suggestWhichBrokerId": "0"}
        if not records:
            return make_response(request, ResponseCode.PULL_NOT_FOUND, "no new message", reply)
        return make_response(request, ResponseCode.SUCCESS, ext_fields=reply, body=b"".join(records))

    async def query_offset(context: RequestContext) -> RemotingCommand:
        header = context.request.ext_fields
        key = (header["consumerGroup"], header["topic"], int(header["queueId"]))
        return make_response(context.request, ResponseCode.SUCCESS,
                             ext_fields={"offset": str(broker.offsets.get(key, 0))})

    async def update_offset(context: RequestContext) -> RemotingCommand:
        header = context.request.ext_fields
        key = (header["consumerGroup"], header["topic"], int(header["queueId"]))
        broker.offsets[key] = int(header["commitOffset"])
        return make_response(context.request, ResponseCode.SUCCESS)

    async def heartbeat(context: RequestContext) -> RemotingCommand:
        data = json.loads(context.request.body or b"{}")
        client_id = data["clientID"]
        for consumer in data.get("consumerDataSet", []):
            group = consumer["groupName"]
            members = broker.consumers.setdefault(group, {})
            joined = client_id not in members
            members[client_id] = context.connection
            if joined:
                # RocketMQ's ConsumerManager tells the group's other members at once (oneway)
                for other_id, connection in list(members.items()):
                    if other_id != client_id and not connection.is_closed:
                        await connection.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                     {"consumerGroup": group})
        return make_response(context.request, ResponseCode.SUCCESS)

    async def unregister(context: RequestContext) -> RemotingCommand:
        fields = context.request.ext_fields
        broker.consumers.get(fields.get("consumerGroup", ""), {}).pop(fields.get("clientID", ""), None)
        return make_response(context.request, ResponseCode.SUCCESS)

    async def consumer_list(context: RequestContext) -> RemotingCommand:
        group = context.request.ext_fields.get("consumerGroup", "")
        body = json.dumps({"consumerIdList": sorted(broker.consumers.get(group, {}))}).encode()
        return make_response(context.request, ResponseCode.SUCCESS, body=body)

    async def lock(context: RequestContext) -> RemotingCommand:
        data = json.loads(context.request.body)
        body = json.dumps({"lockOKMQSet": data.get("mqSet", [])}).encode()
        return make_response(context.request, ResponseCode.SUCCESS, body=body)

    async def succeed(context: RequestContext) -> RemotingCommand:
        return make_response(context.request, ResponseCode.SUCCESS)

    async def max_offset(context: RequestContext) -> RemotingCommand:
        header = context.request.ext_fields
        length = len(broker.queue(header["topic"], int(header["queueId"])).records)
        return make_response(context.request, ResponseCode.SUCCESS, ext_fields={"offset": str(length)})

    async def min_offset(context: RequestContext) -> RemotingCommand:
        return make_response(context.request, ResponseCode.SUCCESS, ext_fields={"offset": "0"})

    return {
        RequestCode.GET_ROUTEINFO_BY_TOPIC: route,
        RequestCode.SEND_MESSAGE: send,
        RequestCode.SEND_MESSAGE_V2: send,
        RequestCode.SEND_BATCH_MESSAGE: send,
        RequestCode.PULL_MESSAGE: pull,
        RequestCode.QUERY_CONSUMER_OFFSET: query_offset,
        RequestCode.UPDATE_CONSUMER_OFFSET: update_offset,
        RequestCode.HEART_BEAT: heartbeat,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
        RequestCode.LOCK_BATCH_MQ: lock,
        RequestCode.UNLOCK_BATCH_MQ: succeed,
        RequestCode.UNREGISTER_CLIENT: unregister,
        RequestCode.CONSUMER_SEND_MSG_BACK: succeed,
        RequestCode.UPDATE_AND_CREATE_TOPIC: succeed,
        RequestCode.GET_MAX_OFFSET: max_offset,
        RequestCode.GET_MIN_OFFSET: min_offset,
    }


# ------------------------------------------------------------------------------------------------ tap


def describe_frame(frame: bytes, direction: str) -> dict[str, object]:
    """One frame (without its length prefix) as a log line: the header as sent, the body summarised."""
    (header_word,) = struct.unpack_from(">i", frame, 0)
    serialize_type, header_length = (header_word >> 24) & 0xFF, header_word & 0xFFFFFF
    header_bytes = frame[4:4 + header_length]
    body = frame[4 + header_length:]
    entry: dict[str, object] = {"direction": direction, "serialize_type": serialize_type,
                                "body_length": len(body)}
    if serialize_type == 0:
        entry["header"] = json.loads(header_bytes)
    else:
        entry["header_base64"] = base64.b64encode(header_bytes).decode()
    try:
        entry["body_json"] = json.loads(body) if body[:1] in (b"{", b"[") else None
    except ValueError:
        entry["body_json"] = None
    if entry["body_json"] is None and body:
        entry["body_base64"] = base64.b64encode(body[:4096]).decode()
    return entry


class FrameTap:
    """Bytes in both directions between a client and the server, split into frames for the log."""

    def __init__(self, log: IO[str], direction: str, connection_id: int) -> None:
        self._buffer = bytearray()
        self._log = log
        self._direction = direction
        self._connection_id = connection_id

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 4:
            (length,) = struct.unpack_from(">i", self._buffer, 0)
            if len(self._buffer) < 4 + length:
                return
            frame = bytes(self._buffer[4:4 + length])
            del self._buffer[:4 + length]
            entry = describe_frame(frame, self._direction)
            entry["connection"] = self._connection_id
            entry["time"] = round(time.time(), 3)
            if isinstance(entry.get("body_json"), dict) and "body_base64" in entry:
                del entry["body_base64"]
            if entry["direction"] == "server->client" and "body_base64" in entry:
                # stored messages: keep the log short, the request says what was asked
                entry["body_base64"] = str(entry["body_base64"])[:64]
            self._log.write(json.dumps(entry) + "\n")
            self._log.flush()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tap: FrameTap) -> None:
    try:
        while data := await reader.read(65536):
            tap.feed(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(log_path: Path, port: int) -> None:
    log = log_path.open("a", encoding="utf-8")
    connection_ids = iter(range(1, 1 << 30))
    transports: list[asyncio.BaseTransport] = []

    inner = RemotingServer(HOST, 0)
    broker = MemoryBroker(port=0)
    for code, processor in build_processors(broker).items():
        inner.register(code, processor, name=RequestCode(code).name)  # type: ignore[arg-type]
    await inner.start()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection_id = next(connection_ids)
        upstream_reader, upstream_writer = await asyncio.open_connection(HOST, inner.port)
        transports.extend((writer.transport, upstream_writer.transport))
        await asyncio.gather(
            _pipe(reader, upstream_writer, FrameTap(log, "client->server", connection_id)),
            _pipe(upstream_reader, writer, FrameTap(log, "server->client", connection_id)),
        )

    tap = await asyncio.start_server(accept, HOST, port)
    broker.port = tap.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    print(json.dumps({"event": "listening", "port": broker.port}), flush=True)
    await stop.wait()
    tap.close()
    for transport in transports:
        transport.abort()  # type: ignore[attr-defined]
    await inner.stop(grace_seconds=0.5)
    log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.recorder")
    parser.add_argument("--log", type=Path, required=True, help="append one JSON line per frame here")
    parser.add_argument("--port", type=int, default=0)
    arguments = parser.parse_args(argv)
    asyncio.run(serve(arguments.log, arguments.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
