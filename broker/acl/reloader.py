"""Keeps a node's ACL file and the group's replicated rules in step.

Every node watches its ACL file (``[broker] acl_file``) and reloads it when it changes (a valid change
becomes the node's local rules, used until the group has replicated rules; an invalid one is logged and
ignored, as RocketMQ keeps its previous rules). The leader also proposes the file's canonical document
through Raft (``AclDocument``) whenever it differs from the replicated one, so every member enforces the
same rules: the leader's file wins. Keep the file identical on every member (a member with an older file
that becomes leader proposes its older rules).

The file is polled (size, modification time, inode: cheap ``stat`` calls) every
``ACL_POLL_INTERVAL_SECONDS``, and at once when this node becomes leader. A change is read once it has
held still for one poll, so a file caught half-written by an editor is not loaded (replacing the file
by a rename is the safe way to change it all the same).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from broker.acl.authorizer import AclRules
from broker.acl.config import AclConfig, load_acl_file
from broker.acl.permissions import AclConfigError

log = logging.getLogger(__name__)

ACL_POLL_INTERVAL_SECONDS: Final = 1.0

#: (size, mtime in ns, inode) of the file, or None when it cannot be read
FileStamp = tuple[int, int, int] | None


def _stamp(path: Path) -> FileStamp:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns, status.st_ino


class AclFileWatcher:
    """``propose(document)`` replicates a document (the broker context's proposal, raising on failure);
    ``is_leader()`` says whether this node may propose; ``replicated_document()`` reads the state."""

    def __init__(self, path: Path, config: AclConfig, rules: AclRules, *,
                 is_leader: Callable[[], bool], replicated_document: Callable[[], bytes],
                 propose: Callable[[bytes], Awaitable[object]],
                 interval_seconds: float = ACL_POLL_INTERVAL_SECONDS) -> None:
        self.path = path
        self.rules = rules
        self.document = config.to_document()
        self._stamp = _stamp(path)
        #: a new stamp seen at the last poll, loaded if it is still the same at the next one
        self._pending: FileStamp = self._stamp
        self._is_leader = is_leader
        self._replicated_document = replicated_document
        self._propose = propose
        self._interval_seconds = interval_seconds
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="acl file watcher")

    def wake(self) -> None:
        """Check now (this node just became leader)."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def reload_if_changed(self) -> bool:
        """Re-read the file if its stamp changed and then held still for one poll; whether the local
        rules changed."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            self._pending = stamp
            return False
        if stamp != self._pending:
            self._pending = stamp
            return False
        self._stamp = stamp
        if stamp is None:
            log.warning("ACL file %s is gone or unreadable; keeping the current rules", self.path)
            return False
        try:
            config = load_acl_file(self.path)
            document = config.to_document()
        except AclConfigError as exc:
            log.error("ACL file changed but is invalid, keeping the current rules: %s", exc)
            return False
        if document == self.document:
            return False
        self.document = document
        self.rules.set_local(config)
        log.info("ACL file %s reloaded: %d account(s)", self.path, len(config.accounts))
        return True

    async def check_once(self) -> None:
        """Reload the file if it changed; as leader, propose it if the group's rules differ."""
        self.reload_if_changed()
        if not self._is_leader() or self._replicated_document() == self.document:
            return
        log.info("proposing the ACL of %s to the group", self.path)
        await self._propose(self.document)

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an operating error (not leader any more, outcome unknown): next round
                log.warning("ACL proposal failed, retrying: %s", exc)
            try:
                async with asyncio.timeout(self._interval_seconds):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
