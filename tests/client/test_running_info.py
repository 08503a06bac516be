"""GET_CONSUMER_RUNNING_INFO bodies: fastjson's object keys, the C++ client's quirks, our encoding, the
per-topic statistics and a process queue's ``ProcessQueueInfo``."""

from __future__ import annotations

import json

import pytest

from client.message import MessageExt, MessageQueue
from client.process_queue import ProcessQueue
from client.running_info import (
    FAILED_WINDOW_SECONDS,
    RATE_WINDOW_SECONDS,
    ConsumeStats,
    RunningInfoError,
    decode_running_info,
    encode_running_info,
    loads_lenient,
)

QUEUE = MessageQueue("Orders", "broker-a", 3)


def test_lenient_json_reads_object_keys_as_their_canonical_json() -> None:
    text = '{{"topic":"T","queueId":1}:{"a":[1,{"b":null}]}, "plain": true, 7: "seven", [1, 2]: {}}'
    assert loads_lenient(text) == {
        '{"queueId":1,"topic":"T"}': {"a": [1, {"b": None}]},
        "plain": True,
        "7": "seven",
        "[1,2]": {},
    }
    # standard JSON reads as json.loads does
    standard = '{"a": [1, 2.5, "x\\u00e9", false, null, {}], "b": {"c": []}}'
    assert loads_lenient(standard) == json.loads(standard)


@pytest.mark.parametrize("text, problem", [
    ("", "end of the body"),
    ('{"a": 1', "end of the body"),
    ('{"a" 1}', "expected ':'"),
    ('{"a": 1} x', "extra data"),
    ("[1, 2,]", "not JSON"),
    ('{"a": tru}', "not JSON"),
    ("[" * 100 + "]" * 100, "nests too deep"),
])
def test_lenient_json_refuses_what_is_not_json(text: str, problem: str) -> None:
    with pytest.raises(RunningInfoError, match=problem):
        loads_lenient(text)


def test_our_encoding_is_fastjsons_form_and_decodes_back() -> None:
    info = {"commitOffset": 5, "cachedMsgCount": 2, "locked": True}
    body = encode_running_info({"PROP_CONSUME_TYPE": "CONSUME_PASSIVELY"}, [{"topic": "Orders", "subString": "*"}],
                               {QUEUE: info}, {"Orders": {"pullTPS": 1.5}}, jstack="stack")
    assert body.startswith(b'{"mqTable":{{"brokerName":"broker-a","queueId":3,"topic":"Orders"}:{')
    with pytest.raises(ValueError):
        json.loads(body)  # as Java's and the C++ client's: not standard JSON
    decoded = decode_running_info("client-1", body)
    assert decoded.client_id == "client-1"
    assert decoded.properties == {"PROP_CONSUME_TYPE": "CONSUME_PASSIVELY"}
    assert decoded.subscriptions == ({"topic": "Orders", "subString": "*"},)
    assert decoded.queues == {QUEUE: info}
    assert decoded.status == {"Orders": {"pullTPS": 1.5}}
    assert decoded.jstack == "stack"
    plain = decoded.to_json_object()
    assert plain["queues"] == [{"topic": "Orders", "brokerName": "broker-a", "queueId": 3, **info}]
    json.dumps(plain)  # plain JSON for --json
    empty = decode_running_info("c", encode_running_info({}, [], {}, {}))
    assert empty.queues == {} and empty.status == {} and empty.jstack == ""


def test_the_cpp_clients_answers_decode() -> None:
    # as librocketmq 1.2.x writes it: pretty-printed queue keys, int64 fields as strings, "flase"
    body = (b'{"mqTable":{{\n   "brokerName" : "broker-a",\n   "queueId" : 0,\n   "topic" : "T"\n}:{\n'
            b'   "cachedMsgCount" : 0,\n   "commitOffset" : "12",\n   "droped" : false,\n'
            b'   "lastConsumeTimestamp" : "4193183512526859831"\n}\n},"jstack":"","properties":'
            b'{"PROP_CONSUMEORDERLY":"flase","PROP_THREADPOOL_CORE_SIZE":"1"},'
            b'"subscriptionSet":[{"subString":"*","subVersion":"1795397980712","topic":"T"}]}\n')
    info = decode_running_info("1634-127.0.0.1@c1", body)
    assert info.queues == {MessageQueue("T", "broker-a", 0): {
        "cachedMsgCount": 0, "commitOffset": "12", "droped": False, "lastConsumeTimestamp": "4193183512526859831"}}
    assert info.properties["PROP_CONSUMEORDERLY"] == "flase" and info.status == {}
    # holding no queue, it writes '"mqTable":}': repaired
    empty = decode_running_info("c", b'{"mqTable":},"jstack":"","properties":{},"subscriptionSet":[]}')
    assert empty.queues == {}


@pytest.mark.parametrize("body, problem", [
    (b"\xff", "not UTF-8"),
    (b"[]", "not an object"),
    (b'{"mqTable": []}', "wrong type"),
    (b'{"mqTable": {"x": {}}}', "not a message queue"),
    (b'{"mqTable": {{"topic": "T"}: {}}}', "not a message queue"),
    (b'{"mqTable":}', "not JSON"),
])
def test_unreadable_bodies_are_refused(body: bytes, problem: str) -> None:
    with pytest.raises(RunningInfoError, match=problem):
        decode_running_info("c", body)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stats_are_rates_and_means_over_the_last_minute() -> None:
    clock = Clock()
    stats = ConsumeStats(clock)
    assert stats.status("Orders") == {"pullRT": 0.0, "pullTPS": 0.0, "consumeRT": 0.0, "consumeOKTPS": 0.0,
                                      "consumeFailedTPS": 0.0, "consumeFailedMsgs": 0}
    stats.pulled("Orders", 30, 4.0)
    stats.pulled("Orders", 0, 2.0)
    stats.consumed("Orders", 6, True, 10.0)
    clock.now += 1
    stats.consumed("Orders", 3, False, 20.0)
    status = stats.status("Orders")
    assert status == {"pullRT": 3.0, "pullTPS": round(30 / RATE_WINDOW_SECONDS, 3), "consumeRT": 15.0,
                      "consumeOKTPS": round(6 / RATE_WINDOW_SECONDS, 3),
                      "consumeFailedTPS": round(3 / RATE_WINDOW_SECONDS, 3), "consumeFailedMsgs": 3}
    assert stats.status("Other")["pullTPS"] == 0.0
    clock.now += RATE_WINDOW_SECONDS - 1  # the first second has left the window, the second is its oldest
    assert stats.status("Orders")["consumeOKTPS"] == 0.0
    assert stats.status("Orders")["consumeFailedTPS"] == round(3 / RATE_WINDOW_SECONDS, 3)
    clock.now += 1
    assert stats.status("Orders")["consumeFailedTPS"] == 0.0 and stats.status("Orders")["pullRT"] == 0.0
    assert stats.status("Orders")["consumeFailedMsgs"] == 3  # failures count over the hour
    clock.now += FAILED_WINDOW_SECONDS
    assert stats.status("Orders")["consumeFailedMsgs"] == 0


def message(offset: int, body: bytes) -> MessageExt:
    return MessageExt(
        topic="Orders", body=body, queue_id=3, queue_offset=offset, commit_log_offset=offset * 100,
        msg_id=f"id{offset}", offset_msg_id=f"o{offset}", properties={}, born_timestamp_ms=0,
        store_timestamp_ms=0, born_host="", store_host="", reconsume_times=0, sys_flag=0, flag=0,
        prepared_transaction_offset=0,
    )


def test_process_queue_info() -> None:
    queue = ProcessQueue(QUEUE, threshold=100)
    assert queue.info(-1, 0) == {
        "commitOffset": -1, "cachedMsgMinOffset": 0, "cachedMsgMaxOffset": 0, "cachedMsgCount": 0,
        "cachedMsgSizeInMiB": 0, "transactionMsgMinOffset": 0, "transactionMsgMaxOffset": 0,
        "transactionMsgCount": 0, "locked": False, "tryUnlockTimes": 0, "lastLockTimestamp": 0, "droped": False,
        "lastPullTimestamp": 0, "lastConsumeTimestamp": 0,
    }
    queue.put([message(7, b"x" * (1 << 20)), message(8, b"y" * (1 << 20)), message(9, b"z")])
    queue.take(1)  # orderly: offset 7 is being consumed, still cached
    queue.locked = True
    queue.last_pull_ms = 1_700_000_000_000
    queue.drop()
    info = queue.info(7, 1_700_000_000_500)
    assert (info["commitOffset"], info["cachedMsgMinOffset"], info["cachedMsgMaxOffset"], info["cachedMsgCount"],
            info["cachedMsgSizeInMiB"], info["locked"], info["droped"], info["lastLockTimestamp"],
            info["lastPullTimestamp"]) == (7, 7, 9, 3, 2, True, True, 1_700_000_000_500, 1_700_000_000_000)
