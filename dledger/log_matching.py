"""What a follower keeps of an append_entries: Raft's consistency check (§5.3) as a pure function.

pysyncobj 0.3.17's follower deletes every entry after ``prevLogIdx`` whenever its log is longer, even
when the leader's entries are the ones it already holds. With pipelining (the leader advances a
follower's next index as it sends, and rewinds it on a stale reply) re-sent and stale messages are
common: the follower cut entries it had applied, and a local compaction that finished meanwhile then
deleted up to its own index on the shortened log, leaving the log empty. :func:`plan_append` turns a
message into one pysyncobj handles the Raft way (``dledger.raft_node.RaftNode`` applies the plan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: pysyncobj's (command, index, term)
Entry = tuple[Any, int, int]


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """The append_entries pysyncobj is given instead: after ``prev_index`` (which matches, so pysyncobj
    deletes only what follows it, and only if the log goes on) it appends ``entries``."""

    prev_index: int
    prev_term: int
    entries: list[Entry]
    #: Raft's min(leader commit, index of the last new entry): entries past the message are unverified
    commit_index: int
    #: the highest next index a success reply may claim: the message proves the log up to its last entry
    reply_index_max: int
    #: how many of the message's entries the log already held (sent again)
    held: int = 0


def matching_entries(term_at: Callable[[int], int | None], entries: Sequence[Entry]) -> int:
    """How many leading ``entries`` the log already holds with the same index and term (and so, by the
    Log Matching property, the same command and everything before). Stops at the first entry the log
    lacks or contradicts."""
    count = 0
    for _, index, term in entries:
        if term_at(index) != term:
            break
        count += 1
    return count


def plan_append(term_at: Callable[[int], int | None], last_entry: tuple[int, int], prev_index: int, prev_term: int,
                entries: Sequence[Entry], leader_commit: int) -> AppendPlan | None:
    """The Raft-correct handling of an append_entries whose previous entry is ``(prev_index, prev_term)``
    on a log whose last entry is ``last_entry`` (index, term); ``term_at`` gives a held entry's term or
    None. None when the previous entry does not match (pysyncobj's own failure reply is right then).

    Entries the log already holds are kept; the log is truncated only from the first conflicting entry;
    a message with nothing new (a heartbeat, or a stale or re-sent batch) changes nothing, and is shown to
    pysyncobj as a heartbeat at the log's end so that it deletes nothing."""
    if term_at(prev_index) != prev_term:
        return None
    last_index = prev_index + len(entries)
    commit_index = min(leader_commit, last_index)
    known = matching_entries(term_at, entries)
    if known == len(entries):
        return AppendPlan(last_entry[0], last_entry[1], [], commit_index, last_index + 1, known)
    anchor_term = entries[known - 1][2] if known else prev_term
    return AppendPlan(prev_index + known, anchor_term, list(entries[known:]), commit_index, last_index + 1, known)
