"""A quick byte comparison of the replicas' commit logs and consume queues, in Python, run after every
chaos run before the (much slower) Spark check. It names the first differing byte, so a divergence is
reported at once even when Spark is skipped; the Spark check (``spark_analytics.verify``) stays the
complete one (integrity, index files, record mapping).

Compared: every file under ``<node>/store/commitlog/`` and ``<node>/store/consumequeue/`` by relative
path; a file missing on one replica is a difference. Files are read in chunks (bounded memory).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CHUNK_BYTES: Final = 4 << 20
COMPARED_DIRECTORIES: Final = ("commitlog", "consumequeue")


@dataclass(frozen=True, slots=True)
class Difference:
    path: str
    #: the replicas that disagree with the majority (or lack the file)
    replicas: tuple[str, ...]
    #: the first byte that differs, or None when a replica lacks the file
    offset: int | None

    def describe(self) -> str:
        where = "missing" if self.offset is None else f"differs from byte {self.offset}"
        return f"{self.path}: {where} on {', '.join(self.replicas)}"


def replica_dirs(cluster_dir: Path) -> dict[str, Path]:
    return {child.name: child / "store" for child in sorted(cluster_dir.iterdir())
            if child.is_dir() and (child / "store").is_dir()}


def _files(store: Path) -> set[str]:
    found: set[str] = set()
    for name in COMPARED_DIRECTORIES:
        root = store / name
        if root.is_dir():
            found.update(str(path.relative_to(store)) for path in root.rglob("*") if path.is_file())
    return found


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def first_difference(left: Path, right: Path) -> int:
    """The offset of the first byte that differs (the shorter file's length if one is a prefix)."""
    offset = 0
    with left.open("rb") as first, right.open("rb") as second:
        while True:
            a, b = first.read(CHUNK_BYTES), second.read(CHUNK_BYTES)
            if a != b:
                for index, (x, y) in enumerate(zip(a, b, strict=False)):
                    if x != y:
                        return offset + index
                return offset + min(len(a), len(b))
            if not a:
                return offset
            offset += len(a)


def compare_replicas(cluster_dir: Path) -> list[Difference]:
    """Every file that is not byte-identical on all replicas (empty: they are identical)."""
    replicas = replica_dirs(cluster_dir)
    if len(replicas) < 2:
        return []
    names = sorted(replicas)
    files = {name: _files(store) for name, store in replicas.items()}
    differences = []
    for relative in sorted(set().union(*files.values())):
        missing = tuple(name for name in names if relative not in files[name])
        if missing:
            differences.append(Difference(relative, missing, None))
            continue
        digests = {name: _digest(replicas[name] / relative) for name in names}
        counts = Counter(digests.values())
        majority = max(counts, key=lambda digest: (counts[digest], -names.index(
            next(name for name in names if digests[name] == digest))))
        reference = next(name for name in names if digests[name] == majority)
        odd = tuple(name for name in names if digests[name] != majority)
        if odd:
            offset = first_difference(replicas[reference] / relative, replicas[odd[0]] / relative)
            differences.append(Difference(relative, odd, offset))
    return differences
