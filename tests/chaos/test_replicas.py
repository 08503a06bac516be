"""The quick replica comparison and the proxied cluster's address layout: pure file and address logic."""

from __future__ import annotations

from pathlib import Path

from chaos.cluster import RaftLink, assign_ports, member_views
from chaos.faults import wipe_directory
from chaos.replicas import compare_replicas, first_difference
from cli.cluster import NodeInfo


def make_replica(root: Path, name: str, commit_log: bytes, queue: bytes = b"q" * 20) -> None:
    store = root / name / "store"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / "00000000000000000000").write_bytes(commit_log)
    (store / "consumequeue" / "T" / "0").mkdir(parents=True)
    (store / "consumequeue" / "T" / "0" / "00000000000000000000").write_bytes(queue)
    (store / "checkpoint").write_bytes(name.encode())  # not compared: it differs legitimately


def test_identical_replicas_have_no_difference(tmp_path: Path) -> None:
    for name in ("n0", "n1", "n2"):
        make_replica(tmp_path, name, b"abc" * 1000)
    (tmp_path / "n0" / "broker.log").write_text("not a store")
    assert compare_replicas(tmp_path) == []


def test_the_odd_replica_and_first_differing_byte_are_named(tmp_path: Path) -> None:
    make_replica(tmp_path, "n0", b"x" * 5000 + b"DIVERGED")
    make_replica(tmp_path, "n1", b"x" * 5000 + b"majority")
    make_replica(tmp_path, "n2", b"x" * 5000 + b"majority")
    [difference] = compare_replicas(tmp_path)
    assert difference.replicas == ("n0",) and difference.offset == 5000
    assert difference.describe() == "commitlog/00000000000000000000: differs from byte 5000 on n0"


def test_a_missing_queue_file_is_a_difference(tmp_path: Path) -> None:
    for name in ("n0", "n1"):
        make_replica(tmp_path, name, b"same")
    (tmp_path / "n1" / "store" / "consumequeue" / "T" / "0" / "00000000000000000000").unlink()
    [difference] = compare_replicas(tmp_path)
    assert difference.offset is None and difference.replicas == ("n1",)


def test_first_difference_of_a_prefix_is_its_length(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"12345")
    (tmp_path / "b").write_bytes(b"1234567")
    assert first_difference(tmp_path / "a", tmp_path / "b") == 5
    assert first_difference(tmp_path / "a", tmp_path / "a") == 5


def test_wipe_keeps_only_the_named_files(tmp_path: Path) -> None:
    (tmp_path / "node.toml").write_text("[node]")
    (tmp_path / "broker.log").write_text("log")
    (tmp_path / "store" / "commitlog").mkdir(parents=True)
    (tmp_path / "store" / "commitlog" / "0").write_bytes(b"data")
    (tmp_path / "raft").mkdir()
    wipe_directory(tmp_path, frozenset({"node.toml", "broker.log"}))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["broker.log", "node.toml"]


def test_proxy_ports_sort_below_member_ports() -> None:
    # pysyncobj's dialer is the member whose address string is greater: "127.0.0.1:9" > "127.0.0.1:10000"
    ports = [9000, 10000, 65000, 2000, 30000, 41000, 5000, 7000, 8000, 12000, 13000, 60000, 1500]
    proxies, others, raft = assign_ports(ports, 3)
    assert len(proxies) == 3 and len(raft) == 3 and len(others) == len(ports) - 6
    assert max(f"127.0.0.1:{port}" for port in proxies) < min(f"127.0.0.1:{port}" for port in raft)
    assert raft == sorted(raft, key=lambda port: f"127.0.0.1:{port}")


def test_each_member_dials_its_lower_peers_through_their_pair_proxy() -> None:
    infos = [NodeInfo(f"n{i}", f"127.0.0.1:{100 + i}", f"127.0.0.1:{500 + i}", f"127.0.0.1:{200 + i}", "", "")
             for i in range(3)]
    links = [RaftLink(f"l{dialer}{acceptor}", f"n{dialer}", f"n{acceptor}", f"127.0.0.1:{300 + 10 * dialer + acceptor}",
                      f"127.0.0.1:{500 + acceptor}")
             for acceptor, dialer in ((0, 1), (0, 2), (1, 2))]
    views = member_views(infos, links)
    as_seen = {node: {peer.id: peer.raft_address for peer in peers} for node, peers in views.items()}
    assert as_seen["n2"] == {"n0": "127.0.0.1:320", "n1": "127.0.0.1:321"}  # dials both, via proxies
    assert as_seen["n1"] == {"n0": "127.0.0.1:310", "n2": "127.0.0.1:502"}  # n2 announces its own address
    assert as_seen["n0"] == {"n1": "127.0.0.1:501", "n2": "127.0.0.1:502"}
    for node in infos:
        for peer_id, address in as_seen[node.id].items():
            dials = node.raft_address > address
            assert dials == (node.id > peer_id), "the greater member must be the one that dials"
