"""Named limits of the Toxiproxy-compatible server: everything that grows has one."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from chaos.toxiproxy_http import HttpLimits


@dataclass(frozen=True)
class ToxiproxyLimits:
    proxies_max: int = 256
    toxics_per_proxy_max: int = 32
    proxy_name_length_max: int = 256
    #: a connection accepted beyond this is closed at once
    connections_per_proxy_max: int = 1024
    upstream_connect_timeout_s: float = 5.0
    #: bytes asked of the socket per read, and the stream reader's buffer
    read_size_max_bytes: int = 64 * 1024
    #: chunks read but not yet through a direction's toxics; a full queue stops reading (backpressure)
    direction_queue_chunks_max: int = 16
    #: a graceful close that cannot flush within this is aborted
    close_flush_timeout_s: float = 5.0
    api_connections_max: int = 64
    api_idle_timeout_s: float = 30.0
    http: HttpLimits = field(default_factory=HttpLimits)

    def validate(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, int | float) and value <= 0:
                raise ValueError(f"limit {item.name} must be > 0, not {value}")
        self.http.validate()
