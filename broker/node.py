"""One broker process: a Raft group member, its remoting server and processors, name-server registration
and the leader-only services. ``python -m broker.node --config node.toml`` (or ``raftmq broker``).

Threads: the event loop runs the server, the processors and the services; pysyncobj's tick thread runs
Raft and apply; the group-commit threads pack sends. The tick thread talks to the loop only through
``call_soon_threadsafe`` (role changes, "something applied").
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import ssl
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from broker.acl.admission import Admission
from broker.acl.authorizer import AclAuthorizer, AclRules
from broker.acl.config import load_acl_file
from broker.acl.reloader import AclFileWatcher
from broker.admin import ADMIN_CODES, AdminProcessor
from broker.config import BrokerConfig, load_node_file
from broker.consumers import ClientProcessor, ConsumerCallProcessor, ConsumerManager, QueueLocks
from broker.context import BrokerContext
from broker.delay import DelayService
from broker.forwarding import (
    MEMBER_LINK_CODES,
    ClientsAtTheLeader,
    Forwarder,
    ForwardLimits,
    LeaderOnly,
    MemberLinks,
    member_link_tls,
)
from broker.front_moves import FrontMover, front_host_set
from broker.http import HttpServer, probe_routes
from broker.logs import add_log_arguments, configure_logging, set_log_context
from broker.metrics import CONTENT_TYPE, new_registry, read_snapshot, render
from broker.offsets import OffsetCommitter
from broker.pop import PopService, ReviveService
from broker.probes import Probes, ProbeState, raft_status, read_probe_state
from broker.pull import PullProcessor, PullWaiters
from broker.pull_rates import PullRates
from broker.registration import Registrar
from broker.relay import CLIENT_GONE, ClientGoneProcessor, ClientRelay, RelayedClients
from broker.remoting.server import Connection, Processor, RemotingServer, RequestContext, ServerLimits
from broker.replica_files import REPLICA_FILES_CODES, ReplicaFilesProcessor
from broker.retention import RetentionService
from broker.runtime_stats import SAMPLE_PERIOD_SECONDS, RuntimeStats, member_totals
from broker.send import SEND_CODES, SendProcessor
from broker.send_back import SendBackProcessor
from broker.timers import TimerService
from broker.transactions import EndTransactionProcessor, TransactionCheckService
from broker.v2.server import GrpcServer, grpc_server
from commitlog.config import ConfigError
from dledger.command import AclDocument, Command
from dledger.config import NodeConfig, parse_address
from dledger.member import GroupMember, RoleChange
from dledger.tuning import tune_process_gc
from protocol import event_loop as event_loop_module
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.route_data import PERM_INHERIT, PERM_READ, PERM_WRITE
from protocol.route_data import TopicConfig as RouteTopicConfig
from protocol.topics import AUTO_CREATE_TOPIC

log = logging.getLogger(__name__)

HOUSEKEEPING_SECONDS = 10.0
#: threads that wait for proposals to apply
PROPOSAL_THREADS = 64
#: the route of TBW102: what clients use for topics that do not exist yet (RocketMQ's default 8 queues)
AUTO_CREATE_QUEUE_NUMS = 8
#: requests that are only for member links and prove it themselves (no client signature to check)
_MEMBER_LINK_ONLY_CODES = frozenset((*MEMBER_LINK_CODES, CLIENT_GONE))


class BrokerNode:
    def __init__(self, node: NodeConfig, config: BrokerConfig) -> None:
        self.node = node
        self.config = config
        self.member: GroupMember | None = None
        self.server: RemotingServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_scheduled = threading.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.acl_watcher: AclFileWatcher | None = None
        #: the RocketMQ 5.x gRPC server (broker.v2), when ``grpc_address`` is set
        self.grpc: GrpcServer | None = None
        #: the probes and metrics (broker.http), when ``http_address`` is set
        self.http: HttpServer | None = None
        #: set first thing by :meth:`stop`: the probes say so while the rest stops
        self.stopping = False
        #: a follower's link to the leader, for what only the leader may serve (broker.forwarding)
        self.forwarder: Forwarder | None = None
        self.front_mover: FrontMover | None = None

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        # Proposals block a thread until they apply (END_TRANSACTION, offsets, topics, delay, timer and
        # transaction services): asyncio's default of cores + 4 threads would queue them behind each other.
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(PROPOSAL_THREADS, "propose"))
        member = self.member = GroupMember(self.node, on_role_change=self._role_changed)
        broker = self.broker = BrokerContext(self.node, self.config, member)
        consumers = self.consumers = ConsumerManager()
        locks = QueueLocks(self.config.queue_lock_seconds)
        offsets = self.offsets = OffsetCommitter(broker)
        waiters = self.waiters = PullWaiters(member.store.max_queue_offset)
        self.registrar = Registrar(self.config, self._registration_snapshot)
        broker.on_topics_changed = self.registrar.trigger
        sender = SendProcessor(broker)
        self.delay = DelayService(broker)
        self.pops = PopService(broker)
        self.revive = ReviveService(self.pops)
        self.timers = TimerService(broker)
        self.retention = RetentionService(broker)
        host, port = parse_address(self.config.listen_address, "broker.listen_address")
        # access control and request limits, checked before a request is queued (broker.acl)
        acl_config = load_acl_file(Path(self.config.acl_file)) if self.config.acl_file else None
        self.acl_rules = AclRules(acl_config, lambda: member.state.acl_document)
        limits = ServerLimits(connections_max=self.config.remoting_connections_max,
                              in_flight_requests_max=self.config.remoting_in_flight_requests_max,
                              idle_timeout_seconds=self.config.remoting_idle_timeout_seconds)
        admission = Admission(AclAuthorizer(self.acl_rules))

        def authorize(request: RemotingCommand, connection: Connection) -> RemotingCommand | None:
            # member-link requests prove the group's secret themselves (they carry no client signature)
            return None if request.code in _MEMBER_LINK_ONLY_CODES else admission(request, connection)

        def find_client(address: str) -> Connection | None:
            for connection in self.server.connections if self.server is not None else ():
                if connection.remote_address == address and not member_links.is_member_link(connection):
                    return connection
            return None

        # any member takes the group's client traffic: what only the leader may serve is forwarded to it, and
        # it learns of every client (broker.relay)
        member_links = MemberLinks(self.node.secret)
        forwarder = self.forwarder = Forwarder(
            broker, self.node.secret,
            ForwardLimits(in_flight_max=self.config.forward_in_flight_max,
                          timeout_seconds=self.config.forward_timeout_seconds),
            ssl_context=member_link_tls(self.config.tls_cert_file) if self.config.tls_cert_file else None,
            relay_handler=ClientRelay(find_client))
        relays = RelayedClients()

        def leader_only(processor: Processor) -> Processor:
            return LeaderOnly(processor, broker, forwarder)

        front_hosts = front_host_set(self.config.follower_front_hosts)
        server = self.server = RemotingServer(host, port, limits, authorizer=authorize,
                                              ssl_context=self._tls_context(),
                                              is_member_link=member_links.is_member_link,
                                              proxy_protocol_hosts=front_hosts)
        server.register(MEMBER_LINK_CODES, member_links, queue_max=64, workers=2, name="member-link")
        server.add_close_listener(member_links.connection_closed)
        if acl_config is not None:
            self.acl_watcher = AclFileWatcher(
                Path(self.config.acl_file), acl_config, self.acl_rules, is_leader=lambda: member.is_leader,
                replicated_document=lambda: member.state.acl_document,
                propose=lambda document: broker.propose(Command((AclDocument(document),))))
        sends = LeaderOnly(sender, broker, forwarder)
        server.register(SEND_CODES, sends, queue_max=10_000, workers=512, name="send", fast=sends.fast(sender.fast))
        rates = PullRates()  # what pulls served, per group and topic: GET_CONSUME_STATS's consumeTps
        # put and get totals and rates as Java's broker keeps them (GET_BROKER_RUNTIME_INFO, /metrics)
        stats = self.runtime_stats = RuntimeStats(member_totals(member.committer, rates))
        server.register(RequestCode.PULL_MESSAGE, PullProcessor(broker, consumers, offsets, waiters, rates),
                        queue_max=10_000, workers=1024, name="pull")
        server.register(RequestCode.CONSUMER_SEND_MSG_BACK, leader_only(SendBackProcessor(broker, sender)),
                        queue_max=10_000, workers=64, name="send-back")
        server.register((RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                         RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ, RequestCode.GET_CONSUMER_CONNECTION_LIST,
                         RequestCode.GET_PRODUCER_CONNECTION_LIST),
                        ClientsAtTheLeader(leader_only(ClientProcessor(broker, consumers, locks, offsets, relays)),
                                           broker, forwarder), queue_max=10_000, workers=16, name="clients")

        async def ask_the_leader(context: RequestContext) -> RemotingCommand | None:
            return None if member.is_leader else await forwarder.forward(context)

        server.register(RequestCode.GET_CONSUMER_RUNNING_INFO,
                        ConsumerCallProcessor(consumers, elsewhere=ask_the_leader), queue_max=256, workers=8,
                        name="consumer-calls")
        server.register(CLIENT_GONE, ClientGoneProcessor(relays, member_links.is_member_link, consumers.connection_closed),
                        queue_max=1024, workers=1, name="client-gone")
        server.register(ADMIN_CODES, leader_only(AdminProcessor(broker, offsets, consumers, rates, stats,
                                                                  server.queue_depths)), queue_max=10_000,
                        workers=64, name="admin")
        server.register(RequestCode.END_TRANSACTION, leader_only(EndTransactionProcessor(broker)), queue_max=10_000,
                        workers=64, name="end-transaction")
        # read-only replica files for audits (raftmq verify --namesrv): few at once, each read bounded
        server.register(REPLICA_FILES_CODES, ReplicaFilesProcessor(member, self.node.secret,
                                                                   lambda: self.acl_rules.enabled),
                        queue_max=64, workers=4, name="replica-files")
        self.transactions = TransactionCheckService(broker, consumers)
        server.add_close_listener(consumers.connection_closed)
        server.add_close_listener(relays.link_closed)
        server.add_close_listener(forwarder.connection_closed)
        # a leader behind a front that routes to followers hands its front connections back to them
        self.front_mover = FrontMover(lambda: server.connections, bool(front_hosts),
                                      member_links.is_member_link, lambda: member.is_leader,
                                      lambda: bool(raft_status(member.raft).get("has_quorum", False)),
                                      consumers.keep_registrations)
        member.on_applied = self._applied
        await server.start()
        if self.config.grpc_address:
            # a broken invariant in a gRPC handler stops the member as one in a remoting processor does
            self.grpc = grpc_server(broker, sender, self.acl_rules, on_fatal=server._fail, pops=self.pops,
                                    offsets=offsets, waiters=waiters)
            self.transactions.recover_orphaned = self.grpc.service.sessions.recover_transaction
            await self.grpc.start()
        offsets.start()
        self.front_mover.start()
        self.registrar.start()
        self.delay.start()
        self.revive.start()
        self.timers.start()
        self.retention.start()
        self.transactions.start()
        if self.acl_watcher is not None:
            self.acl_watcher.start()
        self._tasks.append(loop.create_task(self._housekeeping(), name="housekeeping"))
        self._tasks.append(loop.create_task(self._sample_stats(), name="runtime-stats"))
        if self.config.http_address:
            raft_ids = {peer.raft_address: peer.id for peer in self.node.peers}
            registry = new_registry(lambda: read_snapshot(self.node.id, self.config.broker_name, member, stats,
                                                          rates, server, raft_ids))
            http_host, http_port = parse_address(self.config.http_address, "broker.http_address")
            self.http = HttpServer(http_host, http_port, probe_routes(Probes(self._probe_state),
                                                                      lambda: render(registry), CONTENT_TYPE))
            await self.http.start()

    # ------------------------------------------------------------------ events from the Raft thread

    def _role_changed(self, change: RoleChange) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_role_change, change)

    def _on_role_change(self, change: RoleChange) -> None:
        log.info("%s is now %s (term %d)", self.node.id, change.role, change.term)
        self.registrar.trigger()
        if self.front_mover is not None:
            self.front_mover.role_changed()
        self.delay.role_changed()
        self.revive.wake()
        self.timers.wake()
        self.waiters.wake_all()
        if self.acl_watcher is not None:
            self.acl_watcher.wake()

    def _applied(self) -> None:
        """After an apply (on the Raft thread): wake the loop for what waits for one, and only then: held pulls,
        on the leader receives in their long poll and a delay level that grew. A wake-up for nothing costs the
        Raft thread: the woken loop thread takes the GIL, or the CPU, from it (much of a busy follower's
        GIL time went there). What starts waiting later registers first and then looks (PullWaiters.wait,
        PopService.long_poll), so it sees what applied before."""
        if self._wake_scheduled.is_set():
            return
        member = self.member
        if member is not None and not self.waiters.held and (
                not member.is_leader or not (self.pops.polling or self.delay.wanted())):
            return
        self._wake_scheduled.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between: shutting down
                loop.call_soon_threadsafe(self._on_applied)

    def _on_applied(self) -> None:
        self._wake_scheduled.clear()
        self.waiters.notify()
        self.delay.applied()
        self.pops.applied()

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.config.tls_cert_file:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.config.tls_cert_file, self.config.tls_key_file)
        return context

    # ------------------------------------------------------------------ services

    def _registration_snapshot(self) -> tuple[bool, list[RouteTopicConfig], int, int]:
        member = self.member
        assert member is not None
        is_leader = member.is_leader
        topics = [RouteTopicConfig(name, config.read_queue_nums, config.write_queue_nums, config.perm,
                                   config.topic_sys_flag, config.order)
                  for name, config in sorted(dict(member.state.topics).items())]
        if self.config.auto_create_topic:
            topics.append(RouteTopicConfig(AUTO_CREATE_TOPIC, AUTO_CREATE_QUEUE_NUMS, AUTO_CREATE_QUEUE_NUMS,
                                           PERM_INHERIT | PERM_READ | PERM_WRITE))
        return is_leader, topics, member.state.applied_index, member.status().term

    def _probe_state(self) -> ProbeState:
        assert self.member is not None and self.server is not None
        return read_probe_state(self.member, self.server.is_serving, self.stopping)

    async def _sample_stats(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_PERIOD_SECONDS)
            self.runtime_stats.sample()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            self.consumers.expire(self.config.client_expiry_seconds)

    async def stop(self) -> None:
        self.stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.acl_watcher is not None:
            await self.acl_watcher.stop()
        if self.front_mover is not None:
            await self.front_mover.stop()
        await self.delay.stop()
        await self.revive.stop()
        await self.timers.stop()
        await self.retention.stop()
        await self.transactions.stop()
        await self.registrar.stop()
        await self.offsets.stop()
        if self.grpc is not None:
            await self.grpc.stop(grace_seconds=1.0)
        if self.server is not None:
            await self.server.stop(grace_seconds=1.0)
        if self.http is not None:
            await self.http.stop()
        if self.forwarder is not None:
            await self.forwarder.close()
        if self.member is not None:
            member = self.member
            await asyncio.get_running_loop().run_in_executor(None, member.stop)

    async def wait_server_stopped(self) -> None:
        assert self.server is not None
        await self.server.wait_stopped()


async def serve(node: NodeConfig, config: BrokerConfig) -> None:
    broker_node = BrokerNode(node, config)
    await broker_node.start()
    tune_process_gc()  # a process of its own: start-up objects frozen, fewer young collections
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop_requested.set)
    print(json.dumps({"event": "listening", "node": node.id, "address": config.listen_address,
                      "advertised": config.announced_address, "grpc": config.grpc_address,
                      "http": config.http_address}), flush=True)
    stopped = loop.create_task(broker_node.wait_server_stopped())
    requested = loop.create_task(stop_requested.wait())
    try:
        await asyncio.wait({stopped, requested}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        requested.cancel()
        await broker_node.stop()
    await stopped


def run_loop(main: Coroutine[Any, Any, None], event_loop: str) -> None:
    """Run ``main`` on ``event_loop`` ("uvloop": libuv's loop, the stdlib's if uvloop cannot be imported)."""
    if event_loop == "uvloop":
        event_loop_module.run(main)
    else:
        asyncio.run(main)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.node", description="one raftmq broker group member")
    parser.add_argument("--config", required=True, type=Path, help="the node's TOML file")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_log_arguments(parser)
    arguments = parser.parse_args(argv)
    configure_logging(arguments.log_level, arguments.log_format, arguments.log_file, arguments.log_max_bytes,
                      arguments.log_backups)
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
    if "RAFTMQ_SWITCH_INTERVAL" in os.environ:  # GIL hand-off period (experiments)
        sys.setswitchinterval(float(os.environ["RAFTMQ_SWITCH_INTERVAL"]))
    try:
        node, config = load_node_file(arguments.config)
    except ConfigError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    set_log_context(node=node.id, group=config.broker_name)
    try:
        run_loop(serve(node, config), config.event_loop)
    except OSError as exc:
        log.error("cannot serve on %s: %s", config.listen_address, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
