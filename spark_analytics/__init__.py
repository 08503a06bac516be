"""raftmq: spark_analytics."""
