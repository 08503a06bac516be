"""raftmq: broker."""
