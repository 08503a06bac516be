"""Name server configuration: a frozen dataclass that validates itself, so a bad file fails at start."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Final

from broker.remoting.server import ServerLimits

#: RocketMQ's ``NamesrvConfig`` listen port
DEFAULT_PORT: Final = 9876
_PORT_MAX: Final = 65_535


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    """Where the name server listens, when it forgets silent brokers, and what it holds at most.

    - ``broker_expiry_seconds``: a broker not registered for this long is removed (RocketMQ's
      ``BROKER_CHANNEL_EXPIRED_TIME``, 120 s; brokers register every 30 s).
    - ``expiry_scan_interval_seconds``: how often expiry is checked (RocketMQ: every 10 s).
    - ``forget_brokers_on_disconnect``: remove a broker as soon as the connection it registered over
      closes (RocketMQ's ``BrokerHousekeepingService``). Brokers must then keep that connection open
      between registrations, as Java brokers do.
    - ``broker_addresses_max``, ``topics_max``: the route table's size bounds.
    - ``topics_per_registration_max``, ``register_body_decompressed_max_bytes``: bounds on one
      REGISTER_BROKER body (the codec bounds its size on the wire).
    - ``processor_queue_max``: requests waiting for the name server's single worker (more are
      answered SYSTEM_BUSY). One worker keeps a broker's register/unregister in arrival order.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    broker_expiry_seconds: float = 120.0
    expiry_scan_interval_seconds: float = 10.0
    forget_brokers_on_disconnect: bool = True
    broker_addresses_max: int = 4096
    topics_max: int = 1_000_000
    topics_per_registration_max: int = 100_000
    register_body_decompressed_max_bytes: int = 64 * 1024 * 1024
    processor_queue_max: int = 4096
    server: ServerLimits = field(default_factory=ServerLimits)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field of the wrong type or out of range."""
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if type(self.port) is not int or not 0 <= self.port <= _PORT_MAX:
            raise ValueError(
                f"port must be an int in [0, {_PORT_MAX}] (0 picks a free port), got {self.port!r}"
            )
        for name in ("broker_expiry_seconds", "expiry_scan_interval_seconds"):
            value = getattr(self, name)
            if not (type(value) in (int, float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if type(self.forget_brokers_on_disconnect) is not bool:
            raise ValueError(
                f"forget_brokers_on_disconnect must be a bool, got {self.forget_brokers_on_disconnect!r}"
            )
        for name in (
            "broker_addresses_max",
            "topics_max",
            "topics_per_registration_max",
            "register_body_decompressed_max_bytes",
            "processor_queue_max",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.topics_per_registration_max > self.topics_max:
            raise ValueError(
                f"topics_per_registration_max ({self.topics_per_registration_max}) cannot exceed "
                f"topics_max ({self.topics_max})"
            )
        if not isinstance(self.server, ServerLimits):
            raise ValueError(f"server must be a ServerLimits, got {type(self.server).__name__}")
        self.server.validate()

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> NameServerConfig:
        """Configuration from a table (TOML): unknown keys are rejected, missing ones default;
        ``server`` is a nested table for :meth:`ServerLimits.from_mapping`."""
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown name server settings: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        arguments: dict[str, object] = dict(values)
        server = arguments.get("server")
        if server is not None:
            if not isinstance(server, Mapping):
                raise ValueError(f"server must be a table, got {type(server).__name__}")
            arguments["server"] = ServerLimits.from_mapping(server)
        return cls(**arguments)  # type: ignore[arg-type]  # validate() checks every type
