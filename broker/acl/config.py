"""The ACL file: RocketMQ's ``plain_acl.yml`` written as TOML (same key names, same meaning), and the
canonical document that travels through Raft.

::

    globalWhiteRemoteAddresses = ["10.10.103.*", "192.168.0.{1,2}"]   # no signature, no permission check

    [[accounts]]
    accessKey = "RocketMQ"                  # longer than 6 characters, unique
    secretKey = "12345678"                  # longer than 6 characters
    whiteRemoteAddress = "192.168.1.*"      # this account from these addresses: no signature, no checks
    admin = false                           # admin request codes (create/delete topic, ...) need true
    defaultTopicPerm = "DENY"               # topics not listed below (missing: DENY)
    defaultGroupPerm = "SUB"                # groups not listed below (missing: DENY)
    topicPerms = ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"]
    groupPerms = ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"]

Stricter than RocketMQ where RocketMQ guesses: an unknown key, an unknown permission text, a duplicate
access key or a malformed whitelist pattern is an :class:`AclConfigError` naming it (RocketMQ would read
a typo as DENY, or let the later duplicate win).

The replicated form (:meth:`AclConfig.to_document`) is canonical JSON of the validated configuration
(sorted keys, sorted lists), so reformatting the file changes nothing and every node parses the very
same bytes.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker.acl.addresses import compile_pattern
from broker.acl.permissions import DENY, PERMISSION_NAMES, AclConfigError, parse_permission, permission_text

#: a key must be longer than this (``PlainPermissionManager``: "length should longer than 6")
KEY_CHARS_MIN_EXCLUSIVE: Final = 6
KEY_CHARS_MAX: Final = 1024
ACCOUNTS_MAX: Final = 10_000
RESOURCES_PER_ACCOUNT_MAX: Final = 10_000
WHITELIST_PATTERNS_MAX: Final = 10_000
RESOURCE_CHARS_MAX: Final = 255
#: the canonical document travels in one Raft entry: keep it far below the entry limit
DOCUMENT_BYTES_MAX: Final = 1 << 20
DOCUMENT_FORMAT: Final = "raftmq-acl-1"

_TOP_KEYS: Final = frozenset({"globalWhiteRemoteAddresses", "accounts"})
_ACCOUNT_KEYS: Final = frozenset({"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                                  "defaultGroupPerm", "topicPerms", "groupPerms"})


@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str
    white_remote_address: str = ""
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    #: topic -> permission bits
    topic_perms: Mapping[str, int] = field(default_factory=dict)
    #: group -> permission bits (the group's name, not its retry topic)
    group_perms: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AclConfig:
    global_white_remote_addresses: tuple[str, ...] = ()
    accounts: tuple[Account, ...] = ()

    def account(self, access_key: str) -> Account | None:
        for account in self.accounts:
            if account.access_key == access_key:
                return account
        return None

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "ACL") -> AclConfig:
        """A configuration from a parsed TOML (or JSON) table with RocketMQ's key names."""
        if not isinstance(values, Mapping):
            raise AclConfigError(f"{where}: must be a table")
        unknown = sorted(set(values) - _TOP_KEYS)
        if unknown:
            raise AclConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_TOP_KEYS))})")
        white = values.get("globalWhiteRemoteAddresses", [])
        if isinstance(white, str):
            white = [white]
        if not isinstance(white, list) or len(white) > WHITELIST_PATTERNS_MAX:
            raise AclConfigError(f"{where}: globalWhiteRemoteAddresses must be a list of patterns")
        for pattern in white:
            compile_pattern(pattern)
        accounts_value = values.get("accounts", [])
        if not isinstance(accounts_value, list) or len(accounts_value) > ACCOUNTS_MAX:
            raise AclConfigError(f"{where}: accounts must be a list of at most {ACCOUNTS_MAX} tables")
        accounts = []
        seen: set[str] = set()
        for position, entry in enumerate(accounts_value):
            account = _account(entry, f"{where}: accounts[{position}]")
            if account.access_key in seen:
                raise AclConfigError(f"{where}: accounts[{position}]: accessKey {account.access_key!r} appears twice")
            seen.add(account.access_key)
            accounts.append(account)
        return cls(tuple(str(pattern) for pattern in white), tuple(accounts))

    @classmethod
    def from_toml(cls, text: str, where: str = "ACL file") -> AclConfig:
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise AclConfigError(f"{where} is not valid TOML: {exc}") from None
        if not document.get("accounts") and not document.get("globalWhiteRemoteAddresses"):
            # RocketMQ refuses an empty file too: it would lock every client out (or is a half-written file)
            raise AclConfigError(f"{where} has no accounts and no globalWhiteRemoteAddresses")
        return cls.from_mapping(document, where)

    # ------------------------------------------------------------------ the replicated form

    def to_document(self) -> bytes:
        """Canonical JSON (the replicated form); :class:`AclConfigError` when it exceeds
        :data:`DOCUMENT_BYTES_MAX`."""
        accounts = [{
            "accessKey": account.access_key,
            "secretKey": account.secret_key,
            "whiteRemoteAddress": account.white_remote_address,
            "admin": account.admin,
            "defaultTopicPerm": permission_text(account.default_topic_perm),
            "defaultGroupPerm": permission_text(account.default_group_perm),
            "topicPerms": [f"{name}={permission_text(perm)}" for name, perm in sorted(account.topic_perms.items())],
            "groupPerms": [f"{name}={permission_text(perm)}" for name, perm in sorted(account.group_perms.items())],
        } for account in sorted(self.accounts, key=lambda each: each.access_key)]
        document = {"format": DOCUMENT_FORMAT, "globalWhiteRemoteAddresses": sorted(self.global_white_remote_addresses),
                    "accounts": accounts}
        data = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(data) > DOCUMENT_BYTES_MAX:
            raise AclConfigError(f"the ACL is {len(data)} bytes once encoded; at most {DOCUMENT_BYTES_MAX} are allowed")
        return data

    @classmethod
    def from_document(cls, data: bytes) -> AclConfig:
        """The configuration a replicated document holds; :class:`AclConfigError` when it is not one."""
        if len(data) > DOCUMENT_BYTES_MAX:
            raise AclConfigError("replicated ACL document is too large")
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise AclConfigError(f"replicated ACL document is not JSON: {exc}") from None
        if not isinstance(document, dict) or document.pop("format", None) != DOCUMENT_FORMAT:
            raise AclConfigError(f"replicated ACL document is not in format {DOCUMENT_FORMAT}")
        return cls.from_mapping(document, "replicated ACL")


def load_acl_file(path: Path) -> AclConfig:
    """Read and validate an ACL file; :class:`AclConfigError` naming the file and the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"cannot read the ACL file {path}: {exc}") from None
    return AclConfig.from_toml(text, str(path))


def _text(entry: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise AclConfigError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _key(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = _text(entry, key, where)
    if not KEY_CHARS_MIN_EXCLUSIVE < len(value) <= KEY_CHARS_MAX or value != value.strip():
        raise AclConfigError(f"{where}: {key} must be {KEY_CHARS_MIN_EXCLUSIVE + 1} to {KEY_CHARS_MAX} characters "
                             "without surrounding spaces")
    return value


def _resource_perms(entry: Mapping[str, Any], key: str, where: str) -> dict[str, int]:
    value = entry.get(key, [])
    if not isinstance(value, list) or len(value) > RESOURCES_PER_ACCOUNT_MAX:
        raise AclConfigError(f"{where}: {key} must be a list of \"name=PERM\" strings")
    perms: dict[str, int] = {}
    for item in value:
        if not isinstance(item, str) or item.count("=") != 1:
            raise AclConfigError(f"{where}: {key} entries look like \"name=PUB|SUB\", got {item!r}")
        name, _, perm = (part.strip() for part in item.partition("="))
        if not name or len(name) > RESOURCE_CHARS_MAX:
            raise AclConfigError(f"{where}: {key} entry {item!r} has no name (or one over {RESOURCE_CHARS_MAX} chars)")
        if name in perms:
            raise AclConfigError(f"{where}: {key} names {name!r} twice")
        perms[name] = parse_permission(perm, f"{where}: {key} {name!r}")
    return perms


def _account(entry: object, where: str) -> Account:
    if not isinstance(entry, Mapping):
        raise AclConfigError(f"{where}: must be a table")
    unknown = sorted(set(entry) - _ACCOUNT_KEYS)
    if unknown:
        raise AclConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_ACCOUNT_KEYS))})")
    white = _text(entry, "whiteRemoteAddress", where, "")
    compile_pattern(white)
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise AclConfigError(f"{where}: admin must be true or false, got {admin!r}")
    defaults = {}
    for key in ("defaultTopicPerm", "defaultGroupPerm"):
        defaults[key] = parse_permission(entry.get(key, "DENY"), f"{where}: {key}")
    return Account(
        access_key=_key(entry, "accessKey", where),
        secret_key=_key(entry, "secretKey", where),
        white_remote_address=white,
        admin=admin,
        default_topic_perm=defaults["defaultTopicPerm"],
        default_group_perm=defaults["defaultGroupPerm"],
        topic_perms=_resource_perms(entry, "topicPerms", where),
        group_perms=_resource_perms(entry, "groupPerms", where),
    )


__all__ = ["PERMISSION_NAMES", "Account", "AclConfig", "load_acl_file"]
