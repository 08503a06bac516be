"""The power-loss scenario pointed at a three-node NATS JetStream cluster (``raftmq chaos run --scenario
power-loss --system nats``), so that its figures can be put beside raftmq's own ``power-loss`` run.

1. Start three ``nats-server`` processes, each with its JetStream store on its own powerfs mount
   (:mod:`chaos.nats_cluster`), create an R3 file stream and wait until both followers are current; then
   ``sync`` every disk: the stream as created is durable, as a raftmq member's installed configuration is
   (the question here is what happens to acknowledged messages, not to the stream's definition).
2. Producers publish as raftmq's workload sends: ``producers`` of them, each one message at a time at
   ``rate_per_producer``, every message with a unique id in ``Nats-Msg-Id`` (JetStream deduplicates a
   retry by it within the stream's duplicate window, two minutes, as raftmq does by UNIQ_KEY) and at the
   head of its body; a failed publish is retried with the same id up to ``send_attempts_max`` attempts,
   then given up (an unknown outcome). A publish counts as acknowledged when its PubAck came back.
3. After ``warmup_seconds``, for ``duration_seconds``: the power of all three servers is cut at once (every
   disk drops what was not fsynced, the servers are SIGKILLed), they boot again 0.5-2 s later on what their
   disks kept, and the next gap (2-4 s) starts once the stream has a leader again. Gaps and holds come from
   the seed exactly as raftmq's ``power-loss`` draws them (the same seed, the same schedule; the number of
   cuts in a run depends on how long each restart takes). The wait for the stream's leader is NATS's own: a
   booted raftmq group elects within its gap, while JetStream's meta and stream elections take longer than
   a gap, so without it (``await_stream_leader=False``) the next cut lands before NATS takes a write again
   and the run shows only what the first cut lost.
4. ``cooldown_seconds`` more of publishing, then the producers stop; once the stream has a leader and both
   followers are current, every server's own replica state is recorded (its ``/jsz`` page: messages, first
   and last sequence) and the whole stream is read from the leader, sequence by sequence.
5. :func:`chaos.nats_check.check` compares the acknowledged set with the stream: lost, reordered, stored
   twice, phantom; written to ``report.json`` with every publish (``publishes.jsonl``) and the stream as
   read (``stream.jsonl``).

The verdict is ``clean`` when nothing acknowledged was lost or reordered and nothing stored twice or
unknown, ``violations`` when something was, ``incomplete`` when the stream could not be read back. Every
server is stopped and every mount released on the way out, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import statistics
import string
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from chaos import nats_cluster, powerfs
from chaos.nats_check import NatsCheck, Publish, Stored, check
from chaos.scenarios import GAP_SECONDS, POWER_LOSS_HOLD_SECONDS

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

SYSTEM: Final = "nats"
SCENARIO: Final = "power-loss"
STREAM: Final = "CHAOS"
SUBJECT: Final = "chaos.messages"
MESSAGE_ID_HEADER: Final = "Nats-Msg-Id"
REPORT_VERSION: Final = 1
CLUSTER_DIRECTORY: Final = "cluster"
REPORT_FILE: Final = "report.json"
PUBLISHES_FILE: Final = "publishes.jsonl"
STREAM_FILE: Final = "stream.jsonl"
#: pause after a failed publish before its retry (seconds, jittered up to twice), as raftmq's workload
BACKOFF_SECONDS: Final = 0.1
#: how long JetStream may take to elect the stream's leader, at the start and after the last cut
SETTLE_TIMEOUT_SECONDS: Final = 60.0
#: stream reads in flight at once while the stream is read back (each one message)
READS_IN_FLIGHT_MAX: Final = 64
API_TIMEOUT_SECONDS: Final = 5.0
POLL_SECONDS: Final = 0.25
EXIT_CLEAN: Final = 0
EXIT_VIOLATIONS: Final = 1


@dataclass(frozen=True, slots=True)
class NatsRunOptions:
    """What a run does; the workload's defaults are raftmq's (chaos.workload.WorkloadConfig)."""

    report_dir: Path
    duration_seconds: float = 60.0
    seed: int = 1
    producers: int = 3
    rate_per_producer: float = 40.0
    body_bytes: int = 200
    send_timeout_seconds: float = 5.0
    send_attempts_max: int = 4
    warmup_seconds: float = 3.0
    cooldown_seconds: float = 5.0
    settle_timeout_seconds: float = SETTLE_TIMEOUT_SECONDS
    #: after each boot, wait (up to the settle timeout) until the stream has a leader before the next gap
    await_stream_leader: bool = True
    #: keep the servers' directories after a clean run too (always kept after another verdict)
    keep_data: bool = False

    def validate(self) -> NatsRunOptions:
        checks = [
            (0 < self.duration_seconds <= 24 * 3600, "the duration must be in (0, 86400] seconds"),
            (1 <= self.producers <= 64, "producers must be 1..64"),
            (0 < self.rate_per_producer <= 10_000, "rate_per_producer must be in (0, 10000]"),
            (32 <= self.body_bytes <= 65_536, "body_bytes must be 32..65536"),
            (self.send_timeout_seconds > 0 and self.send_attempts_max >= 1,
             "send timeout and attempts must be positive"),
            (self.warmup_seconds >= 0 and self.cooldown_seconds >= 0 and self.settle_timeout_seconds > 0,
             "warm-up and cool-down must not be negative, the settle timeout positive"),
        ]
        for holds, message in checks:
            if not holds:
                raise ValueError(message)
        return self


@dataclass(frozen=True, slots=True)
class Cut:
    """One power cut of every server: when (seconds since the workload started), what each disk dropped,
    how long the power stayed off, how long the boot took (servers listening) and how long after the boot the
    stream had a leader again (None: not waited for, or not within the settle timeout)."""

    start: float
    dropped: dict[str, dict[str, Any]]
    hold_seconds: float
    boot_seconds: float
    leader_after_boot_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"start": round(self.start, 3), "hold_seconds": round(self.hold_seconds, 3),
                "boot_seconds": round(self.boot_seconds, 3),
                "leader_after_boot_seconds": None if self.leader_after_boot_seconds is None
                else round(self.leader_after_boot_seconds, 3),
                "dropped": {name: {key: report.get(key) for key in ("dropped_bytes", "dropped_files",
                                                                     "undone_changes")}
                            for name, report in self.dropped.items()}}


@dataclass
class _Run:
    """What the run saw, filled in as it goes (the report is written from it whatever failed)."""

    started: float = 0.0
    publishes: list[Publish] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    replicas: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    stored: list[Stored] | None = None
    stream_state: dict[str, Any] | None = None
    error: str | None = None

    def now(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True, slots=True)
class NatsRunOutcome:
    exit_code: int
    verdict: str
    report: dict[str, Any]
    result: NatsCheck


def unavailable() -> str | None:
    return nats_cluster.nats_unavailable()


def _prepare_directory(report_dir: Path) -> Path:
    from chaos.runner import UsageError

    report_dir.mkdir(parents=True, exist_ok=True)
    cluster_dir = report_dir / CLUSTER_DIRECTORY
    if left := nats_cluster.running_servers(cluster_dir):
        raise UsageError(f"nats-server processes of an earlier run still run in {cluster_dir}: {left}")
    if cluster_dir.exists():
        powerfs.release_mounts(cluster_dir)
        shutil.rmtree(cluster_dir)
    for name in (REPORT_FILE, PUBLISHES_FILE, STREAM_FILE):
        (report_dir / name).unlink(missing_ok=True)
    return cluster_dir


def run(options: NatsRunOptions, out: TextIO | None = None) -> NatsRunOutcome:
    """Run the scenario against NATS; print progress and the verdict to ``out`` (default stdout). Raises
    :class:`chaos.runner.UsageError` for bad options and when NATS cannot run here."""
    from chaos.runner import UsageError

    out = out if out is not None else sys.stdout
    try:
        options.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if (reason := unavailable()) is not None:
        raise UsageError(f"the NATS power-loss run cannot run on this machine: {reason}")
    binary = nats_cluster.binary_path()
    assert binary is not None  # unavailable() said so
    version = nats_cluster.server_version(binary)
    cluster_dir = _prepare_directory(options.report_dir)
    print(f"chaos {SCENARIO} on NATS JetStream {version}: seed {options.seed}, {options.duration_seconds:g} s, "
          f"report in {options.report_dir}", file=out, flush=True)
    started = time.monotonic()
    state = _Run()
    try:
        with nats_cluster.NatsCluster(binary, cluster_dir) as cluster:
            asyncio.run(_drive(options, cluster, state, out))
    except Exception as exc:  # reported in the verdict; what was recorded so far is still checked
        state.error = f"{type(exc).__name__}: {exc}"
    result = check(state.publishes, state.stored or [])
    if state.stored is None:
        verdict = "incomplete"
    else:
        verdict = "clean" if result.clean and state.error is None else (
            "violations" if not result.clean else "incomplete")
    exit_code = EXIT_CLEAN if verdict == "clean" else EXIT_VIOLATIONS
    report = _report(options, version, state, result, verdict, exit_code, time.monotonic() - started)
    _write_jsonl(options.report_dir / PUBLISHES_FILE, (publish.to_json() for publish in state.publishes))
    _write_jsonl(options.report_dir / STREAM_FILE, ({"stream_sequence": message.stream_sequence,
                                                     "message_id": message.message_id}
                                                    for message in state.stored or []))
    (options.report_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    print_summary(report, out)
    if verdict == "clean" and not options.keep_data:
        shutil.rmtree(cluster_dir, ignore_errors=True)
    return NatsRunOutcome(exit_code, verdict, report, result)


async def _drive(options: NatsRunOptions, cluster: nats_cluster.NatsCluster, state: _Run, out: TextIO) -> None:
    # the same draws as chaos.runner for a scenario without proxies: the workload's seed, then the faults'
    rng = random.Random(options.seed)
    workload_rng = random.Random(rng.getrandbits(64))
    fault_rng = random.Random(rng.getrandbits(64))
    leader = await _create_stream(cluster.client_urls, options.settle_timeout_seconds)
    await asyncio.to_thread(cluster.sync)  # the stream as created is durable (module doc, step 1)
    print(f"  stream {STREAM} (R3) led by {leader}; publishing", file=out, flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    state.started = time.monotonic()
    producers = [asyncio.create_task(_produce(index, cluster.client_urls, options, state, stop,
                                              random.Random(workload_rng.getrandbits(64))))
                 for index in range(options.producers)]
    try:
        await asyncio.sleep(options.warmup_seconds)
        print(f"  power cuts for {options.duration_seconds:g} s", file=out, flush=True)
        deadline = loop.time() + options.duration_seconds
        while True:
            gap = fault_rng.uniform(*GAP_SECONDS)
            if loop.time() + gap >= deadline:
                break
            await asyncio.sleep(gap)
            hold = fault_rng.uniform(*POWER_LOSS_HOLD_SECONDS)
            cut_at = state.now()
            dropped = await asyncio.to_thread(cluster.cut_power)
            await asyncio.sleep(hold)
            booting = state.now()
            await asyncio.to_thread(cluster.boot)
            booted = state.now()
            leader_after = None
            if (options.await_stream_leader
                    and await _stream_leader(cluster.client_urls, options.settle_timeout_seconds) is not None):
                leader_after = state.now() - booted
            state.cuts.append(Cut(cut_at, dropped, hold, booted - booting, leader_after))
        print(f"  {len(state.cuts)} cuts; cooling down {options.cooldown_seconds:g} s", file=out, flush=True)
        await asyncio.sleep(options.cooldown_seconds)
    finally:
        stop.set()
        # a message in the middle of its attempts may take them all (as chaos.runner waits for raftmq's)
        _, pending = await asyncio.wait(producers, timeout=options.send_timeout_seconds * options.send_attempts_max + 5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*producers, return_exceptions=True)
    for task in producers:
        if not task.cancelled() and (failure := task.exception()) is not None:
            raise RuntimeError(f"a producer failed: {failure!r}") from failure
    print("  reading the stream back", file=out, flush=True)
    await _read_back(cluster, options.settle_timeout_seconds, state)


async def _quiet_error(_error: Exception) -> None:
    """nats-py logs every failed (re)connect attempt with a traceback unless given a callback."""


async def _connect(urls: list[str]) -> Client:
    import nats

    # reconnect for ever: the servers are away for a second or two at every cut
    return await nats.connect(urls, connect_timeout=2, reconnect_time_wait=0.25, max_reconnect_attempts=-1,
                              error_cb=_quiet_error)


async def _create_stream(urls: list[str], timeout_seconds: float) -> str:
    """Create the R3 file stream (retrying while the cluster elects its meta leader), wait until both
    followers are current, and return the stream leader's server name."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    client = await _connect(urls)
    try:
        stream = client.jetstream(timeout=API_TIMEOUT_SECONDS)
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                await stream.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=len(urls),
                                                     storage=StorageType.FILE))
                break
            except (nats.errors.Error, TimeoutError) as exc:  # no meta leader yet: timeouts or API errors
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream stream not created after {timeout_seconds:g} s: {exc!r}") from None
                await asyncio.sleep(POLL_SECONDS)
        leader = await _settled_leader(stream, len(urls), deadline)
        if leader is None:
            raise RuntimeError(f"JetStream stream {STREAM} without a leader and current followers after "
                               f"{timeout_seconds:g} s")
        return leader
    finally:
        await client.close()


async def _settled_leader(stream: JetStreamContext, members: int, deadline: float) -> str | None:
    """The stream leader's name once it has one and every follower is current; None at the deadline.
    Raises nats.js.errors.NotFoundError when the cluster no longer knows the stream."""
    import nats
    from nats.js.errors import NotFoundError

    while time.monotonic() < deadline:
        try:
            info = await stream.stream_info(STREAM)
        except NotFoundError:
            raise
        except (nats.errors.Error, TimeoutError):
            await asyncio.sleep(POLL_SECONDS)
            continue
        group = info.cluster
        if (group is not None and group.leader and len(group.replicas or []) == members - 1
                and all(peer.current for peer in group.replicas or [])):
            return group.leader
        await asyncio.sleep(POLL_SECONDS)
    return None


async def _stream_leader(urls: list[str], timeout_seconds: float) -> str | None:
    """The stream leader's name once the stream has one; None at the deadline or when the stream is gone."""
    import nats
    from nats.js.errors import NotFoundError

    client = await _connect(urls)
    try:
        stream = client.jetstream(timeout=API_TIMEOUT_SECONDS)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            try:
                info = await stream.stream_info(STREAM)
            except NotFoundError:
                return None
            except (nats.errors.Error, TimeoutError):
                await asyncio.sleep(POLL_SECONDS)
                continue
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
            await asyncio.sleep(POLL_SECONDS)
        return None
    finally:
        await client.close()


def _body(message_id: str, size: int, rng: random.Random) -> bytes:
    head = f"{message_id}#"
    return (head + "".join(rng.choices(string.ascii_letters, k=max(0, size - len(head))))).encode()


async def _produce(index: int, urls: list[str], options: NatsRunOptions, state: _Run, stop: asyncio.Event,
                   rng: random.Random) -> None:
    """One producer: a message at a time, paced, each retried with its id until acknowledged or given up."""
    import nats

    client = await _connect(urls)
    stream = client.jetstream(timeout=options.send_timeout_seconds)
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    sequence = 0
    try:
        while not stop.is_set():
            message_id = f"p{index}-{sequence:07d}"
            body = _body(message_id, options.body_bytes, rng)
            first_send = state.now()
            attempts = 0
            ack_sequence: int | None = None
            ack_time: float | None = None
            try:
                while attempts < options.send_attempts_max:
                    attempts += 1
                    try:
                        ack = await stream.publish(SUBJECT, body, stream=STREAM,
                                                   headers={MESSAGE_ID_HEADER: message_id})
                    except (nats.errors.Error, TimeoutError):
                        await asyncio.sleep(BACKOFF_SECONDS * (1 + rng.random()))
                        continue
                    ack_sequence, ack_time = ack.seq, state.now()
                    break
            finally:  # also when cancelled at the end: an attempt under way is an unknown outcome
                state.publishes.append(Publish(message_id, index, sequence, attempts, first_send, ack_sequence,
                                               ack_time))
            sequence += 1
            next_at = max(next_at + 1 / options.rate_per_producer, loop.time() - 1.0)
            delay = next_at - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
    finally:
        await client.close()


async def _read_back(cluster: nats_cluster.NatsCluster, timeout_seconds: float, state: _Run) -> None:
    """Once the stream has a leader and current followers: each server's own replica state, then every
    sequence from the first to the last, read from the leader. A stream the cluster no longer knows reads
    as empty (everything in it is lost); one without a leader leaves ``state.stored`` None (incomplete)."""
    from nats.js.errors import NotFoundError

    client = await _connect(cluster.client_urls)
    try:
        manager = client.jetstream(timeout=API_TIMEOUT_SECONDS)
        try:
            leader = await _settled_leader(manager, len(cluster.servers), time.monotonic() + timeout_seconds)
        except NotFoundError:
            state.error = f"the stream {STREAM} is gone after the cuts"
            state.stored = []
            return
        for server in cluster.servers:
            state.replicas[server.name] = await asyncio.to_thread(cluster.replica_state, server, STREAM)
        if leader is None:
            state.error = f"the stream {STREAM} has no leader with current followers after {timeout_seconds:g} s"
            return
        info = await manager.stream_info(STREAM)
        state.stream_state = {"leader": leader, "messages": info.state.messages, "first_seq": info.state.first_seq,
                              "last_seq": info.state.last_seq, "num_deleted": info.state.num_deleted,
                              "lost": None if info.state.lost is None else str(info.state.lost)}
        state.stored = await _read_stream(manager, info.state.first_seq, info.state.last_seq)
    finally:
        await client.close()


async def _read_stream(manager: JetStreamContext, first: int, last: int) -> list[Stored]:
    """Every message from ``first`` to ``last`` (a sequence with no message is skipped), in stream order."""
    from nats.js.errors import NotFoundError

    window = asyncio.Semaphore(READS_IN_FLIGHT_MAX)

    async def read(sequence: int) -> Stored | None:
        async with window:
            try:
                message = await manager.get_msg(STREAM, sequence)
            except NotFoundError:
                return None
        message_id = (message.headers or {}).get(MESSAGE_ID_HEADER)
        if message_id is None:  # the body starts with it too
            message_id = (message.data or b"").partition(b"#")[0].decode(errors="replace")
        return Stored(sequence, message_id)

    found = await asyncio.gather(*(read(sequence) for sequence in range(first, last + 1))) if first else []
    return [message for message in found if message is not None]


def _write_jsonl(path: Path, documents: Iterable[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as target:
        for document in documents:
            target.write(json.dumps(document, separators=(",", ":")) + "\n")


def _report(options: NatsRunOptions, version: str, state: _Run, result: NatsCheck, verdict: str, exit_code: int,
            elapsed_seconds: float) -> dict[str, Any]:
    replicas = list(state.replicas.values())
    comparable = [(replica["messages"], replica["first_seq"], replica["last_seq"])
                  for replica in replicas if replica is not None]
    return {
        "version": REPORT_VERSION,
        "scenario": SCENARIO,
        "system": SYSTEM,
        "nats_server": version,
        # nats-server 2.9 has no sync setting: its file store syncs on a timer, not before a PubAck
        "nats_sync": "server default",
        "seed": options.seed,
        "duration_seconds": options.duration_seconds,
        "verdict": verdict,
        "exit_code": exit_code,
        "error": state.error,
        "cuts": len(state.cuts),
        "acked": result.acked,
        "lost": None if state.stored is None else result.lost,
        "reordered": None if state.stored is None else result.reordered,
        "check": result.to_json(),
        "stream": state.stream_state,
        "replicas": state.replicas,
        # the servers' own counts (first, last sequence, messages) agree; not a byte comparison
        "replicas_agree": bool(comparable) and len(comparable) == len(replicas) and len(set(comparable)) == 1,
        "await_stream_leader": options.await_stream_leader,
        "cut_details": [{**cut.to_json(), "first_ack_after_seconds": _first_ack_after(state.publishes, cut)}
                        for cut in state.cuts],
        # as raftmq's power-loss members: a namespace change (a new file) survives a cut once its directory
        # was fsynced (chaos.powerfs's "posix" model)
        "powerfs_namespace": "posix",
        "workload": {"producers": options.producers, "rate_per_producer": options.rate_per_producer,
                     "body_bytes": options.body_bytes, "send_timeout_seconds": options.send_timeout_seconds,
                     "send_attempts_max": options.send_attempts_max},
        "elapsed_seconds": round(elapsed_seconds, 1),
        "files": {"publishes": PUBLISHES_FILE, "stream": STREAM_FILE},
    }


def _first_ack_after(publishes: list[Publish], cut: Cut) -> float | None:
    """Seconds from the cut to the first PubAck that came after it (None: none came)."""
    after = [publish.ack_time for publish in publishes if publish.ack_time is not None and publish.ack_time > cut.start]
    return round(min(after) - cut.start, 3) if after else None


def print_summary(report: dict[str, Any], out: TextIO) -> None:
    figures = report["check"]
    lost = "?" if report["lost"] is None else report["lost"]
    reordered = "?" if report["reordered"] is None else report["reordered"]
    print(f"verdict: {report['verdict']} (NATS {report['nats_server']}, {report['cuts']} cuts"
          + (f", error {report['error']}" if report["error"] else "") + ")", file=out)
    print(f"messages {figures['messages']}: acked {report['acked']}, lost {lost}, reordered {reordered}, "
          f"stored twice {figures['stored_twice']}, phantom {figures['phantom']}; moved {figures['moved']}, "
          f"unacked {figures['unacked']} ({figures['unacked_stored']} stored)", file=out)
    recoveries = sorted(cut["first_ack_after_seconds"] for cut in report["cut_details"]
                        if cut["first_ack_after_seconds"] is not None)
    if recoveries:
        print(f"  power-loss x{report['cuts']}: first ack after p50 {round(statistics.median(recoveries), 3)} s "
              f"max {recoveries[-1]} s", file=out)
    for name, replica in report["replicas"].items():
        print(f"  {name}: " + ("no answer" if replica is None else
                               f"{replica['messages']} messages, sequences {replica['first_seq']}-"
                               f"{replica['last_seq']}"), file=out)
    print(f"replicas agree (counts): {report['replicas_agree']}", file=out)
    print(f"report: {REPORT_FILE}", file=out, flush=True)
