"""The Toxiproxy HTTP API: routes, JSON validation and answers, over a collection of proxies.

Endpoints, bodies, status codes and error messages follow Toxiproxy 2.x (api.go), which is what
toxiproxy-python and the other clients expect:

    POST   /reset                          204   enable every proxy, remove every toxic
    GET    /version                        200   {"version": ...}
    GET    /proxies                        200   {name: proxy}
    POST   /proxies                        201   proxy          (409 if the name exists)
    GET    /proxies/{proxy}                200   proxy
    POST   /proxies/{proxy}   (or PATCH)   200   proxy          (listen, upstream, enabled)
    DELETE /proxies/{proxy}                204
    GET    /proxies/{proxy}/toxics         200   [toxic]
    POST   /proxies/{proxy}/toxics         200   toxic          (409 if the name exists)
    GET    /proxies/{proxy}/toxics/{toxic} 200   toxic
    POST   /proxies/{proxy}/toxics/{toxic} 200   toxic          (toxicity, attributes; or PATCH)
    DELETE /proxies/{proxy}/toxics/{toxic} 204

Errors are ``{"error": message, "status": code}``. Requests are handled one at a time (one lock), so
each answer describes a state no other request is half-way through changing.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote

from chaos.toxics import Clock, InvalidToxic, parse_toxic, update_toxic
from chaos.toxiproxy_http import HttpRequest
from chaos.toxiproxy_limits import ToxiproxyLimits
from chaos.toxiproxy_proxy import FailureCallback, ToxicProxy, parse_address

#: the Toxiproxy API level this server speaks (PATCH updates, JSON /version, reset_peer, limit_data)
VERSION = "2.5.0"
IMPLEMENTATION = "raftmq.chaos"
_LISTEN_HOSTS = ("127.0.0.1", "localhost", "")


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ApiResponse:
    status: int
    #: a JSON value; None for a response without a body (204)
    body: object = None

    @staticmethod
    def error(status: int, message: str) -> ApiResponse:
        return ApiResponse(status, {"error": message, "status": status})


class ToxiproxyApi:
    def __init__(
        self, rng: random.Random, clock: Clock, limits: ToxiproxyLimits, on_failure: FailureCallback
    ) -> None:
        self.proxies: dict[str, ToxicProxy] = {}
        self._rng = rng
        self._clock = clock
        self._limits = limits
        self._on_failure = on_failure
        self._lock = asyncio.Lock()

    async def handle(self, request: HttpRequest) -> ApiResponse:
        try:
            if request.headers.get("user-agent", "").startswith("Mozilla/"):
                # as Toxiproxy does: a web page must not drive the API through the user's browser
                raise ApiError(HTTPStatus.FORBIDDEN, "User agent not allowed")
            async with self._lock:
                return await self._route(request)
        except ApiError as error:
            return ApiResponse.error(error.status, error.message)

    async def close(self) -> None:
        """Stop every proxy (their listeners and connections); the collection stays as it was."""
        async with self._lock:
            for proxy in self.proxies.values():
                await proxy.stop()

    async def _route(self, request: HttpRequest) -> ApiResponse:
        try:
            segments = [unquote(part, errors="strict") for part in request.path.split("/")[1:]]
        except UnicodeDecodeError:
            raise ApiError(HTTPStatus.BAD_REQUEST, "path is not UTF-8") from None
        method = request.method
        match segments:
            case ["reset"]:
                _allow(method, "POST")
                return await self._reset()
            case ["version"]:
                _allow(method, "GET")
                return ApiResponse(HTTPStatus.OK, {"version": VERSION, "implementation": IMPLEMENTATION})
            case ["proxies"]:
                if _allow(method, "GET", "POST") == "GET":
                    return ApiResponse(
                        HTTPStatus.OK, {name: proxy.to_json() for name, proxy in self.proxies.items()}
                    )
                return await self._create_proxy(_json_object(request.body))
            case ["proxies", name]:
                proxy = self._proxy(name)
                verb = _allow(method, "GET", "POST", "PATCH", "DELETE")
                if verb == "GET":
                    return ApiResponse(HTTPStatus.OK, proxy.to_json())
                if verb == "DELETE":
                    await proxy.stop()
                    del self.proxies[name]
                    return ApiResponse(HTTPStatus.NO_CONTENT)
                return await self._update_proxy(proxy, _json_object(request.body))
            case ["proxies", name, "toxics"]:
                proxy = self._proxy(name)
                if _allow(method, "GET", "POST") == "GET":
                    return ApiResponse(HTTPStatus.OK, [spec.to_json() for spec in proxy.toxics()])
                return self._create_toxic(proxy, _json_object(request.body))
            case ["proxies", name, "toxics", toxic_name]:
                proxy = self._proxy(name)
                verb = _allow(method, "GET", "POST", "PATCH", "DELETE")
                spec = proxy.find_toxic(toxic_name)
                if spec is None:
                    raise ApiError(HTTPStatus.NOT_FOUND, "toxic not found")
                if verb == "GET":
                    return ApiResponse(HTTPStatus.OK, spec.to_json())
                if verb == "DELETE":
                    proxy.remove_toxic(toxic_name)
                    return ApiResponse(HTTPStatus.NO_CONTENT)
                try:
                    updated = update_toxic(spec, _json_object(request.body))
                except InvalidToxic as error:
                    raise ApiError(HTTPStatus.BAD_REQUEST, str(error)) from None
                proxy.update_toxic(updated)
                return ApiResponse(HTTPStatus.OK, updated.to_json())
            case _:
                raise ApiError(HTTPStatus.NOT_FOUND, "not found")

    def _proxy(self, name: str) -> ToxicProxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(HTTPStatus.NOT_FOUND, "proxy not found")
        return proxy

    async def _reset(self) -> ApiResponse:
        for proxy in self.proxies.values():
            await _start(proxy)
            proxy.reset_toxics()
        return ApiResponse(HTTPStatus.NO_CONTENT)

    async def _create_proxy(self, body: Mapping[str, object]) -> ApiResponse:
        _refuse_unknown_keys(body, ("name", "listen", "upstream", "enabled"))
        name = _required_string(body, "name")
        if len(name) > self._limits.proxy_name_length_max or "/" in name:
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"bad request body: a proxy name has at most {self._limits.proxy_name_length_max} "
                "characters and no '/'",
            )
        upstream = _upstream(_required_string(body, "upstream"))
        listen_port = _listen_port(body.get("listen", "127.0.0.1:0"))
        enabled = _boolean(body.get("enabled", True), "enabled")
        if name in self.proxies:
            raise ApiError(HTTPStatus.CONFLICT, "proxy already exists")
        if len(self.proxies) >= self._limits.proxies_max:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"too many proxies (at most {self._limits.proxies_max})")
        proxy = ToxicProxy(
            name, listen_port, upstream, self._rng, self._clock, self._limits, self._on_failure
        )
        if enabled:
            await _start(proxy)
        self.proxies[name] = proxy
        return ApiResponse(HTTPStatus.CREATED, proxy.to_json())

    async def _update_proxy(self, proxy: ToxicProxy, body: Mapping[str, object]) -> ApiResponse:
        _refuse_unknown_keys(body, ("name", "listen", "upstream", "enabled"))
        if "name" in body and body["name"] != proxy.name:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad request body: a proxy cannot be renamed")
        listen_port = _listen_port(body["listen"]) if "listen" in body else proxy.listen_port
        upstream = (
            _upstream(body["upstream"]) if "upstream" in body else (proxy.upstream_host, proxy.upstream_port)
        )
        enabled = _boolean(body.get("enabled", proxy.enabled), "enabled")
        try:
            await proxy.update(listen_port, upstream, enabled)
        except OSError as error:
            raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"listen tcp {proxy.listen}: {error}") from None
        return ApiResponse(HTTPStatus.OK, proxy.to_json())

    def _create_toxic(self, proxy: ToxicProxy, body: Mapping[str, object]) -> ApiResponse:
        try:
            spec = parse_toxic(body)
        except InvalidToxic as error:
            raise ApiError(HTTPStatus.BAD_REQUEST, str(error)) from None
        if proxy.find_toxic(spec.name) is not None:
            raise ApiError(HTTPStatus.CONFLICT, "toxic already exists")
        if len(proxy.toxics()) >= self._limits.toxics_per_proxy_max:
            raise ApiError(
                HTTPStatus.BAD_REQUEST, f"too many toxics (at most {self._limits.toxics_per_proxy_max})"
            )
        proxy.add_toxic(spec)
        return ApiResponse(HTTPStatus.OK, spec.to_json())


async def _start(proxy: ToxicProxy) -> None:
    try:
        await proxy.start()
    except OSError as error:
        raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"listen tcp {proxy.listen}: {error}") from None


def _allow(method: str, *allowed: str) -> str:
    if method not in allowed:
        raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"method not allowed (allowed: {', '.join(allowed)})")
    return method


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _json_object(body: bytes) -> dict[str, object]:
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise ApiError(HTTPStatus.BAD_REQUEST, f"bad request body: {error}") from None
    if not isinstance(value, dict):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad request body: expected a JSON object")
    return value


def _refuse_unknown_keys(body: Mapping[str, object], known: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"bad request body: unknown field(s) {', '.join(unknown)}")


def _required_string(body: Mapping[str, object], key: str) -> str:
    value = body.get(key)
    if value is None or value == "":
        raise ApiError(HTTPStatus.BAD_REQUEST, f"missing required field: {key}")
    if not isinstance(value, str):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"bad request body: {key} must be a string")
    return value


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(HTTPStatus.BAD_REQUEST, f"bad request body: {key} must be true or false")
    return value


def _upstream(value: object) -> tuple[str, int]:
    if not isinstance(value, str):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad request body: upstream must be a string")
    try:
        host, port = parse_address(value, "upstream", port_min=1)
    except ValueError as error:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"bad request body: {error}") from None
    if not host:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad request body: upstream needs a host")
    return host, port


def _listen_port(value: object) -> int:
    if not isinstance(value, str):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad request body: listen must be a string")
    try:
        host, port = parse_address(value, "listen", port_min=0)
    except ValueError as error:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"bad request body: {error}") from None
    if host not in _LISTEN_HOSTS:
        raise ApiError(
            HTTPStatus.BAD_REQUEST, f"bad request body: proxies listen on 127.0.0.1 only, not {host!r}"
        )
    return port
