"""CPU time per process from ``/proc/<pid>/stat`` (utime + stime: every thread of the process, including
threads that ended meanwhile), sampled before and after one measurement: the CPU microseconds each
process spent per acknowledged message. That figure does not drift with the host's speed the way msgs/s
does, and on a shared machine it is not paced by the other engineers' runs.

The kernel counts in clock ticks (``SC_CLK_TCK``, 100 per second on Linux): a process's figure is exact to
one tick, 10 ms, over the whole measurement.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

CLOCK_TICKS_PER_SECOND: Final = os.sysconf("SC_CLK_TCK")
#: the label under which a measurement's processes are added up
TOTAL: Final = "total"


def parse_cpu_ticks(stat_line: str) -> int:
    """utime + stime (fields 14 and 15 of ``proc(5)``) of one ``/proc/<pid>/stat`` line. The command name,
    field 2, is in parentheses and may hold spaces and parentheses: fields are counted after its last ')'."""
    after_name = stat_line.rsplit(")", 1)[1].split()
    # after_name[0] is field 3 (state), so field N is after_name[N - 3]
    return int(after_name[11]) + int(after_name[12])


def cpu_ticks(pid: int) -> int | None:
    """The process's CPU ticks so far, or None when it is gone."""
    try:
        return parse_cpu_ticks(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):
        return None


def sample(processes: Mapping[str, int]) -> dict[str, int | None]:
    """Each labelled process's CPU ticks now (None for a process that is gone)."""
    return {label: cpu_ticks(pid) for label, pid in processes.items()}


def microseconds_per_message(before: Mapping[str, int | None], after: Mapping[str, int | None],
                             messages: int) -> dict[str, float | None]:
    """CPU microseconds per message of each process between two samples, and their ``total``; None for a
    process that was not there at both samples (the total then leaves it out)."""
    figures: dict[str, float | None] = {}
    total = 0.0
    for label, start in before.items():
        end = after.get(label)
        if start is None or end is None or messages <= 0:
            figures[label] = None
            continue
        figures[label] = round((end - start) * 1e6 / CLOCK_TICKS_PER_SECOND / messages, 1)
        total += (end - start) * 1e6 / CLOCK_TICKS_PER_SECOND / messages
    figures[TOTAL] = round(total, 1) if messages > 0 else None
    return figures


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120] or "?"


def _all_ticks() -> dict[int, int]:
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            value = cpu_ticks(int(entry.name))
            if value is not None:
                ticks[int(entry.name)] = value
    return ticks


def busy_neighbours(seconds: float = 1.0, share_min: float = 0.05,
                    sleep: Callable[[float], None] = time.sleep) -> list[tuple[float, int, str]]:
    """Processes other than this one that used at least ``share_min`` of a core over the next ``seconds``:
    (share of a core, pid, command line), busiest first. A benchmark run next to them measures them too:
    a forgotten cluster idles at a few percent of a core per member."""
    before = _all_ticks()
    sleep(seconds)
    after = _all_ticks()
    own = os.getpid()
    busy = []
    for pid, ticks in after.items():
        share = (ticks - before.get(pid, ticks)) / CLOCK_TICKS_PER_SECOND / seconds
        if pid != own and share >= share_min:
            busy.append((share, pid, _command(pid)))
    return sorted(busy, reverse=True)
