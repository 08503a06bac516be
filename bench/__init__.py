"""raftmq: bench."""
