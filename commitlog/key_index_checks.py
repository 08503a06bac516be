"""The key index's checks: whether a file holds together (:func:`file_problem`, from which a file counts as
checked), and whether the files hold the entries dispatch made of given records (:func:`first_mismatch`,
:func:`entries_match`: the scrubber's comparison against the commit log)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from commitlog.key_index import ENTRY, ENTRY_DTYPE, IndexEntry, IndexFile, image_problem

if TYPE_CHECKING:
    from commitlog.key_index_files import KeyIndex


def holds_newest(index: KeyIndex, index_file: IndexFile) -> bool:
    """Whether no later file holds entries: ``index_file`` is the one filling (files made for an append
    that a full disk stopped are still empty)."""
    position = next(number for number, each in enumerate(index.files) if each is index_file)
    return all(later.entry_count == 0 for later in index.files[position + 1 :])

def file_problem(index: KeyIndex, index_file: IndexFile) -> str | None:
    """What is wrong with one of this index's files (:func:`image_problem`), None when nothing is: the
    file is checked from then on, and its entries' checksum known (appends continue it)."""
    problem, entries_crc = image_problem(index_file.file.map, index.slot_count, index.entry_capacity,
                                         index_file.name_begin, holds_newest(index, index_file))
    if problem is None:
        index_file.entries_crc = entries_crc
        index_file.checked = True
        index_file.doubted = False
    return problem

def first_mismatch(index: KeyIndex, expected: Sequence[IndexEntry]) -> tuple[IndexFile, str] | None:
    """Where the entries ``expected`` of consecutive records (in commit-log order, as dispatch made them)
    differ from what the files hold: the file that should hold the first entry that differs, and how.
    None when they all match (entries of records before the first file are not looked for)."""
    files = index.files
    if not files:
        return None
    first_begin = files[0].name_begin
    wanted = [entry for entry in expected if entry[1] >= first_begin]
    if not wanted:
        return None
    first = wanted[0][1]
    position, number = _entries_start(files, first)
    index_file = files[position]
    if number is None:
        return index_file, f"no entry points at the record at commit-log offset {first}"
    for hash_value, physical, timestamp in wanted:
        while number >= index_file.entry_count:
            if position + 1 == len(files):
                return index_file, f"its entries end before those of the record at commit-log offset {physical}"
            position += 1
            index_file, number = files[position], 0
        entry_hash, entry_physical, seconds, _ = index_file.entry(number)
        found = (entry_hash, entry_physical, index_file.begin_timestamp // 1000 + seconds)
        if found != (hash_value, physical, timestamp // 1000):
            return index_file, (f"entry {number} holds (hash, offset, second) {found}, the commit log says "
                                f"{(hash_value, physical, timestamp // 1000)}")
        number += 1
    return None

def _entries_start(files: list[IndexFile], first: int) -> tuple[int, int | None]:
    """Where the entries of the record at commit-log offset ``first`` begin: the file's position in
    ``files`` and the entry's number in it (None: no entry there points at that record)."""
    position = max(number for number, index_file in enumerate(files) if index_file.name_begin <= first)
    if position > 0 and files[position].name_begin == first:
        before = files[position - 1]  # a record's entries may begin at the end of the file before
        if before.entry_count and before.entry(before.entry_count - 1)[1] == first:
            position -= 1
    return position, _first_entry_at(files[position], first)

def entries_match(index: KeyIndex, hashes: npt.NDArray[np.uint32], physicals: npt.NDArray[np.int64],
                  timestamps: npt.NDArray[np.int64]) -> bool:
    """Whether :func:`first_mismatch` finds nothing for the entries given as columns (hash, physical offset,
    store timestamp), compared a file's run of entries at a time: the scrubber's check, which asks
    :func:`first_mismatch` what differs only when something does."""
    files = index.files
    if not files:
        return True
    wanted = physicals >= files[0].name_begin
    if not wanted.all():
        hashes, physicals, timestamps = hashes[wanted], physicals[wanted], timestamps[wanted]
    if not len(physicals):
        return True
    position, number = _entries_start(files, int(physicals[0]))
    index_file = files[position]
    if number is None:
        return False
    seconds = timestamps // 1000
    done = 0
    while done < len(physicals):
        if number >= index_file.entry_count:
            if position + 1 == len(files):
                return False
            position += 1
            index_file, number = files[position], 0
            continue
        take = min(index_file.entry_count - number, len(physicals) - done)
        found = np.frombuffer(index_file.file.map, ENTRY_DTYPE, count=take,
                              offset=index_file.entries_base + number * ENTRY.size)
        same = (np.array_equal(found["hash"], hashes[done : done + take])
                and np.array_equal(found["physical"], physicals[done : done + take])
                and np.array_equal(found["seconds"].astype(np.int64) + index_file.begin_timestamp // 1000,
                                   seconds[done : done + take]))
        del found  # (a view of the mapping: the file may be unmapped once this returns)
        if not same:
            return False
        done += take
        number += take
    return True

def _first_entry_at(index_file: IndexFile, physical: int) -> int | None:
    """The number of the first entry of ``index_file`` pointing at ``physical`` (entries are in commit-log
    order: a binary search), None when there is none."""
    low, high = 0, index_file.entry_count
    while low < high:
        middle = (low + high) // 2
        if index_file.entry(middle)[1] < physical:
            low = middle + 1
        else:
            high = middle
    return low if low < index_file.entry_count and index_file.entry(low)[1] == physical else None
