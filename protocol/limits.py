"""Named limits on everything a peer can make the codec hold: nothing a peer sends grows without bound."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Final

#: bytes of a frame before its header: the length prefix and the serialize-type/header-length word
FRAME_OVERHEAD_BYTES: Final = 8
#: the header length is the low 24 bits of the second int32
HEADER_LENGTH_FIELD_MAX: Final = 0xFFFFFF
_INT32_MAX: Final = 2**31 - 1
#: Java's ``NettyDecoder.FRAME_MAX_LENGTH`` (Netty counts the 4-byte length prefix in it)
JAVA_FRAME_SIZE_MAX_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CodecLimits:
    """Limits the decoder enforces on every frame; the encoder enforces only ``frame_size_max_bytes``.

    ``frame_size_max_bytes`` is the whole frame on the wire, length prefix included, as Netty's
    ``maxFrameLength`` on the Java side: a frame announcing more is a fatal error, found as soon as its
    first 4 bytes arrive, so the decoder never buffers it. The other limits apply inside a
    well-delimited frame and are recoverable (the server can answer and carry on).

    ``ext_field_value_max_bytes`` admits the largest properties string the store accepts (32767 bytes,
    ``propertiesLength`` is an int16), which travels as one extFields value of SEND_MESSAGE.
    """

    frame_size_max_bytes: int = JAVA_FRAME_SIZE_MAX_BYTES
    header_size_max_bytes: int = 64 * 1024
    ext_fields_count_max: int = 64
    ext_field_value_max_bytes: int = 32 * 1024
    remark_max_bytes: int = 16 * 1024
    body_size_max_bytes: int = JAVA_FRAME_SIZE_MAX_BYTES - FRAME_OVERHEAD_BYTES

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that is of the wrong type or out of range."""
        for limit in fields(self):
            value = getattr(self, limit.name)
            if type(value) is not int:
                raise ValueError(f"{limit.name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{limit.name} must not be negative, got {value}")
        # the smallest useful frame: overhead plus a 2-byte JSON header "{}"
        if not FRAME_OVERHEAD_BYTES + 2 <= self.frame_size_max_bytes <= _INT32_MAX:
            raise ValueError(
                f"frame_size_max_bytes must be in [{FRAME_OVERHEAD_BYTES + 2}, {_INT32_MAX}], "
                f"got {self.frame_size_max_bytes}"
            )
        header_ceiling = min(HEADER_LENGTH_FIELD_MAX, self.frame_size_max_bytes - FRAME_OVERHEAD_BYTES)
        if not 2 <= self.header_size_max_bytes <= header_ceiling:
            raise ValueError(
                f"header_size_max_bytes must be in [2, {header_ceiling}] (24-bit field, inside a frame), "
                f"got {self.header_size_max_bytes}"
            )
        for name in ("ext_field_value_max_bytes", "remark_max_bytes"):
            if getattr(self, name) > self.header_size_max_bytes:
                raise ValueError(
                    f"{name} ({getattr(self, name)}) cannot exceed header_size_max_bytes "
                    f"({self.header_size_max_bytes}): it is part of the header"
                )
        if self.body_size_max_bytes > self.frame_size_max_bytes - FRAME_OVERHEAD_BYTES:
            raise ValueError(
                f"body_size_max_bytes ({self.body_size_max_bytes}) cannot exceed frame_size_max_bytes - "
                f"{FRAME_OVERHEAD_BYTES} ({self.frame_size_max_bytes - FRAME_OVERHEAD_BYTES})"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> CodecLimits:
        """Limits from a configuration table (TOML): unknown keys are rejected, missing ones default."""
        known = {limit.name for limit in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown codec limits: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        arguments: dict[str, int] = {}
        for name, value in values.items():
            if type(value) is not int:
                raise ValueError(f"{name} must be an int, got {type(value).__name__}")
            arguments[name] = value
        return cls(**arguments)


DEFAULT_LIMITS: Final = CodecLimits()
