"""A group's front: a real HAProxy in front of every member, so clients that know one address per group (stock
RocketMQ clients send only to brokerId 0 and re-read routes every 30 s) ride through a leader change.

TCP mode; the backends are every member's remoting address, each checked on its HTTP port
(``[broker] http_address``) often, one result enough to change its state. Two routes (``route_to``):

- ``followers`` (what ``cluster up`` does): a new connection goes to a member that passes
  ``GET /readyz?role=follower`` (else to the leader). The follower forwards what only the leader may serve and
  the client's registrations (broker.forwarding, broker.relay), and holds a request through an election. A
  SIGKILLed leader then cuts no client connection: a stock C++ client's send in flight is answered by the next
  leader, where a cut connection would leave it waiting out its 3 s send timeout. A member that is elected
  hands the front's connections back to the followers as each goes idle (broker.front_moves); it tells them
  by their source host, :data:`FOLLOWER_ROUTE_SOURCE` (``[broker] follower_front_hosts``), and each starts with
  a PROXY protocol v2 header naming the client (its born host, its address for ACL white lists).
- ``leader``: each connection goes to the member that passes ``GET /readyz?role=leader`` (200 only on the leader
  that takes writes). A member marked down has its sessions shut, so clients reconnect through the front to
  the next leader; a request in flight when the leader died is lost with its connection.

A connection refused (a member that died since its last check) goes to another member and marks the refusing
one down at once. The leader registers the front's address as the group's brokerId 0 (``[broker]
front_address``).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: what ``raftmq cluster up --front`` accepts: "auto" is HAProxy when installed, else none
FRONT_KINDS: Final = ("auto", "haproxy", "none")
#: where a front sends new connections (:func:`haproxy_config`)
ROUTES: Final = ("leader", "followers")
#: the host a front routing to followers connects to them from (a loopback address of its own, so members
#: tell its connections from others': ``[broker] follower_front_hosts``)
FOLLOWER_ROUTE_SOURCE: Final = "127.0.0.2"
#: how often each member's readiness is checked; one failed (or one passed) check changes its state
CHECK_INTERVAL_MS: Final = 250
#: the longest one check may take
CHECK_TIMEOUT_MS: Final = 1000
#: connections the front holds at once
CONNECTIONS_MAX: Final = 4096
#: a client connection idle this long is closed (as the brokers' remoting_idle_timeout_seconds; clients
#: heartbeat every 30 s)
IDLE_TIMEOUT_SECONDS: Final = 120
_SEARCH_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class FrontUnavailableError(Exception):
    """``--front haproxy`` where HAProxy is not installed."""


@dataclass(frozen=True, slots=True)
class FrontMember:
    id: str
    #: where the member serves clients (its remoting address)
    remoting_address: str
    #: where it answers ``GET /readyz?role=leader``
    http_address: str


def find_haproxy() -> str | None:
    """The HAProxy binary (Debian installs it in /usr/sbin, not always on a user's PATH), or None."""
    return shutil.which("haproxy") or shutil.which("haproxy", path=_SEARCH_PATH)


def resolve_front(kind: str) -> str:
    """``auto`` / ``haproxy`` / ``none`` as the front to start: "haproxy" or "none". Raises
    :class:`FrontUnavailableError` when HAProxy is asked for and not installed."""
    if kind not in FRONT_KINDS:
        raise ValueError(f"the front must be one of {', '.join(FRONT_KINDS)}, got {kind!r}")
    if kind == "none":
        return "none"
    if find_haproxy() is None:
        if kind == "haproxy":
            raise FrontUnavailableError("--front haproxy: HAProxy is not installed (Debian: apt-get install -y "
                                        "haproxy; `make test` installs it), or start without a front: --front none")
        return "none"
    return "haproxy"


def _split(address: str) -> tuple[str, str]:
    host, _, port = address.rpartition(":")
    return host, port


def haproxy_config(front_address: str, members: Sequence[FrontMember], route_to: str = "leader",
                   follower_source: str = FOLLOWER_ROUTE_SOURCE) -> str:
    """The HAProxy configuration of a front listening on ``front_address`` (see the module docstring).

    ``route_to="followers"``: new connections go to a member that passes ``GET /readyz?role=follower`` while
    one does (else to the leader), connecting from ``follower_source``, the host the members know as such a
    front's (``[broker] follower_front_hosts``: the leader moves those connections to the followers when
    idle, broker.front_moves). A follower forwards what only the leader may serve and the client's
    registrations (broker.forwarding, broker.relay); a client's connection then outlives a leader kill."""
    if route_to not in ROUTES:
        raise ValueError(f"route_to must be one of {', '.join(ROUTES)}, got {route_to!r}")
    lines = [
        "global",
        f"    maxconn {CONNECTIONS_MAX}",
        "    log stderr format short local0 notice",
        "",
        "defaults",
        "    mode tcp",
        "    log global",
        "    timeout connect 1s",
        f"    timeout client {IDLE_TIMEOUT_SECONDS}s",
        f"    timeout server {IDLE_TIMEOUT_SECONDS}s",
        f"    timeout check {CHECK_TIMEOUT_MS}ms",
        "",
        "frontend group",
        f"    bind {front_address}",
        *(["    use_backend followers if { nbsrv(followers) gt 0 }"] if route_to == "followers" else []),
        "    default_backend leader",
    ]
    backends = [("leader", "leader", " on-marked-down shutdown-sessions", "")]
    if route_to == "followers":  # the members believe a PROXY header from this source only
        backends.append(("followers", "follower", " send-proxy-v2", follower_source))
    for backend, role, on_down, source in backends:
        lines += [
            "",
            f"backend {backend}",
            *([f"    source {source}"] if source else []),
            "    option httpchk",
            f"    http-check send meth GET uri /readyz?role={role}",
            "    http-check expect status 200",
            "    option redispatch 1",
            "    retries 3",
            f"    default-server inter {CHECK_INTERVAL_MS}ms fastinter {CHECK_INTERVAL_MS}ms "
            f"downinter {CHECK_INTERVAL_MS}ms fall 1 rise 1{on_down} observe layer4 error-limit 1 on-error mark-down",
        ]
        for member in members:
            check_host, check_port = _split(member.http_address)
            lines.append(f"    server {member.id} {member.remoting_address} check addr {check_host} port {check_port}")
    return "\n".join(lines) + "\n"


def start_haproxy(config_path: Path, log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Check the configuration, then start HAProxy in the foreground (``-db``) in a session of its own."""
    binary = find_haproxy()
    if binary is None:
        raise FrontUnavailableError("HAProxy is not installed")
    checked = subprocess.run([binary, "-c", "-q", "-f", str(config_path)], capture_output=True, timeout=30,
                             check=False)
    if checked.returncode != 0:
        raise FrontUnavailableError(f"HAProxy refuses {config_path}: "
                                    f"{(checked.stderr or checked.stdout).decode(errors='replace').strip()}")
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen([binary, "-db", "-f", str(config_path)], stdout=log_file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
    finally:
        log_file.close()


__all__ = [
    "FOLLOWER_ROUTE_SOURCE",
    "FRONT_KINDS",
    "ROUTES",
    "FrontMember",
    "FrontUnavailableError",
    "find_haproxy",
    "haproxy_config",
    "resolve_front",
    "start_haproxy",
]
