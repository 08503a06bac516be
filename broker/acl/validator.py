"""The access check of one request: RocketMQ's ``PlainPermissionManager.validate`` and ``checkPerm``.

In order, as RocketMQ does it:

1. a peer matching a global whitelist pattern passes (no signature, no permissions);
2. the request must name an ``AccessKey`` of a configured account;
3. a peer matching that account's own whitelist pattern passes (no signature, no permissions);
4. the ``Signature`` must be right for the account's secret key;
5. admin request codes need an admin account; every resource the request touches needs its permission,
   from the account's table or else its default for topics or groups. An admin account without any
   per-resource permission passes step 5 whatever it touches.

Every refusal is an :class:`AccessDeniedError` whose message says which step failed and for what.
:meth:`AccessValidator.check_signed` is the same decision for a request signed another way (the 5.x gRPC
protocol's ``authorization`` header, ``broker.v2.auth``): one set of accounts and rules for both protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.acl.addresses import AddressPattern, compile_pattern
from broker.acl.config import Account, AclConfig
from broker.acl.permissions import (
    ADMIN_CODES,
    PUB,
    SUB,
    check_permission,
    describe_resource,
    group_resource,
    is_group_resource,
    permission_text,
)
from broker.acl.resources import UnreadableRequestError, required_permissions
from protocol.codes import describe_request_code
from protocol.command import RemotingCommand
from protocol.signature import ACCESS_KEY, signature_matches


class AccessDeniedError(Exception):
    """The request is refused; ``str()`` is the remark for the client."""


@dataclass(frozen=True, slots=True)
class _CompiledAccount:
    account: Account
    whitelist: AddressPattern
    #: resource (topic, or %RETRY%<group>) -> permission bits
    resources: dict[str, int]


class AccessValidator:
    """Compiled rules of one :class:`AclConfig`; :meth:`check` is pure and cheap (one HMAC-SHA1)."""

    def __init__(self, config: AclConfig) -> None:
        self.config = config
        self._global = tuple(compile_pattern(pattern) for pattern in config.global_white_remote_addresses)
        self._accounts: dict[str, _CompiledAccount] = {}
        for account in config.accounts:
            resources = dict(account.topic_perms)
            resources.update((group_resource(group), perm) for group, perm in account.group_perms.items())
            self._accounts[account.access_key] = _CompiledAccount(
                account, compile_pattern(account.white_remote_address), resources)

    def check(self, request: RemotingCommand, remote_host: str) -> None:
        """Return if ``request`` from ``remote_host`` may proceed; raise :class:`AccessDeniedError`."""
        fields = request.ext_fields
        compiled = self._account_to_check(fields.get(ACCESS_KEY), remote_host, " (AccessKey and Signature)")
        if compiled is None:
            return
        if not signature_matches(fields, request.body, compiled.account.secret_key):
            raise AccessDeniedError(f"[ACL] Check signature failed for accessKey={compiled.account.access_key}")
        account = compiled.account
        if request.code in ADMIN_CODES and not account.admin:
            raise AccessDeniedError(f"[ACL] Need admin permission for request code={request.code} "
                                    f"({describe_request_code(request.code)}), but accessKey={account.access_key} "
                                    "is not")
        try:
            needed = required_permissions(request)
        except UnreadableRequestError as exc:
            raise AccessDeniedError(f"[ACL] cannot check permissions: {exc}") from None
        self._check_permissions(needed, compiled, describe_request_code(request.code))

    def check_signed(self, access_key: str, remote_host: str, signature_ok: Callable[[str], bool],
                     needed: Mapping[str, int], action: str) -> None:
        """:meth:`check` for a request whose signature is not a remoting one: ``signature_ok(secret_key)``
        says whether it is right for the account's secret, ``needed`` maps each resource the request
        touches to the permission it needs, ``action`` names the request in a refusal."""
        compiled = self._account_to_check(access_key, remote_host, "")
        if compiled is None:
            return
        if not signature_ok(compiled.account.secret_key):
            raise AccessDeniedError(f"[ACL] Check signature failed for accessKey={access_key}")
        self._check_permissions(needed, compiled, action)

    def _account_to_check(self, access_key: str | None, remote_host: str, hint: str) -> _CompiledAccount | None:
        """Steps 1-3: None when a whitelist lets the peer through unchecked, else the named account."""
        if any(pattern.match(remote_host) for pattern in self._global):
            return None
        if not access_key:
            raise AccessDeniedError(f"[ACL] No accessKey is configured: this broker requires signed requests{hint}")
        compiled = self._accounts.get(access_key)
        if compiled is None:
            raise AccessDeniedError(f"[ACL] No acl config for {access_key}")
        if compiled.whitelist.match(remote_host):
            return None
        return compiled

    def _check_permissions(self, needed: Mapping[str, int], compiled: _CompiledAccount, action: str) -> None:
        account = compiled.account
        if account.admin and not compiled.resources:
            return
        for resource, permission in needed.items():
            owned = compiled.resources.get(resource)
            source = "its permission"
            if owned is None:
                owned = account.default_group_perm if is_group_resource(resource) else account.default_topic_perm
                source = "its default permission"
            # each permission on its own: PUB|SUB needed means both (check_permission accepts either)
            if not all(check_permission(bit, owned) for bit in (PUB, SUB) if permission & bit):
                raise AccessDeniedError(
                    f"[ACL] No permission for {describe_resource(resource)}: {action} "
                    f"needs {permission_text(permission)}, accessKey={account.access_key} has "
                    f"{permission_text(owned)} ({source})")
