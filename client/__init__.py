"""raftmq: client."""
