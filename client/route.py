"""Topic routes as the client uses them: which queues to send to, which to read, and where each broker
group lives. Pure functions of a :class:`~protocol.route_data.TopicRouteData` (Java's
``MQClientInstance.topicRouteData2TopicPublishInfo`` / ``topicRouteData2TopicSubscribeInfo``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from client.message import MessageQueue
from protocol.route_data import MASTER_ID, PERM_READ, PERM_WRITE, TopicRouteData


def is_writable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """One topic's route.

    ``publish_queues``: writable queues, sorted by broker name then queue id, of every broker group
    that has an address (Java requires a master; raftmq clients also use a group whose leader is not
    registered yet: a follower's not-leader answer names the leader). ``subscribe_queues``: readable
    queues. ``broker_addresses``: broker name -> {broker id -> address}; id 0 is the leader.
    """

    topic: str
    data: TopicRouteData
    publish_queues: tuple[MessageQueue, ...]
    subscribe_queues: tuple[MessageQueue, ...]
    broker_addresses: Mapping[str, Mapping[int, str]] = field(hash=False)
    broker_clusters: Mapping[str, str] = field(hash=False)
    ordered: bool = False

    @property
    def broker_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.broker_addresses))

    def master_address(self, broker_name: str) -> str | None:
        return self.broker_addresses.get(broker_name, {}).get(MASTER_ID)


def _order_topic_queues(topic: str, conf: str) -> list[MessageQueue]:
    """``orderTopicConf``: ``"brokerA:4;brokerB:4"``, queues in that order (Java)."""
    queues: list[MessageQueue] = []
    for item in conf.split(";"):
        name, _, count = item.partition(":")
        if name and count.strip().isdigit():
            queues.extend(MessageQueue(topic, name, queue_id) for queue_id in range(int(count)))
    return queues


def topic_route_from_data(topic: str, data: TopicRouteData) -> TopicRoute:
    addresses: dict[str, Mapping[int, str]] = {}
    clusters: dict[str, str] = {}
    for broker in data.broker_datas:
        if broker.broker_addresses:
            addresses[broker.broker_name] = MappingProxyType(dict(broker.broker_addresses))
            clusters[broker.broker_name] = broker.cluster
    ordered = bool(data.order_topic_conf)
    if data.order_topic_conf:
        publish = _order_topic_queues(topic, data.order_topic_conf)
    else:
        publish = []
        for queue_data in sorted(data.queue_datas, key=lambda each: each.broker_name):
            if is_writable(queue_data.perm) and queue_data.broker_name in addresses:
                publish.extend(
                    MessageQueue(topic, queue_data.broker_name, queue_id)
                    for queue_id in range(queue_data.write_queue_nums)
                )
    subscribe = sorted(
        MessageQueue(topic, queue_data.broker_name, queue_id)
        for queue_data in data.queue_datas
        if is_readable(queue_data.perm)
        for queue_id in range(queue_data.read_queue_nums)
    )
    return TopicRoute(
        topic=topic,
        data=data,
        publish_queues=tuple(publish),
        subscribe_queues=tuple(subscribe),
        broker_addresses=MappingProxyType(addresses),
        broker_clusters=MappingProxyType(clusters),
        ordered=ordered,
    )


def borrowed_route(topic: str, template: TopicRoute, queue_nums: int) -> TopicRoute:
    """The route a topic that does not exist yet borrows from ``TBW102`` for its first send (the
    broker auto-creates it): at most ``queue_nums`` queues on each broker group of the template."""
    publish = tuple(
        MessageQueue(topic, queue.broker_name, queue.queue_id)
        for queue in template.publish_queues
        if queue.queue_id < queue_nums
    )
    return TopicRoute(
        topic=topic,
        data=template.data,
        publish_queues=publish,
        subscribe_queues=(),
        broker_addresses=template.broker_addresses,
        broker_clusters=template.broker_clusters,
    )
