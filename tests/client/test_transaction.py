"""The transactional producer against the fake group: half message, local transaction, END_TRANSACTION,
and the answer to a broker's check-back."""

from __future__ import annotations

import random

from client.config import ProducerConfig
from client.message import Message, MessageExt
from client.transaction import AsyncTransactionProducer, LocalTransactionState
from commitlog.record_codec import decode_record
from tests.client.fake_broker import FakeGroup, check_transaction
from tests.client.helpers import fake_group, fast_client_config, run
from tests.support.waiting import poll_until, wait_for


class Listener:
    def __init__(self, decisions: list[LocalTransactionState | Exception]) -> None:
        self.decisions = decisions
        self.executed: list[tuple[bytes, object]] = []
        self.checked: list[MessageExt] = []
        self.check_answer = LocalTransactionState.COMMIT_MESSAGE

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        self.executed.append((message.body, arg))
        decision = self.decisions.pop(0)
        if isinstance(decision, Exception):
            raise decision
        return decision

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message)
        return self.check_answer


def producer_for(group: FakeGroup, listener: Listener) -> AsyncTransactionProducer:
    return AsyncTransactionProducer(fast_client_config(group.namesrv), ProducerConfig(group="TPG"),
                                    listener=listener, rng=random.Random(5))


def test_commit_rollback_and_unknown_end_the_transaction() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            listener = Listener([LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                                 RuntimeError("database down")])
            async with producer_for(group, listener) as producer:
                committed = await producer.send_message_in_transaction(Message("Tx", b"commit me", delay_level=3),
                                                                       arg={"order": 1})
                rolled = await producer.send_message_in_transaction(Message("Tx", b"roll me back"))
                unknown = await producer.send_message_in_transaction(Message("Tx", b"unknown"))
                await poll_until(lambda: len(group.store.end_transactions) == 3, "3 END_TRANSACTION",
                                 timeout_seconds=10.0)
            assert [state.local_state for state in (committed, rolled, unknown)] == [
                LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                LocalTransactionState.UNKNOW]
            assert listener.executed[0] == (b"commit me", {"order": 1})
            half = decode_record(group.store.records[0])
            assert half.sys_flag & 0xC == 0x4  # prepared
            properties = dict(p.split("\x01") for p in half.properties.decode().split("\x02") if p)
            assert properties["TRAN_MSG"] == "true" and properties["PGROUP"] == "TPG"
            assert "DELAY" not in properties  # a transactional message is never delayed
            ends = [end.fields for end in group.store.end_transactions]
            assert [end["commitOrRollback"] for end in ends] == ["8", "12", "0"]
            first = ends[0]
            assert first["producerGroup"] == "TPG" and first["fromTransactionCheck"] == "false"
            assert first["commitLogOffset"] == "0" and first["msgId"] == committed.msg_id
            assert first["tranStateTableOffset"] == str(committed.send_result.queue_offset)
            # the committed message became visible in its topic; the others did not
            assert [body for _, _, _, body in group.all_records("Tx")] == [b"commit me"]

    run(scenario())


def test_a_check_back_is_answered_with_end_transaction() -> None:
    async def scenario() -> None:
        async with fake_group() as group:
            listener = Listener([LocalTransactionState.UNKNOW])
            async with producer_for(group, listener) as producer:
                result = await producer.send_message_in_transaction(Message("Tx", b"decide later", keys=("k",)))
                await poll_until(lambda: len(group.store.end_transactions) == 1, "the first END_TRANSACTION",
                                 timeout_seconds=10.0)
                await check_transaction(group, "TPG", 0, transaction_id="TX-1")
                await poll_until(lambda: len(group.store.end_transactions) == 2, "the answer to the check",
                                 timeout_seconds=10.0)
            (checked,) = listener.checked
            assert checked.body == b"decide later" and checked.msg_id == result.msg_id and checked.keys == ("k",)
            answer = group.store.end_transactions[1].fields
            assert answer["fromTransactionCheck"] == "true" and answer["commitOrRollback"] == "8"
            assert answer["transactionId"] == "TX-1" and answer["msgId"] == result.msg_id
            assert answer["commitLogOffset"] == "0" and answer["producerGroup"] == "TPG"

    run(scenario())


def test_an_async_listener_works_too() -> None:
    class AsyncListener:
        async def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

        async def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.ROLLBACK_MESSAGE

    async def scenario() -> None:
        async with fake_group() as group:
            producer = AsyncTransactionProducer(fast_client_config(group.namesrv), ProducerConfig(group="TPG"),
                                                listener=AsyncListener())
            async with producer:
                result = await producer.send_message_in_transaction(Message("Tx", b"a"))
                assert result.local_state is LocalTransactionState.COMMIT_MESSAGE
                await check_transaction(group, "TPG", 0)
                await poll_until(lambda: len(group.store.end_transactions) == 2, "the check answer",
                                 timeout_seconds=10.0)
            assert group.store.end_transactions[1].fields["commitOrRollback"] == "12"

    run(scenario())


def test_sync_transaction_producer() -> None:
    from client.loop import EventLoopThread
    from client.sync import TransactionProducer

    group = FakeGroup()
    loop = EventLoopThread("fake-broker")
    try:
        loop.run(group.start())
        listener = Listener([LocalTransactionState.COMMIT_MESSAGE])
        with TransactionProducer(fast_client_config(group.namesrv), ProducerConfig(group="TPG"),
                                 listener=listener) as producer:
            result = producer.send_message_in_transaction(Message("Tx", b"sync"))
        assert result.local_state is LocalTransactionState.COMMIT_MESSAGE
        assert wait_for(lambda: loop.call(lambda: [e.fields["commitOrRollback"] for e in group.store.end_transactions]),
                 "END_TRANSACTION", timeout_seconds=10) == ["8"]
    finally:
        loop.run(group.stop())
        loop.stop()


def test_a_commit_follows_the_leader_that_changed_during_the_local_transaction() -> None:
    async def scenario() -> None:
        async with fake_group(nodes=2) as group:

            class MovingLeader:
                async def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
                    await group.elect(1)  # the half went to node 0; node 1 leads when the decision is sent
                    return LocalTransactionState.COMMIT_MESSAGE

                async def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
                    return LocalTransactionState.UNKNOW

            producer = AsyncTransactionProducer(fast_client_config(group.namesrv), ProducerConfig(group="TPG"),
                                                listener=MovingLeader())
            async with producer:
                result = await producer.send_message_in_transaction(Message("Tx", b"moved"))
            assert result.send_result.broker_address == group.nodes[0].address
            assert [end.fields["commitOrRollback"] for end in group.store.end_transactions] == ["8"]
            assert group.nodes[1].requests.count(37) == 1  # END_TRANSACTION reached the new leader
            assert [body for _, _, _, body in group.all_records("Tx")] == [b"moved"]

    run(scenario())


def test_a_reconnected_producer_heartbeats_the_broker_at_once() -> None:
    """The broker finds a producer for check-backs by its heartbeat connection: after a reconnect the new
    connection is announced at once, not at the next periodic heartbeat (30 s here, longer than the test)."""

    async def scenario() -> None:
        async with fake_group() as group:
            config = fast_client_config(group.namesrv, heartbeat_interval_seconds=30.0)
            producer = AsyncTransactionProducer(config, ProducerConfig(group="TPG"), listener=Listener([
                LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE]), rng=random.Random(5))
            async with producer:
                await producer.send_message_in_transaction(Message("Tx", b"one"))
                leader = group.leader.address
                await poll_until(lambda: any("TPG" in str(beat) for beat in group.heartbeats),
                                 "a first heartbeat", timeout_seconds=10.0)
                before = len(group.heartbeats)
                await producer.instance._connections[leader].close()  # the link drops (a reset, a proxy cut)
                await producer.send_message_in_transaction(Message("Tx", b"two"))  # reconnects
                await poll_until(lambda: len(group.heartbeats) > before, "a heartbeat on the new connection",
                                 timeout_seconds=10.0)

    run(scenario())
