"""Which ACL rules hold on this node, and the check the remoting server runs before queueing a request.

Rules, in order of precedence:

1. the replicated document (``ReplicatedState.acl_document``): the same bytes on every member, so every
   member enforces the same rules, followers included;
2. until one was replicated, this node's own ACL file (so a fresh group is never open, not even for the
   moment before the leader's first proposal applies);
3. neither: ACL is off and every request passes.

A replicated document this node cannot read (it should not happen: the leader validated it) keeps the
last rules it could read; with none, every request is refused (fail closed) and the error is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.acl.config import AclConfig
from broker.acl.permissions import AclConfigError
from broker.acl.validator import AccessDeniedError, AccessValidator
from broker.remoting.server import Connection
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_response

log = logging.getLogger(__name__)


class AclRules:
    """The rules in force. ``replicated_document`` reads the replicated state (a bytes attribute read
    from the event loop while the Raft thread may replace it: a single reference read, never torn)."""

    def __init__(self, local: AclConfig | None, replicated_document: Callable[[], bytes]) -> None:
        self._local = None if local is None else AccessValidator(local)
        self._replicated_document = replicated_document
        self._document: bytes = b""
        self._replicated: AccessValidator | None = None
        self._unreadable: bytes | None = None

    def set_local(self, config: AclConfig) -> None:
        """This node's ACL file changed (and is valid)."""
        self._local = AccessValidator(config)

    @property
    def enabled(self) -> bool:
        return self._local is not None or bool(self._replicated_document())

    def current(self) -> AccessValidator | None:
        """The validator in force; None: ACL is off. Raises :class:`AccessDeniedError` when the
        replicated rules are unreadable and no earlier ones exist."""
        document = self._replicated_document()
        if not document:
            return self._local
        if document is not self._document:
            # the same bytes in a new object (a snapshot was installed): adopt it, so the next request
            # takes the identity test above instead of comparing up to a megabyte again
            if document == self._document:
                self._document = document
            else:
                self._load(document)
        if self._replicated is None:
            raise AccessDeniedError("[ACL] this broker cannot read the group's ACL rules; see its log")
        return self._replicated

    def _load(self, document: bytes) -> None:
        if document is self._unreadable or document == self._unreadable:
            return
        try:
            validator = AccessValidator(AclConfig.from_document(document))
        except AclConfigError as exc:
            self._unreadable = document
            log.error("the replicated ACL document cannot be read (%s): %s", exc,
                      "keeping the previous rules" if self._replicated is not None else "refusing every request")
            return
        self._document = document
        self._replicated = validator
        log.info("ACL rules in force: %d account(s), %d global whitelist pattern(s)",
                 len(validator.config.accounts), len(validator.config.global_white_remote_addresses))


class AclAuthorizer:
    """The server's pre-dispatch check: None lets the request through; a refusal is answered
    NO_PERMISSION (16) with a remark saying why, before any processor runs."""

    def __init__(self, rules: AclRules) -> None:
        self.rules = rules

    def __call__(self, request: RemotingCommand, connection: Connection) -> RemotingCommand | None:
        try:
            validator = self.rules.current()
            if validator is None:
                return None
            validator.check(request, connection.remote_host)
        except AccessDeniedError as denied:
            log.debug("refused %s from %s: %s", request.code, connection.remote_address, denied)
            return make_response(request, ResponseCode.NO_PERMISSION, str(denied))
        return None
