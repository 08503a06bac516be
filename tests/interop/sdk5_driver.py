"""Drives the stock RocketMQ 5.x Python SDK (``rocketmq-python-client``) for the gRPC interop tests.

Runs only under the SDK's own venv (``tests.interop.sdk5``), never in the test process: the SDK's generated
``apache.rocketmq.v2`` modules and ours cannot share a process. It imports nothing of this repository.

    <sdk python> sdk5_driver.py produce SPEC.json
    <sdk python> sdk5_driver.py consume SPEC.json
    <sdk python> sdk5_driver.py push SPEC.json

SPEC: ``{"endpoints": "host:port", "access_key": "", "secret_key": "", "topic": "T", "messages": [{"body":
"...", "tag": "...", "keys": [...], "properties": {...}, "message_group": "...", "delivery_timestamp_ms": 0,
"transaction": "commit" | "rollback" | "leave"}], "check_answers": {body: "commit" | "rollback"}, "await_checks": 0,
"await_checks_seconds": 0}``. One producer sends every message in order (a transactional one in a transaction
resolved as asked, or left for the broker to check back) and prints one JSON line per message: ``{"index",
"ok", "message_id", "transaction_id", "offset"}`` or ``{"index", "ok": false, "error", "code"}``. Its checker
answers a check-back (RecoverOrphanedTransactionCommand) as ``check_answers`` says, printing ``{"checked",
"message_id", "topic", "answer"}``; it waits for ``await_checks`` of them at most ``await_checks_seconds``.
Exits 0 when it ran to the end.

consume SPEC: ``{"endpoints", "access_key", "secret_key", "topic", "group", "tag": "*", "invisible_seconds",
"await_seconds", "batch", "deliveries", "seconds", "no_ack_first": [bodies], "change_invisible_first":
{body: seconds}, "never_ack": [bodies]}``. One SimpleConsumer receives until ``deliveries`` messages arrived or
``seconds`` passed; it acknowledges each, except the first delivery of a body in ``no_ack_first`` (left to come
back after its invisible time), of a body in ``change_invisible_first`` (its invisible time changed instead),
and every delivery of a body in ``never_ack``. One JSON
line per delivery: ``{"body", "message_id", "tag", "keys", "attempt", "queue", "offset", "acked",
"changed", "ack_error"}``; ``{"error"}`` for a failed receive.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: the SDK's default request timeout is 3 s; two shared cores running a Raft group need more
REQUEST_TIMEOUT_SECONDS = 10


def _checker(rocketmq: Any, answers: dict[str, str], checked: list[str]) -> Any:
    lock = threading.Lock()

    class Answers(rocketmq.TransactionChecker):  # type: ignore[misc]
        """Answers a check-back of a body as ``answers`` says (commit when it does not say), one JSON line each."""

        def check(self, message: Any) -> Any:
            body = message.body.decode()
            answer = answers.get(body, "commit")
            with lock:
                print(json.dumps({"checked": body, "message_id": message.message_id, "topic": message.topic,
                                  "answer": answer}), flush=True)
                checked.append(body)
            if answer == "rollback":
                return rocketmq.TransactionResolution.ROLLBACK
            return rocketmq.TransactionResolution.COMMIT

    return Answers()


def produce(spec: dict[str, Any]) -> None:
    rocketmq = importlib.import_module("rocketmq")  # the SDK's (this runs in its venv); Any to type checkers
    credentials = rocketmq.Credentials(spec.get("access_key", ""), spec.get("secret_key", ""))
    configuration = rocketmq.ClientConfiguration(spec["endpoints"], credentials, request_timeout=REQUEST_TIMEOUT_SECONDS)
    topic = spec["topic"]
    checked: list[str] = []
    producer = rocketmq.Producer(configuration, (topic,), checker=_checker(rocketmq, spec.get("check_answers", {}),
                                                                           checked))
    producer.startup()
    try:
        for index, item in enumerate(spec["messages"]):
            message = rocketmq.Message()
            message.topic = topic
            message.body = item["body"].encode()
            if item.get("tag"):
                message.tag = item["tag"]
            for key in item.get("keys", ()):
                message.keys = key  # the SDK's setter adds one key per assignment
            for key, value in item.get("properties", {}).items():
                message.add_property(key, value)
            if item.get("message_group"):
                message.message_group = item["message_group"]
            if item.get("delivery_timestamp_ms"):
                message.delivery_timestamp = item["delivery_timestamp_ms"]
            try:
                transaction = None
                if item.get("transaction"):
                    transaction = producer.begin_transaction()
                    receipt = producer.send(message, transaction)
                    if item["transaction"] == "commit":
                        transaction.commit()
                    elif item["transaction"] == "rollback":
                        transaction.rollback()
                    # "leave": neither, the broker checks back
                else:
                    receipt = producer.send(message)
                result = {"index": index, "ok": True, "message_id": receipt.message_id,
                          "transaction_id": receipt.transaction_id, "offset": receipt.offset}
            except Exception as error:  # the SDK's errors: reported, the run goes on
                result = {"index": index, "ok": False, "error": f"{type(error).__name__}: {error}",
                          "code": getattr(error, "code", None)}
            print(json.dumps(result), flush=True)
        # stay up for the broker's check-backs, then for the EndTransaction each answer sends
        deadline = time.monotonic() + spec.get("await_checks_seconds", 0)
        while len(checked) < spec.get("await_checks", 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        if checked:
            time.sleep(2.0)
    finally:
        producer.shutdown()


def consume(spec: dict[str, Any]) -> None:
    rocketmq = importlib.import_module("rocketmq")
    credentials = rocketmq.Credentials(spec.get("access_key", ""), spec.get("secret_key", ""))
    configuration = rocketmq.ClientConfiguration(spec["endpoints"], credentials, request_timeout=REQUEST_TIMEOUT_SECONDS)
    subscription = {spec["topic"]: rocketmq.FilterExpression(spec.get("tag", "*"))}
    consumer = rocketmq.SimpleConsumer(configuration, spec["group"], subscription,
                                       await_duration=spec.get("await_seconds", 5))
    consumer.startup()
    no_ack = set(spec.get("no_ack_first", ()))
    change = dict(spec.get("change_invisible_first", {}))
    never = set(spec.get("never_ack", ()))
    deadline = time.monotonic() + spec["seconds"]
    delivered = 0
    try:
        while delivered < spec["deliveries"] and time.monotonic() < deadline:
            try:
                messages = consumer.receive(spec.get("batch", 16), spec["invisible_seconds"])
            except Exception as error:  # reported; the consumer tries again (a leader may be changing)
                print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
                time.sleep(0.5)
                continue
            for message in messages or ():
                body = message.body.decode()
                first = message.delivery_attempt in (None, 0, 1)
                result = {"body": body, "message_id": message.message_id, "tag": message.tag,
                          "keys": sorted(message.keys or ()), "attempt": message.delivery_attempt,
                          "acked": False, "changed": False, "ack_error": None}
                try:
                    if first and body in change:
                        consumer.change_invisible_duration(message, change[body])
                        result["changed"] = True
                    elif not (first and body in no_ack) and body not in never:
                        consumer.ack(message)
                        result["acked"] = True
                except Exception as error:
                    result["ack_error"] = f"{type(error).__name__}: {error}"
                print(json.dumps(result), flush=True)
                delivered += 1
    finally:
        consumer.shutdown()


def push(spec: dict[str, Any]) -> None:
    """A PushConsumer (QueryAssignment, auto-renewed receives, acks) that succeeds with every message except
    the first delivery of a body in ``fail_first``; one JSON line per delivery (``{"body", "attempt"}``) until
    ``deliveries`` or ``seconds``."""
    rocketmq = importlib.import_module("rocketmq")
    credentials = rocketmq.Credentials(spec.get("access_key", ""), spec.get("secret_key", ""))
    configuration = rocketmq.ClientConfiguration(spec["endpoints"], credentials, request_timeout=REQUEST_TIMEOUT_SECONDS)
    fail_first = set(spec.get("fail_first", ()))
    lock = threading.Lock()
    delivered: list[int] = [0]
    listener_base = importlib.import_module("rocketmq.v5.consumer.push.message_listener")

    class Listener(listener_base.MessageListener):  # type: ignore[misc,name-defined]
        def consume(self, message: Any) -> Any:
            body = message.body.decode()
            with lock:
                print(json.dumps({"body": body, "attempt": message.delivery_attempt}), flush=True)
                delivered[0] += 1
            if body in fail_first and message.delivery_attempt in (None, 0, 1):
                return listener_base.ConsumeResult.FAILURE
            return listener_base.ConsumeResult.SUCCESS

    subscription = {spec["topic"]: rocketmq.FilterExpression(spec.get("tag", "*"))}
    consumer = rocketmq.PushConsumer(configuration, spec["group"], Listener(), subscription)
    consumer.startup()
    deadline = time.monotonic() + spec["seconds"]
    try:
        while time.monotonic() < deadline and delivered[0] < spec["deliveries"]:
            time.sleep(0.1)
        time.sleep(spec.get("linger_seconds", 1.0))  # its last acks go out
    finally:
        consumer.shutdown()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("produce", "consume", "push"):
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[2]).read_text())
    if argv[1] == "produce":
        produce(spec)
    elif argv[1] == "push":
        push(spec)
    else:
        consume(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
