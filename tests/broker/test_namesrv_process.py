"""``python -m broker.namesrv`` as a real process on a free port: it serves routes and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.namesrv import GetRouteInfoRequestHeader, RegisterBrokerRequestHeader
from protocol.client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.connection import RemotingConnectError
from protocol.route_data import RegisterBrokerBody, TopicConfig, TopicRouteData
from tests.broker.helpers import LOOPBACK, run

REPOSITORY = Path(__file__).resolve().parents[2]
LEADER = "127.0.0.1:10911"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


async def connect_when_ready(
    process: subprocess.Popen[str], port: int, timeout_seconds: float
) -> RemotingClient:
    """Poll until the process accepts connections; fail at once if it exits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while True:
        try:
            return await RemotingClient.connect(LOOPBACK, port, connect_timeout_seconds=1.0)
        except RemotingConnectError:
            if process.poll() is not None:
                raise AssertionError(
                    f"the name server exited with {process.returncode} before listening"
                ) from None
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.02)


async def register_and_fetch(process: subprocess.Popen[str], port: int) -> None:
    client = await connect_when_ready(process, port, timeout_seconds=15.0)
    body = RegisterBrokerBody(topic_configs=(TopicConfig("orders", 4, 4),)).encode()
    header = RegisterBrokerRequestHeader(
        broker_name="raft-group-a",
        broker_address=LEADER,
        cluster_name="DefaultCluster",
        ha_server_address="",
        broker_id=0,
    )
    response = await client.request(
        RequestCode.REGISTER_BROKER, header.to_ext_fields(), body, timeout_seconds=5
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    response = await client.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        GetRouteInfoRequestHeader("orders").to_ext_fields(),
        timeout_seconds=5,
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert json.loads(response.body)["brokerDatas"][0]["brokerAddrs"] == {"0": LEADER}
    assert TopicRouteData.decode(response.body).queue_datas[0].write_queue_nums == 4
    missing = await client.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        GetRouteInfoRequestHeader("missing").to_ext_fields(),
        timeout_seconds=5,
    )
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST
    await client.close()


@pytest.mark.slow
def test_name_server_process_serves_routes_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "namesrv.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker.namesrv",
                "--host",
                LOOPBACK,
                "--port",
                str(port),
                "--log-level",
                "DEBUG",
            ],
            cwd=REPOSITORY,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        run(register_and_fetch(process, port))
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        assert ready == {"event": "listening", "host": LOOPBACK, "port": port}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    except BaseException:
        print(log_path.read_text())  # shown by pytest for the failing test
        raise
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()


def run_name_server_briefly(*arguments: str) -> subprocess.CompletedProcess[str]:
    """Run the entry point expecting it to exit by itself; killed at the timeout if it does not."""
    return subprocess.run(
        [sys.executable, "-m", "broker.namesrv", *arguments],
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.slow
def test_name_server_process_exits_with_an_error_on_a_busy_port_or_bad_settings() -> None:
    with socket.socket() as occupant:
        occupant.bind((LOOPBACK, 0))
        occupant.listen()
        result = run_name_server_briefly("--host", LOOPBACK, "--port", str(occupant.getsockname()[1]))
    assert result.returncode == 1
    assert "cannot serve" in result.stderr
    result = run_name_server_briefly("--host", LOOPBACK, "--port", "0", "--broker-expiry-seconds", "0")
    assert result.returncode == 2
    assert "broker_expiry_seconds" in result.stderr
