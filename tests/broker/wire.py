"""Raw RocketMQ requests against a running broker, as a stock client sends them (tests only)."""

from __future__ import annotations

import json
import struct
import time
import zlib
from typing import Any

from commitlog.record_codec import decode_record
from protocol.codes import RequestCode

BATCH_MAGIC = 0xDAA320A7


def properties_text(properties: dict[str, str]) -> str:
    return "".join(f"{key}\x01{value}\x02" for key, value in properties.items())


def send(address: str, topic: str, body: bytes, *, queue_id: int = -1, properties: dict[str, str] | None = None,
         v2: bool = True, sys_flag: int = 0, reconsume_times: int = 0,
         max_reconsume_times: int | None = None) -> tuple[int, dict[str, str], str]:
    fields = {"producerGroup": "test-producer", "topic": topic, "defaultTopic": "TBW102",
              "defaultTopicQueueNums": "4", "queueId": str(queue_id), "sysFlag": str(sys_flag),
              "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
              "properties": properties_text(properties or {}), "reconsumeTimes": str(reconsume_times),
              "unitMode": "false", "batch": "false"}
    if max_reconsume_times is not None:
        fields["maxReconsumeTimes"] = str(max_reconsume_times)
    if v2:
        names = ["producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
                 "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch"]
        fields = {chr(ord("a") + names.index(key)): value for key, value in fields.items()}
    code, ext, _ = _request_with_body(address, RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE,
                                      fields, body)
    return code, ext, ext.get("remark", "")


def batch_body(messages: list[tuple[bytes, dict[str, str]]]) -> bytes:
    parts = []
    for body, properties in messages:
        props = properties_text(properties).encode()
        total = 20 + len(body) + 2 + len(props)
        parts.append(struct.pack(">iIiii", total, BATCH_MAGIC, zlib.crc32(body) & 0x7FFFFFFF, 0, len(body)) + body
                     + struct.pack(">h", len(props)) + props)
    return b"".join(parts)


def send_batch(address: str, topic: str, body: bytes, queue_id: int = 0) -> tuple[int, dict[str, str], str]:
    fields = {"producerGroup": "test-producer", "topic": topic, "defaultTopic": "TBW102",
              "defaultTopicQueueNums": "4", "queueId": str(queue_id), "sysFlag": "0",
              "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": "", "reconsumeTimes": "0",
              "unitMode": "false", "batch": "true"}
    code, ext, _ = _request_with_body(address, RequestCode.SEND_BATCH_MESSAGE, fields, body)
    return code, ext, ext.get("remark", "")


def _request_with_body(address: str, code: int, fields: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    import asyncio

    from protocol.client import RemotingClient

    async def run() -> tuple[int, dict[str, str], bytes]:
        host, _, port = address.rpartition(":")
        client = await RemotingClient.connect(host, int(port))
        try:
            response = await client.request(code, fields, body, timeout_seconds=10.0)
            ext = dict(response.ext_fields)
            if response.remark:
                ext["remark"] = response.remark
            return response.code, ext, response.body
        finally:
            await client.close()

    return asyncio.run(run())


def pull(address: str, topic: str, queue_id: int, offset: int, *, count: int = 32, group: str = "test-consumer",
         subscription: str | None = None, suspend_ms: int = 0) -> tuple[int, dict[str, str], list[Any]]:
    sys_flag = (0x2 if suspend_ms else 0) | (0x4 if subscription is not None else 0)
    fields = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
              "maxMsgNums": str(count), "sysFlag": str(sys_flag), "commitOffset": "0",
              "suspendTimeoutMillis": str(suspend_ms), "subVersion": "0", "expressionType": "TAG"}
    if subscription is not None:
        fields["subscription"] = subscription
    code, ext, body = _request_with_body(address, RequestCode.PULL_MESSAGE, fields, b"")
    messages = []
    position = 0
    while position < len(body):
        record = decode_record(body, position)
        messages.append(record)
        position += record.total_size
    return code, ext, messages


def call(address: str, code: int, fields: dict[str, str] | None = None, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    return _request_with_body(address, code, fields or {}, body)


def json_body(body: bytes) -> Any:
    return json.loads(body)


def leader_address(namesrv: str, timeout_seconds: float = 60.0) -> str:
    """The address the name server routes to as brokerId 0 (polled until there is one)."""
    from cli.cluster import route_master
    from tests.support.waiting import wait_for

    return wait_for(lambda: route_master(namesrv), "a leader in the routes", timeout_seconds=timeout_seconds)


def create_topic(address: str, topic: str, queues: int = 4, perm: int = 6) -> None:
    code, _, remark = call(address, RequestCode.UPDATE_AND_CREATE_TOPIC,
                           {"topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues),
                            "perm": str(perm), "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0",
                            "order": "false"})
    assert code == 0, remark
