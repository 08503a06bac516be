"""A child process that appends to a store, reports each acknowledged append on stdout, and SIGKILLs
itself at a chosen point: ``between`` appends, ``after-write`` (records written, not dispatched) or
``before-marker`` (dispatched, apply marker not yet written)."""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

from commitlog import store as store_module
from commitlog.store import MessageStore
from tests.commitlog.helpers import message, small_config


def main() -> None:
    directory, crash_point, crash_after, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    store = MessageStore(small_config(directory))
    raft_index = store.applied_raft_index
    appended = 0

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if crash_point == "after-write":
        original_write = store.commit_log.write

        def write_then_maybe_die(offset: int, data: bytes | bytearray | memoryview) -> None:
            original_write(offset, data)
            if appended == crash_after:
                die()

        store.commit_log.write = write_then_maybe_die  # type: ignore[method-assign]
    if crash_point == "before-marker":
        original_marker = store.apply_position.write

        def marker_or_die(applied: int, end: int) -> None:
            if appended == crash_after:
                die()
            original_marker(applied, end)

        store.apply_position.write = marker_or_die  # type: ignore[method-assign, assignment]
    assert store_module  # the module is patched through the instance only
    while True:
        raft_index += 1
        batch = [
            message(raft_index * 1000 + j, queue_id=rng.randrange(4), body=rng.randbytes(rng.randrange(10, 3000)))
            for j in range(rng.randrange(1, 20))
        ]
        outcome = store.append(raft_index, batch)
        for result in outcome.results:
            print(raft_index, result.physical_offset, result.queue_offset, result.size, flush=False)
        sys.stdout.flush()
        appended += 1
        if crash_point == "between" and appended == crash_after:
            die()
        if appended % 7 == 0:
            store.flush()


if __name__ == "__main__":
    main()
