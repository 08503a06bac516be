"""The store's property scan for dispatch (TAGS, KEYS, UNIQ_KEY from encoded properties)."""

from __future__ import annotations

from commitlog.dispatch import dispatch_fields as _dispatch_fields


def test_dispatch_fields_reads_whole_names_and_the_last_of_a_repeated_one() -> None:
    assert _dispatch_fields(b"") == (None, None, None)
    assert _dispatch_fields(b"UNIQ_KEY\x01u1\x02TAGS\x01t\x02") == (b"t", None, b"u1")
    assert _dispatch_fields(b"WAIT\x01true\x02KEYS\x01a b\x02TAGS\x01x\x02TAGS\x01y\x02") == (b"y", b"a b", None)
    # a name must start the properties or follow a separator: XTAGS and a value holding TAGS\x01 do not count
    assert _dispatch_fields(b"XTAGS\x01no\x02K\x01TAGS\x01no\x02") == (None, None, None)
    assert _dispatch_fields(b"TAGS\x01\x02KEYS\x01k") == (b"", b"k", None)  # empty value; last pair unterminated
