"""The delay service's wake-ups (broker/delay.py): an apply wakes it only on the leader and only when a
delay level's queue grew; a role change always does."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from broker.context import BrokerContext
from broker.delay import DelayService
from protocol.topics import SCHEDULE_TOPIC


def fake_broker(leader: bool) -> Any:
    offsets: dict[tuple[str, int], int] = {}
    return SimpleNamespace(
        member=SimpleNamespace(is_leader=leader),
        store=SimpleNamespace(offsets=offsets,
                              max_queue_offset=lambda topic, queue_id: offsets.get((topic, queue_id), 0)),
        config=SimpleNamespace(delay_levels_seconds=(1, 5, 10)),
        wall_clock_ms=lambda: 0,
    )


def woken(service: DelayService) -> bool:
    event: asyncio.Event = service._wake
    was = event.is_set()
    event.clear()
    return was


def test_applies_wake_the_leader_only_when_a_level_queue_grew() -> None:
    broker = fake_broker(leader=True)
    service = DelayService(cast(BrokerContext, broker))
    service.applied()
    assert woken(service)  # the first look
    for _ in range(3):
        broker.store.offsets[("OtherTopic", 0)] = broker.store.offsets.get(("OtherTopic", 0), 0) + 1
        service.applied()
        assert not woken(service)  # plain sends: nothing to deliver
    broker.store.offsets[(SCHEDULE_TOPIC, 2)] = 1
    service.applied()
    assert woken(service)  # a delayed send arrived
    service.applied()
    assert not woken(service)
    service.role_changed()
    assert woken(service)


def test_applies_never_wake_a_follower() -> None:
    broker = fake_broker(leader=False)
    service = DelayService(cast(BrokerContext, broker))
    broker.store.offsets[(SCHEDULE_TOPIC, 0)] = 5
    service.applied()
    assert not woken(service)
    broker.member.is_leader = True
    service.role_changed()  # it becomes leader: a role change wakes it, and it looks at every level
    assert woken(service)


def test_wanted_says_on_the_raft_thread_what_applied_would_do_without_doing_it() -> None:
    broker = fake_broker(leader=True)
    service = DelayService(cast(BrokerContext, broker))
    assert service.wanted()  # nothing seen yet
    service.applied()
    assert woken(service) and not service.wanted()
    broker.store.offsets[("OtherTopic", 0)] = 5
    assert not service.wanted()
    broker.store.offsets[(SCHEDULE_TOPIC, 1)] = 1
    assert service.wanted() and service.wanted()  # asking changes nothing
    service.applied()
    assert woken(service) and not service.wanted()
    broker.member.is_leader = False
    broker.store.offsets[(SCHEDULE_TOPIC, 1)] = 2
    assert not service.wanted()
