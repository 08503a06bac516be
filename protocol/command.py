"""One remoting command (request or response), as a frozen value that validates itself.

A command carries plain ints for ``code`` (a peer may use codes missing from :mod:`codes`) and
``language`` as the name string the JSON header uses. Allocating request ``opaque`` values is the
caller's business: a response echoes its request's ``opaque`` (0 is a valid opaque).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from protocol.codes import LanguageCode, SerializeType

#: flag bit 0: the command is a response (``RemotingCommand.markResponseType`` in Java)
RESPONSE_FLAG: Final = 1
#: flag bit 1: the sender expects no answer. Stock C++ clients never set it on the wire
#: (tests/interop/README.md), so a server must not rely on it to decide whether to answer.
ONEWAY_FLAG: Final = 2

INT16_MIN: Final = -(2**15)
INT16_MAX: Final = 2**15 - 1
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1

#: ``MQVersion.Version.V4_9_4.ordinal()``: the ``version`` a 4.9.4 Java client or broker writes.
REMOTING_VERSION: Final = 401
#: what we write in ``language`` (``LanguageCode.PYTHON``); peers do not act on it.
DEFAULT_LANGUAGE: Final = LanguageCode.PYTHON.name

_SERIALIZE_TYPES: Final = frozenset(member.value for member in SerializeType)


class InvalidCommandError(ValueError):
    """A :class:`RemotingCommand` was built with a field of the wrong type or out of range."""


def _check_int32(name: str, value: object) -> int:
    """``value`` as a plain int (an IntEnum such as ``RequestCode.SEND_MESSAGE`` is welcome)."""
    # bool is an int subclass: True as an opaque is always a bug
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidCommandError(f"{name} must be an int, got {type(value).__name__}")
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidCommandError(f"{name} must fit an int32, got {value}")
    return int(value)


@dataclass(frozen=True, slots=True, repr=False)
class RemotingCommand:
    """A request or a response, whatever the header form it travels in.

    ``ext_fields`` maps strings to strings, as Java's ``HashMap<String, String>``: the decoder
    turns the JSON numbers and booleans some clients send into strings, and the encoder writes every
    value as a JSON string (the C++ client ignores response fields that are not). It is stored as a
    read-only copy. ``serialize_type`` is the header form (:class:`SerializeType`): a response should
    use its request's, which :func:`make_response` does.
    """

    code: int
    opaque: int
    flag: int = 0
    language: str = DEFAULT_LANGUAGE
    version: int = REMOTING_VERSION
    remark: str | None = None
    # hash=False: a read-only mapping is not hashable, and a command stays hashable by its other fields
    ext_fields: Mapping[str, str] = field(default_factory=dict, hash=False)
    body: bytes = b""
    serialize_type: int = SerializeType.JSON

    def __post_init__(self) -> None:
        # On every decoded frame: the common case (plain ints, a dict) takes the first branch of each test.
        code, opaque, flag, version = self.code, self.opaque, self.flag, self.version
        if not (
            type(code) is int
            and type(opaque) is int
            and type(flag) is int
            and type(version) is int
            and INT32_MIN <= code <= INT32_MAX
            and INT32_MIN <= opaque <= INT32_MAX
            and INT32_MIN <= flag <= INT32_MAX
            and INT32_MIN <= version <= INT32_MAX
        ):
            for name in ("code", "opaque", "flag", "version"):
                object.__setattr__(self, name, _check_int32(name, getattr(self, name)))
        if type(self.language) is not str:
            raise InvalidCommandError(f"language must be a str, got {type(self.language).__name__}")
        if self.remark is not None and type(self.remark) is not str:
            raise InvalidCommandError(f"remark must be a str or None, got {type(self.remark).__name__}")
        if type(self.body) is not bytes:
            raise InvalidCommandError(f"body must be bytes, got {type(self.body).__name__}")
        serialize_type = self.serialize_type
        if type(serialize_type) is not int or serialize_type not in _SERIALIZE_TYPES:
            if (
                not isinstance(serialize_type, int)
                or isinstance(serialize_type, bool)
                or serialize_type not in _SERIALIZE_TYPES
            ):
                raise InvalidCommandError(
                    f"serialize_type must be 0 (JSON) or 1 (ROCKETMQ), got {serialize_type!r}"
                )
            object.__setattr__(self, "serialize_type", int(serialize_type))  # SerializeType.JSON -> 0
        ext_fields = self.ext_fields
        if type(ext_fields) is not dict and not isinstance(ext_fields, Mapping):
            raise InvalidCommandError(f"ext_fields must be a mapping, got {type(ext_fields).__name__}")
        # a private copy behind a read-only view: the caller's dict may change later
        ext_fields = dict(ext_fields)
        for key, value in ext_fields.items():
            if type(key) is not str or type(value) is not str:
                raise InvalidCommandError(
                    f"ext_fields must map str to str, got {type(key).__name__} {key!r} -> {type(value).__name__}"
                )
        object.__setattr__(self, "ext_fields", MappingProxyType(ext_fields))

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        """The oneway bit as sent; see :data:`ONEWAY_FLAG` for why a server should not trust it."""
        return bool(self.flag & ONEWAY_FLAG)

    def __repr__(self) -> str:
        # A body can be megabytes: show its size, not its bytes.
        return (
            f"RemotingCommand(code={self.code}, opaque={self.opaque}, flag={self.flag}, "
            f"language={self.language!r}, version={self.version}, remark={self.remark!r}, "
            f"ext_fields={dict(self.ext_fields)!r}, body=<{len(self.body)} bytes>, "
            f"serialize_type={self.serialize_type})"
        )


def make_request(
    code: int,
    opaque: int,
    ext_fields: Mapping[str, str] | None = None,
    body: bytes = b"",
    *,
    remark: str | None = None,
    oneway: bool = False,
    language: str = DEFAULT_LANGUAGE,
    version: int = REMOTING_VERSION,
    serialize_type: int = SerializeType.JSON,
) -> RemotingCommand:
    """A request; ``opaque`` comes from the caller's own allocator."""
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=ONEWAY_FLAG if oneway else 0,
        language=language,
        version=version,
        remark=remark,
        ext_fields={} if ext_fields is None else ext_fields,
        body=body,
        serialize_type=serialize_type,
    )


def make_response(
    request: RemotingCommand,
    code: int,
    remark: str | None = None,
    ext_fields: Mapping[str, str] | None = None,
    body: bytes = b"",
) -> RemotingCommand:
    """The response to ``request``: echoes its ``opaque`` and header form, sets only the response bit
    (as Java's ``createResponseCommand``: the oneway bit is not carried over)."""
    if request.is_response:
        raise InvalidCommandError(f"cannot answer a response (code {request.code}, opaque {request.opaque})")
    return RemotingCommand(
        code=code,
        opaque=request.opaque,
        flag=RESPONSE_FLAG,
        remark=remark,
        ext_fields={} if ext_fields is None else ext_fields,
        body=body,
        serialize_type=request.serialize_type,
    )
