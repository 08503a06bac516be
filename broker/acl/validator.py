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
"""

from __future__ import annotations

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
from broker.acl.signature import ACCESS_KEY, signature_matches
from broker.remoting.codes import describe_request_code
from broker.remoting.command import RemotingCommand


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
        if any(pattern.match(remote_host) for pattern in self._global):
            return
        fields = request.ext_fields
        access_key = fields.get(ACCESS_KEY)
        if not access_key:
            raise AccessDeniedError("[ACL] No accessKey is configured: this broker requires signed requests "
                                    "(AccessKey and Signature)")
        compiled = self._accounts.get(access_key)
        if compiled is None:
            raise AccessDeniedError(f"[ACL] No acl config for {access_key}")
        if compiled.whitelist.match(remote_host):
            return
        if not signature_matches(fields, request.body, compiled.account.secret_key):
            raise AccessDeniedError(f"[ACL] Check signature failed for accessKey={access_key}")
        self._check_permissions(request, compiled)

    def _check_permissions(self, request: RemotingCommand, compiled: _CompiledAccount) -> None:
        account = compiled.account
        if request.code in ADMIN_CODES and not account.admin:
            raise AccessDeniedError(f"[ACL] Need admin permission for request code={request.code} "
                                    f"({describe_request_code(request.code)}), but accessKey={account.access_key} "
                                    "is not")
        try:
            needed = required_permissions(request)
        except UnreadableRequestError as exc:
            raise AccessDeniedError(f"[ACL] cannot check permissions: {exc}") from None
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
                    f"[ACL] No permission for {describe_resource(resource)}: {describe_request_code(request.code)} "
                    f"needs {permission_text(permission)}, accessKey={account.access_key} has "
                    f"{permission_text(owned)} ({source})")
