"""The key index's upkeep: a damaged key-index file is rebuilt from the commit log (the truth it is derived
from), and the files a lookup that decides apply reads are checked before anything is decided from them."""

from __future__ import annotations

import logging

from commitlog.dispatch import record_index_entries
from commitlog.errors import DamagedRecordError
from commitlog.index_rebuild import rebuild_file, rebuild_index
from commitlog.key_index import IndexEntry, IndexFile
from commitlog.key_index_checks import file_problem, first_mismatch
from commitlog.state import StoreState
from protocol.invariant import fail

log = logging.getLogger(__name__)


def rebuild_index_file(state: StoreState, index_file: IndexFile, reason: str, end: int | None = None) -> bool:
    """Rebuild a damaged key-index file from the commit log, byte for byte what appends made of it, and
    put it in place atomically (:func:`commitlog.index_rebuild.rebuild_file`); the whole index when the
    file's layout does not fit its neighbours. Logged once. ``end`` (recovery): where the commit log ends
    for the last file, the re-dispatch's start; False then instead of rebuilding the whole index (recovery
    does). :class:`DamagedRecordError` when a record it needs is damaged (put it back from a peer, then ask
    again). Store lock held."""
    log.critical("key-index file %s is damaged (%s): rebuilding it from the commit log", index_file.file.path,
                 reason)
    if rebuild_file(state.commit_log, state.index, index_file, record_index_entries,
                    state.commit_log.end_offset if end is None else end):
        return True
    if end is not None:
        return False
    log.critical("key-index file %s does not fit the files around it: rebuilding the whole key index",
                 index_file.file.path)
    state.index = rebuild_index(state.commit_log, state.index, record_index_entries)
    return True


def trust_index(state: StoreState, since_timestamp: int) -> None:
    """Check each key-index file a lookup of keys stored since ``since_timestamp`` reads and that is not
    checked yet (once, until a lookup doubts it): a damaged one is rebuilt from the commit log before
    anything is decided from it. Newest first: only a checked file's begin says whether the lookup reads
    the file before it. Store lock held."""
    while True:
        unchecked = next((f for f in state.index.files_from(since_timestamp) if not f.checked), None)
        if unchecked is None:
            return
        problem = file_problem(state.index, unchecked)
        if problem is not None:
            rebuild_index_file(state, unchecked, problem)


def settle_doubts(state: StoreState, doubts: list[tuple[IndexFile, DamagedRecordError]]) -> None:
    """After a lookup that decides apply met entries that do not name the record they were made for: their
    files are checked again, and the damaged ones rebuilt (the caller then looks up again). When every
    file holds, the entries are what dispatch wrote, so the record is what went bad: its
    :class:`DamagedRecordError` is raised (apply puts it back from a peer's copy). Store lock held."""
    rebuilt = False
    for index_file, _ in doubts:
        if any(each is index_file for each in state.index.files):  # (not rebuilt by an earlier doubt)
            problem = file_problem(state.index, index_file)
            if problem is not None:
                rebuild_index_file(state, index_file, problem)
                rebuilt = True
    if not rebuilt:
        damaged = doubts[0][1]
        if not state.commit_log.min_offset <= damaged.physical_offset < state.commit_log.end_offset:
            fail(f"a key-index file that passes its checks names commit-log offset {damaged.physical_offset}, "
                 f"outside [{state.commit_log.min_offset}, {state.commit_log.end_offset})")
        raise damaged


def index_trusted(state: StoreState, since_timestamp: int) -> bool:
    """Whether no lookup since the last :func:`trust_index` doubted a file it reads."""
    return all(index_file.checked for index_file in state.index.files_from(since_timestamp))


def check_index_entries(state: StoreState, expected: list[IndexEntry]) -> None:
    """The scrubber's check of the key-index entries of the records it just validated (``expected``, in
    commit-log order, as dispatch made them) against the files: a file where they differ is rebuilt from
    the commit log. Store lock held."""
    mismatch = first_mismatch(state.index, expected)
    if mismatch is None:
        return
    index_file, reason = mismatch
    try:
        rebuild_index_file(state, index_file, f"{reason}, against the commit log")
    except DamagedRecordError as exc:
        index_file.doubt(f"{reason}; it is rebuilt once {exc} is repaired")
