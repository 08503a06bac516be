"""Our client and CLI with ACL credentials: where they come from, and every request signed with them."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from broker.acl.admission import Admission
from broker.acl.authorizer import AclAuthorizer, AclRules
from broker.acl.config import AclConfig
from broker.remoting import RequestContext
from broker.remoting.server import RemotingServer
from cli.client_commands import client_config, namesrv_option
from client.config import ClientConfig, ConfigError, load_credentials
from client.errors import BrokerUnavailableError
from client.instance import ClientInstance
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_response
from protocol.signature import signature_matches
from tests.acl.helpers import BASE_ACL, PRODUCER, send_fields
from tests.broker.helpers import LOOPBACK, run


def test_credentials_come_from_options_then_environment_then_file(tmp_path: Path) -> None:
    file = tmp_path / "credentials.toml"
    file.write_text('access_key = "from-file-1"\nsecret_key = "file-secret"\n')
    environment = {"RAFTMQ_ACCESS_KEY": "from-env-1", "RAFTMQ_SECRET_KEY": "env-secret"}
    assert load_credentials("from-opt-1", "opt-secret", file, environment) == ("from-opt-1", "opt-secret")
    assert load_credentials(None, None, file, environment) == ("from-env-1", "env-secret")
    assert load_credentials(None, None, file, {}) == ("from-file-1", "file-secret")
    assert load_credentials(None, None, None, {"RAFTMQ_CREDENTIALS_FILE": str(file)}) == ("from-file-1", "file-secret")
    assert load_credentials(None, None, None, {}) is None


@pytest.mark.parametrize(("arguments", "complaint"), [
    (("only-key", None, None, {}), "go together"),
    ((None, None, None, {"RAFTMQ_ACCESS_KEY": "k"}), "RAFTMQ_ACCESS_KEY"),
    ((None, None, "missing.toml", {}), "cannot read"),
])
def test_half_credentials_or_a_missing_file_are_errors(arguments: tuple[object, ...], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        load_credentials(*arguments)  # type: ignore[arg-type]


def test_client_config_validates_credentials_and_tls() -> None:
    with pytest.raises(ConfigError, match="go together"):
        ClientConfig(("h:1",), access_key="k")
    with pytest.raises(ConfigError, match="tls"):
        ClientConfig(("h:1",), tls="yes")  # type: ignore[arg-type]
    assert ClientConfig.from_mapping({"namesrv_addresses": "h:1", "access_key": "a", "secret_key": "b"}).access_key == "a"


@click.command()
@namesrv_option
def show(namesrv: str) -> None:
    config = client_config(namesrv)
    click.echo(json.dumps([config.access_key, config.secret_key, config.tls, config.tls_ca_file]))


def test_cli_options_environment_and_file(tmp_path: Path) -> None:
    runner = CliRunner()
    file = tmp_path / "credentials.toml"
    file.write_text('access_key = "from-file-1"\nsecret_key = "file-secret"\n')
    result = runner.invoke(show, ["--namesrv", "h:1", "--access-key", "opt-key-1", "--secret-key", "opt-secret",
                                  "--tls", "--tls-ca-file", "ca.pem"], env={})
    assert json.loads(result.output) == ["opt-key-1", "opt-secret", True, "ca.pem"], result.output
    result = runner.invoke(show, ["--namesrv", "h:1"], env={"RAFTMQ_ACCESS_KEY": "env-key-1",
                                                            "RAFTMQ_SECRET_KEY": "env-secret"})
    assert json.loads(result.output)[:2] == ["env-key-1", "env-secret"]
    result = runner.invoke(show, ["--namesrv", "h:1", "--credentials-file", str(file)], env={})
    assert json.loads(result.output)[:2] == ["from-file-1", "file-secret"]
    result = runner.invoke(show, ["--namesrv", "h:1", "--access-key", "lonely-key"], env={})
    assert result.exit_code == 2 and "go together" in result.output
    result = runner.invoke(show, ["--namesrv", "h:1"], env={})
    assert json.loads(result.output) == [None, None, False, None]


def test_every_request_of_the_client_is_signed() -> None:
    """ClientInstance.invoke and oneway sign at send time; a broker with ACL verifies them."""
    seen: list[RemotingCommand] = []

    async def processor(context: RequestContext) -> RemotingCommand:
        seen.append(context.request)
        return make_response(context.request, ResponseCode.SUCCESS)

    async def scenario() -> None:
        server = RemotingServer(LOOPBACK, 0, authorizer=Admission(AclAuthorizer(AclRules(
            AclConfig.from_toml(BASE_ACL), lambda: b""))))
        server.register(RequestCode.SEND_MESSAGE, processor)
        await server.start()
        address = f"{LOOPBACK}:{server.port}"
        try:
            signed = ClientInstance(ClientConfig((address,), client_ip=LOOPBACK, access_key=PRODUCER.access_key,
                                                 secret_key=PRODUCER.secret_key))
            unsigned = ClientInstance(ClientConfig((address,), client_ip=LOOPBACK))
            try:
                accepted = await signed.invoke(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"body")
                assert accepted.code == ResponseCode.SUCCESS
                await signed.oneway(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"oneway body")
                refused = await unsigned.invoke(address, RequestCode.SEND_MESSAGE, send_fields("orders"), b"body")
                assert refused.code == ResponseCode.NO_PERMISSION
                denied = await signed.invoke(address, RequestCode.SEND_MESSAGE, send_fields("audit"), b"body")
                assert denied.code == ResponseCode.NO_PERMISSION and "topic:audit" in (denied.remark or "")
                for _ in range(200):
                    if len(seen) == 2:
                        break
                    await signed.invoke(address, 4242)  # a round trip: the oneway request is ahead of it
            finally:
                await signed.close()
                await unsigned.close()
        finally:
            await server.stop(grace_seconds=1.0)

    run(scenario())
    assert len(seen) == 2
    for request in seen:
        assert signature_matches(request.ext_fields, request.body, PRODUCER.secret_key)


def test_tls_client_cannot_talk_to_a_plain_broker() -> None:
    async def scenario() -> None:
        server = RemotingServer(LOOPBACK, 0)
        await server.start()
        address = f"{LOOPBACK}:{server.port}"
        try:
            client = ClientInstance(ClientConfig(("127.0.0.1:1",), client_ip=LOOPBACK, tls=True,
                                                 connect_timeout_seconds=2.0))
            try:
                with pytest.raises(BrokerUnavailableError):
                    await client.invoke(address, RequestCode.GET_BROKER_RUNTIME_INFO)
            finally:
                await client.close()
        finally:
            await server.stop(grace_seconds=1.0)

    run(scenario())
