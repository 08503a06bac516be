"""``python -m broker.namesrv --host 127.0.0.1 --port 9876``: run one name server until SIGTERM/SIGINT.

Once listening it prints one JSON line to stdout, ``{"event": "listening", "host": ..., "port": ...}``
(with ``--port 0`` that is how a caller learns the port).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from broker.logs import add_log_arguments, configure_logging
from broker.namesrv.config import DEFAULT_PORT, NameServerConfig
from broker.namesrv.server import NameServer

logger = logging.getLogger("broker.namesrv")


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m broker.namesrv", description="raftmq name server")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to bind, 0 for any (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--broker-expiry-seconds",
        type=float,
        default=120.0,
        help="forget a broker that has not registered for this long (default 120)",
    )
    parser.add_argument(
        "--expiry-scan-interval-seconds",
        type=float,
        default=10.0,
        help="how often to look for expired brokers",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_log_arguments(parser)
    return parser.parse_args(argv)


async def serve(config: NameServerConfig) -> None:
    name_server = NameServer(config)
    await name_server.start()
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop_requested.set)
    print(json.dumps({"event": "listening", "host": config.host, "port": name_server.port}), flush=True)
    stopped = loop.create_task(name_server.wait_stopped())
    requested = loop.create_task(stop_requested.wait())
    try:
        await asyncio.wait({stopped, requested}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        requested.cancel()
        await name_server.stop()
    # re-raises the programmer error that stopped the server, if one did
    await stopped


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    configure_logging(arguments.log_level, arguments.log_format, arguments.log_file, arguments.log_max_bytes,
                      arguments.log_backups)
    try:
        config = NameServerConfig(
            host=arguments.host,
            port=arguments.port,
            broker_expiry_seconds=arguments.broker_expiry_seconds,
            expiry_scan_interval_seconds=arguments.expiry_scan_interval_seconds,
        )
    except ValueError as error:
        print(f"invalid configuration: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config))
    except OSError as error:
        logger.error("cannot serve on %s:%d: %s", config.host, config.port, error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
