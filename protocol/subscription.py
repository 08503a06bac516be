"""A subscription's tag expression: ``*`` (every message) or tags separated by ``||`` (``"TagA || TagB"``),
as RocketMQ's ``FilterAPI.buildSubscriptionData`` reads it. The client builds its subscriptions with it and
the broker filters pulls by it, so both read an expression the same way."""

from __future__ import annotations

from typing import Final

#: RocketMQ's SubscriptionData.SUB_ALL
SUBSCRIBE_ALL: Final = "*"
TAG_SEPARATOR: Final = "||"


def expression_tags(expression: str | None) -> frozenset[str] | None:
    """The tags ``expression`` names, each stripped; None when it selects every message (None, blank or
    ``*``). An expression of separators and blanks only names no tag: an empty set, which each reader
    interprets as RocketMQ's counterpart does (a 4.x pull selects nothing, a client subscribes to all)."""
    if expression is None:
        return None
    text = expression.strip()
    if not text or text == SUBSCRIBE_ALL:
        return None
    return frozenset(tag.strip() for tag in text.split(TAG_SEPARATOR) if tag.strip())
