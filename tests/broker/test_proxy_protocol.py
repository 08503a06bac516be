"""The PROXY protocol v2 header a front writes first (broker.remoting.proxy_protocol), and the server taking the
client's address from it on connections from a front's hosts only."""

from __future__ import annotations

import struct

import pytest

from broker.remoting import RemotingServer, RequestContext
from broker.remoting.proxy_protocol import (
    BODY_MAX_BYTES,
    SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    encode_header,
    parse_header,
)
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_response
from tests.broker.helpers import LOOPBACK, RawConnection, run


@pytest.mark.parametrize("client", [("203.0.113.7", 4242), ("2001:db8::1", 65535), ("10.0.0.1", 0)])
def test_a_header_names_the_client_whatever_its_family(client: tuple[str, int]) -> None:
    header = encode_header(client, ("192.0.2.1", 10911))
    assert parse_header(header + b"frame bytes") == ProxyHeader(client, len(header))
    for cut in range(len(header)):  # incomplete: wait for more
        assert parse_header(header[:cut]) is None


def test_local_headers_and_unknown_families_name_no_client_and_tlvs_are_skipped() -> None:
    local = encode_header(None)
    assert parse_header(local) == ProxyHeader(None, 16)
    unix = SIGNATURE + bytes((0x21, 0x31)) + struct.pack(">H", 216) + bytes(216)
    assert parse_header(unix) == ProxyHeader(None, 232)
    with_tlv = encode_header(("198.51.100.2", 80))
    body_length = struct.unpack_from(">H", with_tlv, 14)[0] + 7
    with_tlv = with_tlv[:14] + struct.pack(">H", body_length) + with_tlv[16:] + b"\x04\x00\x04abcd"
    assert parse_header(with_tlv) == ProxyHeader(("198.51.100.2", 80), 16 + body_length)


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x00\x00\x00\x10", "signature"),  # a RocketMQ frame, not a header
    (b"PROXY TCP4 1.2.3.4", "signature"),  # version 1 is not spoken
    (SIGNATURE + bytes((0x13, 0x11)) + struct.pack(">H", 12), "version/command"),
    (SIGNATURE + bytes((0x21, 0x11)) + struct.pack(">H", BODY_MAX_BYTES + 1), "longer than"),
    (SIGNATURE + bytes((0x21, 0x11)) + struct.pack(">H", 4) + bytes(4), "cannot hold"),
])
def test_what_cannot_start_a_header_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError, match=reason):
        parse_header(data)


async def _seen(context: RequestContext) -> RemotingCommand:
    return make_response(context.request, ResponseCode.SUCCESS, context.remote_address)


def test_the_server_takes_the_clients_address_from_a_fronts_header_only() -> None:
    async def scenario() -> None:
        fronted = RemotingServer(LOOPBACK, 0, proxy_protocol_hosts=frozenset({LOOPBACK}))
        plain = RemotingServer(LOOPBACK, 0)
        for server in (fronted, plain):
            server.register(10, _seen)
            await server.start()
        try:
            # from a front's host: the header's client is the connection's address, and it came through the front
            connection = await RawConnection.open(fronted.port)
            header = encode_header(("203.0.113.7", 4242))
            await connection.send(header[:5])  # in pieces, as a stream may deliver it
            await connection.send(header[5:])
            await connection.send_request(10, 1)
            assert (await connection.read_frame()).command.remark == "203.0.113.7:4242"
            assert [each.through_front for each in fronted.connections] == [True]
            await connection.close()
            # a LOCAL header (a health check): the connection's own address
            connection = await RawConnection.open(fronted.port)
            await connection.send(encode_header(None))
            await connection.send_request(10, 2)
            assert str((await connection.read_frame()).command.remark).startswith(f"{LOOPBACK}:")
            await connection.close()
            # no header where one is due: closed before any request is served
            connection = await RawConnection.open(fronted.port)
            await connection.send_request(10, 3)
            assert await connection.closed_by_peer()
            # elsewhere a header is not believed: it is no frame either, and the connection is closed
            connection = await RawConnection.open(plain.port)
            await connection.send(header)
            await connection.send_request(10, 4)
            assert await connection.closed_by_peer()
            assert [each.through_front for each in plain.connections] == []
        finally:
            await fronted.stop(grace_seconds=1.0)
            await plain.stop(grace_seconds=1.0)

    run(scenario())
