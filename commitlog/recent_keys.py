"""A filter in front of the key index for one question: "was a key with this hash stored at or after
store time T?" (the UNIQ_KEY dedupe of retried sends asks it for every send).

Answers are "maybe" or "no". "No" is exact: every key hash indexed with a stamp after ``floor`` is in the
filter, so a "no" skips a key-index lookup whose answer would have been empty. "Maybe" (a true hit or a
false positive, a few percent) means: look it up. The filter therefore never changes what a lookup returns,
only how often the index is read, and replicas stay deterministic whatever their filters hold.

Two bitmaps of 2^27 bits (16 MiB each): keys go into the current one; once a question asks about a time after
the current bitmap's oldest key, nothing in the previous bitmap can matter any more, so it is
dropped and the current one becomes the previous (strictly after: keys of the previous bitmap may carry
that very stamp). A question about a time not after ``floor`` is answered "maybe", and so is one about a
time not after what a dropped bitmap held.

At open the store seeds the filter from the key index (:meth:`RecentKeys.seed`): the keys of the last
``SEED_SPAN_MS`` before the index's newest entry, so that "no" is exact for the first dedupe window after a
restart too (unseeded, every send of that window cost a key-index lookup). Keys stored before the seeded
span are not in the filter, and ``floor`` says so. Left unset (no seed), ``floor`` is the first stamp
added, which no earlier stamp exceeds as store timestamps never decrease in log order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from commitlog.key_index import IndexColumns, IndexEntry
from commitlog.key_index_files import KeyIndex
from protocol.invariant import invariant

#: A bitmap holds up to a dedupe window's keys: at a high send rate, millions of keys in 2^27 bits answer
#: "maybe" for a few percent of new keys per bitmap (a quarter of the bits: four times as many), and each
#: "maybe" costs a key-index lookup.
BITS_LOG2 = 27
_MASK = (1 << BITS_LOG2) - 1
_SPREAD = 0x9E3779B1  # spreads CRC bits over the bitmap
#: how far before the index's newest entry the filter is seeded at open: the UNIQ_KEY dedupe window
#: (dledger.apply.UNIQ_KEY_WINDOW_MS; the store does not import dledger, a test checks they agree). Any span
#: keeps "no" exact; a shorter one leaves the first questions after a restart answered "maybe".
SEED_SPAN_MS = 120_000


def _bits(hashes: npt.NDArray[np.int64] | npt.NDArray[np.uint32]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """Each hash's byte in a bitmap and its bit in that byte (hashes are CRC32s: the product fits 64 bits)."""
    mixed = ((hashes.astype(np.uint64) * np.uint64(_SPREAD)) >> np.uint64(7) & np.uint64(_MASK)).astype(np.int64)
    return mixed >> 3, np.left_shift(1, mixed & 7).astype(np.uint8)


class RecentKeys:
    __slots__ = ("_current", "_current_bits", "_current_oldest", "_previous", "_previous_bits", "floor")

    def __init__(self) -> None:
        self._current = bytearray(1 << (BITS_LOG2 - 3))
        self._previous = bytearray(1 << (BITS_LOG2 - 3))
        # the same bitmaps as numpy arrays (views: they share the bytes), for batches of keys
        self._current_bits = np.frombuffer(self._current, dtype=np.uint8)
        self._previous_bits = np.frombuffer(self._previous, dtype=np.uint8)
        #: the smallest stamp added to the current bitmap (None: empty)
        self._current_oldest: int | None = None
        #: keys stored at or before this stamp may be missing (stored before the filter started, or dropped
        #: with a previous bitmap)
        self.floor: int | None = None

    def add(self, entries: IndexColumns | Sequence[IndexEntry]) -> None:
        """Record key-index entries: (key hash, physical offset, store timestamp ms)."""
        if not len(entries):
            return
        if isinstance(entries, IndexColumns):
            byte, bit = _bits(entries.hashes)
            np.bitwise_or.at(self._current_bits, byte, bit)
            oldest = int(entries.timestamps.min())
        else:
            current = self._current
            oldest = entries[0][2]
            for key_hash, _, store_timestamp in entries:
                mixed = (key_hash * _SPREAD) >> 7 & _MASK
                current[mixed >> 3] |= 1 << (mixed & 7)
                oldest = min(oldest, store_timestamp)
        if self._current_oldest is None or oldest < self._current_oldest:
            self._current_oldest = oldest
        if self.floor is None:
            self.floor = self._current_oldest

    def seed(self, index: KeyIndex, span_ms: int = SEED_SPAN_MS) -> None:
        """Start an empty filter from ``index`` (at open, before any :meth:`add`): add the keys of every entry
        stamped within ``span_ms`` before the index's newest entry, and set ``floor`` so that "no" is exact
        for every time after it.

        The index keeps stamps in whole seconds, so the span is widened to whole seconds: every entry of
        second ``begin_second`` or later is added, with ``begin_second`` the second of ``newest - span_ms``.
        An entry missing from the filter is of an earlier second, stamped at most
        ``begin_second * 1000 - 1``: that is ``floor``. Entries of the same second on both sides of
        ``newest - span_ms`` are all added (the boundary second is taken whole), and older index files are
        read as far as any lookup from ``begin_second`` would read them (:meth:`KeyIndex.entries_from_second`),
        so no key a lookup after ``floor`` can find is denied."""
        invariant(self.floor is None and self._current_oldest is None, "only an empty filter is seeded")
        invariant(span_ms >= 0, "the seeded span is not negative")
        newest = index.newest_timestamp()
        if newest is None:
            self.floor = -1  # an empty index: every key ever stored will be added
            return
        begin_second = (newest - span_ms) // 1000
        oldest_second: int | None = None
        for columns in index.entries_from_second(begin_second):
            if len(columns):
                byte, bit = _bits(columns.hashes)
                np.bitwise_or.at(self._current_bits, byte, bit)
                chunk_oldest = int(columns.timestamps.min()) // 1000
                oldest_second = chunk_oldest if oldest_second is None else min(oldest_second, chunk_oldest)
        if oldest_second is not None:
            # the last millisecond of the oldest second: it may overstate the oldest stamp but never
            # understates it, so a rotation never drops a bitmap whose keys a question can still need
            self._current_oldest = oldest_second * 1000 + 999
        self.floor = begin_second * 1000 - 1

    def authoritative(self, since_timestamp: int) -> bool:
        """Whether "no" answers are exact for keys stored at or after ``since_timestamp``; rotates the
        bitmaps when the previous one can no longer matter."""
        if self.floor is None or since_timestamp <= self.floor:
            return False
        if self._current_oldest is not None and since_timestamp > self._current_oldest:
            # the dropped bitmap's keys carry stamps up to the current one's oldest: a later question about
            # a time not after it gets "maybe" again
            self.floor = max(self.floor, self._current_oldest)
            self._previous, self._current = self._current, self._previous
            self._previous_bits, self._current_bits = self._current_bits, self._previous_bits
            self._current_bits.fill(0)
            self._current_oldest = None
        return True

    def maybe(self, key_hash: int) -> bool:
        mixed = (key_hash * _SPREAD) >> 7 & _MASK
        byte, bit = mixed >> 3, 1 << (mixed & 7)
        return bool(self._current[byte] & bit or self._previous[byte] & bit)

    def maybe_mask(self, hashes: npt.NDArray[np.int64] | npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
        """For each hash, whether it is "maybe"."""
        byte, bit = _bits(hashes)
        mask: npt.NDArray[np.bool_] = ((self._current_bits[byte] | self._previous_bits[byte]) & bit) != 0
        return mask

    def maybe_many(self, hashes: dict[int, int]) -> list[int]:
        """The names in ``hashes`` (name -> key hash) whose hash is "maybe"."""
        current, previous = self._current, self._previous
        found = []
        for name, key_hash in hashes.items():
            mixed = (key_hash * _SPREAD) >> 7 & _MASK
            byte, bit = mixed >> 3, 1 << (mixed & 7)
            if current[byte] & bit or previous[byte] & bit:
                found.append(name)
        return found
