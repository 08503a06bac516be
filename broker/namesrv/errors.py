"""The name server's operating errors besides :class:`protocol.route_data.InvalidRequestError` (raised by
the bodies' decoders, which clients share)."""

from __future__ import annotations

from protocol.route_data import InvalidRequestError


class RouteLimitError(InvalidRequestError):
    """Accepting the request would pass one of the route table's limits."""
