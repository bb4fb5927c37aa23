"""nsqlookupd's HTTP API (``nsqlookupd/http.go``) on aiohttp's low-level server.

Same router rules and envelopes as nsqd's API (``pynsqd.http.server``): exact paths, 405
``METHOD_NOT_ALLOWED`` for a known path with another method, 404 ``NOT_FOUND`` otherwise; V1
routes answer JSON (or an empty body for ``None``) with ``X-NSQ-Content-Type``, errors as
``{"message": TOKEN}``; ``/ping`` is plain text. Parameters come only from the query string.
Go's map order is random; lists here are sorted so that answers are stable.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp.web_request import BaseRequest

from .. import NSQD_VERSION
from ..internal.httpapi import HTTPError, Params, topic_channel_args
from ..internal.names import is_valid_name
from ..internal.router import Router
from .registration_db import Registration, filter_by_active

if TYPE_CHECKING:
    import asyncio

    from .options import LookupdOptions
    from .registration_db import RegistrationDB


class HTTPHost(Protocol):
    """What the HTTP API needs of nsqlookupd (``NSQLookupd``)."""

    loop: asyncio.AbstractEventLoop
    opts: LookupdOptions
    db: RegistrationDB


log = logging.getLogger("pynsqd.lookupd")


def _topic_arg(params: Params) -> str:
    topic = params.checked().get("topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    return topic


class LookupdHTTP(Router):
    def __init__(self, lookupd: HTTPHost) -> None:
        super().__init__(log)
        self.lookupd = lookupd
        self.db = lookupd.db
        add = self.add
        add("GET", "/ping", "plain", self.ping)
        add("GET", "/info", "v1", self.info)
        add("GET", "/debug", "v1", self.debug)
        add("GET", "/lookup", "v1", self.lookup)
        add("GET", "/topics", "v1", self.topics)
        add("GET", "/channels", "v1", self.channels)
        add("GET", "/nodes", "v1", self.nodes)
        add("POST", "/topic/create", "v1", self.topic_create)
        add("POST", "/topic/delete", "v1", self.topic_delete)
        add("POST", "/channel/create", "v1", self.channel_create)
        add("POST", "/channel/delete", "v1", self.channel_delete)
        add("POST", "/topic/tombstone", "v1", self.topic_tombstone)
        self.add_pprof_routes("/debug/pprof")  # no trailing slash, unlike nsqd

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, address: str) -> None:
        await self.serve_on(self.lookupd.loop, address)

    async def stop(self) -> None:
        await self.close()

    # -- requests -------------------------------------------------------------------------

    # -- handlers -------------------------------------------------------------------------

    async def ping(self, request: BaseRequest, params: Params) -> Any:
        return "OK"

    async def info(self, request: BaseRequest, params: Params) -> Any:
        return {"version": NSQD_VERSION}

    async def topics(self, request: BaseRequest, params: Params) -> Any:
        return {"topics": [r.key for r in self.db.find_registrations("topic", "*", "")]}

    async def channels(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        regs = self.db.find_registrations("channel", topic, "*")
        return {"channels": [r.subkey for r in regs]}

    async def lookup(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        if not self.db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        opts = self.lookupd.opts
        channels = [r.subkey for r in self.db.find_registrations("channel", topic, "*")]
        producers = filter_by_active(
            self.db.find_producers("topic", topic, ""),
            opts.inactive_producer_timeout,
            opts.tombstone_lifetime,
        )
        return {"channels": channels, "producers": [p.peer_info.as_json() for p in producers]}

    async def nodes(self, request: BaseRequest, params: Params) -> Any:
        opts = self.lookupd.opts
        db = self.db
        # tombstoned nodes are listed, with a flag per topic
        clients = filter_by_active(
            db.find_producers("client", "", ""), opts.inactive_producer_timeout, 0
        )
        nodes = []
        for client in clients:
            peer = client.peer_info
            topics = [r.key for r in db.lookup_registrations(peer.id) if r.category == "topic"]
            tombstones = []
            for t in topics:
                producer = db.registrations.get(Registration("topic", t, ""), {}).get(peer.id)
                tombstoned = producer is not None and producer.is_tombstoned(
                    opts.tombstone_lifetime
                )
                tombstones.append(tombstoned)
            node = peer.as_json()
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return {"producers": nodes}

    async def debug(self, request: BaseRequest, params: Params) -> Any:
        data: dict[str, list[dict[str, Any]]] = {}
        for r, producers in self.db.registrations.items():
            for p in producers.values():
                peer = p.peer_info
                data.setdefault(f"{r.category}:{r.key}:{r.subkey}", []).append(
                    {
                        "id": peer.id,
                        **{k: v for k, v in peer.as_json().items() if k != "remote_address"},
                        "last_update": peer.last_update_ns,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": p.tombstoned_at_ns,
                    }
                )
        return dict(sorted(data.items()))

    async def topic_create(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def topic_delete(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        for r in self.db.find_registrations("channel", topic, "*"):
            log.info("DB: removing channel(%s) from topic(%s)", r.subkey, topic)
            self.db.remove_registration(r)
        for r in self.db.find_registrations("topic", topic, ""):
            log.info("DB: removing topic(%s)", topic)
            self.db.remove_registration(r)
        return None

    async def topic_tombstone(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        node = params.get("node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        for p in self.db.find_producers("topic", topic, ""):
            peer = p.peer_info
            if f"{peer.node.broadcast_address}:{peer.node.http_port}" == node:
                p.tombstone()
        return None

    async def channel_create(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = topic_channel_args(params.checked())
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration("channel", topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def channel_delete(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = topic_channel_args(params.checked())
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for r in regs:
            self.db.remove_registration(r)
        return None
