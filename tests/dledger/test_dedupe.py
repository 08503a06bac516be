"""The UNIQ_KEY dedupe rule (dledger.dedupe.find_retries) as a table, with the store's look-up faked: a retry
inside the command, a key collision inside it, a retry of a stored message and a collision with one. The
same rule over records (both ways of reading them) is compared with this one in tests/dledger/test_apply.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from commitlog.message import MessageInput
from commitlog.outcomes import AppendResult, AppendStatus
from commitlog.retries import KeyCollision
from dledger.dedupe import Lookup, find_retries, message_sends
from tests.commitlog.helpers import message

KEY = "C0A8000A9CB3000000000000000000AA"
STORED = AppendResult(AppendStatus.OK, 4096, 7, 200)


class Store:
    """Answers look-ups from a table by (topic, UNIQ_KEY); records what was looked up."""

    def __init__(self, answers: dict[tuple[str, bytes], AppendResult | KeyCollision]) -> None:
        self.answers = answers
        self.looked_up: list[Lookup] = []

    def find_recent_sends(self, lookups: list[Lookup], since_timestamp: int
                          ) -> Sequence[AppendResult | KeyCollision | None]:
        assert since_timestamp == 1_000
        self.looked_up += lookups
        return [self.answers.get((topic, key)) for topic, key, _, _ in lookups]


@pytest.mark.parametrize(
    ("sends", "stored", "duplicates", "collisions", "looked_up"),
    [
        pytest.param([message(1, tags=None, UNIQ_KEY="")._replace(properties=b"")], {}, {}, [], 0, id="no key"),
        pytest.param([message(1), message(2)], {}, {}, [], 2, id="first sends"),
        pytest.param([message(1), message(2), message(1)], {}, {2: 0}, [], 2, id="a retry in the command"),
        pytest.param([message(1, UNIQ_KEY=KEY), message(2, UNIQ_KEY=KEY)], {}, {}, [("TopicTest", KEY.encode())], 2,
                     id="a key collision in the command"),
        pytest.param([message(1, UNIQ_KEY=KEY), message(1, UNIQ_KEY=KEY)._replace(reconsume_times=1)], {}, {}, [], 2,
                     id="another reconsume count is another send"),
        pytest.param([message(1, UNIQ_KEY=KEY), message(1, topic="Other", UNIQ_KEY=KEY)], {}, {}, [], 2,
                     id="another topic is another send"),
        pytest.param([message(1, UNIQ_KEY=KEY), message(3)], {("TopicTest", KEY.encode()): STORED}, {0: STORED}, [], 2,
                     id="a retry of a stored message"),
        pytest.param([message(1, UNIQ_KEY=KEY), message(1, UNIQ_KEY=KEY)], {("TopicTest", KEY.encode()): STORED},
                     {0: STORED, 1: 0}, [], 1, id="a stored message sent twice again"),
        pytest.param([message(1, UNIQ_KEY=KEY)], {("TopicTest", KEY.encode()): KeyCollision(4096)}, {},
                     [("TopicTest", KEY.encode())], 1, id="a collision with a stored message"),
    ],
)
def test_retries(sends: list[MessageInput], stored: dict[tuple[str, bytes], AppendResult | KeyCollision],
                 duplicates: dict[int, AppendResult | int], collisions: list[tuple[str, bytes]],
                 looked_up: int) -> None:
    store = Store(stored)
    assert find_retries(message_sends(sends), 1_000, store.find_recent_sends) == (duplicates, collisions)
    assert len(store.looked_up) == looked_up  # a retry inside the command is not looked up again
