"""The human summary ``broker_bench.py`` prints after its JSON lines: each raftmq figure next to NATS
JetStream's from the same run, as a ratio (raftmq / NATS: 1.0x or more is the target for throughput; for
CPU per message, less is cheaper). Pure: records in, text out.

With several rounds (records carrying ``round``, ``broker_bench.py --rounds N``), each figure is the median
of its rounds, and each ratio the median of the ratios of the same round (the two systems measured minutes
apart, not a whole run apart: the drift of a shared machine cancels), followed by the lowest and highest of
them: ``0.52x (0.49-0.55)``."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

Record = Mapping[str, Any]
#: the processes of the CPU table, in this order (a system without one shows "-")
CPU_COLUMNS: Final = ("leader", "follower_1", "follower_2", "namesrv", "client", "total")


def system_label(record: Record) -> str:
    """``raftmq durable``, ``raftmq page_cache``, ``raftmq <variant>`` (``... SDK``: our producer, sends
    coalesced; otherwise one frame per send, as stock clients send; ``... via a follower``: sent to a follower,
    which forwards them), ``NATS default``, ``NATS always``."""
    if record.get("system") == "nats":
        return f"NATS {record.get('nats_sync_setting', 'default')}"
    label = f"raftmq {record.get('variant') or record.get('journal_flush', '')}".strip()
    if record.get("route") == "follower":
        label = f"{label} via a follower"
    return f"{label} SDK" if record.get("client") == "sdk" else label


def ratio(numerator: object, denominator: object) -> str:
    if not isinstance(numerator, int | float) or not isinstance(denominator, int | float) or denominator <= 0:
        return "-"
    return f"{numerator / denominator:.2f}x"


def _same_figure(record: Record) -> tuple[object, ...]:
    """What makes two records the same figure of different rounds."""
    return (record.get("mode"), record.get("in_flight"), system_label(record), record.get("client"),
            record.get("cpp_mode"))


def _median(values: Sequence[object]) -> object:
    numbers = [value for value in values if isinstance(value, int | float)]
    return statistics.median(numbers) if numbers else None


def merge_rounds(records: Sequence[Record]) -> list[dict[str, Any]]:
    """One record per figure: the median of each number over its rounds (CPU per process too), with every
    round's record kept under ``by_round`` (round -> record) for the paired ratios. Order: first appearance."""
    groups: dict[tuple[object, ...], list[Record]] = {}
    for record in records:
        groups.setdefault(_same_figure(record), []).append(record)
    merged: list[dict[str, Any]] = []
    for group in groups.values():
        figure: dict[str, Any] = dict(group[0])
        for key in ("msgs_per_s", "MB_per_s", "p50_ms", "p99_ms"):
            figure[key] = _median([member.get(key) for member in group])
        cpus = [member["cpu_us_per_msg"] for member in group if isinstance(member.get("cpu_us_per_msg"), dict)]
        if cpus:
            figure["cpu_us_per_msg"] = {column: _median([cpu.get(column) for cpu in cpus])
                                        for column in dict.fromkeys(column for cpu in cpus for column in cpu)}
        figure["by_round"] = {member.get("round", 0): member for member in group}
        merged.append(figure)
    return merged


def paired_ratio(record: Record, other: Record | None, read: Any) -> str:
    """``read(record) / read(other)``: of single records, or over rounds (``merge_rounds``) the median of the
    same-round ratios and their range."""
    if other is None:
        return "-"
    mine, theirs = record.get("by_round", {}), other.get("by_round", {})
    shared = [round_ for round_ in mine if round_ in theirs]
    if len(shared) < 2:
        return ratio(read(record), read(other))
    ratios = []
    for round_ in shared:
        numerator, denominator = read(mine[round_]), read(theirs[round_])
        if isinstance(numerator, int | float) and isinstance(denominator, int | float) and denominator > 0:
            ratios.append(numerator / denominator)
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _msgs_per_s(record: Record) -> object:
    return record.get("msgs_per_s")


def _cpu_total(record: Record) -> object:
    cpu = record.get("cpu_us_per_msg")
    return cpu.get("total") if isinstance(cpu, dict) else None


def _number(value: object, digits: int = 0) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:,.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    rows = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return ["  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                      for column, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def render(records: Sequence[Record], notes: Sequence[str] = ()) -> str:
    rounds = len({record.get("round", 0) for record in records})
    records = merge_rounds(records)
    python = [record for record in records if record.get("client", "python") != "cpp"]
    produce = [record for record in python if record.get("mode") == "produce"]
    consume = [record for record in python if record.get("mode") == "consume"]
    nats_labels = list(dict.fromkeys(system_label(record) for record in records if record.get("system") == "nats"))
    lines: list[str] = list(notes)
    if rounds > 1:
        lines.append(f"{rounds} rounds, each system once a round (every other round in reverse order): figures are "
                     "medians over the rounds; ratios the median of the same-round ratios (lowest-highest)")
    if lines:
        lines.append("")

    def reference(mode: str, in_flight: object, label: str) -> Record | None:
        return next((record for record in python if record.get("mode") == mode and system_label(record) == label
                     and record.get("in_flight") == in_flight), None)

    def versus(record: Record, key: str) -> list[str]:
        if record.get("system") == "nats":
            return ["" for _ in nats_labels]
        return [paired_ratio(record, reference(str(record.get("mode")), record.get("in_flight"), label),
                             lambda figure: figure.get(key)) for label in nats_labels]

    in_flights = list(dict.fromkeys(record.get("in_flight") for record in produce))
    lines.append("produce: acknowledged 1 KB sends from one client process "
                 "(ratio: raftmq msgs/s / NATS msgs/s, target >= 1.00x)")
    lines += _table(["in-flight", "system", "msgs/s", "p50 ms", "p99 ms", *(f"vs {label}" for label in nats_labels)],
                    ([str(record.get("in_flight")), system_label(record), _number(record.get("msgs_per_s")),
                      _number(record.get("p50_ms"), 2), _number(record.get("p99_ms"), 2), *versus(record, "msgs_per_s")]
                     for in_flight in in_flights for record in produce if record.get("in_flight") == in_flight))
    if consume:
        lines += ["", "consume: every produced message, 32 a pull (raftmq PULL_MESSAGE; NATS pull consumer fetch)"]
        lines += _table(["system", "msgs/s", "MB/s", *(f"vs {label}" for label in nats_labels)],
                        ([system_label(record), _number(record.get("msgs_per_s")), _number(record.get("MB_per_s"), 1),
                          *versus(record, "msgs_per_s")] for record in consume))
    measured = [record for record in [*produce, *consume] if isinstance(record.get("cpu_us_per_msg"), dict)]
    if measured:
        lines += ["", "CPU microseconds per message, per process (utime + stime; ratio: raftmq total / NATS total, "
                  "lower is cheaper)"]

        def cpu_versus(record: Record) -> list[str]:
            if record.get("system") == "nats":
                return ["" for _ in nats_labels]
            return [paired_ratio(record, reference(str(record.get("mode")), record.get("in_flight"), label), _cpu_total)
                    for label in nats_labels]

        lines += _table(["setting", "system", *CPU_COLUMNS, *(f"vs {label}" for label in nats_labels)],
                        ([f"in-flight {record.get('in_flight')}" if record.get("mode") == "produce" else "consume",
                          system_label(record), *(_number(record["cpu_us_per_msg"].get(column), 1)
                                                  for column in CPU_COLUMNS), *cpu_versus(record)]
                         for record in measured))
    stock = [record for record in records if record.get("client") == "cpp"]
    if stock:
        lines += ["", "the stock C++ client (rocketmq 0.4.4) against the same group, next to our Python client "
                  "(ratio: C++ msgs/s / ours at the same in-flight)"]
        rows = []
        for record in stock:
            ours = reference("produce", record.get("in_flight"), system_label(record))
            cpu = record.get("cpu_us_per_msg") or {}
            rows.append([f"{record.get('cpp_mode')}", str(record.get("in_flight")), _number(record.get("msgs_per_s")),
                         _number(record.get("p50_ms"), 2), _number(record.get("p99_ms"), 2),
                         _number(cpu.get("client"), 1), _number(cpu.get("total"), 1),
                         _number(None if ours is None else ours.get("msgs_per_s")),
                         _number(None if ours is None else ours.get("p50_ms"), 2),
                         _number(None if ours is None else ours.get("p99_ms"), 2),
                         paired_ratio(record, ours, _msgs_per_s)])
        lines += _table(["C++ mode", "in-flight", "msgs/s", "p50 ms", "p99 ms", "client us/msg", "total us/msg",
                         "ours msgs/s", "ours p50", "ours p99", "C++ / ours"], rows)
    return "\n".join(lines)
