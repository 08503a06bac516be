"""raftmq: dledger."""
