"""The server side of RocketMQ 4.x remoting: the asyncio server around the sans-IO codec, and the PROXY
protocol header it accepts in front of a stream.

What both sides share (wire constants, the command value, limits, the codec, the connection base and the
client) is :mod:`protocol`; the server's connections build on :class:`protocol.connection.RemotingConnection`.
"""

from broker.remoting.server import (
    Connection,
    ConnectionCloseListener,
    Processor,
    RemotingServer,
    RequestContext,
    ServerConnection,
    ServerLimits,
)

__all__ = [
    "Connection",
    "ConnectionCloseListener",
    "Processor",
    "RemotingServer",
    "RequestContext",
    "ServerConnection",
    "ServerLimits",
]
