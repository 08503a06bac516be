"""raftmq: cli."""
