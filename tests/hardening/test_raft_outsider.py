"""Outsiders on the Raft and catch-up ports of real broker members: they cannot join, vote, inject
entries or read data, and the group does not notice them.

- Real pysyncobj nodes that believe they belong to the group campaign over and over (terms far above the
  group's): one with pysyncobj's stock transport, one with ours and a wrong secret. Had any of their
  RequestVote or AppendEntries messages been read, the members would have adopted the higher term.
- Stock-framed pickles sent by hand: a membership change (``['add', ...]``), a RequestVote and an
  AppendEntries with an enormous term, and a pickle that creates a file when unpickled.
- The catch-up port: a wrong proof gets nothing after the server's nonce; the right one (the group's
  secret, as a positive control) gets the server's proof and an answer.

tests/dledger/test_transport.py covers the transport's protocol and the same raw injections against
bare Raft members; these tests add real broker processes (their full wiring) and real pysyncobj outsiders.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from pysyncobj import SyncObj, SyncObjConf

from cli.cluster import LocalCluster, free_ports, route_master
from dledger.catchup import MAC_BYTES, NONCE_BYTES, REQUEST, RESPONSE, STATUS_OK
from dledger.transport import transport_class
from protocol.codes import ResponseCode
from tests.acl.helpers import runtime_info
from tests.broker import wire
from tests.dledger.test_transport import malicious_pickle, read_until_closed
from tests.support.stores import small_store
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

#: terms the outsiders reach by campaigning: far above anything the group reaches by itself in a test
OUTSIDER_TERM_MIN: Final = 40
HUGE_TERM: Final = 10**6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("outsider-group")
    with LocalCluster.start(directory, nodes=3, overrides=small_store()) as started:
        yield started


def terms(cluster: LocalCluster) -> dict[str, int]:
    """Each member's Raft term (all must answer)."""
    found = {}
    for node in cluster.info.nodes:
        info = wait_for(lambda node=node: runtime_info(node.broker_address),  # type: ignore[misc]
                        f"{node.id} to answer", timeout_seconds=10)
        found[node.id] = int(info["raftTerm"])
    return found


def stock_frame(message: object) -> bytes:
    """What pysyncobj's stock TCP transport writes: native int length, zlib level 3, pickle protocol 2."""
    import pickle

    data = zlib.compress(pickle.dumps(message, protocol=2), 3)
    return struct.pack("i", len(data)) + data


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def send_and_read(address: str, data: bytes) -> bytes:
    with socket.create_connection(split(address), timeout=5) as connection:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            connection.sendall(data)
        return read_until_closed(connection, 15)


def test_outsiders_cannot_join_vote_or_inject(cluster: LocalCluster, tmp_path: Path) -> None:
    leader = wait_for(lambda: route_master(cluster.namesrv), "a leader", timeout_seconds=30)
    group_terms = terms(cluster)
    raft_addresses = [node.raft_address for node in cluster.info.nodes]
    conf = SyncObjConf(autoTick=True, dynamicMembershipChange=True, raftMinTimeout=0.05, raftMaxTimeout=0.1,
                       appendEntriesPeriod=0.01,
                       connectionRetryTime=0.2, appendEntriesUseBatch=False)
    # Two pairs of outsiders, each pair naming the members and each other: a pair can talk to itself (so
    # pysyncobj lets it campaign) but never reaches a majority of five without a member's vote.
    ports = free_ports(4)
    wrong_secret = transport_class(b"not the group's secret, but long enough")
    outsiders = []
    for first, second, transport in ((0, 1, None), (2, 3, wrong_secret)):
        for own, other in ((first, second), (second, first)):
            options = {} if transport is None else {"transportClass": transport}
            outsiders.append(SyncObj(f"127.0.0.1:{ports[own]}", [*raft_addresses, f"127.0.0.1:{ports[other]}"],
                                     conf=conf, **options))
    marker = tmp_path / "created-by-a-pickle"
    try:
        for outsider in outsiders:
            wait_for(lambda outsider=outsider: outsider.getStatus()["raft_term"] >= OUTSIDER_TERM_MIN,  # type: ignore[misc]
                     "an outsider to campaign many times", timeout_seconds=60)
        outsider_address = f"127.0.0.1:{ports[0]}"
        for address in raft_addresses:
            for message in (
                ["add", outsider_address],
                outsider_address,  # the stock transport's "this is who I am" first message
                {"type": "request_vote", "term": HUGE_TERM, "last_log_index": HUGE_TERM, "last_log_term": HUGE_TERM},
                {"type": "append_entries", "term": HUGE_TERM, "commit_index": HUGE_TERM, "prevLogIdx": 0,
                 "prevLogTerm": 0, "entries": [(b"injected", 1, HUGE_TERM)]},
            ):
                received = send_and_read(address, stock_frame(message))
                assert len(received) <= 64, f"{address} answered a stranger with {len(received)} bytes"
            send_and_read(address, stock_frame(malicious_pickle(marker)))
        for outsider in outsiders:
            status = outsider.getStatus()
            # (pysyncobj's has_quorum counts TCP connections, which the members do accept before the
            # handshake fails, so it says nothing here; no leader and nothing committed do)
            assert status["leader"] is None and status["commit_idx"] <= 1, status
    finally:
        for outsider in outsiders:
            outsider.destroy()
    after = terms(cluster)
    top_outsider = OUTSIDER_TERM_MIN
    assert max(after.values()) < top_outsider, (group_terms, after)
    assert not marker.exists()
    # the group goes on as before: same terms unless it held an election of its own, and it serves
    if after == group_terms:
        assert route_master(cluster.namesrv) == leader
    code, _, remark = wire.send(wait_for(lambda: route_master(cluster.namesrv), "a leader",
                                         timeout_seconds=30), "AfterOutsiders",
                                b"still here")
    assert code == ResponseCode.SUCCESS, remark


def catchup_handshake(address: str, secret: bytes) -> tuple[bytes, bytes]:
    """Our side of the catch-up handshake; returns the server's nonce and everything it sent after it."""
    with socket.create_connection(split(address), timeout=5) as connection:
        server_nonce = b""
        while len(server_nonce) < NONCE_BYTES:
            chunk = connection.recv(NONCE_BYTES - len(server_nonce))
            assert chunk, "closed before its nonce"
            server_nonce += chunk
        client_nonce = os.urandom(NONCE_BYTES)
        proof = hmac.new(secret, b"catchup-client" + server_nonce + client_nonce, hashlib.sha256).digest()
        connection.sendall(client_nonce + proof)
        received = b""
        connection.settimeout(5)
        while len(received) < MAC_BYTES:
            chunk = connection.recv(MAC_BYTES - len(received))
            if not chunk:
                return server_nonce, received
            received += chunk
        expected = hmac.new(secret, b"catchup-server" + client_nonce + server_nonce, hashlib.sha256).digest()
        assert received == expected, "the member's proof is wrong"
        connection.sendall(REQUEST.pack(0, 0))
        while len(received) < MAC_BYTES + RESPONSE.size:
            chunk = connection.recv(64)
            if not chunk:
                break
            received += chunk
        return server_nonce, received


def test_the_catchup_port_serves_nothing_without_the_secret(cluster: LocalCluster) -> None:
    secret = (Path(cluster.info.data_dir) / "group.secret").read_bytes().strip()
    for node in cluster.info.nodes:
        # positive control: with the group's secret the member proves itself and answers the request
        _, answer = catchup_handshake(node.catchup_address, secret)
        assert len(answer) >= MAC_BYTES + RESPONSE.size, answer
        status, _, _ = RESPONSE.unpack_from(answer, MAC_BYTES)
        assert status == STATUS_OK, answer
        # a wrong secret gets nothing past the nonce
        _, answer = catchup_handshake(node.catchup_address, b"a wrong secret of the right length!")
        assert answer == b""
        # raw requests without any handshake: the nonce, then the connection closes
        with socket.create_connection(split(node.catchup_address), timeout=5) as connection:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                connection.sendall(REQUEST.pack(0, 1 << 40) + os.urandom(64))
            assert len(read_until_closed(connection, 15)) == NONCE_BYTES
