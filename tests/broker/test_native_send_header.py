"""protocol._native.read_send_header: SendHeader.parse's common case in C gives the header the Python parse
gives, field for field, and leaves everything else (a missing field, an integer written another way or out
of range, another batch word) to the Python parse, which reads it or names the field in its error.

Derandomized, no example database: the same examples on every run."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import requests
from broker.requests import RequestError, SendHeader
from protocol.codes import RequestCode
from protocol.command import make_request

try:
    from protocol import _native
except ImportError:  # not built: the tests below say so
    _native = None  # type: ignore[assignment]

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=600,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
LETTERS = "abcdefghijlm"  # the one-letter names SendHeader.parse reads, in its order ("k", unitMode, it does not)
NUMBERS = ["", "0", "-0", "7", "-1", "1", "4", "1024", "1025", "16", "2147483647", "2147483648", "-2147483648",
           "-2147483649", " 5", "5 ", "+5", "5_0", "\u0665", "007", "9" * 18, "-" + "9" * 18, "9" * 19, "1.5", "abc",
           "-", "--1", "1700000000123"]
WORDS = ["", "true", "false", "1", "0", "TRUE", " true", "yes", "2"]
VALUE = st.one_of(st.none(), st.sampled_from(NUMBERS), st.sampled_from(WORDS), st.text(max_size=8))
TYPICAL = {"a": "group", "b": "Topic", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000123", "h": "0",
           "i": "UNIQ_KEY\x01K\x02", "j": "0", "l": "", "m": "false"}


def parse(fields: dict[str, str]) -> object:
    try:
        header = SendHeader.parse(fields, True)
    except RequestError as error:
        return ("refused", error.code, error.remark)
    return header, [type(getattr(header, name)) for name in header.__slots__]


def python_parse(fields: dict[str, str]) -> object:
    saved = requests._native_send_header
    requests._native_send_header = None
    try:
        return parse(fields)
    finally:
        requests._native_send_header = saved


def native() -> object:
    assert _native is not None and requests._native_send_header is not None, "protocol._native was not built"
    return _native


@DETERMINISTIC
@given(st.lists(VALUE, min_size=len(LETTERS), max_size=len(LETTERS)), st.sets(st.sampled_from(LETTERS)))
def test_the_c_parse_gives_what_the_python_parse_gives(values: list[str | None], replaced: set[str]) -> None:
    """Each field either typical or drawn (absent, a number written any way, a word, any text)."""
    native()
    fields = dict(TYPICAL)
    for letter, value in zip(LETTERS, values, strict=True):
        if letter in replaced:
            if value is None:
                fields.pop(letter, None)
            else:
                fields[letter] = value
    assert parse(fields) == python_parse(fields)


@pytest.mark.parametrize("fields", [
    TYPICAL,
    {**TYPICAL, "l": "16", "m": "true", "e": "-1", "f": "-2147483648", "g": "-" + "9" * 18},
    {key: value for key, value in TYPICAL.items() if key in "abg"},  # only what is required
    {**TYPICAL, "i": "", "j": "2147483647", "d": "1024", "l": "-1"},
], ids=["typical", "ends-of-ranges", "required-only", "more-ends"])
def test_the_c_parse_takes_the_headers_clients_send(fields: dict[str, str]) -> None:
    module = native()
    values = tuple(map(fields.get, requests._SEND_NAMES_V2))
    header = module.read_send_header(SendHeader, values)  # type: ignore[attr-defined]
    assert isinstance(header, SendHeader)
    assert parse(fields) == python_parse(fields)
    assert header == python_parse(fields)[0]  # type: ignore[index]


@pytest.mark.parametrize(("letter", "value"), [
    ("a", None), ("b", None), ("g", None), ("g", ""), ("d", "0"), ("d", "1025"), ("e", "2147483648"), ("g", "9" * 19),
    ("j", "-1"), ("l", "-2"), ("m", "TRUE"), ("e", " 1"), ("e", "+1"), ("e", "1_0"), ("h", "\u0665"),
])
def test_the_c_parse_leaves_the_rest_to_python(letter: str, value: str | None) -> None:
    module = native()
    fields = {key: item for key, item in TYPICAL.items() if key != letter}
    if value is not None:
        fields[letter] = value
    values = tuple(map(fields.get, requests._SEND_NAMES_V2))
    assert module.read_send_header(SendHeader, values) is None  # type: ignore[attr-defined]
    assert parse(fields) == python_parse(fields)


def test_a_header_from_the_wire_is_read_in_c_and_is_a_whole_send_header() -> None:
    module = native()
    request = make_request(RequestCode.SEND_MESSAGE_V2, 1, TYPICAL)
    values = tuple(map(request.ext_fields.get, requests._SEND_NAMES_V2))
    header = module.read_send_header(SendHeader, values)  # type: ignore[attr-defined]
    assert header == SendHeader.parse(request.ext_fields, True)
    assert repr(header) == repr(python_parse(dict(TYPICAL))[0])  # type: ignore[index]
    assert hash(header) == hash(python_parse(dict(TYPICAL))[0])  # type: ignore[index]
    with pytest.raises(AttributeError):
        header.topic = "other"  # frozen, as the Python-built one


def test_the_c_parse_refuses_what_is_not_a_send_header_type() -> None:
    module = native()

    class Plain:
        pass

    with pytest.raises(AttributeError):
        module.read_send_header(Plain, (None,) * 12)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        module.read_send_header(SendHeader, (None,) * 11)  # type: ignore[attr-defined]
