"""The extFields of the name server's requests and responses, as frozen dataclasses that validate
themselves (``RegisterBrokerRequestHeader`` and friends in apache/rocketmq, 4.9).

``from_ext_fields`` reads what a peer sent (raising :class:`InvalidRequestError`), ``to_ext_fields``
writes what we send; every value is a string on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from protocol.route_data import InvalidRequestError

#: names (broker, cluster) and addresses are bounded: they are held for every registration
NAME_MAX_CHARS: Final = 255
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_INT64_MAX: Final = 2**63 - 1
_PORT_MAX: Final = 65_535


def check_address(address: str, what: str) -> str:
    """``host:port`` with a port in [1, 65535]: clients connect to what brokers register."""
    host, separator, port = address.rpartition(":")
    if (
        not separator
        or not host
        or len(address) > NAME_MAX_CHARS
        or not port.isascii()
        or not port.isdigit()
        or not 1 <= int(port) <= _PORT_MAX
    ):
        raise InvalidRequestError(f"{what} must be host:port, got {address!r}")
    return address


def _required(fields: Mapping[str, str], key: str, request: str) -> str:
    value = fields.get(key)
    if value is None:
        raise InvalidRequestError(f"{request} header field {key!r} is missing")
    return value


def _name(fields: Mapping[str, str], key: str, request: str) -> str:
    value = _required(fields, key, request)
    if not 1 <= len(value) <= NAME_MAX_CHARS:
        raise InvalidRequestError(f"{request} header field {key!r} must be 1 to {NAME_MAX_CHARS} characters")
    return value


def _integer(
    fields: Mapping[str, str], key: str, request: str, default: int | None, minimum: int, maximum: int
) -> int:
    text = fields.get(key)
    if text is None:
        if default is None:
            raise InvalidRequestError(f"{request} header field {key!r} is missing")
        return default
    try:
        value = int(text, 10)
    except ValueError:
        raise InvalidRequestError(
            f"{request} header field {key!r} must be an integer, got {text!r}"
        ) from None
    if not minimum <= value <= maximum:
        raise InvalidRequestError(
            f"{request} header field {key!r} must be in [{minimum}, {maximum}], got {value}"
        )
    return value


def _boolean(fields: Mapping[str, str], key: str) -> bool:
    # Java's Boolean.parseBoolean: "true" in any case is true, anything else false
    return fields.get(key, "").lower() == "true"


@dataclass(frozen=True, slots=True)
class RegisterBrokerRequestHeader:
    """REGISTER_BROKER (103). ``broker_id`` 0 registers the group's master (our Raft leader)."""

    broker_name: str
    broker_address: str
    cluster_name: str
    ha_server_address: str
    broker_id: int
    compressed: bool = False
    #: ``UtilAll.crc32`` of the body, or 0 for "not checked"
    body_crc32: int = 0
    #: raftmq: the Raft term of a leader registering as brokerId 0 (a deposed leader's stale claim, with
    #: a lower term than the group's current master, is refused). Stock brokers do not send it.
    raft_term: int | None = None
    #: raftmq: ``broker_address`` is the group's front, shared by its members (broker.registration): it is
    #: not forgotten when the connection of the member that registered it closes. Stock brokers do not send it.
    shared_address: bool = False

    def to_ext_fields(self) -> dict[str, str]:
        return {
            "brokerName": self.broker_name,
            "brokerAddr": self.broker_address,
            "clusterName": self.cluster_name,
            "haServerAddr": self.ha_server_address,
            "brokerId": str(self.broker_id),
            "compressed": "true" if self.compressed else "false",
            "bodyCrc32": str(self.body_crc32),
            **({} if self.raft_term is None else {"raftTerm": str(self.raft_term)}),
            **({"raftmqSharedAddress": "true"} if self.shared_address else {}),
        }

    @classmethod
    def from_ext_fields(cls, fields: Mapping[str, str]) -> RegisterBrokerRequestHeader:
        request = "REGISTER_BROKER"
        return cls(
            broker_name=_name(fields, "brokerName", request),
            broker_address=check_address(_required(fields, "brokerAddr", request), "brokerAddr"),
            cluster_name=_name(fields, "clusterName", request),
            # required (CFNotNull) but free-form: brokers without HA send an empty or unused address
            ha_server_address=_required(fields, "haServerAddr", request)[:NAME_MAX_CHARS],
            broker_id=_integer(fields, "brokerId", request, None, 0, _INT64_MAX),
            compressed=_boolean(fields, "compressed"),
            body_crc32=_integer(fields, "bodyCrc32", request, 0, _INT32_MIN, _INT32_MAX),
            raft_term=_integer(fields, "raftTerm", request, 0, 0, _INT64_MAX) if "raftTerm" in fields else None,
            shared_address=_boolean(fields, "raftmqSharedAddress"),
        )


@dataclass(frozen=True, slots=True)
class RegisterBrokerResponseHeader:
    """The answer's extFields: a slave learns its master (and the master's HA address) from them.
    Absent values are left out, as Java leaves out null fields."""

    ha_server_address: str | None = None
    master_address: str | None = None

    def to_ext_fields(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        if self.ha_server_address is not None:
            fields["haServerAddr"] = self.ha_server_address
        if self.master_address is not None:
            fields["masterAddr"] = self.master_address
        return fields

    @classmethod
    def from_ext_fields(cls, fields: Mapping[str, str]) -> RegisterBrokerResponseHeader:
        return cls(ha_server_address=fields.get("haServerAddr"), master_address=fields.get("masterAddr"))


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRequestHeader:
    """UNREGISTER_BROKER (104)."""

    broker_name: str
    broker_address: str
    cluster_name: str
    broker_id: int

    def to_ext_fields(self) -> dict[str, str]:
        return {
            "brokerName": self.broker_name,
            "brokerAddr": self.broker_address,
            "clusterName": self.cluster_name,
            "brokerId": str(self.broker_id),
        }

    @classmethod
    def from_ext_fields(cls, fields: Mapping[str, str]) -> UnregisterBrokerRequestHeader:
        request = "UNREGISTER_BROKER"
        return cls(
            broker_name=_name(fields, "brokerName", request),
            broker_address=check_address(_required(fields, "brokerAddr", request), "brokerAddr"),
            cluster_name=_name(fields, "clusterName", request),
            broker_id=_integer(fields, "brokerId", request, None, 0, _INT64_MAX),
        )


@dataclass(frozen=True, slots=True)
class GetRouteInfoRequestHeader:
    """GET_ROUTEINFO_BY_TOPIC (105)."""

    topic: str

    def to_ext_fields(self) -> dict[str, str]:
        return {"topic": self.topic}

    @classmethod
    def from_ext_fields(cls, fields: Mapping[str, str]) -> GetRouteInfoRequestHeader:
        return cls(topic=_name(fields, "topic", "GET_ROUTEINFO_BY_TOPIC"))


@dataclass(frozen=True, slots=True)
class DeleteTopicRequestHeader:
    """DELETE_TOPIC_IN_NAMESRV (216): ``topic``, and from RocketMQ 5 an optional ``clusterName`` that limits
    the deletion to the broker groups of that cluster."""

    topic: str
    cluster_name: str | None = None

    def to_ext_fields(self) -> dict[str, str]:
        fields = {"topic": self.topic}
        if self.cluster_name is not None:
            fields["clusterName"] = self.cluster_name
        return fields

    @classmethod
    def from_ext_fields(cls, fields: Mapping[str, str]) -> DeleteTopicRequestHeader:
        request = "DELETE_TOPIC_IN_NAMESRV"
        cluster = _name(fields, "clusterName", request) if fields.get("clusterName") else None
        return cls(topic=_name(fields, "topic", request), cluster_name=cluster)
