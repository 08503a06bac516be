"""Drives the stock RocketMQ 5.x Python SDK (``rocketmq-python-client``) for the gRPC interop tests.

Runs only under the SDK's own venv (``tests.interop.sdk5``), never in the test process: the SDK's generated
``apache.rocketmq.v2`` modules and ours cannot share a process. It imports nothing of this repository.

    <sdk python> sdk5_driver.py produce SPEC.json

SPEC: ``{"endpoints": "host:port", "access_key": "", "secret_key": "", "topic": "T", "messages": [{"body":
"...", "tag": "...", "keys": [...], "properties": {...}, "message_group": "...", "delivery_timestamp_ms": 0,
"transaction": "commit" | "rollback"}]}``. One producer sends every message in order (a transactional one
in a transaction resolved as asked) and prints one JSON line per message: ``{"index", "ok", "message_id",
"transaction_id", "offset"}`` or ``{"index", "ok": false, "error", "code"}``. Exits 0 when it ran to the end.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

#: the SDK's default request timeout is 3 s; two shared cores running a Raft group need more
REQUEST_TIMEOUT_SECONDS = 10


def _checker(rocketmq: Any) -> Any:
    class CommitAll(rocketmq.TransactionChecker):  # type: ignore[misc]
        """Answers check-backs (none are expected: every transaction here is resolved at once)."""

        def check(self, message: Any) -> Any:
            return rocketmq.TransactionResolution.COMMIT

    return CommitAll()


def produce(spec: dict[str, Any]) -> None:
    rocketmq = importlib.import_module("rocketmq")  # the SDK's (this runs in its venv); Any to type checkers
    credentials = rocketmq.Credentials(spec.get("access_key", ""), spec.get("secret_key", ""))
    configuration = rocketmq.ClientConfiguration(spec["endpoints"], credentials, request_timeout=REQUEST_TIMEOUT_SECONDS)
    topic = spec["topic"]
    producer = rocketmq.Producer(configuration, (topic,), checker=_checker(rocketmq))
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
                    else:
                        transaction.rollback()
                else:
                    receipt = producer.send(message)
                result = {"index": index, "ok": True, "message_id": receipt.message_id,
                          "transaction_id": receipt.transaction_id, "offset": receipt.offset}
            except Exception as error:  # the SDK's errors: reported, the run goes on
                result = {"index": index, "ok": False, "error": f"{type(error).__name__}: {error}",
                          "code": getattr(error, "code", None)}
            print(json.dumps(result), flush=True)
    finally:
        producer.shutdown()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "produce":
        print(__doc__, file=sys.stderr)
        return 2
    produce(json.loads(Path(argv[2]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
