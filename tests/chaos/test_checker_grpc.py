"""The chaos checker over hand-built histories with 5.x operations (chaos.grpc_workload): pop deliveries and
acks, a 5.x ack that names no queue, the ``acked_redelivered`` violation, the history format of the new fields,
the drain's view of a 5.x group, and the Spark history a 5.x send is written as."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.checker import check, check_ack_positions, check_acked_redelivered, check_queue_order, describe
from chaos.history import DeliveryEvent, History, PopAckEvent, SendEvent, decode_event, encode_event
from chaos.runner import write_verify_history
from chaos.workload import Recorder, WorkloadConfig
from tests.chaos.history_builders import ack, run_header

GROUP = "v5"


def send_v5(uniq_key: str, offset: int, at: float, *, key: str = "k5", sequence: int = 0) -> SendEvent:
    """An acknowledged 5.x send: its ack names the queue offset, not the queue."""
    return SendEvent("p2-v5", uniq_key, key, sequence, 0, at - 0.01, at, True, None, "", None, offset, 0,
                     "127.0.0.1:9")


def pop(uniq_key: str, queue: int, offset: int, requested: float, at: float, *, attempt: int = 1,
        session: int = 0) -> DeliveryEvent:
    return DeliveryEvent(GROUP, session, uniq_key, queue, offset, at, "127.0.0.1:9", attempt, requested)


def pop_ack(uniq_key: str, queue: int, offset: int, at: float, *, acked: bool = True) -> PopAckEvent:
    return PopAckEvent(GROUP, uniq_key, queue, offset, at - 0.01, at, acked, None if acked else 40, "", "127.0.0.1:9")


def history(*events: object) -> History:
    built = History.of([run_header((GROUP,))])
    for event in events:
        built.add(event)  # type: ignore[arg-type]
    return built


def test_a_clean_pop_history_with_redelivery_of_an_unacked_message_is_clean() -> None:
    clean = history(
        send_v5("A", 0, 1.0, sequence=0), send_v5("B", 1, 1.1, sequence=1), ack("C", 2, 0, 1.2),
        # B and C in one receive (offsets of several queues), then A; B's ack failed: it comes back, attempt 2
        pop("B", 1, 1, 1.3, 1.4, session=1), pop("C", 2, 0, 1.3, 1.4, session=1), pop("A", 1, 0, 1.5, 1.6, session=2),
        pop_ack("B", 1, 1, 1.45, acked=False), pop_ack("C", 2, 0, 1.45), pop_ack("A", 1, 0, 1.65),
        pop("B", 1, 1, 7.0, 7.1, attempt=2, session=3), pop_ack("B", 1, 1, 7.2))
    result = check(clean)
    assert result.clean, describe(result, clean)
    assert result.acked == 3 and result.groups[GROUP].redeliveries == 1


def test_an_acknowledged_message_delivered_to_a_later_receive_is_a_violation() -> None:
    broken = history(send_v5("A", 0, 1.0), pop("A", 1, 0, 1.1, 1.2), pop_ack("A", 1, 0, 1.3),
                     pop("A", 1, 0, 7.0, 7.1, attempt=2, session=1), pop("A", 1, 0, 9.0, 9.1, attempt=3, session=2))
    violations = check_acked_redelivered(broken)
    assert [violation.kind for violation in violations] == ["acked_redelivered"]  # once per message
    assert violations[0].uniq_keys == ("A",) and violations[0].group == GROUP
    result = check(broken)
    assert result.counts()["acked_redelivered"] == 1
    text = describe(result, broken)
    assert "acked_redelivered" in text and '"type":"pop-ack"' in text  # the slice shows the ack


def test_a_receive_sent_before_the_ack_was_answered_may_carry_the_message() -> None:
    # another consumer's receive, sent before the ack came back, returned afterwards: not a violation
    racing = history(send_v5("A", 0, 1.0), pop("A", 1, 0, 1.1, 1.2), pop_ack("A", 1, 0, 1.5),
                     pop("A", 1, 0, 1.45, 1.6, attempt=2, session=1))
    assert check_acked_redelivered(racing) == []
    # a failed ack promises nothing; nor does an ack of the group's other copy (stored twice is its own kind)
    failed = history(send_v5("A", 0, 1.0), pop("A", 1, 0, 1.1, 1.2), pop_ack("A", 1, 0, 1.3, acked=False),
                     pop("A", 1, 0, 7.0, 7.1, attempt=2, session=1), pop("A", 2, 5, 8.0, 8.1, session=2))
    assert check_acked_redelivered(failed) == []


def test_a_5x_ack_is_compared_by_its_queue_offset_and_pop_deliveries_are_not_held_to_session_order() -> None:
    moved = history(send_v5("A", 3, 1.0), pop("A", 2, 4, 1.1, 1.2))
    (mismatch,) = check_ack_positions(moved)
    assert mismatch.kind == "ack_mismatch" and "offset 4" in mismatch.detail
    assert check_ack_positions(history(send_v5("A", 3, 1.0), pop("A", 2, 3, 1.1, 1.2))) == []
    # one receive handed out a revived offset after a newer one of the same queue
    out_of_order = history(send_v5("A", 0, 1.0), send_v5("B", 1, 1.1, sequence=1),
                           pop("B", 1, 1, 1.2, 1.3), pop("A", 1, 0, 1.2, 1.3))
    assert check_queue_order(out_of_order) == []


def test_a_5x_send_lost_by_a_pop_group_is_lost() -> None:
    lost = history(send_v5("A", 0, 1.0), send_v5("B", 1, 1.1, sequence=1), pop("A", 1, 0, 1.2, 1.3))
    result = check(lost)
    assert [violation.kind for violation in result.violations] == ["lost"]
    assert "queue None offset 1" in result.violations[0].detail


def test_the_new_fields_and_events_survive_the_history_file() -> None:
    for event in (pop("A", 1, 0, 1.25, 1.5, attempt=3), pop_ack("A", 1, 0, 2.0, acked=False), send_v5("A", 7, 1.0),
                  DeliveryEvent("g", 1, "A", 0, 0, 1.0)):
        assert decode_event(encode_event(event)) == event
    old_line = '{"type":"deliver","group":"g","session":1,"uniq_key":"A","queue":0,"queue_offset":0,"time":1.0}'
    assert decode_event(old_line) == DeliveryEvent("g", 1, "A", 0, 0, 1.0)  # histories before 5.x still read


def test_the_drain_waits_for_a_5x_group_to_acknowledge_not_only_to_receive() -> None:
    recorder = Recorder(clock=lambda: 0.0)
    recorder.pop_groups.add(GROUP)
    recorder.record(send_v5("A", 0, 1.0))
    recorder.record(pop("A", 1, 0, 1.1, 1.2))
    recorder.record(DeliveryEvent("g4", 0, "A", 1, 0, 1.2))
    assert recorder.missing(GROUP) == 1 and recorder.missing("g4") == 0
    recorder.record(pop_ack("A", 1, 0, 1.3, acked=False))  # refused: the message must come back
    assert recorder.missing(GROUP) == 1
    recorder.record(pop_ack("A", 1, 0, 1.4))
    assert recorder.missing(GROUP) == 0
    # an ack that got no answer may have been committed: the message may never come back
    recorder.record(send_v5("B", 1, 2.0))
    recorder.record(pop("B", 2, 0, 2.1, 2.2))
    recorder.record(PopAckEvent(GROUP, "B", 2, 0, 2.3, 4.3, False, None, "DEADLINE_EXCEEDED"))
    assert recorder.missing(GROUP) == 0


def test_the_workload_configuration_of_5x_clients() -> None:
    config = WorkloadConfig(producers=3, grpc_producers=1, grpc_groups=("v5",)).validate()
    assert config.group_names == ("chaos-leader-reads", "chaos-any-reads", "v5") and config.uses_grpc
    assert not WorkloadConfig().uses_grpc and WorkloadConfig().group_names == ("chaos-leader-reads", "chaos-any-reads")
    for bad in (WorkloadConfig(producers=2, grpc_producers=3), WorkloadConfig(grpc_producers=3, burst_messages=10),
                WorkloadConfig(grpc_groups=("chaos-any-reads",)), WorkloadConfig(grpc_groups=("v5", "v5"))):
        try:
            bad.validate()
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_the_spark_history_of_a_5x_send_has_no_position(tmp_path: Path) -> None:
    source, target = tmp_path / "history.jsonl", tmp_path / "verify.jsonl"
    source.write_text("\n".join(encode_event(event) for event in (send_v5("A", 7, 1.0), ack("B", 2, 5, 1.0))) + "\n")
    write_verify_history(source, target)
    v5, v4 = (json.loads(line) for line in target.read_text().splitlines())
    assert v5["uniq_key"] == "A" and "queue_offset" not in v5 and v5["acked"] is True
    assert v4["queue"] == 2 and v4["queue_offset"] == 5
