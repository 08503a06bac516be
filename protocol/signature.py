"""Request signatures exactly as RocketMQ's ``AclClientRPCHook`` computes them (and stock clients send).

The signed content is every extFields value except ``Signature`` itself, in the order of their keys
(Java's ``TreeMap<String, String>``: UTF-16 code-unit order), concatenated as text, encoded as UTF-8,
followed by the body's bytes. The signature is ``base64(HMAC-SHA1(secretKey as UTF-8, content))``.
``AccessKey`` (and ``SecurityToken`` when there is one) are added to extFields before signing, so they are
signed too; the C++ client also signs its ``OnsChannel`` field.

The broker leaves ``_UNIQUE_KEY_QUERY`` out of the content (``PlainAccessResource.parse``) while Java
clients add it before signing; :func:`content_variants` gives both so either kind of client verifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Final

ACCESS_KEY: Final = "AccessKey"
SECRET_KEY: Final = "SecretKey"
SIGNATURE: Final = "Signature"
SECURITY_TOKEN: Final = "SecurityToken"
#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``: left out of the content the broker verifies
UNIQUE_KEY_QUERY: Final = "_UNIQUE_KEY_QUERY"


def _java_order(key: str) -> bytes:
    # Java compares strings by UTF-16 code units; big-endian UTF-16 bytes sort the same way.
    return key.encode("utf-16-be", "surrogatepass")


def signature_content(ext_fields: Mapping[str, str], body: bytes, excluded: Iterable[str] = (SIGNATURE,)) -> bytes:
    """The bytes a signature covers (``AclUtils.combineRequestContent``). Java's ``getBytes(UTF_8)``
    writes '?' for a lone surrogate, and so does ``errors="replace"``."""
    skip = frozenset(excluded)
    text = "".join(ext_fields[key] for key in sorted(ext_fields, key=_java_order) if key not in skip)
    return text.encode("utf-8", "replace") + body


def calculate_signature(content: bytes, secret_key: str) -> str:
    """``AclSigner.calSignature``: base64 of HMAC-SHA1 keyed with the secret's UTF-8 bytes."""
    digest = hmac.new(secret_key.encode("utf-8", "replace"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign_fields(ext_fields: Mapping[str, str] | None, body: bytes, access_key: str, secret_key: str,
                security_token: str | None = None) -> dict[str, str]:
    """What ``AclClientRPCHook.doBeforeRequest`` leaves in extFields: the request's own fields plus
    ``AccessKey``, ``SecurityToken`` (if given) and ``Signature``. A ``Signature`` already there is
    replaced (a retried request is signed again)."""
    fields = {key: value for key, value in (ext_fields or {}).items() if key != SIGNATURE}
    fields[ACCESS_KEY] = access_key
    if security_token is not None:
        fields[SECURITY_TOKEN] = security_token
    fields[SIGNATURE] = calculate_signature(signature_content(fields, body), secret_key)
    return fields


def content_variants(ext_fields: Mapping[str, str], body: bytes) -> tuple[bytes, ...]:
    """The contents a broker accepts a signature over: RocketMQ's (without ``_UNIQUE_KEY_QUERY``) and,
    when that field is present, the one a Java client signed (with it)."""
    verified = signature_content(ext_fields, body, (SIGNATURE, UNIQUE_KEY_QUERY))
    if UNIQUE_KEY_QUERY not in ext_fields:
        return (verified,)
    return verified, signature_content(ext_fields, body)


def signature_matches(ext_fields: Mapping[str, str], body: bytes, secret_key: str) -> bool:
    """Whether the request's ``Signature`` is right for ``secret_key`` (constant-time comparison)."""
    given = ext_fields.get(SIGNATURE)
    if not given:
        return False
    expected = given.encode("utf-8", "replace")
    return any(hmac.compare_digest(calculate_signature(content, secret_key).encode("ascii"), expected)
               for content in content_variants(ext_fields, body))
