"""raftmq: Spark checks over replicas' files."""
