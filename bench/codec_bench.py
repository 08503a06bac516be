"""Codec micro-benchmark: microseconds of CPU per frame for the send path's frames, no cluster needed.

Prints one JSON line per frame shape: ``encode_us`` (``encode_frame``), ``decode_us`` (a
``FrameDecoder`` fed the whole frame, then ``next_frame``), and for SEND_MESSAGE_V2 requests
``parse_us`` (``SendHeader.parse``); ``response_us`` is the send processor's response building
(``SendProcessor._response``, one stored message). ``json_path`` says which reader did the work:
``native`` (the C header reader, protocol/_native.c, with orjson for what it leaves), ``orjson`` (the fast
path where the C reader is not built) or ``stdlib`` (the reference, or a codec without either);
``--no-native`` and ``--stdlib`` turn them off in this process, for the ratio on one machine.

Each figure is the best of ``--repeat`` rounds of ``--count`` calls (the least disturbed by other
processes on a shared machine). Shapes:

* ``send_v2_request``: what our client and ``bench/broker_bench.py`` send (one-letter names, 1 KB body);
* ``send_v2_response``: the broker's answer to it;
* ``cpp_send_request``: SEND_MESSAGE as the C++ client writes it (long names, numbers among the values);
* ``heartbeat_request``: a header without extFields and a JSON body.

Usage: ``python bench/codec_bench.py [--count 20000] [--repeat 7] [--no-native | --stdlib]``
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.requests import SendHeader
from broker.send import SendProcessor
from commitlog.hosts import encode_host
from commitlog.outcomes import AppendResult, AppendStatus
from protocol import codec
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, make_request, make_response

BODY: Final = os.urandom(1024)
STORE_HOST: Final = encode_host("127.0.0.1", 10911)


def send_v2_fields(sequence: int) -> dict[str, str]:
    return {"a": "bench-producer", "b": "BenchTopic", "c": "TBW102", "d": "4", "e": str(sequence % 4), "f": "0",
            "g": "1700000000123", "h": "0",
            "i": f"UNIQ_KEY\x01BENCH{os.getpid():08X}{sequence:020X}\x02TAGS\x01bench\x02", "j": "0", "k": "false",
            "m": "false"}


def cpp_send_frame() -> bytes:
    """The C++ client's SEND_MESSAGE (JsonCpp: sorted keys, numbers mixed into extFields, a newline)."""
    header = json.dumps({
        "code": 10, "extFields": {
            "AccessKey": "", "ONSChannelKey": "", "Signature": "", "batch": "0", "bornTimestamp": "1700000000123",
            "defaultTopic": "TBW102", "defaultTopicQueueNums": 4, "flag": 0, "producerGroup": "cpp_producer",
            "properties": "UNIQ_KEY\x017F00000100002A9F000000000000\x02WAIT\x01true\x02TAGS\x01TagA\x02",
            "queueId": 1, "reconsumeTimes": "0", "sysFlag": 0, "topic": "TopicTest", "unitMode": "0"},
        "flag": 0, "language": "CPP", "opaque": 5, "remark": "", "version": 63,
    }, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    return struct.pack(">iI", 4 + len(header) + len(BODY), len(header)) + header + BODY


def best_us(call: Callable[[], object], count: int, repeat: int) -> float:
    return round(min(timeit.repeat(call, number=count, repeat=repeat)) / count * 1e6, 3)


def decoder_of(frame: bytes) -> Callable[[], RemotingCommand | None]:
    decoder = codec.FrameDecoder()

    def decode() -> RemotingCommand | None:
        decoder.feed(frame)
        return decoder.next_frame()

    return decode


def measure(count: int, repeat: int) -> list[dict[str, object]]:
    if codec._native_header is not None:
        json_path = "native"  # protocol/_native.c, then orjson for what it leaves
    else:
        json_path = "orjson" if codec._fast_loads is not None else "stdlib"
    request = make_request(RequestCode.SEND_MESSAGE_V2, 12345, send_v2_fields(12345), BODY, language="JAVA")
    results = (AppendResult(AppendStatus.OK, 1 << 30, 4567, 1200, STORE_HOST),)
    response = SendProcessor._response(request, results, 1)
    cpp_frame = cpp_send_frame()
    cpp_request = codec.decode_frame(cpp_frame)
    heartbeat = make_request(RequestCode.HEART_BEAT, 9, None, b'{"clientID":"127.0.0.1@1","producerDataSet":[]}')
    figures: list[dict[str, object]] = []

    def shape(name: str, command: RemotingCommand, frame: bytes, **extra: float) -> None:
        decoded = decoder_of(frame)()
        assert decoded == command, f"{name}: the frame does not decode to its command"
        figures.append({"bench": "codec", "frame": name, "json_path": json_path, "frame_bytes": len(frame),
                        "encode_us": best_us(lambda: codec.encode_frame(command), count, repeat),
                        "decode_us": best_us(decoder_of(frame), count, repeat), **extra})

    shape("send_v2_request", request, codec.encode_frame(request),
          parse_us=best_us(lambda: SendHeader.parse(request.ext_fields, True), count, repeat))
    shape("send_v2_response", response, codec.encode_frame(response),
          response_us=best_us(lambda: SendProcessor._response(request, results, 1), count, repeat))
    shape("cpp_send_request", cpp_request, cpp_frame,
          parse_us=best_us(lambda: SendHeader.parse(cpp_request.ext_fields, False), count, repeat))
    shape("heartbeat_request", heartbeat, codec.encode_frame(heartbeat))
    assert make_response(request, ResponseCode.SUCCESS).is_response
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="calls per round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds; the best one counts")
    parser.add_argument("--stdlib", action="store_true",
                        help="turn the C header reader and the orjson fast path off (the reference)")
    parser.add_argument("--no-native", action="store_true", help="turn the C header reader off (orjson reads)")
    arguments = parser.parse_args()
    if arguments.stdlib or arguments.no_native:
        codec._native_header = None
    if arguments.stdlib:
        codec._fast_loads = None
        codec._fast_dumps = None
    for figure in measure(arguments.count, arguments.repeat):
        print(json.dumps(figure))


if __name__ == "__main__":
    main()
