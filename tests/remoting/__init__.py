"""Remoting codec tests, and the corpus reader both test modules share.

Corpus files (``corpus/*.hex``) are hex text; ``#`` starts a comment. One line
``# expect: OUTCOME | OUTCOME ...`` states what decoding the whole file as one stream gives, each
outcome being ``ok``, ``ErrorName opaque=N`` / ``ErrorName opaque=none`` (recoverable error),
``ErrorName fatal`` (decoding stops there), or a final ``incomplete N`` (N bytes left waiting).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol.codec import FrameDecoder, FrameError
from protocol.command import RemotingCommand

CORPUS_DIRECTORY = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class CorpusEntry:
    name: str
    data: bytes
    expected_outcomes: tuple[str, ...]


def read_corpus_entry(path: Path) -> CorpusEntry:
    hex_digits: list[str] = []
    expected: tuple[str, ...] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        content, _, comment = line.partition("#")
        comment = comment.strip()
        if comment.startswith("expect:"):
            expected = tuple(item.strip() for item in comment.removeprefix("expect:").split("|"))
        hex_digits.append("".join(content.split()))
    if expected is None:
        raise ValueError(f"{path.name} has no '# expect:' line")
    return CorpusEntry(path.name, bytes.fromhex("".join(hex_digits)), expected)


def read_corpus() -> list[CorpusEntry]:
    return [read_corpus_entry(path) for path in sorted(CORPUS_DIRECTORY.glob("*.hex"))]


def describe_error(error: FrameError) -> str:
    if error.fatal:
        return f"{type(error).__name__} fatal"
    opaque = "none" if error.opaque is None else str(error.opaque)
    return f"{type(error).__name__} opaque={opaque}"


def replay(decoder: FrameDecoder, data: bytes, chunk_size: int) -> tuple[list[str], list[RemotingCommand]]:
    """Feed ``data`` in chunks of ``chunk_size``, draining after each, as a server does.

    Returns the outcomes in corpus notation and the decoded commands.
    """
    outcomes: list[str] = []
    commands: list[RemotingCommand] = []
    for start in range(0, len(data), chunk_size):
        decoder.feed(data[start : start + chunk_size])
        while True:
            try:
                command = decoder.next_frame()
            except FrameError as error:
                outcomes.append(describe_error(error))
                if error.fatal:
                    return outcomes, commands
                continue
            if command is None:
                break
            outcomes.append("ok")
            commands.append(command)
    if decoder.buffered_bytes:
        outcomes.append(f"incomplete {decoder.buffered_bytes}")
    return outcomes, commands
