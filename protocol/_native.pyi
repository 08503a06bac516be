"""protocol/_native.c: the remoting codec's JSON header reader in C."""

def decode_json_header(buffer: bytes | bytearray, start: int, end: int, remark_max_bytes: int,
                       ext_fields_count_max: int, ext_field_value_max_bytes: int, language_missing: str,
                       ) -> tuple[int, str, int, int, int, str | None, dict[str, str]] | None: ...
