"""The name server: brokers register their groups and topics, clients fetch topic routes.

Run one with ``python -m broker.namesrv --host 127.0.0.1 --port 9876``.
"""

from broker.namesrv.config import DEFAULT_PORT, NameServerConfig
from broker.namesrv.errors import InvalidRequestError, RouteLimitError
from broker.namesrv.headers import (
    DeleteTopicRequestHeader,
    GetRouteInfoRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from broker.namesrv.model import (
    MASTER_ID,
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    TopicConfig,
    TopicRouteData,
    decode_topic_list,
    encode_topic_list,
    java_crc32,
)
from broker.namesrv.route_table import RegisterResult, RouteTable
from broker.namesrv.server import NAME_SERVER_CODES, NameServer

__all__ = [
    "DEFAULT_PORT",
    "MASTER_ID",
    "NAME_SERVER_CODES",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "BrokerData",
    "ClusterInfo",
    "DataVersion",
    "DeleteTopicRequestHeader",
    "GetRouteInfoRequestHeader",
    "InvalidRequestError",
    "NameServer",
    "NameServerConfig",
    "QueueData",
    "RegisterBrokerBody",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "RegisterResult",
    "RouteLimitError",
    "RouteTable",
    "TopicConfig",
    "TopicRouteData",
    "UnregisterBrokerRequestHeader",
    "decode_topic_list",
    "encode_topic_list",
    "java_crc32",
]
