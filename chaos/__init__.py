"""raftmq: chaos."""
