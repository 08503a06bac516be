"""A group's front: a real HAProxy in front of every member, so clients that know one address per group (stock
RocketMQ clients send only to brokerId 0 and re-read routes every 30 s) ride through a leader change.

TCP mode; the backends are every member's remoting address, each checked with ``GET /readyz?role=leader`` on
its HTTP port (``[broker] http_address``: 200 only on the leader that takes writes), often, one result enough
to change its state. A member marked down has its sessions shut, so clients reconnect through the front to
the next leader at once; a connection refused (a member that died since its last check) goes to another
member and marks the refusing one down at once. A member that is not the leader forwards what only the
leader may serve (broker.forwarding), so a connection that reaches a follower anyway (a leader that stepped
down since its last check) is still served. The leader registers the front's address as the group's
brokerId 0 (``[broker] front_address``).

Why not also send clients to followers while no member passes the leader check (they would forward): the
members keep client registrations (heartbeats: consumer groups for rebalancing, producers for transaction
check-backs) where they arrive, and such a connection would stay on its follower after the election.
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


def haproxy_config(front_address: str, members: Sequence[FrontMember], route_to: str = "leader") -> str:
    """The HAProxy configuration of a front listening on ``front_address`` (see the module docstring).

    ``route_to="followers"`` (an experiment, not what ``cluster up`` does): new connections go to a member that
    passes ``GET /readyz?role=follower`` while one does, and it forwards what only the leader may serve; a
    follower that becomes the leader keeps its sessions. A client's connection then outlives a leader kill,
    so a stock C++ client's send in flight is answered (an error, retried) instead of waiting for its timeout.
    Not the default: members keep client registrations where they arrive (heartbeats: consumer groups for
    rebalancing, producers for transaction check-backs), and the leader-only services look at the leader's."""
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
    backends = [("leader", "leader", " on-marked-down shutdown-sessions")]
    if route_to == "followers":
        backends.append(("followers", "follower", ""))
    for backend, role, on_down in backends:
        lines += [
            "",
            f"backend {backend}",
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
    "FRONT_KINDS",
    "ROUTES",
    "FrontMember",
    "FrontUnavailableError",
    "find_haproxy",
    "haproxy_config",
    "resolve_front",
    "start_haproxy",
]
