"""protocol._native.plain_properties: a plain send's stored message is made in C exactly as
SendProcessor.build_message makes it (the cluster added, the text kept as it came), and every send it is not
sure of (a delay level, a delivery time, text that does not write back as it came) is made in Python.

Derandomized, no example database: the same examples on every run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import send
from broker.requests import RequestError, SendHeader
from broker.send import SendProcessor
from commitlog.message import MessageInput
from protocol.properties import PROPERTIES_BYTES_MAX
from tests.broker.test_send_fast_path import FakeBroker, context, processor_for, send_request

try:
    from protocol import _native
except ImportError:  # not built: the tests below say so
    _native = None  # type: ignore[assignment]

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=800,
                         suppress_health_check=[HealthCheck.too_slow])
KEYS = st.sampled_from(["UNIQ_KEY", "TAGS", "KEYS", "CLUSTER", "DELAY", "WAIT", "__STARTDELIVERTIME",
                        "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "é", "", "K\x01", "a"])
VALUES = st.one_of(st.sampled_from(["", "0", "1", "3", "00", "-1", "x", "1700000000000", "v\x01w", "主"]),
                   st.text(max_size=6))
PIECES = st.one_of(st.tuples(KEYS, VALUES).map(lambda pair: f"{pair[0]}\x01{pair[1]}\x02"),
                   st.sampled_from(["\x02", "\x01", "K", "\x01\x02", "x\x01y"]))


def messages(processor: SendProcessor, properties: str, body: bytes = b"body") -> list[MessageInput] | tuple[str, ...]:
    request = send_request("T", body)
    header = SendHeader.parse({**request.ext_fields, "i": properties}, True)
    try:
        return processor._messages(context(request), header, "T", 1, False, 0)
    except RequestError as error:
        return ("refused", str(error.code), error.remark)


def in_python(processor: SendProcessor, properties: str, body: bytes = b"body") -> object:
    saved = send._native_plain_properties
    send._native_plain_properties = None
    try:
        return messages(processor, properties, body)
    finally:
        send._native_plain_properties = saved


@pytest.fixture
def processor() -> Iterator[SendProcessor]:
    assert _native is not None and send._native_plain_properties is not None, "protocol._native was not built"
    yield processor_for(FakeBroker())


@DETERMINISTIC
@given(st.lists(PIECES, max_size=8))
def test_a_send_stores_what_the_python_build_stores(pieces: list[str]) -> None:
    assert send._native_plain_properties is not None, "protocol._native was not built"
    processor = processor_for(FakeBroker())
    text = "".join(pieces)
    assert messages(processor, text) == in_python(processor, text)


@pytest.mark.parametrize(("text", "taken"), [
    ("UNIQ_KEY\x01AC11\x02TAGS\x01t\x02", True),
    ("", True),
    ("UNIQ_KEY\x01A\x02CLUSTER\x01Other\x02", True),
    ("DELAY\x010\x02TAGS\x01t\x02", True),
    ("DELAY\x01\x02", True),
    ("WAIT\x01true\x02主\x01é\x02", True),
    ("DELAY\x013\x02", False),
    ("DELAY\x0100\x02", False),
    ("TIMER_DELAY_SEC\x015\x02", False),
    ("__STARTDELIVERTIME\x011\x02", False),
    ("UNIQ_KEY\x01A\x02UNIQ_KEY\x01B\x02", False),
    ("UNIQ_KEY\x01A", False),
    ("UNIQ_KEY\x01A\x02\x02", False),
    ("\x01A\x02", False),
    ("K\x02", False),
    ("K\x01v\x01w\x02", False),
    ("".join(f"K{index}\x01v\x02" for index in range(65)), False),
], ids=["typical", "empty", "cluster-given", "delay-zero", "delay-empty", "unicode", "delay-level", "delay-00",
        "timer-delay", "start-deliver-time", "key-twice", "no-last-separator", "empty-pair", "no-key",
        "no-separator", "separator-in-value", "many-pairs"])
def test_the_c_build_takes_plain_sends_only(processor: SendProcessor, text: str, taken: bool) -> None:
    assert _native is not None
    encoded = _native.plain_properties(text, "CLUSTER", "DefaultCluster", "DELAY", send._TIMER_KEYS,
                                       PROPERTIES_BYTES_MAX)
    assert (encoded is not None) is taken
    assert messages(processor, text) == in_python(processor, text)
    if taken:
        stored = messages(processor, text)
        assert isinstance(stored, list) and stored[0].properties == encoded


def test_properties_at_and_past_their_limit(processor: SendProcessor) -> None:
    assert _native is not None
    cluster = "CLUSTER\x01DefaultCluster\x02"
    for size in (PROPERTIES_BYTES_MAX - len(cluster), PROPERTIES_BYTES_MAX - len(cluster) + 1):
        text = "K\x01" + "v" * (size - 3) + "\x02"
        encoded = _native.plain_properties(text, "CLUSTER", "DefaultCluster", "DELAY", send._TIMER_KEYS,
                                           PROPERTIES_BYTES_MAX)
        assert (encoded is not None) is (size + len(cluster) <= PROPERTIES_BYTES_MAX)
        assert messages(processor, text) == in_python(processor, text)


def test_a_body_over_the_limit_is_refused_as_before(processor: SendProcessor) -> None:
    body = b"b" * (processor.broker.store.config.body_size_max_bytes + 1)
    outcome = messages(processor, "UNIQ_KEY\x01A\x02", body)
    assert outcome == in_python(processor, "UNIQ_KEY\x01A\x02", body) and outcome[0] == "refused"


def test_a_cluster_name_with_a_separator_is_left_to_python() -> None:
    assert _native is not None
    assert _native.plain_properties("K\x01v\x02", "CLUSTER", "a\x01b", "DELAY", (), 100) is None
    assert _native.plain_properties("K\x01\ud800\x02", "CLUSTER", "C", "DELAY", (), 100) is None
    with pytest.raises(TypeError):
        _native.plain_properties(b"K", "CLUSTER", "C", "DELAY", (), 100)  # type: ignore[arg-type]
