"""The group's front (cli.front): which front ``--front`` gives, and HAProxy configurations HAProxy itself
accepts (``haproxy -c``; `make test` installs HAProxy)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli import front
from cli.front import FrontMember, FrontUnavailableError, find_haproxy, haproxy_config, resolve_front

MEMBERS = [FrontMember(f"n{index}", f"127.0.0.1:{10911 + 10 * index}", f"127.0.0.1:{9100 + index}")
           for index in range(3)]


def test_auto_is_haproxy_when_installed_and_none_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_front("none") == "none"
    monkeypatch.setattr(front, "find_haproxy", lambda: "/usr/sbin/haproxy")
    assert resolve_front("auto") == resolve_front("haproxy") == "haproxy"
    monkeypatch.setattr(front, "find_haproxy", lambda: None)
    assert resolve_front("auto") == "none"
    with pytest.raises(FrontUnavailableError, match="--front none"):
        resolve_front("haproxy")
    with pytest.raises(ValueError, match="must be one of"):
        resolve_front("nginx")


@pytest.mark.parametrize("route_to", ["leader", "followers"])
def test_haproxy_accepts_the_configuration(tmp_path: Path, route_to: str) -> None:
    binary = find_haproxy()
    assert binary is not None, "HAProxy is not installed (scripts/system-packages.sh installs it)"
    text = haproxy_config("127.0.0.1:10900", MEMBERS, route_to)
    # every member a backend, checked on its HTTP port for the leader role; a member marked down loses its
    # sessions so that clients reconnect through the front at once
    for member in MEMBERS:
        assert f"server {member.id} {member.remoting_address} check addr 127.0.0.1 port {member.http_address[-4:]}" in text
    assert "uri /readyz?role=leader" in text and "on-marked-down shutdown-sessions" in text
    assert ("uri /readyz?role=follower" in text) == (route_to == "followers")
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    checked = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
