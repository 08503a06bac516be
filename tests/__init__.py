"""raftmq: tests."""
