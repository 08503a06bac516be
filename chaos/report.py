"""A chaos run's report: figures derived from the history and the check (``report.json``), and the
timeline plot (``timeline.png``: acknowledged messages per second, send errors, faults, leader changes,
unavailability windows)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from chaos.checker import CheckResult, FaultWindow
from chaos.history import History


def fault_figures(windows: tuple[FaultWindow, ...]) -> dict[str, dict[str, Any]]:
    """Per fault kind: how many, and p50 / max (seconds) of the time to the first ack after the fault, of
    the longest ack gap around it, and of the recovery time (fault start to the end of that gap). A fault
    with no ack after it counts in ``without_ack``."""
    by_kind: dict[str, list[FaultWindow]] = defaultdict(list)
    for window in windows:
        by_kind[window.fault.kind].append(window)
    figures = {}
    for kind, members in sorted(by_kind.items()):
        first = [window.first_ack_after_seconds for window in members if window.first_ack_after_seconds is not None]
        gaps = [window.longest_gap.seconds for window in members if window.longest_gap is not None]
        recoveries = [window.recovery_seconds for window in members if window.recovery_seconds is not None]
        figures[kind] = {
            "count": len(members),
            "without_ack": len(members) - len(first),
            "first_ack_after_p50_seconds": round(statistics.median(first), 3) if first else None,
            "first_ack_after_max_seconds": round(max(first), 3) if first else None,
            "longest_gap_p50_seconds": round(statistics.median(gaps), 3) if gaps else None,
            "longest_gap_max_seconds": round(max(gaps), 3) if gaps else None,
            "recovery_p50_seconds": round(statistics.median(recoveries), 3) if recoveries else None,
            "recovery_max_seconds": round(max(recoveries), 3) if recoveries else None,
        }
    return figures


def throughput(history: History, bin_seconds: float = 1.0) -> tuple[list[float], list[int], list[int]]:
    """(bin starts, acks per bin, send errors per bin) over the run."""
    times = [send.end_time for send in history.sends]
    if not times:
        return [], [], []
    bins = int(max(times) // bin_seconds) + 1
    acks = [0] * bins
    errors = [0] * bins
    for send in history.sends:
        index = int(send.end_time // bin_seconds)
        if send.acked:
            acks[index] += 1
        else:
            errors[index] += 1
    return [index * bin_seconds for index in range(bins)], acks, errors


def plot_timeline(history: History, result: CheckResult, path: Path) -> None:
    """Write the timeline PNG (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts, acks, errors = throughput(history)
    figure, (rate_axes, window_axes) = plt.subplots(2, 1, sharex=True, figsize=(14, 6),
                                                     gridspec_kw={"height_ratios": [3, 1]})
    rate_axes.plot(starts, acks, drawstyle="steps-post", color="tab:blue", label="acked msgs/s")
    rate_axes.plot(starts, errors, drawstyle="steps-post", color="tab:red", alpha=0.7, label="send errors/s")
    colors = {"kill": "tab:red", "pause": "tab:purple", "partition": "tab:orange", "cut-link": "tab:brown",
              "kill-all": "black", "wipe": "tab:green", "latency": "tab:olive", "bandwidth": "tab:cyan",
              "disk-full": "tab:pink", "disk-full-leader": "deeppink", "corrupt": "darkred", "client-cut": "goldenrod",
              "client-reset": "magenta", "client-latency": "yellowgreen", "client-bandwidth": "teal"}
    labelled: set[str] = set()
    for fault in history.faults:
        color = colors.get(fault.kind, "tab:gray")
        label = None if fault.kind in labelled else f"fault: {fault.kind}"
        labelled.add(fault.kind)
        rate_axes.axvspan(fault.start, max(fault.end, fault.start + 0.05), color=color, alpha=0.15, label=label)
        rate_axes.text(fault.start, 0, fault.target, fontsize=7, rotation=90, va="bottom", color=color)
    top = max(acks, default=1) or 1
    for leader in history.leaders:
        rate_axes.axvline(leader.time, color="gray", linestyle="--", linewidth=0.8)
        rate_axes.text(leader.time, top * 1.02, leader.leader or "none", fontsize=7, color="gray", ha="center")
    rate_axes.set_ylabel("messages / s")
    rate_axes.legend(loc="upper right", fontsize=7)
    scenario = history.run.scenario if history.run is not None else "?"
    verdict = "clean" if result.clean else f"{len(result.violations)} violation(s)"
    rate_axes.set_title(f"{scenario}, seed {result.seed}: {verdict}")
    bars = [(window.longest_gap.start, window.longest_gap.seconds) for window in result.unavailability.faults
            if window.longest_gap is not None]
    window_axes.broken_barh(bars, (0.2, 0.6), color="tab:red", alpha=0.6)
    for start, seconds in bars:
        window_axes.text(start + seconds / 2, 0.5, f"{seconds:.1f}s", fontsize=7, ha="center", va="center")
    overall = result.unavailability.longest_gap
    if overall is not None:
        window_axes.broken_barh([(overall.start, overall.seconds)], (0.85, 0.1), color="black")
    window_axes.set_yticks([])
    window_axes.set_ylabel("no acks")
    window_axes.set_xlabel("seconds since the run started")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
