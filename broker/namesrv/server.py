"""The name server: the route table behind a remoting server (RocketMQ's ``NamesrvController`` and
``DefaultRequestProcessor``).

Name servers are stateless and independent: brokers register with every one of them, clients ask any
of them. Several can run side by side; nothing is shared between them.

Requests served:

- REGISTER_BROKER (103): header :class:`RegisterBrokerRequestHeader`, body :class:`RegisterBrokerBody`;
  answered with ``haServerAddr`` / ``masterAddr`` for a slave of a live master, and an empty body
  (Java sends the order-topic KV table, null when there is none, which is the case here).
- UNREGISTER_BROKER (104).
- GET_ROUTEINFO_BY_TOPIC (105): :class:`TopicRouteData` JSON, or TOPIC_NOT_EXIST (17).
- GET_BROKER_CLUSTER_INFO (106): :class:`ClusterInfo` JSON.
- GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206): ``{"topicList": [...]}``.
- DELETE_TOPIC_IN_NAMESRV (216): the topic's queues are forgotten (those of one cluster's groups with
  ``clusterName``); SUCCESS whether or not it was known, as Java answers.

Every answer's extFields values are strings (the codec writes them so; the C++ client needs it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker.namesrv.config import NameServerConfig
from broker.namesrv.headers import (
    DeleteTopicRequestHeader,
    GetRouteInfoRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from broker.namesrv.route_table import RouteTable
from broker.remoting.server import Connection, RemotingServer, RequestContext
from protocol.codes import RequestCode, ResponseCode, describe_request_code
from protocol.command import RemotingCommand, make_response
from protocol.route_data import InvalidRequestError, RegisterBrokerBody, encode_topic_list, java_crc32

logger = logging.getLogger(__name__)

#: the codes this server answers, all through one queue and one worker (arrival order is kept)
NAME_SERVER_CODES = (
    RequestCode.REGISTER_BROKER,
    RequestCode.UNREGISTER_BROKER,
    RequestCode.GET_ROUTEINFO_BY_TOPIC,
    RequestCode.GET_BROKER_CLUSTER_INFO,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
    RequestCode.DELETE_TOPIC_IN_NAMESRV,
)


class NameServer:
    """One name server. ``clock`` returns seconds from any monotonic origin; tests inject a fake one
    and call :meth:`expire_inactive_brokers` themselves."""

    def __init__(
        self, config: NameServerConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = NameServerConfig() if config is None else config
        self._config.validate()
        self._clock = clock
        self._routes = RouteTable(
            broker_addresses_max=self._config.broker_addresses_max, topics_max=self._config.topics_max
        )
        self._server = RemotingServer(self._config.host, self._config.port, self._config.server)
        self._server.register(
            NAME_SERVER_CODES,
            self._process,
            queue_max=self._config.processor_queue_max,
            workers=1,
            name="name server",
        )
        if self._config.forget_brokers_on_disconnect:
            self._server.add_close_listener(self._on_connection_closed)
        self._expiry_task: asyncio.Task[None] | None = None
        self._handlers: dict[int, Callable[[RequestContext], RemotingCommand]] = {
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route_info,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._get_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
        }

    @property
    def config(self) -> NameServerConfig:
        return self._config

    @property
    def routes(self) -> RouteTable:
        """The route table (read it; change it only through requests)."""
        return self._routes

    @property
    def remoting_server(self) -> RemotingServer:
        return self._server

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self._server.port

    @property
    def address(self) -> str:
        return f"{self._config.host}:{self.port}"

    async def start(self) -> None:
        await self._server.start()
        self._expiry_task = asyncio.get_running_loop().create_task(
            self._expire_periodically(), name="name server expiry"
        )

    async def stop(self, grace_seconds: float = 2.0) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)
        await self._server.stop(grace_seconds)

    async def wait_stopped(self) -> None:
        await self._server.wait_stopped()

    def expire_inactive_brokers(self) -> list[str]:
        """Remove brokers silent for ``broker_expiry_seconds`` by ``clock``; return their addresses."""
        expired = self._routes.expire_brokers(self._clock(), self._config.broker_expiry_seconds)
        for address in expired:
            logger.warning(
                "broker %s expired: no registration for %.0f s", address, self._config.broker_expiry_seconds
            )
        return expired

    async def _expire_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._config.expiry_scan_interval_seconds)
            self.expire_inactive_brokers()

    def _on_connection_closed(self, connection: Connection) -> None:
        for address in self._routes.remove_connection(connection.connection_id):
            logger.info("broker %s removed: its connection %s closed", address, connection.remote_address)

    # -------------------------------------------------------------------------------- processors

    async def _process(self, context: RequestContext) -> RemotingCommand | None:
        request = context.request
        handler = self._handlers[request.code]
        try:
            return handler(context)
        except InvalidRequestError as error:
            # A bad header or body is the sender's mistake: a clear answer, no traceback in our log.
            logger.info(
                "rejected %s from %s: %s", describe_request_code(request.code), context.remote_address, error
            )
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(error))

    def _register_broker(self, context: RequestContext) -> RemotingCommand:
        request = context.request
        header = RegisterBrokerRequestHeader.from_ext_fields(request.ext_fields)
        if header.body_crc32 != 0 and java_crc32(request.body) != header.body_crc32:
            # the Java name server's answer and remark, word for word
            return make_response(request, ResponseCode.SYSTEM_ERROR, "crc32 not match")
        body = RegisterBrokerBody.decode(
            request.body,
            compressed=header.compressed,
            topics_max=self._config.topics_per_registration_max,
            decompressed_max_bytes=self._config.register_body_decompressed_max_bytes,
        )
        result = self._routes.register_broker(
            cluster_name=header.cluster_name,
            broker_name=header.broker_name,
            broker_address=header.broker_address,
            broker_id=header.broker_id,
            ha_server_address=header.ha_server_address,
            topic_configs=body.topic_configs,
            data_version=body.data_version,
            now_seconds=self._clock(),
            connection_id=context.connection.connection_id,
            raft_term=header.raft_term,
            shared=header.shared_address,
        )
        response_header = RegisterBrokerResponseHeader(
            ha_server_address=result.ha_server_address, master_address=result.master_address
        )
        return make_response(request, ResponseCode.SUCCESS, ext_fields=response_header.to_ext_fields())

    def _unregister_broker(self, context: RequestContext) -> RemotingCommand:
        header = UnregisterBrokerRequestHeader.from_ext_fields(context.request.ext_fields)
        self._routes.unregister_broker(
            cluster_name=header.cluster_name,
            broker_name=header.broker_name,
            broker_address=header.broker_address,
            broker_id=header.broker_id,
        )
        logger.info(
            "broker %s (%s id %d) unregistered", header.broker_address, header.broker_name, header.broker_id
        )
        return make_response(context.request, ResponseCode.SUCCESS)

    def _get_route_info(self, context: RequestContext) -> RemotingCommand:
        header = GetRouteInfoRequestHeader.from_ext_fields(context.request.ext_fields)
        route = self._routes.topic_route(header.topic)
        if route is None:
            return make_response(
                context.request,
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {header.topic}",
            )
        return make_response(context.request, ResponseCode.SUCCESS, body=route.encode())

    def _get_cluster_info(self, context: RequestContext) -> RemotingCommand:
        return make_response(context.request, ResponseCode.SUCCESS, body=self._routes.cluster_info().encode())

    def _get_topic_list(self, context: RequestContext) -> RemotingCommand:
        return make_response(
            context.request, ResponseCode.SUCCESS, body=encode_topic_list(self._routes.topics())
        )

    def _delete_topic(self, context: RequestContext) -> RemotingCommand:
        header = DeleteTopicRequestHeader.from_ext_fields(context.request.ext_fields)
        if self._routes.delete_topic(header.topic, header.cluster_name):
            logger.info("topic %s deleted%s by %s", header.topic,
                        f" in cluster {header.cluster_name}" if header.cluster_name else "", context.remote_address)
        return make_response(context.request, ResponseCode.SUCCESS)
