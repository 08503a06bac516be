"""bench/cpu_meter.py: CPU per process from /proc, and the busy neighbours a benchmark warns about."""

from __future__ import annotations

import subprocess
import sys

from bench.cpu_meter import busy_neighbours, parse_cpu_ticks


def test_utime_and_stime_are_read_after_a_command_name_with_parentheses() -> None:
    line = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 100 23 0 0"
    assert parse_cpu_ticks(line) == 123


def test_a_spinning_process_is_a_busy_neighbour_and_this_process_is_not() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = busy_neighbours(seconds=0.5, share_min=0.2)
    finally:
        spinner.kill()
        spinner.wait()
    pids = [pid for _, pid, _ in busy]
    assert spinner.pid in pids
    share, _, command = busy[pids.index(spinner.pid)]
    assert share >= 0.2 and "while True" in command
