"""Network faults for chaos scenarios, through the Toxiproxy HTTP API and ``toxiproxy-python``.

:func:`ensure_toxiproxy` finds a Toxiproxy server at ``TOXIPROXY_URL`` (default
http://127.0.0.1:8474) or, when none answers there, starts ours (:mod:`chaos.toxiproxy_server`) as a
subprocess on a free port; the returned :class:`ToxiproxyHandle` stops that subprocess when closed
(it is a context manager) and leaves a server it found alone.

The helpers below are thin and typed over toxiproxy-python, which keeps the server's address in
class attributes (``APIConsumer.host``/``port``): every helper points them at its handle first, so
one handle at a time per thread.

Toxic names are ``<type>_<stream>`` (toxiproxy-python's default), ``partition_<stream>`` for
partitions, so setting the same fault again updates it in place instead of failing with 409.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

from toxiproxy import Proxy, Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import NotFound, ProxyExists

DEFAULT_URL = "http://127.0.0.1:8474"
DEFAULT_PORT = 8474
PROBE_TIMEOUT_S = 1.0
STARTUP_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
_REPOSITORY = Path(__file__).resolve().parents[1]

Streams = Literal["upstream", "downstream", "both"]
PartitionHow = Literal["disable", "timeout"]


class ToxiproxyStartError(RuntimeError):
    """Our server could not be started (it exited, or did not report listening in time)."""


class ProxyNotFound(LookupError):
    pass


@dataclass(frozen=True)
class ProxyInfo:
    name: str
    listen: str
    upstream: str
    enabled: bool

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class ToxiproxyHandle:
    """A reachable Toxiproxy server; ``process`` is set when this handle started it (and owns it)."""

    def __init__(
        self,
        host: str,
        port: int,
        process: subprocess.Popen[str] | None = None,
        seed: int | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self.process = process
        #: the seed our server was started with (None for a server found running)
        self.seed = seed
        self.returncode: int | None = None

    @property
    def started_here(self) -> bool:
        return self.process is not None

    def client(self) -> Any:
        """A ``toxiproxy.Toxiproxy`` pointed at this server."""
        server = Toxiproxy()
        server.update_api_consumer(self.host, self.port)
        return server

    def close(self) -> None:
        """Stop the server if this handle started it (SIGTERM, then SIGKILL after a grace period)."""
        process, self.process = self.process, None
        if process is not None:
            self.returncode = _stop_process(process)

    def __enter__(self) -> ToxiproxyHandle:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def ensure_toxiproxy(url: str | None = None, seed: int | None = None) -> ToxiproxyHandle:
    """A handle to the Toxiproxy server at ``url`` (default: ``TOXIPROXY_URL``, else
    http://127.0.0.1:8474) if one answers ``GET /version`` there; otherwise ours, started on a free
    127.0.0.1 port with ``seed`` (random if None; kept in ``handle.seed``)."""
    host, port = _parse_url(url or os.environ.get("TOXIPROXY_URL") or DEFAULT_URL)
    if _answers_version(host, port):
        return ToxiproxyHandle(host, port)
    return _start_server(secrets.randbits(32) if seed is None else seed)


def _parse_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"a Toxiproxy URL is http://host:port, not {url!r}")
    return parts.hostname, parts.port or DEFAULT_PORT


def _answers_version(host: str, port: int) -> bool:
    # http.client, not urllib: urllib would route 127.0.0.1 through an HTTP_PROXY from the environment
    connection = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_S)
    try:
        connection.request("GET", "/version")
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _start_server(seed: int) -> ToxiproxyHandle:
    command = [
        sys.executable, "-m", "chaos.toxiproxy_server",
        "--host", "127.0.0.1", "--port", "0", "--seed", str(seed),
    ]  # fmt: skip
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(_REPOSITORY), environment.get("PYTHONPATH", "")) if part
    )
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=environment
    )
    try:
        line = _read_line(process, time.monotonic() + STARTUP_TIMEOUT_S)
        event = json.loads(line)
        if not isinstance(event, dict) or event.get("event") != "listening":
            raise ToxiproxyStartError(f"unexpected first line from the server: {line!r}")
        return ToxiproxyHandle(str(event["host"]), int(event["port"]), process, seed)
    except BaseException:
        _stop_process(process)
        raise


def _read_line(process: subprocess.Popen[str], deadline: float) -> str:
    stdout = process.stdout
    if stdout is None:
        raise ToxiproxyStartError("the server's stdout is not a pipe")
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise ToxiproxyStartError(f"the server did not report listening in {STARTUP_TIMEOUT_S} s")
            if selector.select(remaining_s):
                line = stdout.readline()
                if not line:
                    raise ToxiproxyStartError(f"the server exited with {process.wait()} before listening")
                return line


def _stop_process(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()
    return process.returncode


# -- helpers over toxiproxy-python ---------------------------------------------------------------


def _info(proxy: Any) -> ProxyInfo:
    return ProxyInfo(str(proxy.name), str(proxy.listen), str(proxy.upstream), bool(proxy.enabled))


def _proxy(handle: ToxiproxyHandle, name: str) -> Any:
    handle.client()
    try:
        return Proxy(**APIConsumer.get(f"/proxies/{name}").json())
    except NotFound:
        raise ProxyNotFound(f"no proxy {name!r} on {handle.url}") from None


def _streams(streams: Streams) -> tuple[str, ...]:
    return ("upstream", "downstream") if streams == "both" else (streams,)


def list_proxies(handle: ToxiproxyHandle) -> dict[str, ProxyInfo]:
    proxies: dict[str, Any] = handle.client().proxies()
    return {name: _info(proxy) for name, proxy in proxies.items()}


def get_proxy(handle: ToxiproxyHandle, name: str) -> ProxyInfo:
    return _info(_proxy(handle, name))


def create_proxy(
    handle: ToxiproxyHandle, name: str, upstream: str, listen: str = "127.0.0.1:0", replace: bool = True
) -> ProxyInfo:
    """A proxy ``name`` from ``listen`` to ``upstream`` (``host:port``), enabled, without toxics.
    With ``replace``, an existing proxy of that name is deleted first (its connections close)."""
    server = handle.client()
    if replace:
        delete_proxy(handle, name)
    return _info(server.create(upstream=upstream, name=name, listen=listen))


def delete_proxy(handle: ToxiproxyHandle, name: str) -> None:
    """Delete the proxy if it exists (closing its listener and connections)."""
    handle.client()
    with contextlib.suppress(NotFound):
        APIConsumer.delete(f"/proxies/{name}")


def set_toxic(
    handle: ToxiproxyHandle,
    proxy_name: str,
    toxic_type: str,
    attributes: dict[str, int],
    streams: Streams = "both",
    toxicity: float = 1.0,
    name_prefix: str | None = None,
) -> list[str]:
    """Add the toxic on each stream, or update it in place if one of that name is there already;
    returns the toxic names (``<prefix or type>_<stream>``)."""
    proxy = _proxy(handle, proxy_name)
    names = []
    for stream in _streams(streams):
        toxic_name = f"{name_prefix or toxic_type}_{stream}"
        try:
            proxy.add_toxic(
                name=toxic_name, type=toxic_type, stream=stream, toxicity=toxicity, attributes=attributes
            )
        except ProxyExists:
            APIConsumer.post(
                f"/proxies/{proxy_name}/toxics/{toxic_name}",
                json={"toxicity": toxicity, "attributes": attributes},
            )
        names.append(toxic_name)
    return names


def partition(
    handle: ToxiproxyHandle, proxy_name: str, how: PartitionHow = "disable", streams: Streams = "both"
) -> None:
    """Cut the link. ``disable`` closes the listener and every connection (new connections are
    refused: a peer that is down); ``timeout`` keeps connections open but drops every byte on
    ``streams`` (a black hole: one-way with ``streams``), and closes them when healed."""
    if how == "disable":
        if streams != "both":
            raise ValueError("a disabled proxy is cut both ways; use how='timeout' for one way")
        _proxy(handle, proxy_name).disable()
    else:
        set_toxic(handle, proxy_name, "timeout", {"timeout": 0}, streams, name_prefix="partition")


def add_latency(
    handle: ToxiproxyHandle,
    proxy_name: str,
    latency_ms: int,
    jitter_ms: int = 0,
    streams: Streams = "both",
    toxicity: float = 1.0,
) -> list[str]:
    """Delay every chunk by ``latency_ms`` +/- ``jitter_ms`` on each of ``streams``."""
    attributes = {"latency": latency_ms, "jitter": jitter_ms}
    return set_toxic(handle, proxy_name, "latency", attributes, streams, toxicity)


def limit_bandwidth(
    handle: ToxiproxyHandle, proxy_name: str, rate_kb_s: int, streams: Streams = "both", toxicity: float = 1.0
) -> list[str]:
    """At most ``rate_kb_s`` KB/s (1 KB = 1000 bytes) on each of ``streams``."""
    return set_toxic(handle, proxy_name, "bandwidth", {"rate": rate_kb_s}, streams, toxicity)


def reset_peer(
    handle: ToxiproxyHandle,
    proxy_name: str,
    timeout_ms: int = 0,
    streams: Streams = "both",
    toxicity: float = 1.0,
) -> list[str]:
    """Reset (TCP RST) each connection ``timeout_ms`` after data next flows on one of ``streams``."""
    return set_toxic(handle, proxy_name, "reset_peer", {"timeout": timeout_ms}, streams, toxicity)


def heal(handle: ToxiproxyHandle, proxy_name: str) -> None:
    """Remove every toxic of the proxy and enable it."""
    proxy = _proxy(handle, proxy_name)
    for toxic_name in proxy.toxics():
        proxy.destroy_toxic(toxic_name)
    if not proxy.enabled:
        proxy.enable()


def heal_all(handle: ToxiproxyHandle) -> None:
    """Toxiproxy's reset: every proxy enabled, every toxic removed."""
    handle.client().reset()
