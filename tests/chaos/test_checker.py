"""The chaos checker over hand-built histories: every violation kind, the figures, the slices, the
history file format, and Hypothesis properties over histories of a correct model with faults injected."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.checker import (
    DEDUPE_WINDOW_SECONDS,
    check,
    check_key_order,
    check_lost,
    check_queue_order,
    describe,
    history_slice,
    longest_gap,
)
from chaos.history import (
    DeliveryEvent,
    Event,
    FaultEvent,
    History,
    HistoryError,
    LeaderEvent,
    NoteEvent,
    OffsetCommitEvent,
    SessionEvent,
    decode_event,
    encode_event,
    read_history,
    write_history,
)
from tests.chaos.history_builders import Model, ack, deliver, error, run_header


def kinds(history: History) -> list[str]:
    return [violation.kind for violation in check(history).violations]


# ------------------------------------------------------------------------------- clean histories


def test_an_empty_history_is_clean() -> None:
    result = check(History.of([run_header()]))
    assert result.clean and result.messages == 0 and result.unavailability.longest_gap is None


def test_acked_and_received_once_is_clean_with_figures() -> None:
    history = History.of([
        run_header(("g1", "g2")),
        ack("A", 0, 0, 1.0, sequence=0), ack("B", 0, 1, 1.5, sequence=1),
        deliver("A", 0, 0, 2.0), deliver("B", 0, 1, 2.1),
        deliver("A", 0, 0, 2.0, group="g2"), deliver("B", 0, 1, 2.1, group="g2"),
    ])
    result = check(history)
    assert result.clean, describe(result, history)
    assert (result.messages, result.acked, result.unacked, result.send_attempts) == (2, 2, 0, 2)
    assert result.groups["g1"].distinct_messages == 2 and result.groups["g1"].redeliveries == 0
    gap = result.unavailability.longest_gap
    assert gap is not None and gap.seconds == pytest.approx(0.5)


def test_redelivery_of_the_same_position_in_a_new_session_is_counted_not_a_violation() -> None:
    history = History.of([
        run_header(), ack("A", 0, 0, 1.0), ack("B", 0, 1, 1.1, sequence=1),
        deliver("A", 0, 0, 2.0, session=0), deliver("B", 0, 1, 2.1, session=0),
        deliver("B", 0, 1, 3.0, session=1),
    ])
    result = check(history)
    assert result.clean
    assert result.groups["g1"].redeliveries == 1 and result.groups["g1"].deliveries == 3


def test_an_unacknowledged_message_may_be_stored_or_not() -> None:
    history = History.of([
        run_header(), error("A", 1.0), error("B", 1.2, sequence=1), ack("C", 0, 1, 1.5, sequence=2),
        deliver("A", 0, 0, 2.0), deliver("C", 0, 1, 2.1),
    ])
    result = check(history)
    assert result.clean, describe(result, history)
    assert (result.unacked, result.unacked_stored) == (2, 1)


def test_a_retry_that_was_deduplicated_is_clean() -> None:
    history = History.of([
        run_header(), error("A", 1.0, attempt=0), ack("A", 0, 0, 2.0, attempt=1), deliver("A", 0, 0, 3.0),
    ])
    result = check(history)
    assert result.clean and result.retried_messages == 1 and result.send_attempts == 2


# ----------------------------------------------------------------------------------- violations


def test_an_acknowledged_message_never_received_is_lost() -> None:
    history = History.of([run_header(("g1", "g2")), ack("A", 0, 0, 1.0), deliver("A", 0, 0, 2.0, group="g1")])
    [violation] = check(history).violations
    assert violation.kind == "lost" and violation.uniq_keys == ("A",) and violation.group == "g2"
    assert "never received by g2" in violation.detail


def test_one_id_for_two_messages_is_a_reused_id_though_every_other_check_passes() -> None:
    """What the broker did from the 25th of each month: a second message under a repeated id was answered
    with the first one's position and never stored. Folded by UNIQ_KEY, it looks like a retry."""
    history = History.of([run_header(), ack("A", 0, 0, 1.0, sequence=0), ack("A", 0, 0, 2.0, sequence=1),
                          deliver("A", 0, 0, 3.0)])
    [violation] = check(history).violations
    assert violation.kind == "reused_id" and violation.uniq_keys == ("A",)
    assert "named 2 messages" in violation.detail and "k#0" in violation.detail and "k#1" in violation.detail


def test_a_message_at_two_queue_positions_was_stored_twice() -> None:
    history = History.of([
        run_header(), error("A", 1.0), ack("A", 0, 1, 2.0, attempt=1),
        deliver("A", 0, 0, 3.0), deliver("A", 0, 1, 3.1),
    ])
    result = check(history)
    assert [violation.kind for violation in result.violations] == ["stored_twice"]
    assert "queue 0 offset 0, queue 0 offset 1" in result.violations[0].detail


def test_stored_twice_beyond_the_dedupe_window_is_counted_not_a_violation() -> None:
    late = DEDUPE_WINDOW_SECONDS + 5
    history = History.of([
        run_header(), error("A", 1.0), ack("A", 0, 1, late, attempt=1),
        deliver("A", 0, 0, late + 1), deliver("A", 0, 1, late + 1.1),
    ])
    result = check(history)
    assert result.clean and result.stored_twice_outside_dedupe_window == 1


def test_offsets_going_back_within_a_session_break_queue_order() -> None:
    history = History.of([
        run_header(), ack("A", 0, 0, 1.0), ack("B", 0, 1, 1.1, sequence=1),
        deliver("B", 0, 1, 2.0), deliver("A", 0, 0, 2.1),
    ])
    violations = check_queue_order(history)
    assert len(violations) == 1 and violations[0].uniq_keys == ("B", "A")
    assert "offset 0 after offset 1" in violations[0].detail


def test_the_same_offset_twice_in_one_session_breaks_queue_order() -> None:
    history = History.of([run_header(), ack("A", 0, 0, 1.0), deliver("A", 0, 0, 2.0), deliver("A", 0, 0, 2.1)])
    assert kinds(history) == ["queue_order"]


def test_sharding_key_messages_stored_out_of_send_order() -> None:
    # sequence 1 was acknowledged at an offset before sequence 0
    history = History.of([
        run_header(), ack("A", 0, 1, 1.0, sequence=0), ack("B", 0, 0, 1.1, sequence=1),
        deliver("B", 0, 0, 2.0), deliver("A", 0, 1, 2.1),
    ])
    violations = check_key_order(history)
    assert len(violations) == 1 and violations[0].uniq_keys == ("A", "B")
    assert "sequence 1 is at queue 0 offset 0" in violations[0].detail


def test_sharding_key_messages_in_two_queues_break_key_order() -> None:
    history = History.of([
        run_header(), ack("A", 0, 0, 1.0, sequence=0), ack("B", 1, 0, 1.1, sequence=1),
        deliver("A", 0, 0, 2.0), deliver("B", 1, 0, 2.1),
    ])
    assert kinds(history) == ["key_order"]


def test_key_order_uses_acks_when_a_message_was_not_received() -> None:
    history = History.of([
        run_header(), ack("A", 0, 1, 1.0, sequence=0), ack("B", 0, 0, 1.1, sequence=1), deliver("B", 0, 0, 2.0),
    ])
    assert sorted(kinds(history)) == ["key_order", "lost"]


def test_delayed_messages_are_outside_key_order_and_ack_positions() -> None:
    # the ack of a delayed message names the schedule topic's queue; it arrives elsewhere, later
    history = History.of([
        run_header(), ack("A", 0, 0, 1.0, sequence=0), ack("D", 0, 7, 1.1, sequence=1, delay_level=1),
        ack("B", 0, 1, 1.2, sequence=2), deliver("A", 0, 0, 2.0), deliver("B", 0, 1, 2.1), deliver("D", 0, 2, 3.0),
    ])
    result = check(history)
    assert result.clean, describe(result, history)


def test_a_delayed_message_never_delivered_is_lost() -> None:
    history = History.of([run_header(), ack("D", 0, 7, 1.1, delay_level=1)])
    [violation] = check_lost(history)
    assert "delay level 1" in violation.detail


def test_received_elsewhere_than_acknowledged_is_an_ack_mismatch() -> None:
    history = History.of([run_header(), ack("A", 0, 0, 1.0), deliver("A", 0, 3, 2.0)])
    assert kinds(history) == ["ack_mismatch"]


def test_two_messages_at_one_position_conflict() -> None:
    history = History.of([
        run_header(("g1", "g2")), ack("A", 0, 0, 1.0), error("B", 1.1, sequence=1),
        deliver("A", 0, 0, 2.0), deliver("B", 0, 0, 2.1, group="g2"), deliver("A", 0, 0, 2.2, group="g2", session=5),
    ])
    assert kinds(history) == ["position_conflict"]


def test_a_message_nobody_sent_is_a_phantom() -> None:
    history = History.of([run_header(), deliver("Z", 2, 0, 2.0), deliver("Z", 2, 0, 2.5, session=1)])
    [violation] = check(history).violations
    assert violation.kind == "phantom" and violation.uniq_keys == ("Z",)


# ------------------------------------------------------------------------------- unavailability


def test_fault_windows_measure_first_ack_and_longest_gap() -> None:
    acks = [ack(f"A{i}", 0, i, at, sequence=i) for i, at in enumerate((1.0, 1.1, 1.2, 3.7, 3.8, 9.0, 9.1))]
    faults = [FaultEvent("kill-leader", "n0", 1.25, 6.0), FaultEvent("pause-leader", "n1", 20.0, 25.0)]
    history = History.of([run_header(), *acks, *faults])
    windows = check(history).unavailability.faults
    assert windows[0].first_ack_after_seconds == pytest.approx(2.45)
    first_gap = windows[0].longest_gap
    assert first_gap is not None and (first_gap.start, first_gap.end) == (3.8, 9.0)  # ends after the restart
    assert windows[1].first_ack_after_seconds is None and windows[1].longest_gap is None
    overall = check(history).unavailability.longest_gap
    assert overall is not None and overall.seconds == pytest.approx(5.2)


def test_a_fault_window_stops_at_the_next_fault() -> None:
    acks = [ack(f"A{i}", 0, i, at, sequence=i) for i, at in enumerate((1.0, 2.0, 2.5, 10.0))]
    faults = [FaultEvent("kill-leader", "n0", 1.5, 1.6), FaultEvent("kill-leader", "n1", 3.0, 3.1)]
    windows = check(History.of([run_header(), *acks, *faults])).unavailability.faults
    gap = windows[0].longest_gap
    assert gap is not None and (gap.start, gap.end) == (1.0, 2.0)
    gap = windows[1].longest_gap
    assert gap is not None and (gap.start, gap.end) == (2.5, 10.0)


# ------------------------------------------------------------------------------ slices, verdicts


def test_describe_prints_the_seed_and_the_slice_of_each_violation() -> None:
    history = History.of([
        run_header(seed=4242), ack("A", 0, 0, 10.0), ack("B", 0, 1, 10.5, sequence=1), deliver("B", 0, 1, 11.0),
        FaultEvent("kill-leader", "n0", 9.5, 12.0), LeaderEvent(10.8, "n1", 3), NoteEvent(50.0, "far away"),
    ])
    result = check(history)
    text = describe(result, history)
    assert text.startswith("scenario test seed 4242: 1 violation(s)")
    assert '"lost": 1' in text
    assert '"uniq_key":"A"' in text and '"type":"fault"' in text and '"type":"leader"' in text
    assert "far away" not in text  # outside the slice's time span
    assert '"uniq_key":"B"' not in text


def test_a_slice_is_bounded_and_ordered_by_time() -> None:
    events: list[Event] = [run_header(), ack("A", 0, 0, 1.0)]
    events += [deliver("A", 0, 0, 2.0 + i, session=i) for i in range(100)]
    history = History.of(events)
    violation = check(History.of([run_header(), ack("A", 0, 0, 1.0)])).violations[0]
    chosen = history_slice(violation, history, limit=10)
    assert len(chosen) == 10
    times = [event.time for event in chosen]
    assert times == sorted(times)


def test_describe_a_clean_result() -> None:
    history = History.of([run_header(seed=1)])
    assert describe(check(history), history) == "scenario test seed 1: clean"


def test_result_json_is_serializable() -> None:
    history = History.of([run_header(), ack("A", 0, 0, 1.0), FaultEvent("kill-leader", "n0", 0.5, 2.0)])
    document = json.loads(json.dumps(check(history).to_json()))
    assert document["clean"] is False and document["violation_counts"]["lost"] == 1
    assert document["unavailability"]["faults"][0]["first_ack_after_seconds"] == 0.5


# --------------------------------------------------------------------------------- history file


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    events: list[Event] = [
        run_header(("g1", "g2")), ack("A", 0, 0, 1.0), error("B", 1.5, code=2), deliver("A", 0, 0, 2.0),
        SessionEvent("g1", 3, 0, 0, 1.9, "start", "127.0.0.1:9"), OffsetCommitEvent("g1", 0, 1, 2.5),
        FaultEvent("partition-leader", "n2", 3.0, 4.0, "blackhole"), LeaderEvent(3.5, None, 0),
        LeaderEvent(3.6, "n1", 4), NoteEvent(3.7, "offset moved", "queue 0"),
    ]
    history = History.of(events)
    path = tmp_path / "history.jsonl"
    write_history(path, history)
    again = read_history(path)
    assert again == history
    assert again.events() == history.events()


@pytest.mark.parametrize("line, message", [
    ("[]", "must be a JSON object"),
    ("not json", "not JSON"),
    ('{"type": "bogus"}', "unknown event type"),
    ('{"type": "leader", "time": 1.0, "leader": "n0"}', "lacks 'term'"),
    ('{"type": "leader", "time": 1.0, "leader": "n0", "term": 1, "extra": 2}', "unknown field"),
    ('{"type": "leader", "time": "1", "leader": "n0", "term": 1}', "must be float"),
    ('{"type": "leader", "time": 1, "leader": "n0", "term": true}', "must be int"),
    ('{"type": "send", "producer": "p", "uniq_key": "A", "sharding_key": "k", "sequence": 0, "attempt": 0, '
     '"send_time": 0, "end_time": 1, "acked": 1}', "must be bool"),
    ('{"type": "run", "scenario": "s", "seed": 1, "topic": "t", "queues": 1, "groups": [1], "nodes": [], '
     '"started_at_epoch_seconds": 0, "duration_seconds": 1}', "list of strings"),
])
def test_bad_history_lines_are_refused(line: str, message: str) -> None:
    with pytest.raises(HistoryError, match=message):
        decode_event(line)


def test_a_bad_line_names_its_file_and_number(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(encode_event(run_header()) + "\n\n" + '{"type": "nope"}\n')
    with pytest.raises(HistoryError, match=r"history.jsonl line 3"):
        read_history(path)


def test_a_history_has_one_header() -> None:
    with pytest.raises(HistoryError, match="one run header"):
        History.of([run_header(), run_header()])


def test_integer_times_decode_as_floats() -> None:
    event = decode_event('{"type": "leader", "time": 2, "leader": null, "term": 0}')
    assert event == LeaderEvent(2.0, None, 0) and isinstance(event.time, float)


# ------------------------------------------------------------------------------------ properties


@st.composite
def model_histories(draw: st.DrawFn) -> tuple[Model, History]:
    seed = draw(st.integers(0, 2**32 - 1))
    model = Model(queues=draw(st.integers(1, 4)), groups=draw(st.sampled_from((("g1",), ("g1", "g2")))),
                  rng=random.Random(seed))
    keys = [f"k{i}" for i in range(draw(st.integers(1, 4)))]
    for number in range(draw(st.integers(0, 30))):
        model.send(number, draw(st.sampled_from(keys)), draw(st.sampled_from(("ack", "ack", "ack", "stored", "dropped"))),
                   draw(st.integers(1, 3)))
        if draw(st.integers(0, 9)) == 0:
            model.faults.append(FaultEvent("kill-leader", "n0", model.time, model.time + 0.5))
    return model, model.history(restarts=draw(st.integers(0, 2)))


@settings(max_examples=150, deadline=None)
@given(model_histories())
def test_a_correct_model_is_clean(generated: tuple[Model, History]) -> None:
    model, history = generated
    result = check(history)
    assert result.clean, describe(result, history)
    assert result.acked == sum(1 for send in model.sends if send.acked)
    for figures in result.groups.values():
        assert figures.distinct_messages == sum(len(contents) for contents in model.stored.values())
        assert figures.deliveries == figures.distinct_messages + figures.redeliveries


@settings(max_examples=100, deadline=None)
@given(model_histories(), st.data())
def test_dropping_a_received_acked_message_is_reported_lost_exactly(generated: tuple[Model, History],
                                                                     data: st.DataObject) -> None:
    _, history = generated
    acked = sorted({send.uniq_key for send in history.sends if send.acked})
    if not acked:
        return
    victim = data.draw(st.sampled_from(acked))
    history.deliveries = [delivery for delivery in history.deliveries if delivery.uniq_key != victim]
    result = check(history)
    assert [(violation.kind, violation.uniq_keys) for violation in result.violations] == [("lost", (victim,))]


@settings(max_examples=100, deadline=None)
@given(model_histories(), st.data())
def test_a_message_stored_again_is_reported_stored_twice(generated: tuple[Model, History],
                                                        data: st.DataObject) -> None:
    model, history = generated
    if not history.deliveries:
        return
    original = data.draw(st.sampled_from(history.deliveries))
    end = len(model.stored.get(original.queue, []))
    # the broker appended it again at the end of its queue, and a new session read it there
    history.deliveries.append(dataclasses.replace(original, queue_offset=end, session=10_000, time=model.tick()))
    stored_twice = [violation for violation in check(history).violations if violation.kind == "stored_twice"]
    assert [violation.uniq_keys for violation in stored_twice] == [(original.uniq_key,)]


@settings(max_examples=100, deadline=None)
@given(model_histories(), st.data())
def test_swapping_two_deliveries_of_a_session_breaks_queue_order(generated: tuple[Model, History],
                                                                  data: st.DataObject) -> None:
    _, history = generated
    pairs = [index for index in range(len(history.deliveries) - 1)
             if (history.deliveries[index].group, history.deliveries[index].session)
             == (history.deliveries[index + 1].group, history.deliveries[index + 1].session)]
    if not pairs:
        return
    index = data.draw(st.sampled_from(pairs))
    deliveries = history.deliveries
    deliveries[index], deliveries[index + 1] = deliveries[index + 1], deliveries[index]
    assert "queue_order" in kinds(history)


@settings(max_examples=50, deadline=None)
@given(model_histories())
def test_an_unknown_message_received_is_a_phantom(generated: tuple[Model, History]) -> None:
    _, history = generated
    history.deliveries.append(DeliveryEvent("g1", 99_999, "NEVER-SENT", 0, 10_000, 1e6, ""))
    assert kinds(history) == ["phantom"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1000, allow_nan=False), max_size=30))
def test_the_longest_gap_is_the_largest_difference_of_sorted_times(times: list[float]) -> None:
    ordered = sorted(times)
    gap = longest_gap(ordered)
    if len(ordered) < 2:
        assert gap is None
    else:
        assert gap is not None
        assert gap.seconds == max(later - earlier for earlier, later in itertools.pairwise(ordered))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=30), st.floats(0, 100), st.floats(0, 50))
def test_a_bounded_gap_overlaps_its_bounds(times: list[float], start: float, length: float) -> None:
    ordered = sorted(times)
    gap = longest_gap(ordered, start, start + length)
    overlapping = [(earlier, later) for earlier, later in itertools.pairwise(ordered)
                   if later >= start and earlier <= start + length]
    if not overlapping:
        assert gap is None
    else:
        assert gap is not None and gap.seconds == max(later - earlier for earlier, later in overlapping)


def test_recovery_ignores_an_answer_already_on_its_way() -> None:
    # an ack lands 10 ms after the kill (sent before it); the outage follows
    acks = [ack(f"A{i}", 0, i, at, sequence=i) for i, at in enumerate((1.0, 2.01, 4.0, 4.1))]
    history = History.of([run_header(), *acks, FaultEvent("kill-leader", "n0", 2.0, 3.0)])
    [window] = check(history).unavailability.faults
    assert window.first_ack_after_seconds == pytest.approx(0.01)
    assert window.recovery_seconds == pytest.approx(2.0)
    assert window.to_json()["recovery_seconds"] == 2.0


def test_no_recovery_time_when_the_gap_came_after_the_fault() -> None:
    acks = [ack(f"A{i}", 0, i, at, sequence=i) for i, at in enumerate((1.0, 1.1, 1.2, 4.0, 6.0))]
    history = History.of([run_header(), *acks, FaultEvent("wipe", "n1", 1.05, 1.15)])
    [window] = check(history).unavailability.faults
    assert window.longest_gap is not None and window.longest_gap.start == 1.2  # after the wipe ended
    assert window.recovery_seconds is None
