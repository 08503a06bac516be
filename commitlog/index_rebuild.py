"""A key-index file rebuilt from the commit log: which entries it holds (:func:`rebuilt_entries`, pure), and
the rebuild itself (:func:`rebuild_file`: the records it covers scanned, the file written by
:meth:`commitlog.key_index_files.KeyIndex.replace_file`), or of the whole index when a file's layout does not fit.

A file holds a run of the index's entries in commit-log order: all but the last hold ``entry_capacity``, and
a file is named by the commit-log offset of its first entry. The entries of one record (its UNIQ_KEY, then
each of its KEYS) can be split between two files, so a rebuild needs to know how many entries of the record
a file is named by belong to the file before (``skip``), and for a file that a newer one follows, where it
ends. Both come from the sizes: the file ends inside the entries of the record the next file is named by
(at least one of those is the next file's first). When that leaves a choice (records with several keys at both
ends), the entries the damaged file still holds at its head decide, then the tail of the file before it.

A file that begins below the commit log's start (retention deleted the records its first entries point at)
keeps those entries as it holds them: no lookup uses an entry of a deleted record, nor an older one of its
chain, and they cannot be rebuilt.
"""

from __future__ import annotations

import shutil
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from commitlog.commit_log import CommitLog
from commitlog.errors import DamagedRecordError
from commitlog.key_index import IndexColumns, IndexEntry, IndexFile, concatenated
from commitlog.key_index_checks import file_problem
from commitlog.key_index_files import KeyIndex
from commitlog.record_codec import StoredMessage
from protocol.invariant import invariant


@dataclass(frozen=True, slots=True)
class ScannedRecords:
    """What a rebuild scanned: the index entries of the records from the file's name (or the commit log's
    start, if later) on, in dispatch order; through the record the next file is named by, or to the end."""

    entries: IndexColumns
    #: entries of the record the file is named by (0 when the file begins below the commit log's start)
    first_count: int
    #: entries of the record the next file is named by; None for the last file
    next_count: int | None


def rebuilt_entries(scanned: ScannedRecords, stored: IndexColumns, previous_tail: int, entry_capacity: int,
                    begins_below_log: bool) -> IndexColumns | None:
    """The entries the rebuilt file holds, or None when no layout fits the sizes (the files do not fit the
    commit log around this one: the whole index has to be rebuilt). ``stored``: what the damaged file holds
    (its head decides a choice); ``previous_tail``: how many entries of the file before it point at the record
    this file is named by; ``begins_below_log``: its first entries are of records retention deleted, which
    are kept from ``stored``."""
    entries = scanned.entries
    prefix = stored.since(0, _leading_below(stored, entries)) if begins_below_log else stored.since(0, 0)
    room = entry_capacity - len(prefix)
    total = len(entries)
    first_count = 0 if begins_below_log else scanned.first_count
    next_count = scanned.next_count

    def fits(skip: int) -> bool:
        if next_count is None:
            return total - skip <= room
        before_next = total - next_count  # entries of the records before the one the next file is named by
        return next_count >= 1 and before_next <= skip + room <= before_next + next_count - 1

    def agrees(skip: int) -> bool:
        head = first_count - skip
        held = stored.since(len(prefix), len(prefix) + head)
        return len(held) == head and bool(np.array_equal(held.hashes, entries.hashes[skip:first_count])
                                         and np.array_equal(held.physicals, entries.physicals[skip:first_count]))

    candidates = [skip for skip in range(max(first_count, 1)) if fits(skip)]
    if not candidates:
        return None
    skip = next((each for each in candidates if agrees(each)),
                previous_tail if previous_tail in candidates else candidates[0])
    window = entries.since(skip, total if next_count is None else skip + room)
    return concatenated([prefix, window])


def _leading_below(stored: IndexColumns, scanned: IndexColumns) -> int:
    """How many of the held entries come before the first scanned one (records retention deleted)."""
    if not len(scanned):
        return len(stored)
    below = stored.physicals < scanned.physicals[0]
    return int(np.argmin(below)) if not below.all() else len(stored)


def rebuild_file(commit_log: CommitLog, index: KeyIndex, index_file: IndexFile,
                 entries_of: Callable[[StoredMessage], list[IndexEntry]], end: int) -> bool:
    """Rebuild ``index_file`` of ``index`` from the records of ``commit_log`` it covers (up to ``end`` for the
    last file), with ``entries_of`` a record's entries as dispatch makes them, and put it in place
    (:meth:`KeyIndex.replace_file`: atomically). False when no layout fits (nothing changed: the whole index
    must be rebuilt). :class:`DamagedRecordError` when a record it needs fails its checks (put it back, then
    rebuild again); DiskFullError. The commit log is read record by record, CRC-checked: it is the truth."""
    files = index.files
    position = next(number for number, each in enumerate(files) if each is index_file)
    name_begin = index_file.name_begin
    later = [each for each in files[position + 1 :] if each.entry_count]  # (not files a full disk left empty)
    next_begin = later[0].name_begin if later else None
    start = max(name_begin, commit_log.min_offset)
    stop = end if next_begin is None else min(next_begin + 1, end)  # through the record the next file is named by
    hashes, physicals, stamps = array("q"), array("q"), array("q")
    first_count, next_count = 0, (0 if next_begin is not None else None)
    for message in commit_log.scan(start, stop):
        entries = entries_of(message)
        for hash_value, physical, store_timestamp in entries:
            hashes.append(hash_value)
            physicals.append(physical)
            stamps.append(store_timestamp)
        if message.physical_offset == name_begin:
            first_count = len(entries)
        if message.physical_offset == next_begin:
            next_count = len(entries)
    if start < stop and commit_log.scan_end < stop:
        raise DamagedRecordError(commit_log.scan_end, f"key-index file {index_file.file.path} is rebuilt from the "
                                                      "records it covers, and this one fails its checks")
    scanned = ScannedRecords(IndexColumns(*(np.frombuffer(column, dtype=np.int64) if column else
                                            np.empty(0, dtype=np.int64) for column in (hashes, physicals, stamps))),
                             first_count, next_count)
    previous_tail = 0
    if position > 0:
        before = files[position - 1]
        while (previous_tail < min(first_count, before.entry_count)
               and before.entry(before.entry_count - 1 - previous_tail)[1] == name_begin):
            previous_tail += 1
    below = name_begin < commit_log.min_offset
    held = rebuilt_entries(scanned, index_file.stored_columns(), previous_tail, index.entry_capacity, below)
    if held is None:
        return False
    held_below = below and bool(len(held)) and int(held.physicals[0]) < commit_log.min_offset
    begin_timestamp = index_file.begin_timestamp if held_below or not len(held) else int(held.timestamps[0])
    rebuilt = index.replace_file(index_file, held, begin_timestamp)
    if rebuilt is not None:
        problem = file_problem(index, rebuilt)
        invariant(problem is None, f"the rebuilt key-index file {rebuilt.file.path} passes its checks ({problem})")
    return True


def rebuild_index(commit_log: CommitLog, index: KeyIndex,
                  entries_of: Callable[[StoredMessage], list[IndexEntry]]) -> KeyIndex:
    """A new index in ``index``'s directory, rebuilt whole from the commit log (its files laid out from the
    commit log's start, which may differ from the other replicas' after retention); ``index`` is closed.
    :class:`DamagedRecordError` (nothing changed) when a record fails its checks."""
    pending: list[IndexEntry] = []
    end = commit_log.end_offset
    for message in commit_log.scan(commit_log.min_offset, end):
        pending.extend(entries_of(message))
    if commit_log.scan_end < end:
        raise DamagedRecordError(commit_log.scan_end, "the key index is rebuilt from every record, and this one "
                                                      "fails its checks")
    index.close()
    shutil.rmtree(index.directory, ignore_errors=True)
    rebuilt = KeyIndex(index.directory, index.slot_count, index.entry_capacity)
    rebuilt.prepare(pending)
    rebuilt.insert_many(pending)
    return rebuilt
