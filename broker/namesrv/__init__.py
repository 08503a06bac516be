"""The name server: brokers register their groups and topics, clients fetch topic routes.

Run one with ``python -m broker.namesrv --host 127.0.0.1 --port 9876``.
"""

from broker.namesrv.config import DEFAULT_PORT, NameServerConfig
from broker.namesrv.errors import RouteLimitError
from broker.namesrv.headers import (
    DeleteTopicRequestHeader,
    GetRouteInfoRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from broker.namesrv.route_table import RegisterResult, RouteTable
from broker.namesrv.server import NAME_SERVER_CODES, NameServer

__all__ = [
    "DEFAULT_PORT",
    "NAME_SERVER_CODES",
    "DeleteTopicRequestHeader",
    "GetRouteInfoRequestHeader",
    "NameServer",
    "NameServerConfig",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "RegisterResult",
    "RouteLimitError",
    "RouteTable",
    "UnregisterBrokerRequestHeader",
]
