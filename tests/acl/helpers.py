"""What the ACL and hardening tests share: ACL files, raw (optionally signed, TLS, source-bound) requests,
and a local cluster whose readiness probe can sign and speak TLS.

Requests here go through a blocking socket and the sans-IO codec, so a test can choose the source
address (``127.0.0.2`` is another host as far as the whitelist is concerned) and wrap the socket in TLS.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cli.cluster import LocalCluster, NodeInfo, is_alive
from protocol.codec import FrameDecoder, encode_frame
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request
from protocol.signature import sign_fields
from tests.broker.wire import properties_text

REQUEST_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str


ADMIN = Credentials("raftmq-admin", "admin-secret-0001")
PRODUCER = Credentials("orders-producer", "producer-secret-01")
CONSUMER = Credentials("orders-consumer", "consumer-secret-01")

#: the ACL most tests use: an admin, a producer of "orders", a consumer of "orders" in group "billing"
BASE_ACL = f"""
globalWhiteRemoteAddresses = []

[[accounts]]
accessKey = "{ADMIN.access_key}"
secretKey = "{ADMIN.secret_key}"
admin = true

[[accounts]]
accessKey = "{PRODUCER.access_key}"
secretKey = "{PRODUCER.secret_key}"
defaultTopicPerm = "DENY"
defaultGroupPerm = "DENY"
topicPerms = ["orders=PUB", "audit=DENY"]

[[accounts]]
accessKey = "{CONSUMER.access_key}"
secretKey = "{CONSUMER.secret_key}"
whiteRemoteAddress = "127.0.0.3"
defaultTopicPerm = "DENY"
defaultGroupPerm = "DENY"
topicPerms = ["orders=SUB"]
groupPerms = ["billing=SUB"]
"""


def request(address: str, code: int, fields: Mapping[str, str] | None = None, body: bytes = b"", *,
            credentials: Credentials | None = None, source_host: str | None = None,
            ssl_context: ssl.SSLContext | None = None,
            timeout_seconds: float = REQUEST_TIMEOUT_SECONDS) -> RemotingCommand:
    """One request on a fresh connection: signed with ``credentials`` if given, from ``source_host`` if
    given, over TLS if ``ssl_context`` is given. Raises ``ConnectionError`` if the broker hangs up."""
    host, _, port = address.rpartition(":")
    ext_fields = dict(fields or {})
    if credentials is not None:
        ext_fields = sign_fields(ext_fields, body, credentials.access_key, credentials.secret_key)
    frame = encode_frame(make_request(code, 7, ext_fields, body))
    raw = socket.create_connection((host, int(port)), timeout=timeout_seconds,
                                   source_address=(source_host, 0) if source_host else None)
    with raw:
        connection = ssl_context.wrap_socket(raw, server_hostname=host) if ssl_context is not None else raw
        with connection:
            connection.sendall(frame)
            decoder = FrameDecoder()
            while True:
                data = connection.recv(65536)
                if not data:
                    raise ConnectionError(f"{address} closed the connection without answering")
                decoder.feed(data)
                response = decoder.next_frame()
                if response is not None:
                    return response


def send_fields(topic: str, group: str = "acl-producers", properties: Mapping[str, str] | None = None) -> dict[str, str]:
    return {"producerGroup": group, "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
            "properties": properties_text(dict(properties or {})), "reconsumeTimes": "0", "unitMode": "false",
            "batch": "false"}


def pull_fields(topic: str, group: str, offset: int = 0, queue_id: int = 0) -> dict[str, str]:
    return {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
            "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subscription": "*", "subVersion": "0"}


def create_topic_fields(topic: str, queues: int = 1) -> dict[str, str]:
    return {"topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues), "perm": "6",
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}


def runtime_info(address: str, credentials: Credentials | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> dict[str, str] | None:
    """A broker's runtime table (role, term, indexes), or None when it does not answer or refuses."""
    try:
        response = request(address, RequestCode.GET_BROKER_RUNTIME_INFO, credentials=credentials,
                           ssl_context=ssl_context, timeout_seconds=2.0)
    except (OSError, ssl.SSLError):
        return None
    if response.code != ResponseCode.SUCCESS:
        return None
    table: dict[str, Any] = json.loads(response.body).get("table", {})
    return {str(key): str(value) for key, value in table.items()}


class ProbedCluster(LocalCluster):
    """A :class:`LocalCluster` whose leader probe signs with ``probe_credentials`` and speaks TLS with
    ``probe_ssl_context`` (``LocalCluster``'s own probe does neither, so with ACL or TLS on it never finds
    the leader). Make a subclass with :func:`probed_cluster`."""

    probe_credentials: ClassVar[Credentials | None] = None
    probe_ssl_context: ClassVar[ssl.SSLContext | None] = None

    def node_info(self, node: NodeInfo) -> dict[str, str] | None:
        return runtime_info(node.broker_address, self.probe_credentials, self.probe_ssl_context)

    def leader_node(self) -> NodeInfo | None:
        for node in self.info.nodes:
            if is_alive(node.pid) and (self.node_info(node) or {}).get("brokerRole") == "LEADER":
                return node
        return None


def probed_cluster(credentials: Credentials | None = None,
                   ssl_context: ssl.SSLContext | None = None) -> type[ProbedCluster]:
    return type("Probed", (ProbedCluster,), {"probe_credentials": credentials, "probe_ssl_context": ssl_context})


def write_acl(directory: Path, text: str, nodes: int = 3) -> None:
    """The same ACL file in every node's directory (``acl_file = "acl.toml"`` is read from there)."""
    for index in range(nodes):
        node_directory = directory / f"n{index}"
        node_directory.mkdir(parents=True, exist_ok=True)
        (node_directory / "acl.toml").write_text(text)


def source_address_usable(host: str) -> bool:
    """Whether this machine can send from ``host`` (all of 127.0.0.0/8 is loopback on Linux)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
        return True
    except OSError:
        return False
