"""What Java's fastjson writes that standard JSON cannot: maps keyed by objects, in the bodies of the
admin answers stock tools read."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def object_keyed_json(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> str:
    """A map whose keys are objects, written as Java's fastjson writes one (``Map<MessageQueue, ...>`` in
    ConsumeStats, TopicStatsTable, ConsumerRunningInfo): ``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``.
    Not standard JSON: Java's tools read it, and so does ``client.running_info.loads_lenient``."""

    def dumps(value: Mapping[str, Any]) -> str:
        return json.dumps(dict(value), separators=(",", ":"), sort_keys=True)

    return "{" + ",".join(f"{dumps(key)}:{dumps(value)}" for key, value in pairs) + "}"
