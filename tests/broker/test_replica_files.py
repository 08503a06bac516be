"""broker.replica_files without a network: typed requests, audit signatures, and what a member's store
serves (bounded, below the applied end, written parts only); spark_analytics.remote's pure helpers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import broker.replica_files
import spark_analytics.remote
from broker.acl.config import AclConfig
from broker.acl.permissions import ADMIN_CODES
from broker.acl.validator import AccessDeniedError, AccessValidator
from broker.remoting.server import RequestContext
from broker.replica_files import (
    DIGEST_RANGE_BYTES_MAX,
    FIELD_SIGNATURE,
    KIND_COMMIT_LOG,
    KIND_CONSUME_QUEUE,
    KIND_INDEX,
    KIND_STATE,
    RANGE_BYTES_MAX,
    REPLICA_FILES_CODES,
    REPLICA_FILES_DIGESTS,
    REPLICA_FILES_READ,
    REPLICA_FILES_STATUS,
    DigestRequest,
    DigestResult,
    FileName,
    ReadRequest,
    ReadResult,
    ReplicaFilesError,
    ReplicaFilesProcessor,
    StoreView,
    audit_key,
    block_bounds,
    parse_digest_response,
    parse_read_response,
    sign_request,
    signature_problem,
)
from commitlog.consume_queue import CQ_UNIT
from commitlog.key_index import ENTRY, HEADER, HEADER_BYTES
from commitlog.store import MessageStore
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, make_request
from spark_analytics.index_file import read_index_file
from spark_analytics.layout import list_replicas
from spark_analytics.remote import (
    Access,
    MemberClient,
    MemberState,
    RemoteCut,
    RemotePath,
    _index_image,
    _units_below,
)
from spark_analytics.sources import DIGEST_NAME, _entries_below, block_digests
from tests.acl.helpers import ADMIN, BASE_ACL, PRODUCER
from tests.commitlog.helpers import message, small_config

SECRET = b"s" * 32
NOW = 1_800_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    opened = MessageStore(small_config(tmp_path / "store"), background_flush=False)
    for number in range(40):
        opened.append(number + 1, [message(number, queue_id=number % 2)])
    opened.flush()
    yield opened
    opened.close()


@pytest.mark.parametrize(("kind", "name", "topic", "queue_id", "problem"), [
    ("journal", "0" * 20, "", 0, "kind must be one of"),
    (KIND_COMMIT_LOG, "../../etc/passwd", "", 0, "20 digits"),
    (KIND_COMMIT_LOG, "0" * 19, "", 0, "20 digits"),
    (KIND_CONSUME_QUEUE, "0" * 20, "../x", 0, "not a topic name"),
    (KIND_CONSUME_QUEUE, "0" * 20, "a/b", 0, "not a topic name"),
    (KIND_CONSUME_QUEUE, "0" * 20, "TopicTest", 70_000, "queue id out of range"),
    (KIND_STATE, "node.toml", "", 0, "state files are"),
])
def test_files_are_named_by_kind_and_offset_never_by_path(kind: str, name: str, topic: str, queue_id: int,
                                                          problem: str) -> None:
    with pytest.raises(ReplicaFilesError, match=problem):
        FileName(kind, name, topic, queue_id)


def test_a_read_is_bounded_and_its_fields_are_checked() -> None:
    file = FileName(KIND_CONSUME_QUEUE, "0" * 20, "TopicTest", 1)
    request = ReadRequest(file, 40, RANGE_BYTES_MAX)
    assert ReadRequest.parse(request.fields()) == request
    with pytest.raises(ReplicaFilesError, match="length must be"):
        ReadRequest(file, 0, RANGE_BYTES_MAX + 1)
    with pytest.raises(ReplicaFilesError, match="field offset"):
        ReadRequest.parse({**request.fields(), "offset": "-1"})
    with pytest.raises(ReplicaFilesError, match="field length"):
        ReadRequest.parse({**request.fields(), "length": "many"})


def test_a_read_response_carries_the_crc_of_its_bytes() -> None:
    result = ReadResult(100, b"abc" * 10, 4096)
    assert parse_read_response(result.fields(), result.data) == result
    with pytest.raises(ReplicaFilesError, match="CRC mismatch"):
        parse_read_response(result.fields(), b"abd" * 10)


def test_audit_signatures_derive_from_the_secret_and_expire() -> None:
    expiry = int(NOW) + 600
    fields = sign_request({"kind": "commitlog", "offset": "0"}, audit_key(SECRET, expiry), expiry)
    assert signature_problem(fields, SECRET, NOW) is None
    assert "does not match" in (signature_problem(fields, b"t" * 32, NOW) or "")
    assert "does not match" in (signature_problem({**fields, "offset": "4096"}, SECRET, NOW) or "")
    assert "expired" in (signature_problem(fields, SECRET, NOW + 601) or "")
    assert "need an audit signature" in (signature_problem({"kind": "commitlog"}, SECRET, NOW) or "")
    far = int(NOW) + 30 * 24 * 3600
    assert "too long" in (signature_problem(sign_request({}, audit_key(SECRET, far), far), SECRET, NOW) or "")
    # the client's side signs the same way; its key is not the secret
    access = Access.from_secret(SECRET, NOW, 600)
    assert bytes.fromhex(access.audit_key_hex) != SECRET and repr(access) == "Access(...)"
    assert signature_problem(access.sign({"kind": "index"}), SECRET, NOW) is None
    assert FIELD_SIGNATURE in access.sign({})


def test_with_acl_only_admin_accounts_read_replica_files() -> None:
    assert set(REPLICA_FILES_CODES) <= ADMIN_CODES


def test_a_member_lists_its_files_and_positions(store: MessageStore) -> None:
    view = StoreView(store)
    positions = view.positions()
    assert positions["applied_end"] == store.max_physical_offset == positions["durable_end"]
    assert positions["segment_size_bytes"] == store.config.segment_size_bytes
    listing = view.listing()
    assert listing[KIND_COMMIT_LOG][0] == [0, store.config.segment_size_bytes]  # (and the next, preallocated)
    assert {(topic, queue) for topic, queue, _, _ in listing[KIND_CONSUME_QUEUE]} == {("TopicTest", 0), ("TopicTest", 1)}
    assert listing[KIND_INDEX] and listing[KIND_STATE] == [["checkpoint", (store.root / "checkpoint").stat().st_size]]


def test_reads_end_at_the_applied_end_and_at_the_written_units_and_entries(store: MessageStore) -> None:
    view = StoreView(store)
    end = store.max_physical_offset
    segment = FileName(KIND_COMMIT_LOG, "0" * 20)
    whole = view.read(ReadRequest(segment, 0, RANGE_BYTES_MAX))
    assert whole.readable_end == end and whole.data == store.read_committed(0, end)
    assert view.read(ReadRequest(segment, end - 10, 100)).data == whole.data[-10:]
    assert view.read(ReadRequest(segment, end + 10, 100)).data == b""
    queue = view.read(ReadRequest(FileName(KIND_CONSUME_QUEUE, "0" * 20, "TopicTest", 1), 0, RANGE_BYTES_MAX))
    assert len(queue.data) == 20 * CQ_UNIT.size and queue.readable_end == len(queue.data)
    index = view.read(ReadRequest(FileName(KIND_INDEX, "0" * 20), 0, RANGE_BYTES_MAX))
    assert read_index_file(index.data).entry_count == HEADER.unpack_from(index.data, 0)[-1] > 0
    checkpoint = view.read(ReadRequest(FileName(KIND_STATE, "checkpoint"), 0, RANGE_BYTES_MAX))
    assert checkpoint.data == (store.root / "checkpoint").read_bytes()
    with pytest.raises(ReplicaFilesError, match="no file"):
        view.read(ReadRequest(FileName(KIND_COMMIT_LOG, f"{1 << 30:020d}"), 0, 10))


@given(st.integers(0, 50), st.integers(0, 3000), st.integers(0, 3000), st.integers(1, 700))
def test_members_cut_blocks_where_the_executors_cut_them(segment_number: int, low: int, length: int,
                                                          block_size: int) -> None:
    segment_start = segment_number * 1000
    data = bytes(range(256)) * 24
    bounds = block_bounds(segment_start, low, low + length, block_size)
    with memoryview(data) as view:
        hashed = list(block_digests(view[low:], segment_start + low, length, block_size))
    assert [(segment_start + start, end - start) for start, end in bounds] == [(o, n) for o, n, _ in hashed]
    assert all((segment_start + start) % block_size == 0 for start, _ in bounds[1:])


@pytest.mark.parametrize("read_bytes", [1000, 4096, 4 << 20])
def test_a_member_hashes_each_block_from_its_file_when_asked(store: MessageStore, read_bytes: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker.replica_files, "DIGEST_READ_BYTES", read_bytes)
    view = StoreView(store)
    end = store.max_physical_offset
    assert end > 3 * 4096
    segment = FileName(KIND_COMMIT_LOG, "0" * 20)
    asked = DigestRequest(segment, 100, end, 4096)  # past the applied end: hashed up to it
    result = view.digests(asked)
    assert result.hashed_bytes == end - 100 and result.readable_end == end
    committed = store.read_committed(0, end)
    expected = tuple(hashlib.new(DIGEST_NAME, committed[low:high]).digest()
                     for low, high in block_bounds(0, 100, end, 4096))
    assert result.digests == expected and len(expected) == len(block_bounds(0, 100, end, 4096)) > 3
    assert view.digests(DigestRequest(segment, end + 5, 100, 4096)) == DigestResult(end + 5, 0, end, ())
    # nothing is cached: a byte changed in the file changes its block's digest, and only that one
    path = store.root / segment.relative_path()
    handle = os.open(path, os.O_RDWR)
    try:
        os.pwrite(handle, bytes([committed[5000] ^ 0xFF]), 5000)
    finally:
        os.close(handle)
    again = view.digests(asked)
    changed = [number for number, (old, new) in enumerate(zip(result.digests, again.digests, strict=True)) if old != new]
    assert changed == [1]  # [100, 4096), [4096, 8192), ...


def test_digests_are_asked_of_segments_in_bounded_blocks_and_checked() -> None:
    segment = FileName(KIND_COMMIT_LOG, "0" * 20)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: DigestRequest(FileName(KIND_INDEX, "0" * 20), 0, 10, 4096), "commit-log segments only"),
        (lambda: DigestRequest(segment, 0, DIGEST_RANGE_BYTES_MAX + 1, 4096), "length must be"),
        (lambda: DigestRequest(segment, 0, 10, 512), "blockSize must be"),
        (lambda: DigestRequest(segment, 0, 10, 4096, "md5"), "digest must be"),
        (lambda: DigestRequest.parse({"kind": "commitlog", "name": "0" * 20, "offset": "0", "length": "9"}),
         "field blockSize"),
    ]
    for request, problem in cases:
        with pytest.raises(ReplicaFilesError, match=problem):
            request()
    asked = DigestRequest(segment, 0, 10_000, 4096)
    assert DigestRequest.parse(asked.fields()) == asked
    digests = tuple(bytes([number]) * 32 for number in range(3))
    answer = DigestResult(0, 10_000, 20_000, digests)
    assert parse_digest_response(asked, answer.fields(), answer.body()) == answer
    with pytest.raises(ReplicaFilesError, match="CRC mismatch"):
        parse_digest_response(asked, answer.fields(), b"x" + answer.body()[1:])
    short = DigestResult(0, 10_000, 20_000, digests[:2])
    with pytest.raises(ReplicaFilesError, match="for 3 blocks"):
        parse_digest_response(asked, short.fields(), short.body())


class LocalMember(MemberClient):
    """A client whose digest requests go straight to a member's StoreView (no socket)."""

    def __init__(self, view: StoreView) -> None:
        super().__init__("127.0.0.1:1", None)
        self.view = view
        self.asked: list[DigestRequest] = []

    def digests(self, request: DigestRequest) -> DigestResult:
        self.asked.append(request)
        return self.view.digests(DigestRequest.parse(request.fields()))


def test_the_auditor_asks_for_digests_in_requests_that_end_on_block_boundaries(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_analytics.remote, "DIGEST_RANGE_BYTES_MAX", 10_000)
    member = LocalMember(StoreView(store))
    end = store.max_physical_offset
    rows = member.digest_span(FileName(KIND_COMMIT_LOG, "0" * 20), 300, end + 5000, 4096, DIGEST_NAME)
    with memoryview(store.read_committed(0, end)) as view:
        assert rows == list(block_digests(view[300:], 300, end - 300, 4096))
    assert len(member.asked) > 1
    assert all(request.length <= 10_000 for request in member.asked)
    assert all((asked.offset + asked.length) % 4096 == 0 for asked in member.asked[:-1])


def test_units_at_or_past_the_cut_read_as_empty() -> None:
    units = b"".join(CQ_UNIT.pack(offset, 100, 7) for offset in (0, 100, 200, 300))
    assert _units_below(units, 200) == units[:40] + bytes(40)
    assert _units_below(units + b"\x01", 1000) == units


class GrowingIndex:
    """A member whose key-index file gains an entry (and moves a slot to it) between reads."""

    def __init__(self, image: bytes, slot_count: int) -> None:
        self.image = bytearray(image)
        self.slot_count = slot_count
        self.reads = 0

    def _grow(self) -> None:
        count = HEADER.unpack_from(self.image, 0)[-1]
        base = HEADER_BYTES + self.slot_count * 4
        key_hash = 5
        slot = HEADER_BYTES + (key_hash % self.slot_count) * 4
        previous = int.from_bytes(self.image[slot : slot + 4], "big")
        entry = ENTRY.pack(key_hash, 1_000_000 + count, 0, previous)
        self.image[base + count * ENTRY.size : base + (count + 1) * ENTRY.size] = entry
        self.image[slot : slot + 4] = (count + 1).to_bytes(4, "big")
        fields = list(HEADER.unpack_from(self.image, 0))
        fields[-1] = count + 1
        self.image[:HEADER.size] = HEADER.pack(*fields)

    def read(self, file: FileName, offset: int, length: int) -> ReadResult:
        self.reads += 1
        count = HEADER.unpack_from(self.image, 0)[-1]
        readable_end = HEADER_BYTES + self.slot_count * 4 + count * ENTRY.size
        data = bytes(self.image[offset : min(readable_end, offset + min(length, 64))])
        result = ReadResult(offset, data, readable_end)
        self._grow()
        return result

    def read_span(self, file: FileName, start: int, end: int | None) -> tuple[bytes, int]:
        parts, position, first_end = [], start, None
        while end is None or position < end:
            want = 64 if end is None else min(64, end - position)
            result = self.read(file, position, want)
            first_end = result.readable_end if first_end is None else first_end
            parts.append(result.data)
            position += len(result.data)
            if len(result.data) < want:
                break
        return b"".join(parts), first_end or start


def test_a_key_index_file_being_written_is_read_as_one_consistent_image(store: MessageStore) -> None:
    index_file = store.index.files[0]
    used = index_file.entries_base + index_file.entry_count * ENTRY.size
    member = GrowingIndex(bytes(index_file.file.map[: index_file.entries_base + index_file.entry_capacity * ENTRY.size]),
                          index_file.slot_count)
    image = _index_image(member, FileName(KIND_INDEX, "0" * 20))  # type: ignore[arg-type]
    contents = read_index_file(image)
    assert member.reads > 3 and contents.entry_count > index_file.entry_count and len(image) > used
    # every entry written before the read began is reachable: each slot read points at an entry the image holds
    assert all(contents.reachable[: index_file.entry_count])
    # below the cut, only what was indexed before it
    cut = 1_000_000
    below = _entries_below(contents, RemotePath("h:1", "n0", FileName(KIND_INDEX, "0" * 20), cut).text())
    assert below.entry_count == index_file.entry_count and max(below.physical_offsets) < cut


def test_a_cut_lists_each_member_below_it_and_round_trips() -> None:
    def member(name: str, applied_end: int) -> MemberState:
        status = {"applied_end": applied_end, "segment_size_bytes": 1000, "files": {
            KIND_COMMIT_LOG: [[0, 1000], [1000, 1000], [2000, 1000]], KIND_INDEX: [[0, 500], [2500, 500]],
            KIND_CONSUME_QUEUE: [["T", 0, 0, 80]], KIND_STATE: [["checkpoint", 90]]}}
        return MemberState(name, f"127.0.0.1:{10 + len(name)}", status)

    cut = RemoteCut((member("n0", 2600), member("n1", 1500), MemberState("h:9", "h:9", None, "refused")), 1500,
                    Access.from_secret(SECRET, NOW).encode(), NOW, since=1200)
    assert RemoteCut.decode(cut.encode()) == cut and "/" not in cut.encode()
    replicas = list_replicas(Path(cut.encode()))
    assert [replica.name for replica in replicas] == ["n0", "n1"]
    assert [segment.start for segment in replicas[0].segments] == [1000]  # at or past 1200's segment, below 1500
    assert [file.begin_physical for file in replicas[0].index_files] == [0]
    path = RemotePath.parse(replicas[0].queue_files[0].path)
    assert path.below == 1500 and path.file == FileName(KIND_CONSUME_QUEUE, "0" * 20, "T", 0)
    assert RemotePath.parse(path.text()) == path


def test_with_acl_an_admin_account_reads_and_others_are_refused() -> None:
    rules = AccessValidator(AclConfig.from_toml(BASE_ACL))
    for code in REPLICA_FILES_CODES:
        for credentials, allowed in ((ADMIN, True), (PRODUCER, False)):
            access = Access(access_key=credentials.access_key, secret_key=credentials.secret_key)
            request = make_request(code, 1, access.sign(ReadRequest(FileName(KIND_INDEX, "0" * 20), 0, 10).fields()))
            try:
                rules.check(request, "127.0.0.1")
                refused = False
            except AccessDeniedError:
                refused = True
            assert refused != allowed


class Member:
    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def status(self) -> SimpleNamespace:
        return SimpleNamespace(node_id="n0", role="follower", commit_index=40, applied_index=40)


def test_the_processor_answers_signed_requests_only_unless_acl_checked_them(store: MessageStore) -> None:
    acl = [False]
    processor = ReplicaFilesProcessor(Member(store), SECRET, lambda: acl[0], clock=lambda: NOW)
    connection: Any = None

    def call(fields: dict[str, str], code: int = REPLICA_FILES_STATUS) -> RemotingCommand:
        answer = asyncio.run(processor(RequestContext(make_request(code, 7, fields), connection)))
        assert answer is not None and answer.opaque == 7
        return answer

    assert call({}).code == ResponseCode.NO_PERMISSION
    access = Access.from_secret(SECRET, NOW, 600)
    status = json.loads(call(access.sign({})).body)
    assert status["member"] == "n0" and status["applied_end"] == store.max_physical_offset
    assert status["files"][KIND_COMMIT_LOG][0][0] == 0
    read = call(access.sign(ReadRequest(FileName(KIND_COMMIT_LOG, "0" * 20), 0, 100).fields()), REPLICA_FILES_READ)
    assert parse_read_response(read.ext_fields, read.body).data == store.read_committed(0, 100)
    missing = call(access.sign(ReadRequest(FileName(KIND_INDEX, f"{1 << 40:020d}"), 0, 1).fields()), REPLICA_FILES_READ)
    assert missing.code == ResponseCode.QUERY_NOT_FOUND and "no file" in (missing.remark or "")
    bad = call(access.sign({"kind": "commitlog", "name": "x", "offset": "0", "length": "1"}), REPLICA_FILES_READ)
    assert bad.code == ResponseCode.QUERY_NOT_FOUND and "20 digits" in (bad.remark or "")
    asked = DigestRequest(FileName(KIND_COMMIT_LOG, "0" * 20), 0, 8192, 4096)
    assert call(asked.fields(), REPLICA_FILES_DIGESTS).code == ResponseCode.NO_PERMISSION
    hashed = call(access.sign(asked.fields()), REPLICA_FILES_DIGESTS)
    assert parse_digest_response(asked, hashed.ext_fields, hashed.body).digests == tuple(
        hashlib.new(DIGEST_NAME, store.read_committed(low, high - low)).digest() for low, high in ((0, 4096), (4096, 8192)))
    acl[0] = True  # the Admission check in front required an admin account already
    assert call({}).code == ResponseCode.SUCCESS
