"""``raftmq cluster status --namesrv HOST:PORT``: every broker group, member, role and lag of a deployment
seen from outside, without ``cluster.json``.

The name servers say which groups exist and which addresses their members registered
(GET_BROKER_CLUSTER_INFO: the leader as brokerId 0, followers under their own ids); each of those addresses
is asked for its runtime info (GET_BROKER_RUNTIME_INFO: node id, role, term, commit/applied index, commit
log offsets, the leader it follows). A leader one of them names but no name server lists is asked too. An
address that does not answer is a row of its own, "unreachable". One member answering under two addresses
(its own and a front's) is one row.

Lag, as in the local ``cluster status``: how many commit-log bytes the member is behind the furthest member
of its group; ``index_lag``: how many Raft entries it has yet to apply against the highest commit index
its group reports.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from cli.cluster import request
from protocol.codes import RequestCode, ResponseCode
from protocol.connection import RemotingError
from protocol.route_data import ClusterInfo

#: requests in flight at once (one per member address)
PROBES_MAX: Final = 32
#: the columns of the table, in order (the JSON rows carry these and more)
COLUMNS: Final = ("cluster", "group", "node", "role", "term", "commit_index", "applied_index", "max_offset", "lag",
                  "index_lag", "address")


class RemoteStatusError(Exception):
    """No name server answered, or none knows a broker group (the CLI prints it and exits 1)."""


@dataclass
class _Group:
    cluster: str
    #: address -> the broker ids it is registered under (an address may be listed by several name servers)
    addresses: dict[str, set[int]] = field(default_factory=dict)


def name_servers(text: str) -> list[str]:
    """RocketMQ's ``namesrvAddr``: addresses separated by ';'."""
    addresses = [part.strip() for part in text.split(";") if part.strip()]
    if not addresses:
        raise RemoteStatusError(f"no name server address in {text!r}")
    return addresses


def _cluster_info(namesrv: str, timeout_seconds: float) -> ClusterInfo:
    code, _, body = request(namesrv, RequestCode.GET_BROKER_CLUSTER_INFO, timeout_seconds=timeout_seconds)
    if code != ResponseCode.SUCCESS:
        raise RemoteStatusError(f"{namesrv} refused GET_BROKER_CLUSTER_INFO (code {code})")
    return ClusterInfo.decode(body)


def _runtime_info(address: str, timeout_seconds: float) -> dict[str, str] | str:
    """The member's runtime info table, or why there is none (a string)."""
    try:
        code, _, body = request(address, RequestCode.GET_BROKER_RUNTIME_INFO, timeout_seconds=timeout_seconds)
    except (RemotingError, OSError, TimeoutError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    if code != ResponseCode.SUCCESS:
        return f"GET_BROKER_RUNTIME_INFO answered code {code}"
    try:
        table = json.loads(body)["table"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable runtime info: {exc}"
    if not isinstance(table, dict):
        return "the runtime info is not a table"
    return {str(key): str(value) for key, value in table.items()}


def _groups(namesrv_text: str, timeout_seconds: float, pool: concurrent.futures.Executor) -> dict[str, _Group]:
    """Every broker group any name server knows, with the addresses registered for it."""
    addresses = name_servers(namesrv_text)
    futures = {address: pool.submit(_cluster_info, address, timeout_seconds) for address in addresses}
    groups: dict[str, _Group] = {}
    errors = []
    for address, future in futures.items():
        try:
            info = future.result()
        except (RemoteStatusError, RemotingError, OSError, TimeoutError, ValueError) as exc:
            errors.append(f"{address}: {exc}")
            continue
        for name, broker in info.broker_datas.items():
            group = groups.setdefault(name, _Group(broker.cluster))
            for broker_id, broker_address in broker.broker_addresses.items():
                group.addresses.setdefault(broker_address, set()).add(broker_id)
    if len(errors) == len(addresses):
        raise RemoteStatusError("no name server answered: " + "; ".join(errors))
    return groups


def _probe(addresses: Iterable[str], timeout_seconds: float,
           pool: concurrent.futures.Executor) -> dict[str, dict[str, str] | str]:
    futures = {address: pool.submit(_runtime_info, address, timeout_seconds) for address in addresses}
    return {address: future.result() for address, future in futures.items()}


def _as_int(value: object) -> int | None:
    text = str(value)
    return int(text) if text.isdigit() else None


def _group_rows(name: str, group: _Group, answers: dict[str, dict[str, str] | str],
                now: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    by_node: dict[str, dict[str, object]] = {}
    for address in sorted(answers, key=lambda item: (min(group.addresses.get(item, {1 << 30})), item)):
        answer = answers[address]
        broker_ids = sorted(group.addresses.get(address, set()))
        if isinstance(answer, str):
            rows.append({"cluster": group.cluster, "group": name, "node": "?", "role": "unreachable", "term": "-",
                         "commit_index": "-", "applied_index": "-", "max_offset": "-", "address": address,
                         "addresses": [address], "broker_ids": broker_ids, "leader": "", "damage": "",
                         "reachable": False, "error": answer, "time": now})
            continue
        node = answer.get("nodeId", "") or address
        known = by_node.get(node)
        if known is not None:  # the same member behind a second address (a front, a proxy)
            known_addresses = known["addresses"]
            assert isinstance(known_addresses, list)
            known_addresses.append(address)
            known_ids = known["broker_ids"]
            assert isinstance(known_ids, list)
            known["broker_ids"] = sorted({*known_ids, *broker_ids})
            continue
        row: dict[str, object] = {
            "cluster": group.cluster, "group": answer.get("brokerName", name) or name, "node": node,
            "role": answer.get("brokerRole", "unknown").lower(), "term": answer.get("raftTerm", "-"),
            "commit_index": answer.get("commitIndex", "-"), "applied_index": answer.get("appliedIndex", "-"),
            "max_offset": answer.get("commitLogMaxOffset", "-"),
            "address": answer.get("brokerAddress", "") or address, "addresses": [address],
            "broker_ids": broker_ids, "leader": answer.get("raftLeader", ""), "damage": answer.get("raftDamage", ""),
            "reachable": True, "error": "", "time": now,
        }
        by_node[node] = row
        rows.append(row)
    offsets = [value for row in rows if (value := _as_int(row["max_offset"])) is not None]
    commits = [value for row in rows if (value := _as_int(row["commit_index"])) is not None]
    for row in rows:
        offset, applied = _as_int(row["max_offset"]), _as_int(row["applied_index"])
        row["lag"] = max(offsets) - offset if offset is not None else "-"
        row["index_lag"] = max(0, max(commits) - applied) if applied is not None and commits else "-"
    return rows


def remote_status(namesrv: str, timeout_seconds: float = 2.0) -> list[dict[str, object]]:
    """One row per member of every broker group the name servers (``a:port;b:port``) know, sorted by
    cluster, group and node; RemoteStatusError when no name server answers or none knows a group."""
    with concurrent.futures.ThreadPoolExecutor(PROBES_MAX, thread_name_prefix="status") as pool:
        groups = _groups(namesrv, timeout_seconds, pool)
        if not groups:
            raise RemoteStatusError(f"no broker group is registered with {namesrv}")
        now = round(time.time(), 3)
        answers = {name: _probe(group.addresses, timeout_seconds, pool) for name, group in groups.items()}
        # a leader the members name but no name server lists (its registration expired or failed)
        for group_answers in answers.values():
            named = {answer.get("raftLeader", "") for answer in group_answers.values() if isinstance(answer, dict)}
            missing = sorted(address for address in named if address and address not in group_answers)
            group_answers.update(_probe(missing, timeout_seconds, pool))
    rows = [row for name, group in groups.items() for row in _group_rows(name, group, answers[name], now)]
    return sorted(rows, key=lambda row: (str(row["cluster"]), str(row["group"]), row["node"] == "?", str(row["node"]),
                                         str(row["address"])))


def format_table(rows: list[dict[str, object]], columns: Iterable[str] = COLUMNS) -> list[str]:
    """Rows as aligned text lines (a header, then one line per row)."""
    names = list(columns)
    table = [[str(row.get(column, "")) for column in names] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in table)) for i, column in enumerate(names)]
    lines = ["  ".join(column.ljust(widths[i]) for i, column in enumerate(names)).rstrip()]
    lines += ["  ".join(value.ljust(widths[i]) for i, value in enumerate(line)).rstrip() for line in table]
    return lines
