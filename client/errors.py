"""Typed client errors, each carrying a RocketMQ response code, so callers handle each failure by its code.

Broker answers keep the broker's code (:class:`~protocol.codes.ResponseCode`); failures found
on the client side use the codes of Java's ``ClientErrorCode`` (10001..10007), so one ``code`` field
tells every failure apart, as ``MQClientException.getResponseCode()`` does in the Java client.
"""

from __future__ import annotations

import enum

from protocol.codes import ResponseCode, describe_response_code


class ClientErrorCode(enum.IntEnum):
    """``org.apache.rocketmq.client.exception.ClientErrorCode`` (plus one of ours)."""

    CONNECT_BROKER_EXCEPTION = 10001
    ACCESS_BROKER_TIMEOUT = 10002
    BROKER_NOT_EXIST_EXCEPTION = 10003
    NO_NAME_SERVER_EXCEPTION = 10004
    NOT_FOUND_TOPIC_EXCEPTION = 10005
    REQUEST_TIMEOUT_EXCEPTION = 10006
    CREATE_REPLY_MESSAGE_EXCEPTION = 10007
    #: ours: the producer, consumer or admin was closed (or not started)
    CLIENT_NOT_RUNNING = 10100


def describe_code(code: int) -> str:
    """``"SYSTEM_BUSY(2)"``, ``"CONNECT_BROKER_EXCEPTION(10001)"``, or ``"UNKNOWN(n)"``."""
    try:
        return f"{ClientErrorCode(code).name}({code})"
    except ValueError:
        return describe_response_code(code)


class MQClientError(Exception):
    """Any operating error of the client SDK: ``code`` is a RocketMQ response code or a
    :class:`ClientErrorCode`; ``remark`` says what happened."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(f"{describe_code(code)}: {remark}")
        self.code = int(code)
        self.remark = remark


class MessageValidationError(MQClientError, ValueError):
    """A message or argument the client refuses to send (Java's ``Validators``): MESSAGE_ILLEGAL."""

    def __init__(self, remark: str) -> None:
        super().__init__(ResponseCode.MESSAGE_ILLEGAL, remark)


class ClientNotRunningError(MQClientError):
    def __init__(self, remark: str) -> None:
        super().__init__(ClientErrorCode.CLIENT_NOT_RUNNING, remark)


class MQBrokerError(MQClientError):
    """A broker (or name server) answered with an error code."""

    def __init__(self, code: int, remark: str, address: str = "") -> None:
        super().__init__(code, f"{remark} (from {address})" if address else remark)
        self.address = address


class NotLeaderError(MQBrokerError):
    """SERVICE_NOT_AVAILABLE from a raftmq follower (or a leader stepping down); ``leader_address``
    names the leader when the follower knows it."""

    def __init__(self, remark: str, address: str = "", leader_address: str | None = None) -> None:
        super().__init__(ResponseCode.SERVICE_NOT_AVAILABLE, remark, address)
        self.leader_address = leader_address


class TopicNotFoundError(MQClientError):
    """No name server knows a route for the topic (and it could not be auto-created)."""

    def __init__(self, topic: str, remark: str = "") -> None:
        super().__init__(
            ClientErrorCode.NOT_FOUND_TOPIC_EXCEPTION, remark or f"no route info for topic {topic!r}"
        )
        self.topic = topic


class NameServerUnavailableError(MQClientError):
    """No name server could be reached."""

    def __init__(self, remark: str) -> None:
        super().__init__(ClientErrorCode.NO_NAME_SERVER_EXCEPTION, remark)


class BrokerUnavailableError(MQClientError):
    """No address of the broker group could be reached (connection refused, reset, or no route)."""

    def __init__(self, remark: str, address: str = "") -> None:
        super().__init__(ClientErrorCode.CONNECT_BROKER_EXCEPTION, remark)
        self.address = address


class RequestTimeoutError(MQClientError, TimeoutError):
    """No answer in time. The request may still have taken effect (a send: retry with the same
    UNIQ_KEY, which the broker deduplicates)."""

    def __init__(self, remark: str, address: str = "") -> None:
        super().__init__(ClientErrorCode.REQUEST_TIMEOUT_EXCEPTION, remark)
        self.address = address


def broker_error(code: int, remark: str | None, address: str, ext_fields: dict[str, str]) -> MQBrokerError:
    """The typed error for a broker's non-success answer."""
    text = remark or describe_response_code(code)
    if code == ResponseCode.SERVICE_NOT_AVAILABLE:
        return NotLeaderError(text, address, ext_fields.get("leaderAddress") or None)
    return MQBrokerError(code, text, address)
