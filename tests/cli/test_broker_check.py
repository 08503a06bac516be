"""`raftmq broker --config node.toml --check`, and the three-host example files it is meant for."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.check import check_node_file
from cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SECRET = "0123456789abcdef0123456789abcdef\n"

LOCAL_NODE = """
[node]
id = "n0"
raft_address = "localhost:{raft}"
catchup_address = "[::1]:{catchup}"
data_dir = "."
secret_file = "group.secret"

[[peers]]
id = "n1"
raft_address = "127.0.0.1:{peer_raft}"
catchup_address = "localhost:{peer_catchup}"

[broker]
listen_address = "127.0.0.1:{broker}"
namesrv = ["localhost:9876", "[::1]:9877"]
peer_addresses = {{ n1 = "localhost:10921" }}
"""


def examples_in(directory: Path) -> list[Path]:
    for path in EXAMPLES.glob("raftmq-*.toml"):
        shutil.copy(path, directory / path.name)
    (directory / "group.secret").write_text(SECRET)
    return sorted(directory.glob("raftmq-*.toml"))


def local_node(directory: Path, **changes: str) -> Path:
    (directory / "group.secret").write_text(SECRET)
    text = LOCAL_NODE.format(raft=21010, catchup=21011, peer_raft=21020, peer_catchup=21021, broker=21911)
    for old, new in changes.items():
        text = text.replace(old, new)
    path = directory / "node.toml"
    path.write_text(text)
    return path


def test_the_example_files_are_valid_for_three_hosts_by_name(tmp_path: Path) -> None:
    hosts = {"raftmq-0": "10.0.0.10", "raftmq-1": "10.0.0.11", "raftmq-2": "10.0.0.12", "namesrv": "10.0.0.2"}

    def resolve(host: str) -> list[tuple[socket.AddressFamily, str]]:
        return [(socket.AF_INET, hosts[host])]

    files = examples_in(tmp_path)
    assert [path.name for path in files] == ["raftmq-0.toml", "raftmq-1.toml", "raftmq-2.toml"]
    for index, path in enumerate(files):
        own_ip = f"10.0.0.1{index}"

        def on_its_host(family: socket.AddressFamily, ip: str, own_ip: str = own_ip) -> bool:
            return ip == own_ip

        report = check_node_file(path, resolve=resolve, is_local=on_its_host)
        assert report.ok, report.problems
        assert f"node raftmq-{index} of group broker-a" in report.notes[0]
        assert not any("warning" in note for note in report.notes)
        assert f"node.raft_address raftmq-{index}:20010 -> 10.0.0.1{index}" in report.notes
    # checked elsewhere than on its host: usable, with a warning for each address it would listen on
    report = check_node_file(files[0], resolve=resolve, is_local=lambda family, ip: False)
    assert report.ok and sum("is not an address of this host" in note for note in report.notes) == 3
    unit = (EXAMPLES / "raftmq-broker.service").read_text()
    assert "--check" in unit and "RestartPreventExitStatus=2" in unit
    compose = (EXAMPLES / "compose.yaml").read_text()
    assert all(f"./raftmq-{index}.toml:/etc/raftmq/node.toml:ro" in compose for index in range(3))


def test_a_name_that_does_not_resolve_exits_2_naming_it(tmp_path: Path) -> None:
    path = local_node(tmp_path, **{'"localhost:10921"': '"no-such-host.invalid:10921"'})
    result = CliRunner().invoke(main, ["broker", "--config", str(path), "--check"])
    assert result.exit_code == 2, result.output
    assert "broker.peer_addresses.n1 no-such-host.invalid:10921: cannot resolve 'no-such-host.invalid'" in result.output
    assert "not usable (1 problem(s))" in result.output and "Traceback" not in result.output


def test_a_usable_local_file_exits_0(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["broker", "--config", str(local_node(tmp_path)), "--check"])
    assert result.exit_code == 0, result.output
    assert "node.catchup_address [::1]:21011" in result.output and result.output.rstrip().endswith(": ok")
    assert "broker.namesrv[1] [::1]:9877" in result.output


@pytest.mark.parametrize(("old", "new", "message"), [
    ('raft_address = "localhost:21010"', 'raft_address = "::1:21010"', "n0.raft_address an IPv6 host goes between"),
    ('listen_address = "127.0.0.1:21911"', 'listen_address = "127.0.0.1"', "broker.listen_address must be"),
    ('secret_file = "group.secret"', 'secret_file = "missing.secret"', "cannot read node.secret_file"),
    ("[broker]", "[brokers]", "a [broker] table is required"),
])
def test_a_bad_file_exits_2_saying_what_is_wrong(tmp_path: Path, old: str, new: str, message: str) -> None:
    result = CliRunner().invoke(main, ["broker", "--config", str(local_node(tmp_path, **{old: new})), "--check"])
    assert result.exit_code == 2, result.output
    assert "invalid configuration" in result.output and message in result.output
    assert "Traceback" not in result.output
