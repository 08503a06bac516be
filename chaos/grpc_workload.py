"""The 5.x part of the chaos workload: producers and SimpleConsumer-style consumers that speak the gRPC protocol
(``apache.rocketmq.v2``) to the members' gRPC servers, through :class:`chaos.grpc_client.GrpcMembers`, and
record what they see in the same history as the 4.x clients (:mod:`chaos.history`).

Producers (:class:`GrpcProducerWorker`): like the 4.x ones (chaos.workload), each owns a few sharding keys and
sends one message at a time at a paced rate; each key is a FIFO message group, so the server stores a key's
messages in one queue (the proxy's choice of queue) and in send order, which the checker holds them to. Each
message gets its id (the UNIQ_KEY) before its first attempt and keeps it on retries (the broker deduplicates);
every attempt is recorded. An ack names the queue offset only (SendResultEntry has no queue). Neither delays nor
transactions here: the 4.x producers send those.

Consumers (:class:`PopConsumer`): a few per 5.x consumer group, each receiving from every queue at once (queue
id -1) from the leader, with an invisible time, and acknowledging what it received in one AckMessage; a seeded
fraction is left unacknowledged to come back after its invisible time (with one attempt more). Every delivery
is recorded with its attempt and the time its receive was sent, every ack entry with its outcome. A call that
gets no answer, or a member that is not the leader, sends the consumer to QueryRoute again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import string
import time
from typing import TYPE_CHECKING, Final

from google.protobuf.duration_pb2 import Duration

from broker.v2.protocol import service_pb2 as pb
from broker.v2.protocol.definition_pb2 import (
    Code,
    Encoding,
    FilterExpression,
    FilterType,
    Message,
    MessageQueue,
    MessageType,
    Resource,
)
from chaos.grpc_client import GrpcMembers, GrpcUnreachable
from chaos.history import DeliveryEvent, NoteEvent, PopAckEvent, SendEvent
from client.unique_id import UniqueIdGenerator

if TYPE_CHECKING:  # chaos.workload starts these workers: the names are annotations only here
    from chaos.workload import Recorder, SharedConsumers, WorkloadConfig

#: a 5.x attempt that got no answer is recorded with this code (the outcome is unknown)
UNANSWERED_CODE: Final = -2
#: no member named a leader (the attempt was not sent)
NO_LEADER_CODE: Final = -3
#: the tag every 5.x message carries
TAG: Final = "chaos"
#: pause after a failed call before the next (seconds, jittered up to twice), as the 4.x workers do
BACKOFF_SECONDS: Final = 0.1
#: a 5.x producer's name ends so, to tell its sends from the 4.x producers' in a history
NAME_SUFFIX: Final = "-v5"


def _duration(milliseconds: float) -> Duration:
    whole = int(milliseconds)
    return Duration(seconds=whole // 1000, nanos=whole % 1000 * 1_000_000)


class _Pacer:
    """The backoff after a failed call (seconds, jittered up to twice), from the worker's seeded random."""

    def __init__(self, rng: random.Random, seconds: float) -> None:
        self.rng = rng
        self.seconds = seconds

    async def backoff(self) -> None:
        await asyncio.sleep(self.seconds * (1 + self.rng.random()))


# ------------------------------------------------------------------------------------------ producers


class GrpcProducerWorker:
    """One 5.x producer: ``run(stop, release)`` as :class:`chaos.workload.ProducerWorker`'s."""

    def __init__(self, index: int, members: list[str], config: WorkloadConfig, recorder: Recorder,
                 rng: random.Random) -> None:
        self.name = f"p{index}{NAME_SUFFIX}"
        self.index = index
        self.members = members
        self.config = config
        self.recorder = recorder
        self.rng = rng
        self.idle = asyncio.Event()
        self.keys = [f"{self.name}-k{number}" for number in range(config.keys_per_producer)]
        self.sequences = dict.fromkeys(self.keys, 0)
        self.ids = UniqueIdGenerator(rng=random.Random(rng.getrandbits(64)))
        self.pacer = _Pacer(rng, BACKOFF_SECONDS)

    def _body(self, key: str, sequence: int) -> bytes:
        head = f"{key}#{sequence}#"
        filler = "".join(self.rng.choices(string.ascii_letters, k=max(0, self.config.body_bytes - len(head))))
        return (head + filler).encode()

    async def run(self, stop: asyncio.Event, release: asyncio.Event) -> None:
        members = GrpcMembers(self.members, self.name, random.Random(self.rng.getrandbits(64)))
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        try:
            while not stop.is_set():
                await self.send_one(members)
                next_at = max(next_at + 1 / self.config.rate_per_producer, loop.time() - 1.0)
                delay = next_at - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
            self.idle.set()
            await release.wait()
        finally:
            self.idle.set()
            await members.close()

    def _message(self, key: str, sequence: int, uniq_key: str) -> Message:
        message = Message(topic=Resource(name=self.config.topic), body=self._body(key, sequence))
        system = message.system_properties
        system.message_id = uniq_key
        system.message_type = MessageType.FIFO
        system.message_group = key
        system.tag = TAG
        system.born_timestamp.FromMilliseconds(time.time_ns() // 1_000_000)
        system.born_host = "127.0.0.1"
        system.body_encoding = Encoding.IDENTITY
        return message

    async def send_one(self, members: GrpcMembers) -> None:
        config = self.config
        key = self.keys[self.rng.randrange(len(self.keys))]
        sequence = self.sequences[key]
        self.sequences[key] = sequence + 1
        uniq_key = self.ids.next_id()
        request = pb.SendMessageRequest(messages=[self._message(key, sequence, uniq_key)])
        recorder = self.recorder
        for attempt in range(config.send_attempts_max):
            started = recorder.now()

            def failed(code: int, error: str, attempt: int = attempt, started: float = started) -> None:
                recorder.record(SendEvent(self.name, uniq_key, key, sequence, attempt, started, recorder.now(), False,
                                          code, error[:200]))

            address = await members.leader_address(config.topic, config.request_timeout_seconds)
            if address is None:
                failed(NO_LEADER_CODE, "no member named a leader")
                await self.pacer.backoff()
                continue
            try:
                response = await members.unary(address, "SendMessage", request, pb.SendMessageResponse,
                                               config.send_timeout_seconds)
            except asyncio.CancelledError:
                failed(UNANSWERED_CODE, "cancelled")
                raise
            except GrpcUnreachable as error:
                failed(UNANSWERED_CODE, str(error))
                members.forget_leader()
                await self.pacer.backoff()
                continue
            # one message sent, one entry answered: anything else is a refusal, whatever the top status says
            status = response.entries[0].status if len(response.entries) == 1 else response.status
            if response.status.code != Code.OK or status.code != Code.OK or len(response.entries) != 1:
                code = next((each.code for each in (response.status, status) if each.code != Code.OK), Code.OK)
                failed(code, f"{Code.Name(code) if code in Code.values() else code}: "
                             f"{response.status.message or status.message or 'no result entry'}")
                members.forget_leader()  # a member that lost the leadership, or knows no leader: ask again
                await self.pacer.backoff()
                continue
            recorder.record(SendEvent(self.name, uniq_key, key, sequence, attempt, started, recorder.now(), True, None,
                                      "", None, response.entries[0].offset, 0, address))
            return


# ------------------------------------------------------------------------------------------ consumers


class PopConsumer:
    """One 5.x SimpleConsumer of ``group``: receive from the leader, acknowledge, record."""

    def __init__(self, group: str, index: int, members: list[str], config: WorkloadConfig,
                 recorder: Recorder, rng: random.Random, shared: SharedConsumers) -> None:
        self.group = group
        self.name = f"{group}-c{index}"
        self.members = members
        self.config = config
        self.recorder = recorder
        self.rng = rng
        self.shared = shared
        self.pacer = _Pacer(rng, BACKOFF_SECONDS)
        self._last_note: tuple[str, str] | None = None

    def _note(self, what: str, node: str, detail: str) -> None:
        """Record a note, once per run of identical (what, node)."""
        if self._last_note != (what, node):
            self._last_note = (what, node)
            self.recorder.record(NoteEvent(self.recorder.now(), what, f"{self.name} at {node}: {detail[:160]}"))

    async def run(self) -> None:
        members = GrpcMembers(self.members, self.name, random.Random(self.rng.getrandbits(64)))
        try:
            while True:
                await self.receive_once(members)
        finally:
            await members.close()

    def _request(self) -> pb.ReceiveMessageRequest:
        config = self.config
        return pb.ReceiveMessageRequest(
            group=Resource(name=self.group),
            message_queue=MessageQueue(topic=Resource(name=config.topic), id=-1),
            filter_expression=FilterExpression(type=FilterType.TAG, expression="*"),
            batch_size=config.grpc_receive_batch, invisible_duration=_duration(config.grpc_invisible_seconds * 1000),
            long_polling_timeout=_duration(config.grpc_long_poll_ms), auto_renew=False)

    async def receive_once(self, members: GrpcMembers) -> None:
        config, recorder = self.config, self.recorder
        address = await members.leader_address(config.topic, config.request_timeout_seconds)
        if address is None:
            self._note("no 5.x leader", "-", "no member named a leader")
            await self.pacer.backoff()
            return
        requested = recorder.now()
        try:
            received = await members.receive(address, self._request(),
                                             config.grpc_long_poll_ms / 1000 + config.request_timeout_seconds)
        except GrpcUnreachable as error:
            self._note("5.x receive failed", address, str(error))
            members.forget_leader()
            await self.pacer.backoff()
            return
        if received.code == Code.MESSAGE_NOT_FOUND:
            return
        if received.code != Code.OK:
            self._note("5.x receive refused", address, f"{received.code}: {received.message}")
            members.forget_leader()
            await self.pacer.backoff()
            return
        session = next(self.shared.sessions)
        at = recorder.now()
        to_ack: list[Message] = []
        for message in received.messages:
            system = message.system_properties
            recorder.record(DeliveryEvent(self.group, session, system.message_id, system.queue_id, system.queue_offset,
                                          at, address, max(1, system.delivery_attempt), requested))
            # some are left to come back after their invisible time (not while draining: the drain waits for acks)
            if self.shared.draining or self.rng.random() >= config.grpc_unacked_fraction:
                to_ack.append(message)
        if to_ack:
            await self._ack(members, address, to_ack)

    async def _ack(self, members: GrpcMembers, address: str, messages: list[Message]) -> None:
        config, recorder = self.config, self.recorder
        request = pb.AckMessageRequest(
            group=Resource(name=self.group), topic=Resource(name=config.topic),
            entries=[pb.AckMessageEntry(message_id=message.system_properties.message_id,
                                        receipt_handle=message.system_properties.receipt_handle)
                     for message in messages])
        sent = recorder.now()

        def record(message: Message, acked: bool, code: int | None, error: str) -> None:
            system = message.system_properties
            recorder.record(PopAckEvent(self.group, system.message_id, system.queue_id, system.queue_offset, sent,
                                        recorder.now(), acked, code, error[:200], address))

        try:
            response = await members.unary(address, "AckMessage", request, pb.AckMessageResponse,
                                           config.request_timeout_seconds)
        except asyncio.CancelledError:
            for message in messages:
                record(message, False, None, "cancelled")
            raise
        except GrpcUnreachable as error:
            for message in messages:
                record(message, False, None, str(error))
            members.forget_leader()
            return
        if len(response.entries) != len(messages):  # refused whole: the top status says why
            for message in messages:
                record(message, False, response.status.code, response.status.message)
            members.forget_leader()
            return
        for message, entry in zip(messages, response.entries, strict=True):
            code = entry.status.code
            record(message, code == Code.OK, None if code == Code.OK else code, entry.status.message)


__all__ = ["NAME_SUFFIX", "NO_LEADER_CODE", "UNANSWERED_CODE", "GrpcProducerWorker", "PopConsumer"]
