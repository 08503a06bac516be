import mmap
from collections.abc import Callable, Sequence
from types import NotImplementedType
from typing import Final

from commitlog.message import MessageInput

MESSAGE_MAGIC: Final[int]
PROPERTIES_BYTES_MAX: Final[int]
META_BYTES: Final[int]
HAS_UNIQ_KEY: Final[int]
BORN_HOST_V6: Final[int]
RECORD_FACTS_BYTES: Final[int]
KEY_ENTRY_BYTES: Final[int]

def build_records(
    messages: Sequence[MessageInput],
    stamp: int,
    store_host: bytes,
    body_max: int,
    segment_max: int,
    topic_entry: Callable[[str], tuple[bytes, int] | None],
    tag_codes: dict[bytes, int],
    tag_code_of: Callable[[dict[bytes, int], bytes | None], int],
    crc32: Callable[..., int],
    /,
) -> tuple[tuple[str, ...], bytes, bytes, bytes] | NotImplementedType: ...

def walk_records(
    segment: bytes | bytearray | memoryview | mmap.mmap,
    segment_start: int,
    local_start: int,
    local_stop: int,
    tag_codes: dict[bytes, int],
    tag_code_of: Callable[[dict[bytes, int], bytes | None], int],
    crc32: Callable[..., int],
    /,
) -> tuple[int, bytes, bytes, tuple[str, ...]]: ...
