"""Signatures as RocketMQ's AclClientRPCHook computes them: content, order, HMAC-SHA1, base64."""

from __future__ import annotations

import base64
import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.signature import (
    ACCESS_KEY,
    SIGNATURE,
    UNIQUE_KEY_QUERY,
    calculate_signature,
    sign_fields,
    signature_content,
    signature_matches,
)

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=200)


def reference_signature(fields: dict[str, str], body: bytes, secret: str) -> str:
    """Written out the way the Java sources read: TreeMap order (ASCII keys here), values concatenated."""
    content = "".join(fields[key] for key in sorted(fields) if key != SIGNATURE).encode() + body
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


def test_a_known_vector() -> None:
    fields = {"topic": "orders", "AccessKey": "rocketmq2", "queueId": "3", "OnsChannel": "ALIYUN"}
    # keys sorted: AccessKey, OnsChannel, queueId, topic (upper case sorts before lower case)
    assert signature_content(fields, b"body") == b"rocketmq2ALIYUN3ordersbody"
    expected = base64.b64encode(hmac.new(b"12345678", b"rocketmq2ALIYUN3ordersbody", hashlib.sha1).digest()).decode()
    assert calculate_signature(b"rocketmq2ALIYUN3ordersbody", "12345678") == expected
    # pinned, computed independently: printf rocketmq2ALIYUN3ordersbody | openssl dgst -sha1 -hmac 12345678 -binary | base64
    assert expected == "r4MYYAQN27y268sp9G2+d6lI32Y="


def test_sign_fields_adds_access_key_and_signature_and_verifies() -> None:
    signed = sign_fields({"topic": "orders", "b": "x"}, b"\x00\xff", "rocketmq2", "12345678")
    assert signed[ACCESS_KEY] == "rocketmq2"
    assert signed[SIGNATURE] == reference_signature(signed, b"\x00\xff", "12345678")
    assert signature_matches(signed, b"\x00\xff", "12345678")
    assert not signature_matches(signed, b"\x00\xfe", "12345678")
    assert not signature_matches(signed, b"\x00\xff", "12345679")
    assert not signature_matches({**signed, "topic": "other"}, b"\x00\xff", "12345678")
    assert not signature_matches({key: value for key, value in signed.items() if key != SIGNATURE}, b"\x00\xff",
                                 "12345678")


def test_resigning_replaces_the_old_signature() -> None:
    once = sign_fields({"topic": "t"}, b"", "rocketmq2", "12345678")
    twice = sign_fields(once, b"", "rocketmq2", "12345678")
    assert once == twice


def test_keys_sort_in_java_utf16_order_not_code_point_order() -> None:
    # U+10000 is the surrogate pair D800 DC00 in Java, which sorts before U+FFFF; Python sorts it after
    fields = {"\U00010000": "first", "\uffff": "second"}
    assert signature_content(fields, b"") == b"firstsecond"


def test_unique_key_query_flag_is_accepted_signed_either_way() -> None:
    fields = {"topic": "t", "key": "k", UNIQUE_KEY_QUERY: "true"}
    with_flag = sign_fields(fields, b"", "rocketmq2", "12345678")  # a Java client signs it
    assert signature_matches(with_flag, b"", "12345678")
    without = sign_fields({"topic": "t", "key": "k"}, b"", "rocketmq2", "12345678")
    without[UNIQUE_KEY_QUERY] = "true"  # added after signing: what the broker verifies (RocketMQ)
    assert signature_matches(without, b"", "12345678")


@DETERMINISTIC
@given(fields=st.dictionaries(st.text(max_size=12), st.text(max_size=30), max_size=8), body=st.binary(max_size=64),
       secret=st.text(min_size=7, max_size=20))
def test_any_request_signed_verifies_and_any_change_breaks_it(fields: dict[str, str], body: bytes, secret: str) -> None:
    signed = sign_fields(fields, body, "access-key", secret)
    assert signature_matches(signed, body, secret)
    assert not signature_matches(signed, body + b"!", secret)
    assert not signature_matches({**signed, "extra": "1"} if "extra" not in signed else
                                 {**signed, "extra": signed["extra"] + "1"}, body, secret)
