"""The 5.x clients a member has heard of, and the Settings it answers their Telemetry with.

A client announces itself on its Telemetry stream with its own Settings (type, topics or group); the
server answers with the Settings the client then uses as they are (RocketMQ's proxy,
``GrpcClientSettingsManager``): a producer refuses every send with a zero ``max_body_size``, and a consumer
takes its batch size, long-polling timeout and retry back-off from the reply. Heartbeats keep an entry
alive; entries silent for ``client_expiry_seconds`` go, and NotifyClientTermination removes one at once.

Local, not replicated: which clients are connected to this member is this member's business (a client
re-announces itself to the leader it talks to next).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from broker.v2.protocol.definition_pb2 import (
    ClientType,
    Code,
    CustomizedBackoff,
    ExponentialBackoff,
    RetryPolicy,
    Settings,
)
from broker.v2.status import StatusError

#: clients one member keeps track of at most (a new one beyond it is refused TOO_MANY_REQUESTS)
CLIENTS_MAX: Final = 10_000
#: the proxy's producer defaults (ProxyConfig.grpcClientProducer*): 3 attempts, back-off 10 ms doubling to 1 s
PRODUCER_MAX_ATTEMPTS: Final = 3
PRODUCER_BACKOFF_INITIAL_MS: Final = 10
PRODUCER_BACKOFF_MAX_MS: Final = 1_000
PRODUCER_BACKOFF_MULTIPLIER: Final = 2.0
#: the proxy's consumer defaults (grpcClientConsumerLongPollingBatchSize, ...MaxLongPollingTimeoutMillis)
CONSUMER_RECEIVE_BATCH_SIZE: Final = 32
CONSUMER_LONG_POLLING_MS_MAX: Final = 20_000


@dataclass(frozen=True, slots=True)
class SettingsLimits:
    """What the server fills into every Settings reply."""

    body_size_max_bytes: int
    long_polling_max_ms: int
    #: the default delivery attempts of a consumer group (RocketMQ: retryMaxTimes + 1)
    max_delivery_attempts: int
    #: redelivery back-off of a consumer group (the broker's delay levels, as RocketMQ's customized policy)
    redelivery_backoff_seconds: Sequence[int]


def _duration_ms(milliseconds: int) -> tuple[int, int]:
    return milliseconds // 1000, (milliseconds % 1000) * 1_000_000


def server_settings(client: Settings, limits: SettingsLimits) -> Settings:
    """The reply to a client's Settings: the client's own, with the server's side filled in."""
    reply = Settings()
    reply.CopyFrom(client)
    reply.ClearField("metric")
    reply.metric.on = False  # we collect no client metrics
    if client.HasField("publishing"):
        reply.backoff_policy.CopyFrom(RetryPolicy(max_attempts=PRODUCER_MAX_ATTEMPTS, exponential_backoff=ExponentialBackoff(
            multiplier=PRODUCER_BACKOFF_MULTIPLIER)))
        backoff = reply.backoff_policy.exponential_backoff
        backoff.initial.seconds, backoff.initial.nanos = _duration_ms(PRODUCER_BACKOFF_INITIAL_MS)
        backoff.max.seconds, backoff.max.nanos = _duration_ms(PRODUCER_BACKOFF_MAX_MS)
        reply.publishing.max_body_size = limits.body_size_max_bytes
        reply.publishing.validate_message_type = True
    elif client.HasField("subscription"):
        subscription = reply.subscription
        subscription.receive_batch_size = CONSUMER_RECEIVE_BATCH_SIZE
        polling_ms = min(CONSUMER_LONG_POLLING_MS_MAX, limits.long_polling_max_ms)
        subscription.long_polling_timeout.seconds, subscription.long_polling_timeout.nanos = _duration_ms(polling_ms)
        reply.backoff_policy.CopyFrom(RetryPolicy(max_attempts=limits.max_delivery_attempts,
                                                  customized_backoff=CustomizedBackoff()))
        for seconds in limits.redelivery_backoff_seconds:
            reply.backoff_policy.customized_backoff.next.add(seconds=seconds)
    else:
        raise StatusError(Code.BAD_REQUEST, "there is no publishing or subscription data in settings")
    return reply


@dataclass(slots=True)
class ClientEntry:
    client_id: str
    client_type: ClientType
    settings: Settings | None
    last_seen: float


class ClientTable:
    """The clients heard of, by client id (``x-mq-client-id``), bounded by ``clients_max``."""

    def __init__(self, clients_max: int = CLIENTS_MAX, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.clients_max = clients_max
        self.monotonic = monotonic
        self._clients: dict[str, ClientEntry] = {}

    def __len__(self) -> int:
        return len(self._clients)

    def get(self, client_id: str) -> ClientEntry | None:
        return self._clients.get(client_id)

    def heard(self, client_id: str, client_type: ClientType, settings: Settings | None = None) -> ClientEntry:
        """Record that ``client_id`` called (with its Settings when it sent them)."""
        if not client_id:
            raise StatusError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")
        entry = self._clients.get(client_id)
        if entry is None:
            if len(self._clients) >= self.clients_max:
                raise StatusError(Code.TOO_MANY_REQUESTS, f"this broker serves at most {self.clients_max} 5.x clients")
            entry = self._clients[client_id] = ClientEntry(client_id, client_type, settings, self.monotonic())
        else:
            entry.last_seen = self.monotonic()
            if client_type != ClientType.CLIENT_TYPE_UNSPECIFIED:
                entry.client_type = client_type
            if settings is not None:
                entry.settings = settings
        return entry

    def forget(self, client_id: str) -> ClientEntry | None:
        return self._clients.pop(client_id, None)

    def expire(self, expiry_seconds: float) -> list[str]:
        """Forget the clients silent for ``expiry_seconds``; their ids."""
        cutoff = self.monotonic() - expiry_seconds
        gone = [client_id for client_id, entry in self._clients.items() if entry.last_seen < cutoff]
        for client_id in gone:
            del self._clients[client_id]
        return gone
