"""The stored properties of a send (broker/send.py): encoded in order, a separator inside a key or a value
refused with MESSAGE_ILLEGAL, the size limit kept."""

from __future__ import annotations

import pytest

from broker.requests import RequestError
from broker.send import _properties_bytes
from protocol.codes import ResponseCode
from protocol.properties import PROPERTIES_BYTES_MAX, parse_properties


def test_properties_are_encoded_in_order() -> None:
    properties = {"TAGS": "a", "UNIQ_KEY": "7F00", "WAIT": "true", "é": "ü", "EMPTY": ""}
    assert _properties_bytes(properties) == "TAGS\x01a\x02UNIQ_KEY\x017F00\x02WAIT\x01true\x02é\x01ü\x02EMPTY\x01\x02".encode()
    assert _properties_bytes({}) == b""
    assert parse_properties(_properties_bytes(properties).decode()) == properties


@pytest.mark.parametrize("properties", [
    {"TAGS": "a\x01b"},           # a value with a name separator (parse_properties keeps it)
    {"TAGS": "a", "K\x02": "v"},  # a key with a pair separator
    {"K\x01": "v"},
    {"TAGS": "a", "V": "x\x02"},
])
def test_a_separator_inside_a_key_or_a_value_is_refused(properties: dict[str, str]) -> None:
    with pytest.raises(RequestError) as refused:
        _properties_bytes(properties)
    assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL and "separator" in str(refused.value.remark)


def test_a_value_parsed_with_an_extra_separator_is_refused() -> None:
    with pytest.raises(RequestError):
        _properties_bytes(parse_properties("TAGS\x01a\x01b\x02"))


def test_the_size_limit_holds() -> None:
    with pytest.raises(RequestError) as refused:
        _properties_bytes({"BIG": "x" * PROPERTIES_BYTES_MAX})
    assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
