"""Sans-IO codec for RocketMQ 4.x remoting frames: bytes in, :class:`RemotingCommand` out, and back.

Frame (all big-endian)::

    total_len i32 | (serialize_type << 24 | header_len) i32 | header | body

``total_len`` counts everything after itself. The header is JSON (serialize type 0, what every stock
4.x client sends) or the ROCKETMQ binary form (type 1)::

    code i16 | language i8 | version i16 | opaque i32 | flag i32 | remark_len i32 + utf8 |
    ext_len i32 + (key_len i16 + utf8, value_len i32 + utf8)*

No sockets here: a server or client feeds received bytes to a :class:`FrameDecoder` and writes what
:func:`encode_frame` returns.

Errors come in two kinds, told apart by ``FrameError.fatal``:

- fatal: the length prefix is unusable, so the stream cannot be re-synchronised; the decoder refuses
  all further input and the connection must be closed.
- recoverable: the frame was well delimited and has been consumed; the error carries what could be
  read of it (``opaque``, ``code``, ``flag``, ``serialize_type``) so the server can answer with
  :func:`make_error_response` and go on with the next frame.

JSON headers take one of two paths. The reference reads them with the stdlib ``json`` and checks every
field (:func:`_decode_json_header`). The fast path (:func:`_decode_json_header_fast`) reads them with
orjson when it is installed and accepts only the plain shapes stock clients send; for anything else
(a refusal of orjson's, a value orjson could read differently, anything the reference would refuse)
it steps aside and the reference decides, so both paths give the same command or the same error.
Encoding is the same: orjson writes the header, byte for byte what the stdlib writes, and the stdlib
path names what orjson refuses (a lone surrogate).
"""

from __future__ import annotations

import dataclasses
import json
import re
import reprlib
import struct
from collections.abc import Callable, Mapping
from types import MappingProxyType, MemberDescriptorType
from typing import Any, ClassVar, Final

from protocol.codes import LanguageCode, ResponseCode, SerializeType
from protocol.command import (
    DEFAULT_LANGUAGE,
    INT16_MAX,
    INT16_MIN,
    INT32_MAX,
    INT32_MIN,
    REMOTING_VERSION,
    RESPONSE_FLAG,
    InvalidCommandError,
    RemotingCommand,
)
from protocol.invariant import invariant
from protocol.limits import DEFAULT_LIMITS, FRAME_OVERHEAD_BYTES, HEADER_LENGTH_FIELD_MAX, CodecLimits

_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_UINT32: Final = struct.Struct(">I")
#: total_len, then serialize_type << 24 | header_len
_FRAME_PREFIX: Final = struct.Struct(">iI")
#: code, language, version, opaque, flag: the fixed start of a ROCKETMQ binary header
_BINARY_FIXED: Final = struct.Struct(">hbhii")
invariant(_FRAME_PREFIX.size == FRAME_OVERHEAD_BYTES, "frame prefix must be 8 bytes")
invariant(_BINARY_FIXED.size == 13, "binary header fixed part must be 13 bytes")

_LENGTH_PREFIX_BYTES: Final = 4
#: total_len covers at least the serialize-type/header-length word
_TOTAL_LENGTH_MIN: Final = 4
_JSON: Final = int(SerializeType.JSON)
_ROCKETMQ: Final = int(SerializeType.ROCKETMQ)
_LANGUAGE_NAMES: Final = {member.value: member.name for member in LanguageCode}
_LANGUAGE_VALUES: Final = {member.name: member.value for member in LanguageCode}
#: what Java assumes when a JSON header has no "language"
_LANGUAGE_MISSING: Final = LanguageCode.JAVA.name
#: an int field sent as a string ("10"): ASCII digits only (``int()`` would also take "1_0", " 10", "١٠")
_INTEGER_TEXT: Final = re.compile(r"-?[0-9]{1,10}")
_PREVIEW: Final = reprlib.Repr()
_PREVIEW.maxstring = 40
_PREVIEW.maxother = 40


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


#: one decoder for every frame (``json.loads`` with arguments would build one per call)
_JSON_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
_JSON_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)

_fast_loads: Callable[[bytes | bytearray], Any] | None
_fast_dumps: Callable[[Any], bytes] | None
_FastEncodeError: type[Exception]
try:
    import orjson
except ImportError:  # a dependency, but optional here: the stdlib path is complete on its own
    _fast_loads = _fast_dumps = None
    _FastEncodeError = TypeError
else:
    _fast_loads = orjson.loads
    _fast_dumps = orjson.dumps
    _FastEncodeError = orjson.JSONEncodeError

#: the JSON header reader in C (protocol/_native.c): the first reader asked, where it is built
_native_header: Callable[[bytes | bytearray, int, int, int, int, int, str],
                         tuple[int, str, int, int, int, str | None, dict[str, str]] | None] | None
try:
    from protocol._native import decode_json_header as _native_header
except ImportError:  # not built (setup.py: optional): orjson, then the reference, read every header
    _native_header = None


# --------------------------------------------------------------------------------------------- errors


class FrameError(Exception):
    """A frame that breaks the protocol or a limit.

    ``fatal``: the stream is out of sync and the connection must be closed. Otherwise the frame was
    consumed, and ``opaque`` / ``code`` / ``flag`` / ``serialize_type`` hold whatever could be read of
    it (None where unknown). ``response_code`` is what to answer when answering is possible
    (:attr:`can_respond`).
    """

    fatal: ClassVar[bool] = False
    response_code: ClassVar[ResponseCode] = ResponseCode.SYSTEM_ERROR

    def __init__(
        self,
        message: str,
        *,
        opaque: int | None = None,
        code: int | None = None,
        flag: int | None = None,
        serialize_type: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.opaque = opaque
        self.code = code
        self.flag = flag
        self.serialize_type = serialize_type

    @property
    def can_respond(self) -> bool:
        """Recoverable, the request's opaque is known, and the frame was not itself a response."""
        if self.fatal or self.opaque is None:
            return False
        return self.flag is None or not self.flag & RESPONSE_FLAG


class FrameLengthError(FrameError):
    """The length prefix is impossible (below 4), or a single-frame decode got too few or too many bytes."""

    fatal = True


class UnknownSerializeTypeError(FrameError):
    """The serialize-type byte is neither 0 (JSON) nor 1 (ROCKETMQ)."""


class HeaderLengthError(FrameError):
    """The header length runs past the end of the frame."""


class HeaderEncodingError(FrameError):
    """Header text is not valid UTF-8 (or a JSON escape produced a lone surrogate)."""


class HeaderSyntaxError(FrameError):
    """The header cannot be parsed: not JSON, not a JSON object, or a broken binary layout."""


class TruncatedHeaderError(HeaderSyntaxError):
    """A binary header ends before the fields it announces."""


class HeaderFieldError(FrameError):
    """A header field is missing, of the wrong type, or out of range."""


class FrameLimitError(FrameError):
    """A frame breaks one of the :class:`CodecLimits`."""

    response_code = ResponseCode.MESSAGE_ILLEGAL


class FrameTooLargeError(FrameLimitError):
    """The length prefix announces more than ``frame_size_max_bytes``: refused before buffering it."""

    fatal = True


class HeaderTooLargeError(FrameLimitError):
    """The header is longer than ``header_size_max_bytes``."""


class TooManyExtFieldsError(FrameLimitError):
    """More extFields entries than ``ext_fields_count_max``."""


class ExtFieldValueTooLargeError(FrameLimitError):
    """An extFields value is longer than ``ext_field_value_max_bytes`` (UTF-8 bytes)."""


class RemarkTooLargeError(FrameLimitError):
    """The remark is longer than ``remark_max_bytes`` (UTF-8 bytes)."""


class BodyTooLargeError(FrameLimitError):
    """The body is longer than ``body_size_max_bytes``."""


class DecoderUsageError(RuntimeError):
    """A programmer error: more bytes were fed while a whole max-size frame's worth sat undrained."""


class EncodeError(ValueError):
    """A command cannot be written in its serialize type, or the frame would exceed the frame limit."""


class _DecodedSoFar:
    """What has been read of the frame being decoded, for the error raised if it goes wrong."""

    __slots__ = ("code", "flag", "opaque", "serialize_type")

    def __init__(self, serialize_type: int | None) -> None:
        self.serialize_type = serialize_type
        self.opaque: int | None = None
        self.code: int | None = None
        self.flag: int | None = None

    def error(self, error_type: type[FrameError], message: str) -> FrameError:
        return error_type(
            message, opaque=self.opaque, code=self.code, flag=self.flag, serialize_type=self.serialize_type
        )


def _describe_json(value: object) -> str:
    """``string 'abc'``: the JSON type and a short preview, for error messages."""
    if value is None:
        kind = "null"
    elif isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, int | float):
        kind = "number"
    elif isinstance(value, str):
        kind = "string"
    elif isinstance(value, list):
        kind = "array"
    else:
        kind = "object"
    return f"{kind} {_PREVIEW.repr(value)}"


def _utf8_length_exceeds(text: str, limit: int) -> bool:
    # A str never takes more than 4 UTF-8 bytes per character: skip the encode when that settles it.
    if len(text) * 4 <= limit:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


# ---------------------------------------------------------------------------------------- JSON header


def _json_int(header: dict[str, object], key: str, known: _DecodedSoFar, default: int | None) -> int:
    """An int32 header field; fastjson also accepts a decimal string, so do we. None default = required."""
    value = header.get(key)
    if value is None:
        if default is None:
            raise known.error(HeaderFieldError, f"header field {key!r} is missing or null")
        return default
    if type(value) is int:
        number = value
    elif type(value) is str and _INTEGER_TEXT.fullmatch(value):
        number = int(value)
    else:
        raise known.error(
            HeaderFieldError, f"header field {key!r} must be an integer, got {_describe_json(value)}"
        )
    if not INT32_MIN <= number <= INT32_MAX:
        raise known.error(HeaderFieldError, f"header field {key!r} must fit an int32, got {number}")
    return number


def _json_language(value: object, known: _DecodedSoFar) -> str:
    if value is None:
        return _LANGUAGE_MISSING
    if type(value) is str:
        # A name we do not know (a newer client) is kept as sent: nothing here depends on it.
        return value
    if type(value) is int:
        # fastjson reads an enum from its ordinal too
        name = _LANGUAGE_NAMES.get(value)
        if name is not None:
            return name
        raise known.error(HeaderFieldError, f"header field 'language' is not a known language code: {value}")
    raise known.error(
        HeaderFieldError, f"header field 'language' must be a string, got {_describe_json(value)}"
    )


def _json_ext_value(key: str, value: object, known: _DecodedSoFar) -> str:
    """A non-string extFields value as Java's ``HashMap<String, String>`` would hold it."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        return repr(value)
    # An object or an array: fastjson keeps its JSON text.
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError) as error:
        raise known.error(
            HeaderFieldError, f"extFields value of {key!r} cannot be kept as text: {error}"
        ) from None


def _decode_json_header(
    text: str, known: _DecodedSoFar, limits: CodecLimits
) -> tuple[int, str, int, int, int, str | None, dict[str, str]]:
    """(code, language, version, opaque, flag, remark, ext_fields) from a JSON header."""
    try:
        header = _JSON_DECODER.decode(text)
    except (ValueError, RecursionError) as error:
        # ValueError covers JSONDecodeError, over-long integers and NaN/Infinity; RecursionError deep nesting
        raise known.error(HeaderSyntaxError, f"header is not valid JSON: {error}") from None
    if type(header) is not dict:
        raise known.error(HeaderSyntaxError, f"header must be a JSON object, got {_describe_json(header)}")
    # opaque first: every later error can then name the request it belongs to
    opaque = known.opaque = _json_int(header, "opaque", known, None)
    code = known.code = _json_int(header, "code", known, None)
    flag = known.flag = _json_int(header, "flag", known, 0)
    version = _json_int(header, "version", known, 0)
    language = _json_language(header.get("language"), known)

    remark = header.get("remark")
    if remark is not None:
        if type(remark) is not str:
            raise known.error(
                HeaderFieldError, f"header field 'remark' must be a string, got {_describe_json(remark)}"
            )
        if _utf8_length_exceeds(remark, limits.remark_max_bytes):
            raise known.error(
                RemarkTooLargeError,
                f"remark is {len(remark.encode('utf-8', 'surrogatepass'))} bytes, "
                f"more than remark_max_bytes={limits.remark_max_bytes}",
            )

    raw_ext_fields = header.get("extFields")
    ext_fields: dict[str, str] = {}
    if raw_ext_fields is not None:
        if type(raw_ext_fields) is not dict:
            raise known.error(
                HeaderFieldError,
                f"header field 'extFields' must be an object, got {_describe_json(raw_ext_fields)}",
            )
        if len(raw_ext_fields) > limits.ext_fields_count_max:
            raise known.error(
                TooManyExtFieldsError,
                f"{len(raw_ext_fields)} extFields, more than ext_fields_count_max={limits.ext_fields_count_max}",
            )
        value_max_bytes = limits.ext_field_value_max_bytes
        # values this short cannot exceed the limit (4 UTF-8 bytes per character at most): no encode
        value_short_max = value_max_bytes // 4
        for key, value in raw_ext_fields.items():
            if type(value) is str:
                value_text = value
            elif value is None:
                continue  # Java's map holds null, which every reader treats as absent
            else:
                value_text = _json_ext_value(key, value, known)
            if len(value_text) > value_short_max and _utf8_length_exceeds(value_text, value_max_bytes):
                raise known.error(
                    ExtFieldValueTooLargeError,
                    f"extFields value of {key!r} is {len(value_text.encode('utf-8', 'surrogatepass'))} bytes, "
                    f"more than ext_field_value_max_bytes={value_max_bytes}",
                )
            ext_fields[key] = value_text

    # The text was valid UTF-8, but a "\ud800" escape decodes to a lone surrogate, which no UTF-8
    # encoder (ours included, when the value is echoed) can write. Rare: look only if such an escape is there.
    if "\\ud" in text or "\\uD" in text:
        for item in (language, remark, *ext_fields.keys(), *ext_fields.values()):
            if item is not None:
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise known.error(
                        HeaderEncodingError,
                        f"header string {_PREVIEW.repr(item)} holds a lone surrogate escape",
                    ) from None
    return code, language, version, opaque, flag, remark, ext_fields


def _decode_json_header_fast(
    header: bytes | bytearray, limits: CodecLimits
) -> tuple[int, str, int, int, int, str | None, dict[str, str]] | None:
    """What :func:`_decode_json_header` gives for ``header`` (UTF-8 bytes), read by orjson, or None to
    let the reference decide.

    Only plain headers pass: int code/opaque/flag/version in int32 range, a string (or known ordinal)
    language, a string remark, extFields of strings, ints, booleans and nulls, every limit kept. For
    those orjson reads exactly what the stdlib reads. Everything else steps aside, errors included, and
    so does every header where the two libraries differ: orjson refuses a lone surrogate escape (the
    stdlib reads it, and the reference answers HeaderEncodingError), invalid UTF-8 (the reference:
    HeaderEncodingError, not HeaderSyntaxError), numbers beyond a double (the stdlib reads inf) and
    nesting deeper than 1024; it reads integers beyond 64 bits as floats (the stdlib keeps them exact),
    so floats and nested values in extFields step aside too. Both join a surrogate pair escape into
    one character, and both keep the last value of a duplicate key, in the first one's place.
    """
    loads = _fast_loads
    if loads is None:
        return None
    try:
        fields = loads(header)
    except ValueError:  # orjson.JSONDecodeError: the reference names the error, or reads what orjson refused
        return None
    if type(fields) is not dict:
        return None
    get = fields.get
    opaque = get("opaque")
    code = get("code")
    flag = get("flag")
    if flag is None:
        flag = 0
    version = get("version")
    if version is None:
        version = 0
    if not (
        type(opaque) is int
        and type(code) is int
        and type(flag) is int
        and type(version) is int
        and INT32_MIN <= opaque <= INT32_MAX
        and INT32_MIN <= code <= INT32_MAX
        and INT32_MIN <= flag <= INT32_MAX
        and INT32_MIN <= version <= INT32_MAX
    ):
        return None
    language = get("language")
    if type(language) is not str:
        if language is None:
            language = _LANGUAGE_MISSING
        elif type(language) is int and language in _LANGUAGE_NAMES:
            language = _LANGUAGE_NAMES[language]
        else:
            return None
    remark = get("remark")
    if remark is not None and (
        type(remark) is not str or _utf8_length_exceeds(remark, limits.remark_max_bytes)
    ):
        return None
    ext_fields = get("extFields")
    if ext_fields is None:
        ext_fields = {}
    elif type(ext_fields) is not dict or len(ext_fields) > limits.ext_fields_count_max:
        return None
    else:
        value_max_bytes = limits.ext_field_value_max_bytes
        value_short_max = value_max_bytes // 4
        for value in ext_fields.values():
            if type(value) is not str:
                # C++ clients write numbers and booleans; Java leaves nulls out, others may send them
                ext_fields = _fast_ext_fields(ext_fields, value_max_bytes)
                if ext_fields is None:
                    return None
                break
            if len(value) > value_short_max and _utf8_length_exceeds(value, value_max_bytes):
                return None
    return code, language, version, opaque, flag, remark, ext_fields


def _fast_ext_fields(raw: dict[str, object], value_max_bytes: int) -> dict[str, str] | None:
    """extFields of strings, ints, booleans and nulls as :func:`_decode_json_header` keeps them, or None
    when a value is of another kind or over the limit (the reference decides)."""
    value_short_max = value_max_bytes // 4
    ext_fields: dict[str, str] = {}
    for key, value in raw.items():
        if type(value) is str:
            text = value
        elif type(value) is int:
            text = str(value)  # orjson's ints are exact (those beyond 64 bits come as floats)
        elif value is True:
            text = "true"
        elif value is False:
            text = "false"
        elif value is None:
            continue
        else:
            return None
        if len(text) > value_short_max and _utf8_length_exceeds(text, value_max_bytes):
            return None
        ext_fields[key] = text
    return ext_fields


# -------------------------------------------------------------------------------------- binary header


def _binary_text(view: memoryview, start: int, end: int, what: str, known: _DecodedSoFar) -> str:
    # No slice of ``view`` may outlive this call: a live slice pins the decoder's bytearray (no resize).
    try:
        return str(view[start:end], "utf-8")
    except UnicodeDecodeError as error:
        raise known.error(
            HeaderEncodingError, f"{what} is not valid UTF-8: {error.reason} at byte {error.start}"
        ) from None


def _decode_binary_header(
    view: memoryview, start: int, end: int, known: _DecodedSoFar, limits: CodecLimits
) -> tuple[int, str, int, int, int, str | None, dict[str, str]]:
    """(code, language, version, opaque, flag, remark, ext_fields) from a ROCKETMQ binary header
    occupying ``view[start:end]``. A remark of length 0 reads as None, as in Java."""
    length = end - start
    if length < _BINARY_FIXED.size:
        # Keep what the fragment holds: code at 0, opaque at 5, flag at 9.
        if length >= 2:
            known.code = _INT16.unpack_from(view, start)[0]
        if length >= 9:
            known.opaque = _INT32.unpack_from(view, start + 5)[0]
        raise known.error(
            TruncatedHeaderError,
            f"binary header is {length} bytes, shorter than its {_BINARY_FIXED.size}-byte fixed part",
        )
    code, language_value, version, opaque, flag = _BINARY_FIXED.unpack_from(view, start)
    known.code, known.opaque, known.flag = code, opaque, flag
    language = _LANGUAGE_NAMES.get(language_value)
    if language is None:
        raise known.error(
            HeaderFieldError, f"binary header language {language_value} is not a known language code"
        )
    position = start + _BINARY_FIXED.size

    def read_length(what: str) -> int:
        nonlocal position
        if position + 4 > end:
            raise known.error(TruncatedHeaderError, f"binary header ends before the {what} length")
        value: int = _INT32.unpack_from(view, position)[0]
        position += 4
        if value < 0:
            raise known.error(HeaderSyntaxError, f"binary header {what} length is negative: {value}")
        if value > end - position:
            raise known.error(
                TruncatedHeaderError,
                f"binary header {what} length {value} runs past the header end ({end - position} left)",
            )
        return value

    remark_length = read_length("remark")
    if remark_length > limits.remark_max_bytes:
        raise known.error(
            RemarkTooLargeError,
            f"remark is {remark_length} bytes, more than remark_max_bytes={limits.remark_max_bytes}",
        )
    remark = (
        _binary_text(view, position, position + remark_length, "remark", known) if remark_length else None
    )
    position += remark_length

    ext_length = read_length("extFields")
    ext_end = position + ext_length
    if ext_end != end:
        raise known.error(HeaderSyntaxError, f"binary header has {end - ext_end} bytes after its extFields")
    ext_fields: dict[str, str] = {}
    count = 0
    count_max = limits.ext_fields_count_max
    value_max_bytes = limits.ext_field_value_max_bytes
    while position < ext_end:
        count += 1
        if count > count_max:
            raise known.error(TooManyExtFieldsError, f"more than ext_fields_count_max={count_max} extFields")
        if position + 2 > ext_end:
            raise known.error(
                TruncatedHeaderError, f"binary extFields entry {count} ends inside its key length"
            )
        key_length = _INT16.unpack_from(view, position)[0]
        position += 2
        if key_length < 0:
            raise known.error(
                HeaderSyntaxError, f"binary extFields entry {count} key length is negative: {key_length}"
            )
        if position + key_length + 4 > ext_end:
            raise known.error(TruncatedHeaderError, f"binary extFields entry {count} ends inside its key")
        key = _binary_text(view, position, position + key_length, f"extFields key {count}", known)
        position += key_length
        value_length = _INT32.unpack_from(view, position)[0]
        position += 4
        if value_length < 0:
            raise known.error(
                HeaderSyntaxError, f"binary extFields value of {key!r} has a negative length: {value_length}"
            )
        if position + value_length > ext_end:
            raise known.error(
                TruncatedHeaderError, f"binary extFields value of {key!r} runs past the extFields end"
            )
        if value_length > value_max_bytes:
            raise known.error(
                ExtFieldValueTooLargeError,
                f"extFields value of {key!r} is {value_length} bytes, more than ext_field_value_max_bytes={value_max_bytes}",
            )
        ext_fields[key] = _binary_text(
            view, position, position + value_length, f"extFields value of {key!r}", known
        )
        position += value_length
    return code, language, version, opaque, flag, remark, ext_fields


# ----------------------------------------------------------------------------------------------- frame

_COMMAND_FIELDS: Final = (
    "code", "opaque", "flag", "language", "version", "remark", "ext_fields", "body", "serialize_type"
)  # fmt: skip
invariant(
    tuple(field.name for field in dataclasses.fields(RemotingCommand)) == _COMMAND_FIELDS,
    "RemotingCommand's fields changed: update _COMMAND_FIELDS and _decoded_command",
)
invariant(
    all(isinstance(getattr(RemotingCommand, name), MemberDescriptorType) for name in _COMMAND_FIELDS),
    "RemotingCommand must keep slots: _decoded_command stores through the slots' own setters",
)
# A slot's setter stores a value without the frozen class's __setattr__ (which refuses every store).
(
    _SET_CODE, _SET_OPAQUE, _SET_FLAG, _SET_LANGUAGE, _SET_VERSION, _SET_REMARK, _SET_EXT_FIELDS, _SET_BODY,
    _SET_TYPE,
) = (getattr(RemotingCommand, name).__set__ for name in _COMMAND_FIELDS)  # fmt: skip
_new_object: Final = object.__new__


def _decoded_command(
    code: int,
    opaque: int,
    flag: int,
    language: str,
    version: int,
    remark: str | None,
    ext_fields: dict[str, str],
    body: bytes,
    serialize_type: int,
) -> RemotingCommand:
    """The command for fields a header parser has already checked one by one: what
    ``RemotingCommand.__post_init__`` would check again (int32 ints of type int, str language and
    remark, bytes body, str to str extFields), without its cost on every frame. ``ext_fields`` must be
    a dict no one else keeps: the command holds it behind a read-only view, as ``__post_init__`` does
    with its copy."""
    command: RemotingCommand = _new_object(RemotingCommand)
    _SET_CODE(command, code)
    _SET_OPAQUE(command, opaque)
    _SET_FLAG(command, flag)
    _SET_LANGUAGE(command, language)
    _SET_VERSION(command, version)
    _SET_REMARK(command, remark)
    _SET_EXT_FIELDS(command, MappingProxyType(ext_fields))
    _SET_BODY(command, body)
    _SET_TYPE(command, serialize_type)
    return command


def _decode_frame_content(
    buffer: bytes | bytearray, start: int, end: int, limits: CodecLimits
) -> RemotingCommand:
    """The command in ``buffer[start:end]``: one frame without its length prefix (``end - start >= 4``).

    Raises only recoverable :class:`FrameError` subclasses: the frame is delimited by the caller.
    A JSON frame within every limit goes through the fast header path first; whatever it declines
    goes through the reference below, which gives the same command or raises the error.
    """
    (type_and_length,) = _UINT32.unpack_from(buffer, start)
    serialize_type = type_and_length >> 24
    header_length = type_and_length & HEADER_LENGTH_FIELD_MAX
    header_start = start + 4
    header_end = header_start + header_length
    if (
        serialize_type == _JSON
        and header_end <= end
        and header_length <= limits.header_size_max_bytes
        and end - header_end <= limits.body_size_max_bytes
        and (_native_header is not None or _fast_loads is not None)
    ):
        fields = None
        if _native_header is not None:
            fields = _native_header(buffer, header_start, header_end, limits.remark_max_bytes,
                                    limits.ext_fields_count_max, limits.ext_field_value_max_bytes, _LANGUAGE_MISSING)
        if fields is None:
            fields = _decode_json_header_fast(buffer[header_start:header_end], limits)
        if fields is not None:
            if header_end == end:
                body = b""
            else:
                with memoryview(buffer) as view:
                    body = view[header_end:end].tobytes()
            code, language, version, opaque, flag, remark, ext_fields = fields
            return _decoded_command(code, opaque, flag, language, version, remark, ext_fields, body, _JSON)
    return _decode_frame_content_reference(buffer, start, end, limits)


def _decode_frame_content_reference(
    buffer: bytes | bytearray, start: int, end: int, limits: CodecLimits
) -> RemotingCommand:
    """:func:`_decode_frame_content` through the stdlib JSON and every check, in the order of the
    errors it raises; the fast path is tested against it."""
    (type_and_length,) = _UINT32.unpack_from(buffer, start)
    serialize_type = type_and_length >> 24
    header_length = type_and_length & HEADER_LENGTH_FIELD_MAX
    known = _DecodedSoFar(serialize_type)
    if serialize_type != _JSON and serialize_type != _ROCKETMQ:
        known.serialize_type = None
        raise known.error(
            UnknownSerializeTypeError, f"serialize type {serialize_type} is neither 0 (JSON) nor 1 (ROCKETMQ)"
        )
    header_start = start + 4
    header_end = header_start + header_length
    if header_end > end:
        raise known.error(
            HeaderLengthError,
            f"header length {header_length} runs past the frame end ({end - header_start} bytes left)",
        )
    if header_length > limits.header_size_max_bytes:
        raise known.error(
            HeaderTooLargeError,
            f"header is {header_length} bytes, more than header_size_max_bytes={limits.header_size_max_bytes}",
        )
    with memoryview(buffer) as view:
        if serialize_type == _JSON:
            try:
                text = str(view[header_start:header_end], "utf-8")
            except UnicodeDecodeError as error:
                raise known.error(
                    HeaderEncodingError,
                    f"JSON header is not valid UTF-8: {error.reason} at byte {error.start}",
                ) from None
            fields = _decode_json_header(text, known, limits)
        else:
            fields = _decode_binary_header(view, header_start, header_end, known, limits)
        body_length = end - header_end
        if body_length > limits.body_size_max_bytes:
            raise known.error(
                BodyTooLargeError,
                f"body is {body_length} bytes, more than body_size_max_bytes={limits.body_size_max_bytes}",
            )
        body = view[header_end:end].tobytes() if body_length else b""
    code, language, version, opaque, flag, remark, ext_fields = fields
    try:
        return RemotingCommand(
            code=code,
            opaque=opaque,
            flag=flag,
            language=language,
            version=version,
            remark=remark,
            ext_fields=ext_fields,
            body=body,
            serialize_type=serialize_type,
        )
    except InvalidCommandError as error:
        # The header parsers check every field first; this only keeps the "FrameError only" promise.
        raise known.error(HeaderFieldError, str(error)) from None


class FrameDecoder:
    """Turns a byte stream into commands: :meth:`feed` what arrives, then call :meth:`next_frame` until it
    returns None (more bytes needed).

    Memory: the buffer holds at most one incomplete frame plus the bytes of the latest :meth:`feed`,
    because a length prefix above ``frame_size_max_bytes`` is refused as soon as its 4 bytes are there.

    Errors: :meth:`next_frame` raises only :class:`FrameError` subclasses, whatever the bytes. After a
    recoverable one the bad frame is consumed and decoding goes on; after a fatal one every call raises it
    again. :meth:`feed` raises :class:`DecoderUsageError` if the caller keeps feeding without draining.
    """

    __slots__ = ("_buffer", "_fatal_error", "_limits", "_offset", "_total_length_max")

    def __init__(self, limits: CodecLimits = DEFAULT_LIMITS) -> None:
        limits.validate()
        self._limits = limits
        self._total_length_max = limits.frame_size_max_bytes - _LENGTH_PREFIX_BYTES
        self._buffer = bytearray()
        # bytes before this offset are consumed: dropped at the next feed, not on every frame
        self._offset = 0
        self._fatal_error: FrameError | None = None

    @property
    def limits(self) -> CodecLimits:
        return self._limits

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._buffer) - self._offset

    @property
    def broken(self) -> bool:
        """A fatal error happened: the connection must be closed."""
        return self._fatal_error is not None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes, then drain with :meth:`next_frame` until it returns None.

        A caller that keeps feeding without draining gets :class:`DecoderUsageError` once a max frame's
        worth is waiting. Empty bytes are harmless; end of stream is the caller's business.
        """
        if self._fatal_error is not None:
            raise self._fatal_error.with_traceback(None)
        unconsumed = len(self._buffer) - self._offset
        if unconsumed >= self._limits.frame_size_max_bytes:
            # Drained, the buffer holds less than one max frame; this much means next_frame was not called.
            raise DecoderUsageError(
                f"{unconsumed} bytes are buffered (frame_size_max_bytes={self._limits.frame_size_max_bytes}): "
                "call next_frame() until it returns None before feeding more"
            )
        if self._offset:
            del self._buffer[: self._offset]  # CPython drops a bytearray prefix without copying the rest
            self._offset = 0
        self._buffer += data

    def next_frame(self) -> RemotingCommand | None:
        """The next complete command, or None when more bytes are needed."""
        if self._fatal_error is not None:
            raise self._fatal_error.with_traceback(None)
        buffer = self._buffer
        start = self._offset
        if len(buffer) - start < _LENGTH_PREFIX_BYTES:
            return None
        (total_length,) = _INT32.unpack_from(buffer, start)
        if total_length < _TOTAL_LENGTH_MIN:
            self._fatal_error = FrameLengthError(
                f"frame length prefix is {total_length}, below the minimum {_TOTAL_LENGTH_MIN}: stream out of sync"
            )
            raise self._fatal_error
        if total_length > self._total_length_max:
            self._fatal_error = FrameTooLargeError(
                f"frame of {total_length + _LENGTH_PREFIX_BYTES} bytes announced, more than "
                f"frame_size_max_bytes={self._limits.frame_size_max_bytes}"
            )
            raise self._fatal_error
        end = start + _LENGTH_PREFIX_BYTES + total_length
        if len(buffer) < end:
            return None
        try:
            return _decode_frame_content(buffer, start + _LENGTH_PREFIX_BYTES, end, self._limits)
        finally:
            # consumed whether it decoded or not: a recoverable error leaves us at the next frame
            if end == len(buffer):
                buffer.clear()
                self._offset = 0
            else:
                self._offset = end


def decode_frame(data: bytes | bytearray, limits: CodecLimits = DEFAULT_LIMITS) -> RemotingCommand:
    """The command in ``data``, which must hold exactly one whole frame (tests, tools, corpus replay)."""
    decoder = FrameDecoder(limits)
    decoder.feed(data)
    command = decoder.next_frame()
    if command is None:
        raise FrameLengthError(f"incomplete frame: {len(data)} bytes")
    if decoder.buffered_bytes:
        raise FrameLengthError(f"{decoder.buffered_bytes} bytes after the frame")
    return command


# ---------------------------------------------------------------------------------------------- encode


def _encode_json_header(command: RemotingCommand, opaque: int | None = None,
                        ext_fields: Mapping[str, str] | None = None) -> bytes:
    """The JSON header (of ``command``, with ``opaque`` and ``ext_fields`` in place of its own when given):
    orjson's bytes are the stdlib's byte for byte (``ensure_ascii=False``, no spaces: the same escapes for
    every code point), and what orjson refuses, only a lone surrogate here (every other value is an int32
    or a str), goes to the stdlib, which names it."""
    header: dict[str, object] = {
        "code": command.code,
        "language": command.language,
        "version": command.version,
        "opaque": command.opaque if opaque is None else opaque,
        "flag": command.flag,
    }
    if command.remark is not None:
        header["remark"] = command.remark
    fields = command.ext_fields if ext_fields is None else ext_fields
    if fields:
        # every value a JSON string: the C++ client ignores response extFields that are not
        header["extFields"] = dict(fields)
    if _fast_dumps is not None:
        try:
            return _fast_dumps(header)
        except _FastEncodeError:
            pass
    try:
        return _JSON_ENCODER.encode(header).encode("utf-8")
    except UnicodeEncodeError as error:
        raise EncodeError(f"header text cannot be written as UTF-8: {error.reason}") from None


def _encode_binary_header(command: RemotingCommand) -> bytes:
    if not INT16_MIN <= command.code <= INT16_MAX:
        raise EncodeError(f"code {command.code} does not fit the binary header's int16")
    if not INT16_MIN <= command.version <= INT16_MAX:
        raise EncodeError(f"version {command.version} does not fit the binary header's int16")
    language_value = _LANGUAGE_VALUES.get(command.language)
    if language_value is None:
        raise EncodeError(f"language {command.language!r} has no binary code")
    try:
        remark = command.remark.encode("utf-8") if command.remark else b""
        parts = [
            _BINARY_FIXED.pack(command.code, language_value, command.version, command.opaque, command.flag),
            _INT32.pack(len(remark)),
            remark,
            b"",  # extFields length, filled below
        ]
        ext_length = 0
        for key, value in command.ext_fields.items():
            key_bytes = key.encode("utf-8")
            value_bytes = value.encode("utf-8")
            if len(key_bytes) > INT16_MAX:
                raise EncodeError(
                    f"extFields key of {len(key_bytes)} bytes does not fit the binary int16 length"
                )
            parts += (_INT16.pack(len(key_bytes)), key_bytes, _INT32.pack(len(value_bytes)), value_bytes)
            ext_length += 6 + len(key_bytes) + len(value_bytes)
    except UnicodeEncodeError as error:
        raise EncodeError(f"header text cannot be written as UTF-8: {error.reason}") from None
    parts[3] = _INT32.pack(ext_length)
    return b"".join(parts)


def encode_frame(command: RemotingCommand, limits: CodecLimits = DEFAULT_LIMITS) -> bytes:
    """The frame for ``command``, its header in ``command.serialize_type``.

    Raises :class:`EncodeError` if the binary form cannot hold a field, if text is not encodable as
    UTF-8 (a lone surrogate), or if the frame would exceed ``limits.frame_size_max_bytes``.
    """
    if command.serialize_type == _JSON:
        header = _encode_json_header(command)
    else:
        header = _encode_binary_header(command)
    return _framed(command, header, limits)


def encode_relayed(command: RemotingCommand, opaque: int, ext_fields: dict[str, str] | None = None,
                   limits: CodecLimits = DEFAULT_LIMITS) -> bytes:
    """The frame of ``replace(command, opaque=opaque)`` (and ``ext_fields=ext_fields`` when given), byte for
    byte as :func:`encode_frame` writes it, without building that command: what a member relays, a
    client's request to the leader and the leader's answer back. ``opaque`` is an int32 and
    ``ext_fields`` maps str to str (a JSON header is written as is); raises as :func:`encode_frame`."""
    if command.serialize_type != _JSON:
        changed = dataclasses.replace(command, opaque=opaque) if ext_fields is None else \
            dataclasses.replace(command, opaque=opaque, ext_fields=ext_fields)
        return encode_frame(changed, limits)
    return _framed(command, _encode_json_header(command, opaque, ext_fields), limits)


def _framed(command: RemotingCommand, header: bytes, limits: CodecLimits) -> bytes:
    """The frame of ``command``'s body under ``header`` (written in ``command.serialize_type``)."""
    header_length = len(header)
    if header_length > HEADER_LENGTH_FIELD_MAX:
        raise EncodeError(f"header of {header_length} bytes does not fit the 24-bit header length")
    total_length = _TOTAL_LENGTH_MIN + header_length + len(command.body)
    if total_length + _LENGTH_PREFIX_BYTES > limits.frame_size_max_bytes:
        raise EncodeError(
            f"frame of {total_length + _LENGTH_PREFIX_BYTES} bytes exceeds "
            f"frame_size_max_bytes={limits.frame_size_max_bytes}"
        )
    prefix = _FRAME_PREFIX.pack(total_length, command.serialize_type << 24 | header_length)
    return b"".join((prefix, header, command.body))


def encode_json_answer(opaque: int, code: int, ext_fields: dict[str, str]) -> bytes | None:
    """The frame of ``make_response(request, code, None, ext_fields)`` for a JSON ``request`` with ``opaque``,
    byte for byte as :func:`encode_frame` writes it, without building the command (the answer to every
    send); None when only the general path can write it (no orjson, or text that is not UTF-8)."""
    encoded = _fast_json_header(code, opaque, RESPONSE_FLAG, ext_fields)
    if encoded is None:
        return None
    header_length = len(encoded)
    return _FRAME_PREFIX.pack(_TOTAL_LENGTH_MIN + header_length, header_length) + encoded


def _fast_json_header(code: int, opaque: int, flag: int, ext_fields: Mapping[str, str] | None) -> bytes | None:
    """The JSON header of a command with these fields and our language and version, by orjson, as
    :func:`_encode_json_header` writes it; None without orjson or for text it refuses (a lone surrogate)."""
    dumps = _fast_dumps
    if dumps is None:
        return None
    header: dict[str, object] = {"code": code, "language": DEFAULT_LANGUAGE, "version": REMOTING_VERSION,
                                 "opaque": opaque, "flag": flag}
    if ext_fields:
        header["extFields"] = ext_fields
    try:
        return dumps(header)
    except _FastEncodeError:
        return None


def encode_json_request(code: int, opaque: int, ext_fields: Mapping[str, str] | None, body: bytes,
                        limits: CodecLimits = DEFAULT_LIMITS) -> bytes | None:
    """The frame of ``make_request(code, opaque, ext_fields, body)`` (JSON, no remark, not oneway), byte for
    byte as :func:`encode_frame` writes it, without building the command (every request a client sends);
    None when only the general path can write it or name what is wrong (a field of another type or out of
    range, text that is not UTF-8, a frame over the limits, no orjson)."""
    if type(body) is not bytes or type(opaque) is not int or not INT32_MIN <= opaque <= INT32_MAX:
        return None
    if type(code) is not int:
        if not isinstance(code, int) or isinstance(code, bool):
            return None
        code = int(code)  # a RequestCode
    if not INT32_MIN <= code <= INT32_MAX:
        return None
    if ext_fields:
        if type(ext_fields) is not dict:
            return None
        for key, value in ext_fields.items():
            if type(key) is not str or type(value) is not str:
                return None
    encoded = _fast_json_header(code, opaque, 0, ext_fields)
    if encoded is None:
        return None
    header_length = len(encoded)
    total_length = _TOTAL_LENGTH_MIN + header_length + len(body)
    if header_length > HEADER_LENGTH_FIELD_MAX or total_length + _LENGTH_PREFIX_BYTES > limits.frame_size_max_bytes:
        return None
    return b"".join((_FRAME_PREFIX.pack(total_length, header_length), encoded, body))


def make_error_response(error: FrameError) -> RemotingCommand | None:
    """The answer to a recoverable bad frame (its ``response_code``, the error text as remark, in the
    frame's header form), or None when there is no one to answer (see :attr:`FrameError.can_respond`)."""
    if not error.can_respond or error.opaque is None:
        return None
    serialize_type = _JSON if error.serialize_type is None else error.serialize_type
    return RemotingCommand(
        code=error.response_code,
        opaque=error.opaque,
        flag=RESPONSE_FLAG,
        remark=error.message,
        serialize_type=serialize_type,
    )
