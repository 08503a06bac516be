"""When an apply wakes a member's event loop (broker/node.py ``BrokerNode._applied``, called on the Raft
thread): only for what waits for one. Held pulls on any member; on the leader also receives in their long
poll and a delay level that grew. A wake-up for nothing takes the GIL or the CPU from the Raft thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from broker.node import BrokerNode
from broker.pop import PopService


class FakeLoop:
    def __init__(self) -> None:
        self.scheduled: list[Callable[[], None]] = []

    def is_closed(self) -> bool:
        return False

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        self.scheduled.append(callback)


def node(leader: bool, held: int = 0, polling: int = 0, delay_wanted: bool = False) -> Any:
    member_node: Any = object.__new__(BrokerNode)
    member_node._wake_scheduled = threading.Event()
    member_node._loop = FakeLoop()
    member_node.member = SimpleNamespace(is_leader=leader)
    member_node.waiters = SimpleNamespace(held=held)
    member_node.pops = SimpleNamespace(polling=polling)
    member_node.delay = SimpleNamespace(wanted=lambda: delay_wanted)
    return member_node


@pytest.mark.parametrize(("leader", "held", "polling", "delay_wanted", "wakes"), [
    (False, 0, 0, False, False),  # a follower with nothing held: the bulk of its applies
    (False, 0, 3, True, False),   # receives and delays are the leader's business
    (False, 1, 0, False, True),   # a pull held on a follower
    (True, 0, 0, False, False),   # a leader's plain sends: answered through the completions, not this
    (True, 2, 0, False, True),
    (True, 0, 1, False, True),    # a 5.x receive in its long poll
    (True, 0, 0, True, True),     # a delay level's queue grew
])
def test_an_apply_wakes_the_loop_only_for_what_waits(leader: bool, held: int, polling: int, delay_wanted: bool,
                                                     wakes: bool) -> None:
    member_node = node(leader, held, polling, delay_wanted)
    member_node._applied()
    assert len(member_node._loop.scheduled) == int(wakes)
    member_node._applied()  # a second apply before the loop ran: one wake-up for both
    assert len(member_node._loop.scheduled) == int(wakes)


def test_a_receive_counts_as_polling_for_its_whole_long_poll() -> None:
    pops: Any = object.__new__(PopService)
    pops.polling = 0
    with pops.long_poll():
        assert pops.polling == 1
        with pytest.raises(RuntimeError), pops.long_poll():
            assert pops.polling == 2
            raise RuntimeError("the receive failed")
        assert pops.polling == 1
    assert pops.polling == 0
