"""protocol/_native.c: the remoting codec's JSON header reader and the send header's common case in C."""

from typing import TypeVar

_Header = TypeVar("_Header")

def decode_json_header(buffer: bytes | bytearray, start: int, end: int, remark_max_bytes: int,
                       ext_fields_count_max: int, ext_field_value_max_bytes: int, language_missing: str,
                       ) -> tuple[int, str, int, int, int, str | None, dict[str, str]] | None: ...

def read_send_header(type: type[_Header], values: tuple[str | None, ...]) -> _Header | None: ...

def plain_properties(text: str, cluster_key: str, cluster: str, delay_key: str, timer_keys: tuple[str, ...],
                     bytes_max: int) -> bytes | None: ...
