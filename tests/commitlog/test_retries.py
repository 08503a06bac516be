"""commitlog.retries: what a retry has in common with its first attempt."""

from __future__ import annotations

from commitlog.retries import retry_digest, retry_properties
from protocol.properties import encode_properties


def props(**values: str) -> bytes:
    return encode_properties(values)


def test_per_attempt_properties_are_left_out_and_the_rest_kept_in_order() -> None:
    timed = props(UNIQ_KEY="K", REAL_TOPIC="T", REAL_QID="3", TIMER_OUT_MS="1700000060000",
                  KEYS="order-1 RMQ_TIMER_1700000060", TIMER_DELAY_SEC="60")
    assert retry_properties(timed) == props(UNIQ_KEY="K", REAL_TOPIC="T", KEYS="order-1", TIMER_DELAY_SEC="60")
    # a KEYS of nothing but the timer token goes away, as it was absent before the broker added it
    assert retry_properties(props(UNIQ_KEY="K", KEYS="RMQ_TIMER_5")) == props(UNIQ_KEY="K")
    plain = props(UNIQ_KEY="K", KEYS="a b", TAGS="t")
    assert retry_properties(plain) is plain


def test_the_digest_tells_content_apart_and_ignores_the_attempt() -> None:
    base = retry_digest(0, b"body", props(UNIQ_KEY="K", REAL_QID="0", TIMER_OUT_MS="1"))
    assert base == retry_digest(0, b"body", props(UNIQ_KEY="K", REAL_QID="2", TIMER_OUT_MS="2"))
    assert base != retry_digest(0, b"bodz", props(UNIQ_KEY="K", REAL_QID="0", TIMER_OUT_MS="1"))
    assert base != retry_digest(1, b"body", props(UNIQ_KEY="K", REAL_QID="0", TIMER_OUT_MS="1"))
    assert base != retry_digest(0, b"body", props(UNIQ_KEY="K", TAGS="x"))
    # body and properties are delimited: moving bytes from one to the other changes the digest
    assert retry_digest(0, b"ab", b"c") != retry_digest(0, b"a", b"bc")
