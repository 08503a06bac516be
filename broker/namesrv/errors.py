"""The name server's operating errors."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request header or body the name server cannot use; answered SYSTEM_ERROR with this text as the
    remark (what the Java name server answers when a header or body does not decode)."""


class RouteLimitError(InvalidRequestError):
    """Accepting the request would pass one of the route table's limits."""
