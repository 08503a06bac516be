"""The ACL file watcher: reload on change, keep the rules on a bad change, the leader proposes."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from broker.acl.authorizer import AclRules
from broker.acl.config import AclConfig, load_acl_file
from broker.acl.reloader import AclFileWatcher
from tests.acl.helpers import BASE_ACL
from tests.broker.helpers import run
from tests.support.waiting import poll_until

EXTRA = BASE_ACL + '\n[[accounts]]\naccessKey = "late-comer"\nsecretKey = "late-secret"\n'


class Group:
    """The replicated document and the proposals, as the broker context would make them."""

    def __init__(self, leader: bool) -> None:
        self.leader = leader
        self.document = b""
        self.proposals: list[bytes] = []

    async def propose(self, document: bytes) -> None:
        self.proposals.append(document)
        self.document = document


def rewrite(path: Path, text: str) -> None:
    path.write_text(text)
    stamp = path.stat()
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))  # coarse clocks: a new stamp


async def settle(watcher: AclFileWatcher) -> None:
    """Two polls: a change is read once it held still for one."""
    await watcher.check_once()
    await watcher.check_once()


def make(path: Path, group: Group) -> tuple[AclFileWatcher, AclRules]:
    config = load_acl_file(path)
    rules = AclRules(config, lambda: group.document)
    watcher = AclFileWatcher(path, config, rules, is_leader=lambda: group.leader,
                             replicated_document=lambda: group.document, propose=group.propose,
                             interval_seconds=0.01)
    return watcher, rules


def test_leader_proposes_its_file_and_every_change_of_it(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(BASE_ACL)
    group = Group(leader=True)
    watcher, _ = make(path, group)

    async def scenario() -> None:
        await watcher.check_once()
        assert group.proposals == [AclConfig.from_toml(BASE_ACL).to_document()]
        await watcher.check_once()
        assert len(group.proposals) == 1  # nothing changed: nothing proposed
        rewrite(path, BASE_ACL.replace("orders=PUB", "orders = PUB"))  # same rules, other spelling
        await settle(watcher)
        assert len(group.proposals) == 1
        rewrite(path, EXTRA)
        await watcher.check_once()
        assert len(group.proposals) == 1  # not read yet: it may be half-written
        await watcher.check_once()
        assert group.proposals[-1] == AclConfig.from_toml(EXTRA).to_document()

    run(scenario())


def test_follower_reloads_its_local_rules_but_never_proposes(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(BASE_ACL)
    group = Group(leader=False)
    watcher, rules = make(path, group)

    async def scenario() -> None:
        rewrite(path, EXTRA)
        await settle(watcher)
        current = rules.current()
        assert current is not None and current.config.account("late-comer") is not None
        assert group.proposals == []
        group.leader = True  # became leader: proposes what it has
        await watcher.check_once()
        assert group.proposals == [AclConfig.from_toml(EXTRA).to_document()]

    run(scenario())


def test_an_invalid_or_missing_file_keeps_the_current_rules(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(BASE_ACL)
    group = Group(leader=True)
    watcher, rules = make(path, group)

    async def scenario() -> None:
        await watcher.check_once()
        with caplog.at_level(logging.WARNING):
            for broken in ("accounts = 'oops'", ""):
                rewrite(path, broken)
                await settle(watcher)
            path.unlink()
            await settle(watcher)
        assert len(group.proposals) == 1
        current = rules.current()
        assert current is not None and current.config.to_document() == AclConfig.from_toml(BASE_ACL).to_document()

    run(scenario())
    assert "invalid, keeping the current rules" in caplog.text and "gone or unreadable" in caplog.text


def test_the_running_watcher_retries_failed_proposals_and_wakes_on_demand(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(BASE_ACL)
    group = Group(leader=False)
    attempts: list[bytes] = []

    async def flaky(document: bytes) -> None:
        attempts.append(document)
        if len(attempts) == 1:
            raise RuntimeError("not leader any more")
        await group.propose(document)

    async def scenario() -> None:
        config = load_acl_file(path)
        watcher = AclFileWatcher(path, config, AclRules(config, lambda: group.document),
                                 is_leader=lambda: group.leader, replicated_document=lambda: group.document,
                                 propose=flaky, interval_seconds=30.0)
        watcher.start()
        try:
            group.leader = True
            watcher.wake()
            await poll_until(lambda: len(attempts) >= 1, "a first attempt", timeout_seconds=5.0)
            watcher.wake()
            await poll_until(lambda: bool(group.proposals), "a successful proposal after the failed one",
                             timeout_seconds=5.0)
        finally:
            await watcher.stop()
        await asyncio.sleep(0)

    run(scenario())
