"""Tests of the dledger Raft transport."""
