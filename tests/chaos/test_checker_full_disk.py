"""The checker on a full disk on the leader (``disk-full-leader`` faults): the group is wedged when no send is
acknowledged, or the full member goes on leading, for longer than ``WEDGE_BOUND_SECONDS`` while its disk is
full; it is not when the member steps down (or stops) and another leader takes the sends."""

from __future__ import annotations

import json

import pytest

from chaos.checker import WEDGE_BOUND_SECONDS, check, describe, full_disk_leaders
from chaos.history import Event, FaultEvent, History, LeaderEvent
from tests.chaos.history_builders import ack, deliver, run_header

#: the leader's disk full from 10 s to 24 s
FILL = FaultEvent("disk-full-leader", "n0", 10.0, 24.0, "33554432 filler bytes for 14.0 s")


def acked_every_tenth(*spans: tuple[float, float]) -> list[Event]:
    """A send acknowledged (and received) every 0.1 s within each span (seconds, both ends included)."""
    events: list[Event] = []
    for low, high in spans:
        for step in range(round((high - low) * 10) + 1):
            at = round(low + step / 10, 3)
            number = len(events) // 2
            events += [ack(f"U{number}", 0, number, at, sequence=number), deliver(f"U{number}", 0, number, at + 0.05)]
    return events


def history(acks: list[Event], leaders: list[tuple[float, str | None]], fault: FaultEvent = FILL) -> History:
    return History.of([run_header(), *acks, fault, *(LeaderEvent(at, leader, term)
                                                    for term, (at, leader) in enumerate(leaders, 1))])


def test_a_leader_that_steps_down_at_once_leaves_the_group_acknowledging() -> None:
    result = check(history(acked_every_tenth((0.0, 10.0), (12.0, 30.0)),
                           [(0.0, "n0"), (10.2, None), (11.8, "n1")]))
    assert result.clean, result.violations
    (window,) = result.full_disk_leaders
    assert window.longest_gap is not None and (window.longest_gap.start, window.longest_gap.end) == (10.0, 12.0)
    assert window.acks_resumed_after_seconds == pytest.approx(2.0)
    assert window.stepped_down_after_seconds == pytest.approx(0.2)
    assert window.led_seconds == pytest.approx(0.2) and not window.wedged
    document = result.to_json()["full_disk_leaders"][0]
    assert document["wedged"] is False and document["bound_seconds"] == WEDGE_BOUND_SECONDS
    assert document["longest_gap"]["seconds"] == pytest.approx(2.0) and document["node"] == "n0"
    json.dumps(result.to_json())


def test_a_leader_that_keeps_leading_on_a_full_disk_wedges_the_group() -> None:
    """The control: nothing acknowledged from the fill until 5 s after it was freed, and the full member led
    throughout."""
    result = check(history(acked_every_tenth((0.0, 10.0), (29.0, 35.0)), [(0.0, "n0")]))
    assert [violation.kind for violation in result.violations] == ["wedged"]
    (window,) = result.full_disk_leaders
    assert window.wedged and window.stepped_down_after_seconds is None
    assert window.led_seconds == pytest.approx(14.0) and window.acks_resumed_after_seconds == pytest.approx(19.0)
    detail = result.violations[0].detail
    assert "no ack for 19.0 s (10.000-29.000 s)" in detail and "n0 led for 14.0 s" in detail
    assert "bound 9 s" in detail and FILL.detail in detail
    text = describe(result, history(acked_every_tenth((0.0, 10.0), (29.0, 35.0)), [(0.0, "n0")]))
    assert '"wedged": 1' in text and '"kind":"disk-full-leader"' in text


@pytest.mark.parametrize(("resumed_at", "wedged"), [(10.0 + WEDGE_BOUND_SECONDS - 0.1, False),
                                                     (10.0 + WEDGE_BOUND_SECONDS + 0.1, True)])
def test_the_bound_is_on_the_longest_ack_gap(resumed_at: float, wedged: bool) -> None:
    result = check(history(acked_every_tenth((0.0, 10.0), (resumed_at, 30.0)), [(0.0, "n0"), (10.1, "n1")]))
    assert [violation.kind for violation in result.violations] == (["wedged"] if wedged else [])


def test_nothing_acknowledged_after_the_fill_is_a_wedge() -> None:
    result = check(history(acked_every_tenth((0.0, 10.0)), [(0.0, "n0"), (10.5, "n1")]))
    (window,) = result.full_disk_leaders
    assert window.acks_resumed_after_seconds is None and window.wedged
    assert window.longest_gap is not None and (window.longest_gap.start, window.longest_gap.end) == (10.0, 24.0)
    assert "no send acknowledged after it was filled" in result.violations[0].detail


def test_leading_through_the_fill_is_a_wedge_even_with_acks() -> None:
    """However the acks came (the monitor's view and the acks are separate evidence), a member that led for
    longer than the bound on a full disk did not step down."""
    result = check(history(acked_every_tenth((0.0, 30.0)), [(0.0, "n0")]))
    assert [violation.kind for violation in result.violations] == ["wedged"]
    assert "no ack" not in result.violations[0].detail and "n0 led for 14.0 s" in result.violations[0].detail


def test_a_poll_nobody_answered_as_leader_does_not_end_a_stretch() -> None:
    leaders = [(0.0, "n0"), (10.5, None), (11.0, "n0"), (21.0, "n1")]
    (window,) = full_disk_leaders(history(acked_every_tenth((0.0, 30.0)), leaders))
    assert window.led_seconds == pytest.approx(11.0) and window.stepped_down_after_seconds == pytest.approx(11.0)
    assert window.wedged


def test_a_member_not_leading_when_filled_stepped_down_at_once() -> None:
    (window,) = full_disk_leaders(history(acked_every_tenth((0.0, 30.0)), [(0.0, "n1")]))
    assert window.stepped_down_after_seconds == 0.0 and window.led_seconds == 0.0 and not window.wedged


def test_only_a_full_disk_on_the_leader_is_judged() -> None:
    """A follower's full disk (``disk-full``) and other faults have their unavailability counted, not judged."""
    follower = FaultEvent("disk-full", "n2", 10.0, 24.0)
    result = check(history(acked_every_tenth((0.0, 10.0), (29.0, 30.0)), [(0.0, "n0")], follower))
    assert result.clean and result.full_disk_leaders == ()
