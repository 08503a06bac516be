"""The pure parts of the Toxiproxy-compatible server, without a network: the HTTP/1.1 parser, toxic
validation, slicing, and the stages on a fake clock (virtual time, so exact and instant)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.toxics import (
    InvalidToxic,
    Piece,
    Stream,
    ToxicSpec,
    make_stage,
    parse_toxic,
    slice_bounds,
    update_toxic,
)
from chaos.toxiproxy_http import HttpError, HttpLimits, RequestParser, encode_response

# -- HTTP ------------------------------------------------------------------------------------------

POST = b'POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{"name": "a"}'


def test_a_request_fed_byte_by_byte() -> None:
    parser = RequestParser()
    for index in range(len(POST) - 1):
        parser.feed(POST[index : index + 1])
        assert parser.next_request() is None
    parser.feed(POST[-1:])
    request = parser.next_request()
    assert request is not None
    assert (request.method, request.path, request.body, request.keep_alive) == (
        "POST",
        "/proxies",
        b'{"name": "a"}',
        True,
    )
    assert request.headers["host"] == "x"
    assert parser.next_request() is None


def test_pipelined_requests_and_connection_close() -> None:
    parser = RequestParser()
    parser.feed(b"GET /version?x=1 HTTP/1.1\r\n\r\n" + POST + b"GET / HTTP/1.0\r\n\r\n")
    first, second, third = parser.next_request(), parser.next_request(), parser.next_request()
    assert first is not None and (first.path, first.query, first.body) == ("/version", "x=1", b"")
    assert second is not None and second.body == b'{"name": "a"}'
    assert third is not None and third.keep_alive is False  # HTTP/1.0 closes by default
    parser.feed(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    closing = parser.next_request()
    assert closing is not None and closing.keep_alive is False


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"GET relative HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 2000\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 9 + b"\r\n", 431),
        (b"GET /" + b"a" * 300, 431),
    ],
)
def test_refused_requests(raw: bytes, status: int) -> None:
    parser = RequestParser(HttpLimits(head_size_max_bytes=256, header_count_max=8, body_size_max_bytes=1000))
    parser.feed(raw)
    with pytest.raises(HttpError) as raised:
        parser.next_request()
    assert raised.value.status == status


def test_encode_response() -> None:
    assert encode_response(204) == b"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\n\r\n"
    assert encode_response(404, b"{}", "application/json", keep_alive=False) == (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\n{}"
    )


# -- toxic validation ---------------------------------------------------------------------------------


def test_toxic_defaults_and_update() -> None:
    spec = parse_toxic({"type": "latency", "attributes": {"latency": 100}})
    assert spec.to_json() == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 100, "jitter": 0},
    }
    updated = update_toxic(spec, {"toxicity": 0.5, "attributes": {"jitter": 10}, "name": spec.name})
    assert updated.toxicity == 0.5 and dict(updated.attributes) == {"latency": 100, "jitter": 10}
    with pytest.raises(InvalidToxic):
        update_toxic(spec, {"stream": "upstream"})


@pytest.mark.parametrize(
    "body",
    [
        {"type": "flood"},
        {"type": "latency", "stream": "both"},
        {"type": "latency", "toxicity": -0.1},
        {"type": "latency", "toxicity": True},
        {"type": "latency", "attributes": {"latency": -1}},
        {"type": "latency", "attributes": {"latency": 1.5}},
        {"type": "latency", "attributes": {"delay": 1}},
        {"type": "latency", "attributes": []},
        {"type": "latency", "color": "red"},
        {"type": "slicer", "attributes": {"average_size": 0}},
        {"type": "slicer", "attributes": {"average_size": 8, "size_variation": 8}},
        {"type": "latency", "name": "a/b"},
    ],
)
def test_invalid_toxics(body: dict[str, object]) -> None:
    with pytest.raises(InvalidToxic):
        parse_toxic(body)


@settings(derandomize=True, max_examples=300)
@given(
    size=st.integers(0, 5000),
    average_size=st.integers(1, 300),
    variation_fraction=st.floats(0, 0.99),
    seed=st.integers(0, 2**32),
)
def test_slices_cover_the_data_in_order(
    size: int, average_size: int, variation_fraction: float, seed: int
) -> None:
    size_variation = int(average_size * variation_fraction)
    bounds = slice_bounds(size, average_size, size_variation, random.Random(seed))
    assert bounds[0] == 0 and bounds[-1] == size
    pieces = [end - start for start, end in itertools.pairwise(bounds)]
    if size:
        assert all(0 < piece <= average_size + size_variation for piece in pieces)


# -- stages on a fake clock ------------------------------------------------------------------------------


class FakeClock:
    """Virtual time: a sleep moves the clock to its deadline at once."""

    def __init__(self) -> None:
        self.now = 100.0

    def now_s(self) -> float:
        return self.now

    async def sleep_until(self, deadline_s: float, interrupt: asyncio.Event | None = None) -> bool:
        if interrupt is not None and interrupt.is_set():
            return True
        self.now = max(self.now, deadline_s)
        await asyncio.sleep(0)
        return False


class FakeLink:
    def __init__(self) -> None:
        self.closed: list[bool] = []
        self.tasks: list[asyncio.Task[None]] = []

    def close_link(self, reset: bool) -> None:
        self.closed.append(reset)

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self.tasks.append(task)
        return task


def run_stage(spec: ToxicSpec, chunks: list[bytes], seed: int = 1) -> tuple[list[Piece], FakeClock, FakeLink]:
    """Every chunk, read at the fake clock's start, through one stage; what it emitted, when."""

    async def go() -> tuple[list[Piece], FakeClock, FakeLink]:
        clock, link = FakeClock(), FakeLink()
        stage = make_stage(spec, random.Random(seed), clock, link)
        stage.start()
        emitted: list[Piece] = []

        async def emit(piece: Piece) -> None:
            emitted.append(Piece(piece.data, clock.now))  # stamped with when it left

        arrival_s = clock.now
        for chunk in chunks:
            await stage.process(Piece(chunk, arrival_s), emit)
        stage.detach()
        for task in link.tasks:
            task.cancel()
        await asyncio.gather(*link.tasks, return_exceptions=True)
        return emitted, clock, link

    return asyncio.run(go())


def spec_of(toxic_type: str, toxicity: float = 1.0, **attributes: int) -> ToxicSpec:
    return parse_toxic({"type": toxic_type, "toxicity": toxicity, "attributes": attributes})


def test_latency_counts_from_arrival_with_seeded_jitter() -> None:
    emitted, _, _ = run_stage(spec_of("latency", latency=100), [b"a", b"b"])
    assert [piece.timestamp_s for piece in emitted] == [100.1, 100.1]  # pipelined, not 100 ms each
    jittered, _, _ = run_stage(spec_of("latency", latency=100, jitter=50), [b"x"] * 20, seed=3)
    again, _, _ = run_stage(spec_of("latency", latency=100, jitter=50), [b"x"] * 20, seed=3)
    assert jittered == again  # same seed, same delays
    assert all(100.05 - 1e-9 <= piece.timestamp_s < 100.15 for piece in jittered)


def test_bandwidth_spends_size_over_rate() -> None:
    emitted, clock, _ = run_stage(spec_of("bandwidth", rate=10), [bytes(2500), bytes(500)])
    assert b"".join(piece.data for piece in emitted) == bytes(3000)
    assert max(len(piece.data) for piece in emitted) <= 1000  # 100 ms slices at 10 KB/s
    assert clock.now - 100.0 >= 3000 / 10_000 - 1e-9


def test_limit_data_truncates_then_closes() -> None:
    emitted, _, link = run_stage(spec_of("limit_data", bytes=5), [b"abc", b"defg", b"hij"])
    assert b"".join(piece.data for piece in emitted) == b"abcde"
    assert link.closed and link.closed[0] is False


def test_reset_peer_drops_and_resets_after_its_timeout() -> None:
    emitted, clock, link = run_stage(spec_of("reset_peer", timeout=250), [b"hello"])
    assert emitted == [] and link.closed == [True] and clock.now >= 100.25


def test_toxicity_zero_passes_everything() -> None:
    emitted, _, link = run_stage(spec_of("timeout", toxicity=0.0), [b"a", b"b"])
    assert [piece.data for piece in emitted] == [b"a", b"b"] and link.closed == []


def test_removing_an_applied_timeout_closes_the_connection() -> None:
    emitted, _, link = run_stage(spec_of("timeout"), [b"a"])
    assert emitted == [] and link.closed == [False]  # closed by detach (Toxiproxy's cleanup)


def test_stream_names() -> None:
    assert [str(stream) for stream in Stream] == ["upstream", "downstream"]
