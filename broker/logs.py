"""How a broker or name server process logs: plain text or one JSON object per line (``--log-format json``),
to stderr or to a file rotated by size (``--log-file``, ``--log-max-bytes``, ``--log-backups``).

With a log file, the process's own stdout and stderr are pointed at the current file too, and again after
every rotation: what is printed or dumped outside logging (the "listening" event line, a traceback that
ends the process, faulthandler's dump) lands in the same, current file, never in a rotated-away one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import logging.handlers
import os
import sys
from pathlib import Path
from typing import Final

LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: fields every JSON line carries besides these (set once the node file is read: node, group)
_context: dict[str, str] = {}


def set_log_context(**fields: str) -> None:
    """Fields added to every JSON log line from now on (e.g. ``node="n0", group="broker-a"``)."""
    _context.update(fields)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601, ms), level, logger, message, the context fields,
    and the exception's traceback as one string when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        line: dict[str, object] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


class StdioFollowingRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A size-rotated log file that the process's stdout and stderr (file descriptors 1 and 2) follow."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self._point_stdio_here()

    def doRollover(self) -> None:
        super().doRollover()
        self._point_stdio_here()

    def _point_stdio_here(self) -> None:
        if self.stream is None:
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        descriptor = self.stream.fileno()
        for target in (1, 2):
            os.dup2(descriptor, target)


def configure_logging(level: str, log_format: str = "text", log_file: Path | None = None,
                      max_bytes: int = 0, backups: int = 5) -> None:
    """The root logger's one handler: stderr, or ``log_file`` rotated at ``max_bytes`` (0: never) keeping
    ``backups`` older files; plain text or JSON lines."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"the log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler: logging.Handler = (StdioFollowingRotatingFileHandler(log_file, max_bytes, backups)
                                if log_file is not None else logging.StreamHandler(sys.stderr))
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-format``, ``--log-file``, ``--log-max-bytes`` and ``--log-backups`` for a process's parser."""
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                        help="plain text lines, or one JSON object per line (default text)")
    parser.add_argument("--log-file", type=Path, default=None,
                        help="log to this file (stdout and stderr follow it) instead of stderr")
    parser.add_argument("--log-max-bytes", type=int, default=0,
                        help="with --log-file: rotate it at this size (default 0: never)")
    parser.add_argument("--log-backups", type=int, default=5, help="with --log-file: rotated files kept (default 5)")
