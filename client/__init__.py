"""raftmq's Python client SDK: an asyncio core with a thin synchronous facade.

asyncio: :class:`AsyncProducer`. Blocking: :class:`Producer` (the same methods, run on a background
event loop). Configuration: :class:`ClientConfig`, :class:`ProducerConfig`. Errors derive from
:class:`MQClientError` and carry a RocketMQ response code.
"""

from client.config import (
    AllocateStrategy,
    ClientConfig,
    ConfigError,
    ConsumeFromWhere,
    ConsumerConfig,
    MessageModel,
    ProducerConfig,
)
from client.errors import (
    BrokerUnavailableError,
    ClientErrorCode,
    ClientNotRunningError,
    MessageValidationError,
    MQBrokerError,
    MQClientError,
    NameServerUnavailableError,
    NotLeaderError,
    RequestTimeoutError,
    TopicNotFoundError,
)
from client.message import (
    Message,
    MessageExt,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from client.producer import AsyncProducer
from client.selector import MessageQueueSelector, select_by_hash, select_by_sharding_key
from client.sync import Producer

__all__ = [
    "AllocateStrategy",
    "AsyncProducer",
    "BrokerUnavailableError",
    "ClientConfig",
    "ClientErrorCode",
    "ClientNotRunningError",
    "ConfigError",
    "ConsumeFromWhere",
    "ConsumerConfig",
    "MQBrokerError",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageQueueSelector",
    "MessageValidationError",
    "NameServerUnavailableError",
    "NotLeaderError",
    "Producer",
    "ProducerConfig",
    "PullResult",
    "PullStatus",
    "RequestTimeoutError",
    "SendResult",
    "SendStatus",
    "TopicNotFoundError",
    "select_by_hash",
    "select_by_sharding_key",
]
