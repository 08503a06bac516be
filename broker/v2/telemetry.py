"""The open Telemetry streams of a member, and what the server pushes on them: transaction recovery.

A 5.x client keeps one Telemetry stream open to each endpoint it uses. Besides answering the client's
Settings, the server may write on it at any time; RocketMQ's proxy does so to ask a producer about an
orphaned transaction (the broker's CHECK_TRANSACTION_STATE becomes a ``RecoverOrphanedTransactionCommand``
with the half message and its transaction id; the producer's checker answers with EndTransaction, source
``SOURCE_SERVER_CHECK``). raftmq's leader-only check-back service (broker.transactions) does the same
through :meth:`TelemetrySessions.recover_transaction` when the half's producer group has no live 4.x
producer: it asks a producer whose Settings publish the half's real topic (the proxy registers a 5.x
producer under each topic it publishes, and stores a 5.x half under its topic as the producer group).

Each stream has an outbox of at most :data:`TELEMETRY_OUTBOX_MAX` commands; a recovery command that does not
fit is dropped (the check-back service asks again at its next interval). Local, not replicated: a stream
belongs to the member the client connected to.
"""

from __future__ import annotations

import asyncio
import random
from typing import Final

from broker.v2.consumer import v2_stored_message
from broker.v2.protocol.definition_pb2 import Code, Resource, Settings
from broker.v2.protocol.service_pb2 import RecoverOrphanedTransactionCommand, TelemetryCommand
from broker.v2.status import StatusError
from commitlog.record_codec import StoredMessage
from protocol.properties import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC

#: commands waiting to be written on one Telemetry stream, at most
TELEMETRY_OUTBOX_MAX: Final = 256
#: open Telemetry streams one member keeps, at most (a new one beyond it is refused TOO_MANY_REQUESTS)
TELEMETRY_STREAMS_MAX: Final = 10_000


class TelemetrySession:
    """One open Telemetry stream: its client, the last Settings it announced, and the commands to write on it."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.settings: Settings | None = None
        self.outbox: asyncio.Queue[TelemetryCommand] = asyncio.Queue(TELEMETRY_OUTBOX_MAX)

    def publishes(self, topic: str) -> bool:
        settings = self.settings
        return (settings is not None and settings.HasField("publishing")
                and any(resource.name == topic for resource in settings.publishing.topics))

    def push(self, command: TelemetryCommand) -> bool:
        """Queue ``command`` for the stream without waiting; False when its outbox is full."""
        try:
            self.outbox.put_nowait(command)
        except asyncio.QueueFull:
            return False
        return True


def recovery_command(half: StoredMessage) -> TelemetryCommand:
    """The proxy's RecoverOrphanedTransactionCommand for a half message: the message as its producer sent it
    (real topic and queue) and its transaction id (the half's message id, as SendMessage answered it)."""
    properties = half.property_map
    message = v2_stored_message(half, Resource(name=properties.get(PROPERTY_REAL_TOPIC, half.topic)))
    real_queue = properties.get(PROPERTY_REAL_QUEUE_ID, "")
    message.system_properties.queue_id = int(real_queue) if real_queue.isdigit() else half.queue_id
    return TelemetryCommand(recover_orphaned_transaction_command=RecoverOrphanedTransactionCommand(
        message=message, transaction_id=half.msg_id))


class TelemetrySessions:
    """The open Telemetry streams of this member, bounded by ``streams_max``."""

    def __init__(self, streams_max: int = TELEMETRY_STREAMS_MAX, rng: random.Random | None = None) -> None:
        self.streams_max = streams_max
        self.rng = rng or random.Random()
        self._sessions: set[TelemetrySession] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, client_id: str) -> TelemetrySession:
        if len(self._sessions) >= self.streams_max:
            raise StatusError(Code.TOO_MANY_REQUESTS, f"this broker keeps at most {self.streams_max} Telemetry streams")
        session = TelemetrySession(client_id)
        self._sessions.add(session)
        return session

    def close(self, session: TelemetrySession) -> None:
        self._sessions.discard(session)

    def publishers(self, topic: str) -> list[TelemetrySession]:
        """The streams of producers that publish ``topic``, by client id (a stable order for the pick)."""
        return sorted((session for session in self._sessions if session.publishes(topic)),
                      key=lambda session: session.client_id)

    def recover_transaction(self, half: StoredMessage) -> str | None:
        """Ask one producer of the half's real topic (picked at random) to resolve it; the client id asked,
        or None when no producer of the topic has a stream here or its outbox is full."""
        topic = half.property_map.get(PROPERTY_REAL_TOPIC, "")
        candidates = self.publishers(topic)
        if not candidates:
            return None
        session = candidates[self.rng.randrange(len(candidates))]
        return session.client_id if session.push(recovery_command(half)) else None
