"""Route data and the JSON bodies of the name server's requests and responses, as RocketMQ 4.9 writes them.

Sources (apache/rocketmq): ``RegisterBrokerBody`` (the REGISTER_BROKER body, plain JSON or the
``compressed`` binary form), ``TopicConfigSerializeWrapper``, ``TopicConfig``, ``DataVersion``,
``TopicRouteData`` / ``QueueData`` / ``BrokerData`` (GET_ROUTEINFO_BY_TOPIC), ``ClusterInfo``
(GET_BROKER_CLUSTER_INFO), ``TopicList`` (GET_ALL_TOPIC_LIST_FROM_NAMESERVER).

What we write is standard JSON: Java's fastjson writes ``brokerAddrs`` keys unquoted (``{0:"ip:port"}``),
which is not JSON; both stock clients, C++ and Java, accept the quoted form.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final


#: brokerId of the master: clients send only to the address registered under it
class InvalidRequestError(ValueError):
    """A request header or body the name server cannot use; answered SYSTEM_ERROR with this text as the
    remark (what the Java name server answers when a header or body does not decode)."""


MASTER_ID: Final = 0
#: ``PermName``: what a topic's queues allow on a broker
PERM_PRIORITY: Final = 8
PERM_READ: Final = 4
PERM_WRITE: Final = 2
PERM_INHERIT: Final = 1
_PERM_MAX: Final = PERM_PRIORITY | PERM_READ | PERM_WRITE | PERM_INHERIT
#: ``TopicConfig.defaultReadQueueNums`` / ``defaultWriteQueueNums``
DEFAULT_QUEUE_NUMS: Final = 16
#: ``TopicFilterType.SINGLE_TAG``: the only filter type 4.x brokers write
SINGLE_TAG: Final = "SINGLE_TAG"
#: a bound, not RocketMQ's validation (the broker checks names before it registers them)
TOPIC_NAME_MAX_CHARS: Final = 255
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_INT32: Final = struct.Struct(">i")
#: what ``UtilAll.crc32`` keeps of a CRC32: Java's int, made non-negative
_CRC32_MASK: Final = 0x7FFFFFFF


def java_crc32(data: bytes) -> int:
    """``UtilAll.crc32``: CRC32 with the top bit cleared (REGISTER_BROKER's ``bodyCrc32``)."""
    return zlib.crc32(data) & _CRC32_MASK


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# -------------------------------------------------------------------------------- lenient JSON reading


def _parse_json(data: bytes, what: str) -> object:
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise InvalidRequestError(f"{what} is not UTF-8: {error.reason} at byte {error.start}") from None
    except (ValueError, RecursionError) as error:
        raise InvalidRequestError(f"{what} is not JSON: {error}") from None


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _integer(
    container: Mapping[str, object], key: str, what: str, default: int | None, minimum: int, maximum: int
) -> int:
    """An integer field; like fastjson, a decimal string is accepted too. None default = required."""
    value = container.get(key)
    if value is None:
        if default is None:
            raise InvalidRequestError(f"{what}: {key!r} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidRequestError(f"{what}: {key!r} must be an integer, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value, 10)
        except ValueError:
            raise InvalidRequestError(f"{what}: {key!r} must be an integer, got {value!r}") from None
    if not minimum <= value <= maximum:
        raise InvalidRequestError(f"{what}: {key!r} must be in [{minimum}, {maximum}], got {value}")
    return value


def _text(container: Mapping[str, object], key: str, what: str) -> str | None:
    value = container.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what}: {key!r} must be a string, got {value!r}")
    return value


def _boolean(container: Mapping[str, object], key: str, what: str) -> bool:
    value = container.get(key)
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidRequestError(f"{what}: {key!r} must be a boolean, got {value!r}")


def _string_list(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidRequestError(f"{what} must be a list of strings")
    return tuple(value)


# -------------------------------------------------------------------------------------- registration


@dataclass(frozen=True, slots=True)
class DataVersion:
    """``DataVersion``: when and how often a broker's topic table changed."""

    timestamp: int = 0
    counter: int = 0

    def to_json_object(self) -> dict[str, object]:
        return {"timestamp": self.timestamp, "counter": self.counter}

    @classmethod
    def from_json_object(cls, value: object) -> DataVersion:
        if value is None:
            return cls()
        container = _object(value, "dataVersion")
        return cls(
            timestamp=_integer(container, "timestamp", "dataVersion", 0, _INT64_MIN, _INT64_MAX),
            counter=_integer(container, "counter", "dataVersion", 0, _INT64_MIN, _INT64_MAX),
        )


def _check_topic_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= TOPIC_NAME_MAX_CHARS:
        raise InvalidRequestError(f"topic name must be 1 to {TOPIC_NAME_MAX_CHARS} characters, got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A broker's configuration of one topic, as far as routes need it (``TopicConfig``)."""

    topic_name: str
    read_queue_nums: int = DEFAULT_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_QUEUE_NUMS
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0
    order: bool = False

    def __post_init__(self) -> None:
        _check_topic_name(self.topic_name)
        for name in ("read_queue_nums", "write_queue_nums", "topic_sys_flag"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= _INT32_MAX:
                raise InvalidRequestError(
                    f"topic {self.topic_name!r}: {name} must be in [0, {_INT32_MAX}], got {value!r}"
                )
        if type(self.perm) is not int or not 0 <= self.perm <= _PERM_MAX:
            raise InvalidRequestError(
                f"topic {self.topic_name!r}: perm must be in [0, {_PERM_MAX}], got {self.perm!r}"
            )

    def to_json_object(self) -> dict[str, object]:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": SINGLE_TAG,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }

    @classmethod
    def from_json_object(cls, key: str, value: object) -> TopicConfig:
        """One ``topicConfigTable`` entry; its ``topicName`` wins over the map key, as in Java."""
        what = f"topic config {key!r}"
        container = _object(value, what)
        name = _text(container, "topicName", what)
        return cls(
            topic_name=key if name is None else name,
            read_queue_nums=_integer(container, "readQueueNums", what, DEFAULT_QUEUE_NUMS, 0, _INT32_MAX),
            write_queue_nums=_integer(container, "writeQueueNums", what, DEFAULT_QUEUE_NUMS, 0, _INT32_MAX),
            perm=_integer(container, "perm", what, PERM_READ | PERM_WRITE, 0, _PERM_MAX),
            topic_sys_flag=_integer(container, "topicSysFlag", what, 0, 0, _INT32_MAX),
            order=_boolean(container, "order", what),
        )

    def to_compressed_text(self) -> str:
        """``TopicConfig.encode()`` of 4.9: five space-separated fields (no sys flag, no order)."""
        return f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums} {self.perm} {SINGLE_TAG}"

    @classmethod
    def from_compressed_text(cls, text: str) -> TopicConfig:
        """``TopicConfig.decode()``: at least five fields; 5.x appends attributes JSON, ignored here."""
        parts = text.split(" ")
        if len(parts) < 5:
            raise InvalidRequestError(f"compressed topic config {text[:80]!r} has fewer than 5 fields")
        numbers = {"readQueueNums": parts[1], "writeQueueNums": parts[2], "perm": parts[3]}
        what = f"compressed topic config {parts[0]!r}"
        return cls(
            topic_name=_check_topic_name(parts[0]),
            read_queue_nums=_integer(numbers, "readQueueNums", what, None, 0, _INT32_MAX),
            write_queue_nums=_integer(numbers, "writeQueueNums", what, None, 0, _INT32_MAX),
            perm=_integer(numbers, "perm", what, None, 0, _PERM_MAX),
        )


@dataclass(frozen=True, slots=True)
class RegisterBrokerBody:
    """The REGISTER_BROKER body (``RegisterBrokerBody``): the broker's topic table
    (``topicConfigSerializeWrapper``) and its filter servers.

    Plain form: ``{"topicConfigSerializeWrapper": {"topicConfigTable": {name: TopicConfig},
    "dataVersion": {"timestamp", "counter"}}, "filterServerList": []}``. Brokers older than 3.0.11
    sent the bare wrapper; :meth:`decode` takes that too. Compressed form (header ``compressed=true``):
    zlib of ``i32 len + dataVersion JSON | i32 count | (i32 len + TopicConfig.encode())* | i32 len +
    filterServerList JSON``, all big-endian.
    """

    topic_configs: tuple[TopicConfig, ...] = ()
    data_version: DataVersion = field(default_factory=DataVersion)
    filter_servers: tuple[str, ...] = ()

    def encode(self, *, compressed: bool = False) -> bytes:
        if not compressed:
            return _json_bytes(
                {
                    "topicConfigSerializeWrapper": {
                        "topicConfigTable": {
                            config.topic_name: config.to_json_object() for config in self.topic_configs
                        },
                        "dataVersion": self.data_version.to_json_object(),
                    },
                    "filterServerList": list(self.filter_servers),
                }
            )
        parts: list[bytes] = []

        def add(data: bytes) -> None:
            parts.append(_INT32.pack(len(data)))
            parts.append(data)

        add(_json_bytes(self.data_version.to_json_object()))
        parts.append(_INT32.pack(len(self.topic_configs)))
        for config in self.topic_configs:
            add(config.to_compressed_text().encode("utf-8"))
        add(_json_bytes(list(self.filter_servers)))
        return zlib.compress(b"".join(parts), 9)

    @classmethod
    def decode(
        cls, body: bytes, *, compressed: bool, topics_max: int, decompressed_max_bytes: int
    ) -> RegisterBrokerBody:
        """The body of a REGISTER_BROKER request; an empty body is an empty topic table (Java: a null
        body registers the broker with data version 0). Raises :class:`InvalidRequestError`."""
        if not body:
            return cls()
        if compressed:
            return cls._decode_compressed(body, topics_max, decompressed_max_bytes)
        root = _object(_parse_json(body, "REGISTER_BROKER body"), "REGISTER_BROKER body")
        wrapper_value = root.get("topicConfigSerializeWrapper")
        wrapper = root if wrapper_value is None else _object(wrapper_value, "topicConfigSerializeWrapper")
        table_value = wrapper.get("topicConfigTable")
        table = {} if table_value is None else _object(table_value, "topicConfigTable")
        if len(table) > topics_max:
            raise InvalidRequestError(
                f"REGISTER_BROKER body lists {len(table)} topics, more than topics_per_registration_max={topics_max}"
            )
        return cls(
            topic_configs=tuple(TopicConfig.from_json_object(key, value) for key, value in table.items()),
            data_version=DataVersion.from_json_object(wrapper.get("dataVersion")),
            filter_servers=_string_list(root.get("filterServerList"), "filterServerList"),
        )

    @classmethod
    def _decode_compressed(
        cls, body: bytes, topics_max: int, decompressed_max_bytes: int
    ) -> RegisterBrokerBody:
        decompressor = zlib.decompressobj()
        try:
            data = decompressor.decompress(body, decompressed_max_bytes + 1)
        except zlib.error as error:
            raise InvalidRequestError(f"compressed REGISTER_BROKER body does not inflate: {error}") from None
        if len(data) > decompressed_max_bytes or decompressor.unconsumed_tail:
            raise InvalidRequestError(
                f"compressed REGISTER_BROKER body inflates past register_body_decompressed_max_bytes="
                f"{decompressed_max_bytes}"
            )
        position = 0

        def read_int(what: str) -> int:
            nonlocal position
            if position + 4 > len(data):
                raise InvalidRequestError(f"compressed REGISTER_BROKER body ends before the {what}")
            (value,) = _INT32.unpack_from(data, position)
            position += 4
            if value < 0:
                raise InvalidRequestError(f"compressed REGISTER_BROKER body: negative {what} {value}")
            return int(value)

        def read_bytes(what: str) -> bytes:
            nonlocal position
            length = read_int(f"{what} length")
            if position + length > len(data):
                raise InvalidRequestError(f"compressed REGISTER_BROKER body ends inside the {what}")
            chunk = data[position : position + length]
            position += length
            return chunk

        data_version = DataVersion.from_json_object(_parse_json(read_bytes("dataVersion"), "dataVersion"))
        count = read_int("topic count")
        if count > topics_max:
            raise InvalidRequestError(
                f"REGISTER_BROKER body lists {count} topics, more than topics_per_registration_max={topics_max}"
            )
        configs: list[TopicConfig] = []
        for index in range(count):
            raw = read_bytes(f"topic config {index}")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequestError(f"compressed topic config {index} is not UTF-8") from None
            configs.append(TopicConfig.from_compressed_text(text))
        filter_servers = _string_list(
            _parse_json(read_bytes("filterServerList"), "filterServerList"), "filterServerList"
        )
        return cls(topic_configs=tuple(configs), data_version=data_version, filter_servers=filter_servers)


# -------------------------------------------------------------------------------------------- routes


@dataclass(frozen=True, slots=True)
class QueueData:
    """One broker group's queues of a topic (``QueueData``)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json_object(self) -> dict[str, object]:
        # "topicSysFlag", as 5.x spells it; 4.x Java's field is "topicSynFlag" (a typo fixed in 5.x).
        # Readers ignore the key they do not know and default it to 0.
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }

    @classmethod
    def from_json_object(cls, value: object) -> QueueData:
        container = _object(value, "queueData")
        name = _text(container, "brokerName", "queueData")
        if not name:
            raise InvalidRequestError("queueData: 'brokerName' is missing")
        # a 4.x Java name server writes the field as "topicSynFlag"
        flag_key = "topicSysFlag" if "topicSysFlag" in container else "topicSynFlag"
        return cls(
            broker_name=name,
            read_queue_nums=_integer(container, "readQueueNums", "queueData", 0, 0, _INT32_MAX),
            write_queue_nums=_integer(container, "writeQueueNums", "queueData", 0, 0, _INT32_MAX),
            perm=_integer(container, "perm", "queueData", 0, 0, _PERM_MAX),
            topic_sys_flag=_integer(container, flag_key, "queueData", 0, 0, _INT32_MAX),
        )


@dataclass(frozen=True, slots=True)
class BrokerData:
    """The addresses of one broker group by brokerId (``BrokerData``); id 0 is the master (leader)."""

    cluster: str
    broker_name: str
    # hash=False: a read-only mapping is not hashable
    broker_addresses: Mapping[int, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "broker_addresses", MappingProxyType(dict(sorted(self.broker_addresses.items())))
        )

    @property
    def master_address(self) -> str | None:
        return self.broker_addresses.get(MASTER_ID)

    def to_json_object(self) -> dict[str, object]:
        return {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            # JSON object keys are strings: "0", not fastjson's bare 0
            "brokerAddrs": {str(broker_id): address for broker_id, address in self.broker_addresses.items()},
        }

    @classmethod
    def from_json_object(cls, value: object) -> BrokerData:
        container = _object(value, "brokerData")
        addresses_value = container.get("brokerAddrs")
        addresses = {} if addresses_value is None else _object(addresses_value, "brokerAddrs")
        parsed: dict[int, str] = {}
        for key, address in addresses.items():
            try:
                broker_id = int(key, 10)
            except ValueError:
                raise InvalidRequestError(f"brokerAddrs key {key!r} is not a broker id") from None
            if not isinstance(address, str):
                raise InvalidRequestError(f"brokerAddrs[{key}] must be a string, got {address!r}")
            parsed[broker_id] = address
        return cls(
            cluster=_text(container, "cluster", "brokerData") or "",
            broker_name=_text(container, "brokerName", "brokerData") or "",
            broker_addresses=parsed,
        )


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """The answer to GET_ROUTEINFO_BY_TOPIC (``TopicRouteData``)."""

    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None

    def encode(self) -> bytes:
        root: dict[str, object] = {}
        if self.order_topic_conf is not None:
            # fastjson leaves out null fields; both clients read a missing one as empty
            root["orderTopicConf"] = self.order_topic_conf
        root["queueDatas"] = [queue_data.to_json_object() for queue_data in self.queue_datas]
        root["brokerDatas"] = [broker_data.to_json_object() for broker_data in self.broker_datas]
        root["filterServerTable"] = {}
        return _json_bytes(root)

    @classmethod
    def decode(cls, body: bytes) -> TopicRouteData:
        """Standard JSON as our name server writes it (not fastjson's bare integer keys)."""
        root = _object(_parse_json(body, "TopicRouteData"), "TopicRouteData")
        queue_datas = root.get("queueDatas") or []
        broker_datas = root.get("brokerDatas") or []
        if not isinstance(queue_datas, list) or not isinstance(broker_datas, list):
            raise InvalidRequestError("TopicRouteData: queueDatas and brokerDatas must be lists")
        return cls(
            queue_datas=tuple(QueueData.from_json_object(item) for item in queue_datas),
            broker_datas=tuple(BrokerData.from_json_object(item) for item in broker_datas),
            order_topic_conf=_text(root, "orderTopicConf", "TopicRouteData"),
        )


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The answer to GET_BROKER_CLUSTER_INFO (``ClusterInfo``): every broker group, and the group names
    of every cluster."""

    broker_datas: Mapping[str, BrokerData] = field(default_factory=dict, hash=False)
    cluster_broker_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def encode(self) -> bytes:
        return _json_bytes(
            {
                "brokerAddrTable": {
                    name: broker_data.to_json_object()
                    for name, broker_data in sorted(self.broker_datas.items())
                },
                "clusterAddrTable": {
                    cluster: sorted(names) for cluster, names in sorted(self.cluster_broker_names.items())
                },
            }
        )

    @classmethod
    def decode(cls, body: bytes) -> ClusterInfo:
        root = _object(_parse_json(body, "ClusterInfo"), "ClusterInfo")
        brokers = _object(root.get("brokerAddrTable") or {}, "brokerAddrTable")
        clusters = _object(root.get("clusterAddrTable") or {}, "clusterAddrTable")
        return cls(
            broker_datas={name: BrokerData.from_json_object(value) for name, value in brokers.items()},
            cluster_broker_names={
                cluster: _string_list(names, f"clusterAddrTable[{cluster!r}]")
                for cluster, names in clusters.items()
            },
        )


def encode_topic_list(topics: Iterable[str]) -> bytes:
    """The answer to GET_ALL_TOPIC_LIST_FROM_NAMESERVER (``TopicList``)."""
    return _json_bytes({"topicList": sorted(topics)})


def decode_topic_list(body: bytes) -> list[str]:
    root = _object(_parse_json(body, "TopicList"), "TopicList")
    return list(_string_list(root.get("topicList"), "topicList"))
