"""The consume-queue tag code of a message: Java's String.hashCode of its TAGS property, as RocketMQ stores it
in every consume-queue unit and as consumers filter by it."""

from __future__ import annotations

from typing import Final


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit wrap-around), as a signed int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_hash_code(tags: str | None) -> int:
    """The consume-queue tag code: Java's hashCode of the TAGS property, 0 when absent."""
    return java_string_hash(tags) if tags else 0


#: bound on a tag-code cache
TAG_CODE_CACHE_MAX: Final = 100_000


def cached_tag_code(cache: dict[bytes, int], tags: bytes | None) -> int:
    """:func:`tags_hash_code` of raw TAGS bytes, remembered in ``cache`` (up to TAG_CODE_CACHE_MAX)."""
    if not tags:
        return 0
    code = cache.get(tags)
    if code is None:
        code = tags_hash_code(tags.decode("utf-8", "replace"))
        if len(cache) < TAG_CODE_CACHE_MAX:
            cache[tags] = code
    return code
