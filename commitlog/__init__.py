"""raftmq: commitlog."""
