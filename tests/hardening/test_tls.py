"""Optional TLS on the remoting port (``[broker] tls_cert_file`` / ``tls_key_file``), with a self-signed
certificate made at test time by the ``openssl`` command (skipped, saying so, where there is none: the
``cryptography`` package is not a dependency). Our client and CLI connect with ``tls`` and the
certificate as their CA; plain clients, clients trusting another CA and stalled handshakes get nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from click.testing import CliRunner

from cli.client_commands import send
from cli.cluster import LocalCluster, route_master
from client import ClientConfig, Message, Producer, ProducerConfig, SendStatus
from client.errors import MQClientError
from commitlog.record_codec import decode_record
from protocol.codes import RequestCode, ResponseCode
from tests.acl.helpers import probed_cluster, pull_fields, request
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

IDLE_TIMEOUT_SECONDS: Final = 4.0


@dataclass(frozen=True)
class TlsGroup:
    cluster: LocalCluster
    certificate: Path
    other_certificate: Path

    def context(self, certificate: Path | None = None) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(certificate or self.certificate))


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
    result = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(certificate), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, timeout=60, check=False)
    if result.returncode != 0:
        pytest.skip(f"openssl cannot make a self-signed certificate here: {result.stderr.decode()[-300:]}")
    return certificate, key


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsGroup]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate (and the cryptography package is not installed)")
    directory = tmp_path_factory.mktemp("tls-group")
    certificate, key = make_certificate(directory, "broker")
    other, _ = make_certificate(directory, "other")
    overrides = small_store({"broker": {"tls_cert_file": str(certificate), "tls_key_file": str(key),
                                        "remoting_idle_timeout_seconds": IDLE_TIMEOUT_SECONDS}})
    context = ssl.create_default_context(cafile=str(certificate))
    with probed_cluster(ssl_context=context).start(directory, nodes=3, overrides=overrides) as started:
        yield TlsGroup(started, certificate, other)


def leader(group: TlsGroup) -> str:
    return wait_for(lambda: route_master(group.cluster.namesrv), "a leader in the routes", timeout_seconds=30)


def test_our_client_sends_over_tls_and_reads_back(group: TlsGroup) -> None:
    config = ClientConfig((group.cluster.namesrv,), client_ip="127.0.0.1", tls=True,
                          tls_ca_file=str(group.certificate))
    with Producer(config, ProducerConfig(group="tls-producers")) as producer:
        results = [producer.send(Message("TlsTopic", f"secret {index}".encode())) for index in range(10)]
    assert {result.status for result in results} == {SendStatus.SEND_OK}
    address = leader(group)
    queue = results[0].queue.queue_id
    offset = results[0].queue_offset
    response = request(address, RequestCode.PULL_MESSAGE, pull_fields("TlsTopic", "tls-readers", offset, queue),
                       ssl_context=group.context())
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert decode_record(response.body, 0).body == b"secret 0"


def test_the_cli_speaks_tls_when_told(group: TlsGroup) -> None:
    runner = CliRunner()
    arguments = ["TlsTopic", "from the cli", "--namesrv", group.cluster.namesrv]
    sent = runner.invoke(send, [*arguments, "--tls", "--tls-ca-file", str(group.certificate)], env={})
    assert sent.exit_code == 0, sent.output
    plain = runner.invoke(send, arguments, env={})
    assert plain.exit_code == 1 and "Traceback" not in plain.output, plain.output


def test_a_follower_forwards_a_send_to_the_leader_over_tls(group: TlsGroup) -> None:
    master = leader(group)
    follower = next(node.broker_address for node in group.cluster.info.nodes if node.broker_address != master)
    response = request(follower, RequestCode.SEND_MESSAGE, {
        "producerGroup": "tls-producers", "topic": "TlsForwarded", "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": "1", "flag": "0",
        "properties": "", "reconsumeTimes": "0"}, b"through a follower", ssl_context=group.context())
    assert response.code == ResponseCode.SUCCESS, response.remark


def test_plain_and_untrusting_clients_get_nothing(group: TlsGroup) -> None:
    address = leader(group)
    with pytest.raises(ConnectionError):
        request(address, RequestCode.GET_BROKER_RUNTIME_INFO, timeout_seconds=IDLE_TIMEOUT_SECONDS * 3)
    with pytest.raises(ssl.SSLCertVerificationError):
        request(address, RequestCode.GET_BROKER_RUNTIME_INFO, ssl_context=group.context(group.other_certificate))
    config = ClientConfig((group.cluster.namesrv,), client_ip="127.0.0.1", request_timeout_seconds=2.0)
    with Producer(config, ProducerConfig(group="plain-producers", send_timeout_seconds=3.0)) as producer, \
            pytest.raises(MQClientError):
        producer.send(Message("TlsTopic", b"in clear"))


def test_a_stalled_handshake_is_closed(group: TlsGroup) -> None:
    host, _, port = leader(group).rpartition(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=IDLE_TIMEOUT_SECONDS * 4) as silent, \
            contextlib.suppress(ConnectionResetError):
        assert silent.recv(1) == b""
    assert time.monotonic() - started < IDLE_TIMEOUT_SECONDS * 4
