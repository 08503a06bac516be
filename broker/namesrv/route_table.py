"""The name server's state: which broker groups exist, their addresses by brokerId, which topics they
serve, and when each broker last registered (RocketMQ 4.9's ``RouteInfoManager``).

Pure: no sockets, no clock of its own. Callers pass the time (``now_seconds``, any monotonic clock)
so expiry is driven deterministically in tests.

Rules, as in RocketMQ:

- One address holds one brokerId within its group: when a member registers under a new id (a
  follower becoming leader registers as 0), its entry under the old id goes.
- A registration under an id already held replaces the address: a new leader registering as
  brokerId 0 displaces the old leader, which clients see on their next route fetch.
- Only the master (brokerId 0) registration updates the group's queues of each topic.
- A broker that has not registered for ``broker_expiry_seconds`` (or whose connection closed) is
  removed; a group with no address left is removed with its queues. raftmq: an address registered as
  *shared* (a group's front, which every member stands behind) is not removed when the connection it came
  over closes, only when it expires or is unregistered: the member that registered it died, the group did not.

One deliberate difference: UNREGISTER_BROKER removes an id only while it still maps to the address
that unregisters. Java removes the id whatever address it holds, so an old leader shutting down after
its successor registered as 0 would remove the successor from the routes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from broker.namesrv.errors import RouteLimitError
from protocol.route_data import (
    MASTER_ID,
    BrokerData,
    ClusterInfo,
    DataVersion,
    InvalidRequestError,
    QueueData,
    TopicConfig,
    TopicRouteData,
)


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """What a registering slave learns: the group's live master and its HA address (None for a master,
    or while the group has no live master)."""

    master_address: str | None = None
    ha_server_address: str | None = None


class StaleLeaderError(InvalidRequestError):
    """A deposed Raft leader still registering as its group's master (nothing changed)."""


@dataclass(slots=True)
class _BrokerGroup:
    cluster: str
    addresses: dict[int, str]
    #: the highest Raft term a master of this group registered with (raftmq groups)
    master_term: int = -1


@dataclass(slots=True)
class _LiveBroker:
    broker_name: str
    ha_server_address: str
    data_version: DataVersion
    last_registered_seconds: float
    connection_id: int | None
    #: a group's front (see the module docstring): kept when its connection closes
    shared: bool = False


class RouteTable:
    """Brokers and topic routes; see the module docstring for the rules."""

    def __init__(self, *, broker_addresses_max: int = 4096, topics_max: int = 1_000_000) -> None:
        if broker_addresses_max < 1 or topics_max < 1:
            raise ValueError("broker_addresses_max and topics_max must be positive")
        self._broker_addresses_max = broker_addresses_max
        self._topics_max = topics_max
        #: cluster name -> broker group names
        self._clusters: dict[str, set[str]] = {}
        #: broker group name -> its cluster and addresses by brokerId
        self._groups: dict[str, _BrokerGroup] = {}
        #: topic -> broker group name -> that group's queues of the topic
        self._topic_queues: dict[str, dict[str, QueueData]] = {}
        #: broker address -> its last registration
        self._live: dict[str, _LiveBroker] = {}

    # ------------------------------------------------------------------------------------ changes

    def register_broker(
        self,
        *,
        cluster_name: str,
        broker_name: str,
        broker_address: str,
        broker_id: int,
        ha_server_address: str,
        topic_configs: Iterable[TopicConfig],
        data_version: DataVersion,
        now_seconds: float,
        connection_id: int | None = None,
        raft_term: int | None = None,
        shared: bool = False,
    ) -> RegisterResult:
        """Record a registration (or a re-registration: brokers repeat it every 30 s as a heartbeat).

        Raises :class:`RouteLimitError` (nothing changed) when a new address or new topics would pass
        the table's limits.
        """
        configs = list(topic_configs) if broker_id == MASTER_ID else []
        if broker_address not in self._live and len(self._live) >= self._broker_addresses_max:
            raise RouteLimitError(
                f"{len(self._live)} broker addresses are registered (broker_addresses_max={self._broker_addresses_max})"
            )
        new_topics = {config.topic_name for config in configs if config.topic_name not in self._topic_queues}
        if len(self._topic_queues) + len(new_topics) > self._topics_max:
            raise RouteLimitError(
                f"{len(self._topic_queues)} topics are known and {len(new_topics)} more would pass "
                f"topics_max={self._topics_max}"
            )

        existing = self._groups.get(broker_name)
        if (broker_id == MASTER_ID and raft_term is not None and existing is not None
                and raft_term < existing.master_term
                and existing.addresses.get(MASTER_ID, broker_address) != broker_address):
            raise StaleLeaderError(
                f"{broker_address} registers as the master of {broker_name} with Raft term {raft_term}, "
                f"but {existing.addresses[MASTER_ID]} did with term {existing.master_term}"
            )
        self._clusters.setdefault(cluster_name, set()).add(broker_name)
        group = self._groups.get(broker_name)
        if group is None:
            group = self._groups[broker_name] = _BrokerGroup(cluster=cluster_name, addresses={})
        # One address, one id: a member that changes role re-registers under its new id.
        for held_id, held_address in list(group.addresses.items()):
            if held_address == broker_address and held_id != broker_id:
                del group.addresses[held_id]
        # Replaces whoever held the id (a new leader as 0). The displaced address keeps its live entry
        # until it expires, disconnects or re-registers under its own id.
        group.addresses[broker_id] = broker_address
        if broker_id == MASTER_ID and raft_term is not None:
            group.master_term = max(group.master_term, raft_term)
        for config in configs:
            self._topic_queues.setdefault(config.topic_name, {})[broker_name] = QueueData(
                broker_name=broker_name,
                read_queue_nums=config.read_queue_nums,
                write_queue_nums=config.write_queue_nums,
                perm=config.perm,
                topic_sys_flag=config.topic_sys_flag,
            )
        self._live[broker_address] = _LiveBroker(
            broker_name=broker_name,
            ha_server_address=ha_server_address,
            data_version=data_version,
            last_registered_seconds=now_seconds,
            connection_id=connection_id,
            shared=shared,
        )
        if broker_id != MASTER_ID:
            master_address = group.addresses.get(MASTER_ID)
            master = None if master_address is None else self._live.get(master_address)
            if master_address is not None and master is not None:
                return RegisterResult(
                    master_address=master_address, ha_server_address=master.ha_server_address
                )
        return RegisterResult()

    def unregister_broker(
        self, *, cluster_name: str, broker_name: str, broker_address: str, broker_id: int
    ) -> bool:
        """Forget ``broker_address`` (a broker shutting down). Returns whether the id was removed from
        the group; see the module docstring for why it must still map to that address."""
        self._live.pop(broker_address, None)
        group = self._groups.get(broker_name)
        if group is None or group.addresses.get(broker_id) != broker_address:
            return False
        del group.addresses[broker_id]
        if not group.addresses:
            self._remove_group(broker_name)
        return True

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> bool:
        """Forget ``topic``'s queues (DELETE_TOPIC_IN_NAMESRV), on the broker groups of ``cluster_name`` only
        when given. Registrations only ever add a group's topics, so a topic deleted on the brokers stays
        routed until this is asked; delete it on the brokers first, or their next registration brings it
        back. Returns whether anything was removed."""
        queues = self._topic_queues.get(topic)
        if queues is None:
            return False
        names = set(queues) if cluster_name is None else set(queues) & self._clusters.get(cluster_name, set())
        for name in names:
            del queues[name]
        if not queues:
            del self._topic_queues[topic]
        return bool(names)

    def expire_brokers(self, now_seconds: float, expiry_seconds: float) -> list[str]:
        """Remove the brokers that last registered more than ``expiry_seconds`` before ``now_seconds``;
        return their addresses."""
        expired = [
            address
            for address, live in self._live.items()
            if now_seconds - live.last_registered_seconds > expiry_seconds
        ]
        for address in expired:
            self._remove_address(address)
        return expired

    def remove_connection(self, connection_id: int) -> list[str]:
        """Remove the brokers whose latest registration came over ``connection_id`` (it closed: the
        broker process is most likely gone), shared addresses excepted; return their addresses."""
        gone = [address for address, live in self._live.items()
                if live.connection_id == connection_id and not live.shared]
        for address in gone:
            self._remove_address(address)
        return gone

    # ------------------------------------------------------------------------------------ queries

    def topic_route(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic``, or None when no live group serves it (TOPIC_NOT_EXIST)."""
        queues = self._topic_queues.get(topic)
        if not queues:
            return None
        broker_datas = tuple(
            BrokerData(cluster=group.cluster, broker_name=name, broker_addresses=dict(group.addresses))
            for name in sorted(queues)
            if (group := self._groups.get(name)) is not None
        )
        if not broker_datas:
            return None
        queue_datas = tuple(queues[name] for name in sorted(queues))
        return TopicRouteData(queue_datas=queue_datas, broker_datas=broker_datas)

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_datas={
                name: BrokerData(
                    cluster=group.cluster, broker_name=name, broker_addresses=dict(group.addresses)
                )
                for name, group in self._groups.items()
            },
            cluster_broker_names={cluster: tuple(sorted(names)) for cluster, names in self._clusters.items()},
        )

    def topics(self) -> list[str]:
        return sorted(self._topic_queues)

    def live_addresses(self) -> list[str]:
        return sorted(self._live)

    # ----------------------------------------------------------------------------------- internal

    def _remove_address(self, address: str) -> None:
        """RocketMQ's ``onChannelDestroy``: the address leaves every id it holds; an emptied group goes."""
        self._live.pop(address, None)
        for name, group in list(self._groups.items()):
            held = [
                broker_id for broker_id, held_address in group.addresses.items() if held_address == address
            ]
            if not held:
                continue
            for broker_id in held:
                del group.addresses[broker_id]
            if not group.addresses:
                self._remove_group(name)

    def _remove_group(self, broker_name: str) -> None:
        group = self._groups.pop(broker_name)
        names = self._clusters.get(group.cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._clusters[group.cluster]
        for topic in [topic for topic, queues in self._topic_queues.items() if broker_name in queues]:
            queues = self._topic_queues[topic]
            del queues[broker_name]
            if not queues:
                del self._topic_queues[topic]
