"""The figures every produce measurement reports, whatever it measured (raftmq, NATS, the C++ client), so
that their lines carry the same keys computed the same way."""

from __future__ import annotations

from client.figures import percentile


def produce_figures(latencies_seconds: list[float], errors: int, seconds: float,
                    body_size_bytes: int) -> dict[str, object]:
    """msgs/s and MB/s of the acknowledged sends (one latency each) over ``seconds``, with p50/p99 in ms."""
    acked = len(latencies_seconds)
    return {"messages": acked, "errors": errors, "msgs_per_s": round(acked / seconds) if seconds > 0 else 0,
            "MB_per_s": round(acked * body_size_bytes / seconds / 1e6, 2) if seconds > 0 else 0.0,
            "p50_ms": round(1000 * percentile(latencies_seconds, 0.5), 2),
            "p99_ms": round(1000 * percentile(latencies_seconds, 0.99), 2)}
