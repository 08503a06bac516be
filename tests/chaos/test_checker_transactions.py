"""The checker on transactional sends: a committed one is an acknowledged send, a rolled-back one must
never be received; and the workload's decision is a pure function of the seed's salt and the UNIQ_KEY."""

from __future__ import annotations

import dataclasses

from chaos.checker import check, check_lost, check_rolled_back, describe
from chaos.history import (
    TRANSACTION_COMMIT,
    TRANSACTION_ROLLBACK,
    History,
    SendEvent,
    decode_event,
    encode_event,
)
from chaos.workload import WorkloadConfig, transaction_decision
from tests.chaos.history_builders import ack, deliver, error, run_header

HALF_QUEUE = 0


def transaction(uniq_key: str, half_offset: int, at: float, decision: str, *, checked_back: bool = False,
                acked: bool = True, key: str = "k", sequence: int = 0) -> SendEvent:
    """A transactional send: its ack names the half queue's position, not the real topic's."""
    base = ack(uniq_key, HALF_QUEUE, half_offset, at, key=key, sequence=sequence) if acked else error(
        uniq_key, at, key=key, sequence=sequence)
    return dataclasses.replace(base, transaction=decision, checked_back=checked_back)


def kinds(history: History) -> list[str]:
    return [violation.kind for violation in check(history).violations]


def test_a_transactional_send_round_trips_through_the_history_format() -> None:
    event = transaction("T", 3, 1.0, TRANSACTION_ROLLBACK, checked_back=True)
    assert decode_event(encode_event(event)) == event
    # histories written before transactions decode as plain sends
    line = encode_event(ack("A", 0, 0, 1.0)).replace(',"transaction":"","checked_back":false', "")
    assert decode_event(line) == ack("A", 0, 0, 1.0)


def test_a_committed_transaction_received_once_per_group_is_clean() -> None:
    history = History.of([
        run_header(("g1", "g2")),
        transaction("T", 7, 1.0, TRANSACTION_COMMIT), transaction("C", 8, 1.1, TRANSACTION_COMMIT, checked_back=True),
        # received at its real queue position (not the half's): not an ack mismatch
        deliver("T", 2, 0, 2.0), deliver("T", 2, 0, 2.5, group="g2"),
        deliver("C", 3, 0, 4.0), deliver("C", 3, 0, 4.0, group="g2"), deliver("C", 3, 0, 5.0, session=1),
    ])
    result = check(history)
    assert result.clean, describe(result, history)
    assert result.transactions["committed"] == 2 and result.transactions["committed_received"] == 2
    assert result.transactions["checked_back"] == 1


def test_a_committed_acked_transaction_never_received_is_lost() -> None:
    history = History.of([run_header(("g1", "g2")), transaction("T", 7, 1.0, TRANSACTION_COMMIT, checked_back=True),
                          deliver("T", 2, 0, 2.0)])
    violations = check_lost(history)
    assert [violation.kind for violation in violations] == ["lost"]
    assert violations[0].group == "g2" and "committed transaction (checked back)" in violations[0].detail


def test_a_committed_transaction_stored_twice_is_a_violation() -> None:
    history = History.of([run_header(), transaction("T", 7, 1.0, TRANSACTION_COMMIT),
                          deliver("T", 2, 0, 2.0), deliver("T", 2, 5, 3.0)])
    assert kinds(history) == ["stored_twice"]


def test_a_committed_transaction_whose_half_was_not_acked_may_or_may_not_arrive() -> None:
    unacked = transaction("T", 0, 1.0, TRANSACTION_COMMIT, acked=False)
    assert check(History.of([run_header(), unacked])).clean
    result = check(History.of([run_header(), unacked, deliver("T", 1, 0, 2.0)]))
    assert result.clean and result.unacked_stored == 1


def test_a_rolled_back_transaction_received_is_a_violation_acked_or_not() -> None:
    for acked in (True, False):
        history = History.of([
            run_header(("g1", "g2")),
            transaction("R", 4, 1.0, TRANSACTION_ROLLBACK, checked_back=True, acked=acked),
            deliver("R", 1, 9, 3.0, group="g2"), deliver("R", 1, 9, 3.5),
        ])
        assert kinds(history) == ["rolled_back_consumed"]
        (violation,) = check_rolled_back(history)
        assert violation.group == "g2" and violation.uniq_keys == ("R",)
        assert "check-back" in violation.detail and "queue 1 offset 9" in violation.detail
        assert "rolled_back_consumed" in describe(check(history), history)


def test_a_rolled_back_transaction_never_received_is_clean_and_not_lost() -> None:
    history = History.of([run_header(("g1", "g2")), transaction("R", 4, 1.0, TRANSACTION_ROLLBACK)])
    result = check(history)
    assert result.clean and result.acked == 1
    assert result.transactions["rolled_back"] == 1 and result.transactions["rolled_back_received"] == 0


def test_transactional_sends_stay_out_of_the_sharding_key_order() -> None:
    # the committed message lands in the queue the half chose, after its plain neighbours: not an order fault
    history = History.of([
        run_header(),
        ack("A", 0, 0, 1.0, sequence=0), transaction("T", 0, 1.2, TRANSACTION_COMMIT, sequence=1),
        ack("B", 0, 1, 1.4, sequence=2),
        deliver("A", 0, 0, 2.0), deliver("B", 0, 1, 2.1), deliver("T", 3, 0, 2.2),
    ])
    assert check(history).clean


def test_the_decision_is_a_pure_function_of_salt_and_uniq_key() -> None:
    config = WorkloadConfig(transaction_rollback_fraction=0.3, transaction_unknown_fraction=0.3)
    keys = [f"U{number:05d}" for number in range(2000)]
    first = [transaction_decision(11, key, config) for key in keys]
    assert first == [transaction_decision(11, key, config) for key in keys]
    assert first != [transaction_decision(12, key, config) for key in keys]
    rollbacks = sum(not decision.commit for decision in first) / len(keys)
    unknown = sum(decision.unknown_first for decision in first) / len(keys)
    assert 0.25 < rollbacks < 0.35 and 0.25 < unknown < 0.35
    never = WorkloadConfig(transaction_rollback_fraction=0.0, transaction_unknown_fraction=0.0)
    assert all(transaction_decision(11, key, never).commit for key in keys[:100])
