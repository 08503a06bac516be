"""raftmq's Python client SDK: an asyncio core with a thin synchronous facade.

asyncio: :class:`AsyncProducer`, :class:`AsyncTransactionProducer`, :class:`AsyncPushConsumer`, :class:`AsyncLitePullConsumer`,
:class:`AsyncPullConsumer`, :class:`AsyncAdmin`. Blocking: :class:`Producer`, :class:`PushConsumer`,
:class:`LitePullConsumer`, :class:`PullConsumer`, :class:`Admin`, :class:`TransactionProducer` (the same methods, run on a
background event loop). Configuration: :class:`ClientConfig`, :class:`ProducerConfig`,
:class:`ConsumerConfig`. Errors derive from :class:`MQClientError` and carry a RocketMQ response code.
"""

from client.admin import (
    AsyncAdmin,
    ClientConnection,
    ConsumerConnection,
    ConsumerProgress,
    QueueConsumeStats,
    QueueOffsets,
    QueueProgress,
    TopicQueueStats,
)
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
from client.lite_pull_consumer import AsyncLitePullConsumer
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
from client.pull_consumer import AsyncPullConsumer
from client.push_consumer import (
    AsyncPushConsumer,
    ConsumeConcurrentlyStatus,
    ConsumeContext,
    ConsumeOrderlyStatus,
)
from client.running_info import ConsumerRunningInfo
from client.selector import MessageQueueSelector, select_by_hash, select_by_sharding_key
from client.sync import Admin, LitePullConsumer, Producer, PullConsumer, PushConsumer, TransactionProducer
from client.transaction import (
    AsyncTransactionProducer,
    LocalTransactionState,
    TransactionListener,
    TransactionSendResult,
)

__all__ = [
    "Admin",
    "AllocateStrategy",
    "AsyncAdmin",
    "AsyncLitePullConsumer",
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "AsyncTransactionProducer",
    "BrokerUnavailableError",
    "ClientConfig",
    "ClientConnection",
    "ClientErrorCode",
    "ClientNotRunningError",
    "ConfigError",
    "ConsumeConcurrentlyStatus",
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumerConfig",
    "ConsumerConnection",
    "ConsumerProgress",
    "ConsumerRunningInfo",
    "LitePullConsumer",
    "LocalTransactionState",
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
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueConsumeStats",
    "QueueOffsets",
    "QueueProgress",
    "RequestTimeoutError",
    "SendResult",
    "SendStatus",
    "TopicNotFoundError",
    "TopicQueueStats",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "select_by_hash",
    "select_by_sharding_key",
]
