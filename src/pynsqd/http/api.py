"""The HTTP API handlers (nsqd's ``nsqd/http.go``): each returns data or raises ``HTTPError``.

What a handler returns is sent as nsqd's ``RespondV1`` does: ``str``/``bytes`` raw, ``None`` as
an empty body, anything else as JSON. Parameters come only from the URL query string. Error
checks run in nsqd's order, except that nothing is created before the whole request has been
validated (a bad ``defer`` or ``/mpub`` body leaves no new topic behind).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import Field
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp.web_request import BaseRequest

from .. import NSQD_VERSION
from ..core import publish
from ..core.dedup import MAX_SEQUENCE
from ..core.e2e import go_float
from ..internal import jsonbound
from ..internal.httpapi import HTTPError, Params, topic_arg, topic_channel_args
from ..internal.listener import is_unix_address, split_host_port
from ..internal.memstats import mem_stats
from ..internal.names import is_valid_producer
from ..internal.optiontable import config_key, option_fields, option_kind
from ..internal.router import respond_plain
from ..log import LOG_LEVELS, LOGGER_NAME, parse_log_level
from ..options import Options
from ..protocol import headers
from ..protocol.errors import FatalClientError
from ..protocol.parser import parse_mpub_body
from .host import NSQDHost
from .replay import ReplayAPI
from .stats import get_stats, health, print_stats, stats_version

if TYPE_CHECKING:
    from ..core.topic import Topic

log = logging.getLogger(LOGGER_NAME)
_UINT = re.compile(r"[0-9]{1,19}")

#: nsqd's ``boolParams``: anything else means "not given" (or, for /mpub ``binary``, true).
BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}

#: Go's ``lg.LogLevel`` numbers, as ``GET /config/log_level`` shows them.
_GO_LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
#: Go's ``TLSNotRequired``, ``TLSRequiredExceptHTTP``, ``TLSRequired``.
_GO_TLS_REQUIRED = {"false": 0, "tcp-https": 1, "true": 2}
_GO_TLS_VERSIONS = {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}

_GO_INT = re.compile(r"[+-]?[0-9]+")
#: pynsqd: a request header of /pub and /mpub that is a message header (``protocol/headers.py``):
#: ``Nsq-Header-Traceparent: 00-...`` gives each message the header ``traceparent``.
HEADER_PREFIX = "Nsq-Header-"
HEADER_PREFIX_LOWER = HEADER_PREFIX.lower()
_INT64_MAX = (1 << 63) - 1


#: Where a body already read for this request is kept (``--workers``: an admin call read once,
#: made here and on every other worker).
BODY_READ = "pynsqd.body"


async def read_body(request: BaseRequest, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of the body, or None if it is longer (the rest is not read)."""
    if BODY_READ in request:
        kept: bytes = request[BODY_READ]
        return kept if len(kept) <= limit else None
    buf = bytearray()
    content = request.content
    try:
        if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == (
            "100-continue"
        ):
            # Go's server answers 100 Continue once the handler reads the body (curl waits).
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        while True:
            chunk = await content.read(limit + 1 - len(buf))
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > limit:
                return None
    except Exception as err:
        log.error("HTTP: failed to read request body - %s", err)
        raise HTTPError(500, "INTERNAL_ERROR") from err


def _port(address: str) -> int:
    """A bound address's port; -1 for a unix socket (as nsqd's /info)."""
    if not address or is_unix_address(address):
        return -1
    return split_host_port(address)[1]


class API:
    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd
        self.replay = ReplayAPI(nsqd)  # pynsqd's replayable-topic endpoints

    # -- helpers --------------------------------------------------------------------------

    def _topic_name(self, params: Params) -> str:
        """nsqd's ``getTopicFromQuery`` without creating the topic."""
        return topic_arg(params, "INVALID_TOPIC")

    def _existing_topic(self, params: Params) -> tuple[Topic, str]:
        """nsqd's ``getExistingTopicFromQuery``."""
        topic_name, channel_name = topic_channel_args(params.checked())
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, channel_name

    def _identity(self, params: Params) -> tuple[bytes, int] | None:
        """pynsqd: ``producer`` and ``seq`` of an idempotent publish (``core/dedup.py``)."""
        producer, seq = params.get("producer"), params.get("seq")
        if producer is None and seq is None:
            return None
        if producer is None:
            raise HTTPError(400, "MISSING_ARG_PRODUCER")
        if seq is None:
            raise HTTPError(400, "MISSING_ARG_SEQ")
        raw = producer.encode("utf-8", "surrogateescape")
        if not is_valid_producer(raw):
            raise HTTPError(400, "INVALID_ARG_PRODUCER")
        if not _UINT.fullmatch(seq) or int(seq) > MAX_SEQUENCE:
            raise HTTPError(400, "INVALID_ARG_SEQ")
        return raw, int(seq)

    async def _publish(
        self,
        request: BaseRequest,
        raw: bytes,
        topic_name: str,
        bodies: list[bytes],
        defer_ms: int = 0,
        identity: tuple[bytes, int] | None = None,
    ) -> Any:
        """/pub and /mpub, validated: decided by ``core/publish.decide``, carried out here.
        ``raw``: the request's body, for a worker that keeps the topic (``AdminLinks.proxy``)."""
        nsqd = self.nsqd
        if nsqd.exiting:
            raise HTTPError(503, "EXITING")
        blocks = self._headers(request, len(bodies))
        topic = nsqd.get_topic(topic_name)
        replication = nsqd.replication
        home = nsqd.workers.placement.home
        outcome = publish.decide(
            topic, bodies, defer_ms, identity, replication=replication, home=home, headers=blocks
        )
        while isinstance(outcome, publish.WaitWritable):
            # A partition this node is taking back: the publish waits for it (at most
            # --replication-timeout), then is decided again.
            assert replication is not None
            gate = replication.publishing
            why = await self._until(partial(gate.when_writable, topic_name))
            if why is not None:
                outcome = publish.not_committed(why)
                break
            outcome = publish.decide(
                topic,
                bodies,
                defer_ms,
                identity,
                replication=replication,
                home=home,
                headers=blocks,
            )
        if isinstance(outcome, publish.Forward):
            return await nsqd.workers.admin.proxy(outcome.worker, request, raw)
        if isinstance(outcome, publish.WaitCommit):
            # OK once committed (a replicated topic: ``cluster/replicator.py``; 503 PUB_FAILED
            # with the reason after --replication-timeout, it may still commit) and, under
            # --sync-every=1, once an fsync covers it (``storage/group_sync.py``).
            end = outcome.end
            why = await self._until(outcome.wait)
            outcome = (
                publish.Done(end, outcome.duplicates) if why is None else publish.not_committed(why)
            )
        if isinstance(outcome, publish.Refused):
            if outcome.why is publish.Refusal.DISK and isinstance(outcome.error, OSError):
                nsqd.set_health_error(outcome.error)
                log.error("TOPIC(%s): failed to put messages - %s", topic_name, outcome.reason)
            raise HTTPError(*publish.http_error(outcome))
        if outcome.duplicates:
            # What was already published is answered OK, and counted in a header.
            resp = respond_plain(200, "OK")
            resp.headers["X-Nsq-Duplicates"] = str(outcome.duplicates)
            return resp
        return "OK"

    def _headers(self, request: BaseRequest, count: int) -> list[bytes] | None:
        """pynsqd: the request's ``Nsq-Header-<name>: <value>`` headers as every message's
        header block (``protocol/headers.py``); None when it has none. 400 ``INVALID_HEADERS``
        naming the rule a header breaks, or ``HEADERS_UNSUPPORTED`` where the node has none
        (``--max-headers=0``, or a node of several workers)."""
        pairs = [
            (name[len(HEADER_PREFIX) :], value.encode("utf-8", "surrogateescape"))
            for name, value in request.headers.items()
            if name.lower().startswith(HEADER_PREFIX_LOWER)
        ]
        if not pairs:
            return None
        config = self.nsqd.protocol_config
        if config.max_headers <= 0:
            raise HTTPError(400, "HEADERS_UNSUPPORTED")
        try:
            block = headers.encode(
                pairs, headers.HeaderLimits(config.max_headers, config.max_header_bytes)
            )
        except headers.HeaderError as err:
            raise HTTPError(400, "INVALID_HEADERS", {"reason": str(err)}) from None
        return [block] * count

    async def _until(self, start: Callable[[Callable[[str | None], None]], None]) -> str | None:
        """Waits for a callback-style wait (``start(done)``): None, or the reason it failed."""
        answer: asyncio.Future[str | None] = self.nsqd.loop.create_future()

        def done(why: str | None) -> None:
            if not answer.done():
                answer.set_result(why)

        start(done)
        return await answer

    # -- handlers, named after nsqd's ---------------------------------------------------

    async def ping(self, request: BaseRequest, params: Params) -> Any:
        if self.nsqd.starting is not None:  # ready means ready: every worker, nsqlookupd
            raise HTTPError(500, f"NOK - starting ({self.nsqd.starting})")
        text = health(self.nsqd)
        if self.nsqd.health_error is not None:
            raise HTTPError(500, text)
        # --workers: the node is healthy when every worker is.
        for peer, line in await self.nsqd.workers.admin.unhealthy_peers(request):
            raise HTTPError(500, f"{line} (worker {peer})")
        return text

    async def info(self, request: BaseRequest, params: Params) -> Any:
        nsqd = self.nsqd
        opts = nsqd.opts
        try:
            hostname = socket.gethostname()
        except OSError as err:
            raise HTTPError(500, str(err)) from err
        return {
            "version": NSQD_VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": hostname,
            "http_port": _port(nsqd.http_address),
            "tcp_port": _port(nsqd.tcp_address),
            "start_time": nsqd.start_time,
            "max_heartbeat_interval": round(opts.max_heartbeat_interval * 1e9),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": round(opts.max_output_buffer_timeout * 1e9),
            "max_deflate_level": opts.max_deflate_level,
            "topology_zone": opts.topology_zone,
            "topology_region": opts.topology_region,
            # pynsqd: what it can do beyond nsqd (clients ignore unknown keys, as Go's do).
            "features": ["replayable-topics"]
            + (["replicated-topics"] if nsqd.replication is not None else [])
            + (["headers"] if nsqd.protocol_config.max_headers > 0 else []),
            "max_headers": nsqd.protocol_config.max_headers,
            "max_header_bytes": opts.max_header_bytes,
            "retention_time": round(opts.retention_time * 1e9),
            "retention_bytes": opts.retention_bytes,
            # Which data directory this is, whatever address reached it (storage/identity.py).
            "storage_id": nsqd.node_storage_id,
            **self._cluster_info(),
        }

    def _cluster_info(self) -> dict[str, Any]:
        """pynsqd: with --etcd-endpoints, the node's cluster and identity (replicated topics)."""
        replication = self.nsqd.replication
        if replication is None:
            return {}
        member = replication.member
        return {
            "node_id": member.node_id,
            "cluster": {
                "name": self.nsqd.opts.cluster_name,
                "etcd_endpoints": member.etcd.endpoints,
                "storage_id": member.storage,
                "lease_ttl": member.ttl,
                "nodes": sorted(replication.view.state.nodes),
                # Those seen alive lately (their registration re-written): new copies go there.
                "alive": replication.alive(),
            },
        }

    async def pub(self, request: BaseRequest, params: Params) -> Any:
        max_msg = self.nsqd.opts.max_msg_size
        if (request.content_length or 0) > max_msg:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = await read_body(request, max_msg)
        if body is None:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        topic_name = self._topic_name(params)
        defer_ms = 0
        text = params.get("defer")
        if text is not None:
            if not _GO_INT.fullmatch(text) or abs(int(text)) > _INT64_MAX:
                raise HTTPError(400, "INVALID_DEFER")
            defer_ms = int(text)
            if defer_ms < 0 or defer_ms > self.nsqd.opts.max_req_timeout * 1000:
                raise HTTPError(400, "INVALID_DEFER")
        identity = self._identity(params)
        return await self._publish(request, body, topic_name, [body], defer_ms, identity)

    async def mpub(self, request: BaseRequest, params: Params) -> Any:
        opts = self.nsqd.opts
        if (request.content_length or 0) > opts.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        topic_name = self._topic_name(params)
        binary = False
        mode = params.get("binary")
        if mode is not None:
            binary = BOOL_PARAMS.get(mode, True)
            if mode not in BOOL_PARAMS:
                log.warning("deprecated value '%s' used for /mpub binary param", mode)
        body = await read_body(request, opts.max_body_size)
        if body is None:
            raise HTTPError(413, "BODY_TOO_BIG")
        if binary:
            try:
                bodies = parse_mpub_body(body, self.nsqd.protocol_config)
            except FatalClientError as err:
                raise HTTPError(413, err.code.removeprefix("E_")) from err
        else:
            bodies = []
            for line in body.split(b"\n"):
                # nsqd removes the "\n" only; "\r" stays, empty lines are skipped.
                if not line:
                    continue
                if len(line) > opts.max_msg_size:
                    raise HTTPError(413, "MSG_TOO_BIG")
                bodies.append(line)
        return await self._publish(request, body, topic_name, bodies, 0, self._identity(params))

    async def stats(self, request: BaseRequest, params: Params) -> Any:
        params.checked()
        nsqd = self.nsqd
        include_clients = BOOL_PARAMS.get(params.get("include_clients") or "", True)
        include_mem = BOOL_PARAMS.get(params.get("include_mem") or "", True)
        topics, producers = get_stats(
            nsqd, params.get("topic") or "", params.get("channel") or "", include_clients
        )
        # --workers: the node's figures, every worker's summed.
        topics, producers = await nsqd.workers.admin.combine_stats(request, topics, producers)
        memory = mem_stats() if include_mem else None
        if params.get("format") != "json":
            return print_stats(
                stats_version(), topics, producers, memory, health(nsqd), nsqd.start_time
            )
        out: dict[str, Any] = {
            "version": NSQD_VERSION,
            "health": health(nsqd),
            "start_time": nsqd.start_time,
            "topics": topics,
        }
        if memory is not None:
            out["memory"] = memory
        out["producers"] = producers
        return out

    # -- topics ---------------------------------------------------------------------------

    async def topic_create(self, request: BaseRequest, params: Params) -> Any:
        self.nsqd.get_topic(self._topic_name(params))
        return None

    async def topic_delete(self, request: BaseRequest, params: Params) -> Any:
        name = params.checked().get("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not self.nsqd.delete_existing_topic(name):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return None

    async def topic_empty(self, request: BaseRequest, params: Params) -> Any:
        topic = self.nsqd.get_existing_topic(self._topic_name(params))
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        try:
            topic.empty()
        except OSError as err:
            log.error("TOPIC(%s): failed to empty - %s", topic.name, err)
            raise HTTPError(500, "INTERNAL_ERROR") from err
        return None

    async def _topic_pause(self, params: Params, pause: bool) -> Any:
        name = params.checked().get("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        # The core persists the pause flag in nsqd.dat, as nsqd does after this call.
        (topic.pause if pause else topic.unpause)()
        return None

    async def topic_pause(self, request: BaseRequest, params: Params) -> Any:
        return await self._topic_pause(params, True)

    async def topic_unpause(self, request: BaseRequest, params: Params) -> Any:
        return await self._topic_pause(params, False)

    # -- channels -------------------------------------------------------------------------

    async def channel_create(self, request: BaseRequest, params: Params) -> Any:
        topic, channel_name = self._existing_topic(params)
        # pynsqd: with offset= or timestamp=, a new channel starts in the past (--workers:
        # the worker that keeps the log replays it; the others make the channel).
        start = None
        if topic.kept_by is None:
            start = self.replay.start_offset_for_new_channel(topic.name, params)
        existed = channel_name in topic.channels
        channel = topic.get_channel(channel_name)
        if start is None or existed:
            return None
        return self.replay.answer(
            await self.nsqd.retention.rewinds.create_at(topic, channel, start)
        )

    async def channel_delete(self, request: BaseRequest, params: Params) -> Any:
        topic, channel_name = self._existing_topic(params)
        if not topic.delete_channel(channel_name):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return None

    async def channel_empty(self, request: BaseRequest, params: Params) -> Any:
        topic, channel_name = self._existing_topic(params)
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        try:
            channel.empty()
        except OSError as err:
            log.error("CHANNEL(%s): failed to empty - %s", channel_name, err)
            raise HTTPError(500, "INTERNAL_ERROR") from err
        return None

    async def _channel_pause(self, params: Params, pause: bool) -> Any:
        topic, channel_name = self._existing_topic(params)
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        (channel.pause if pause else channel.unpause)()
        return None

    async def channel_pause(self, request: BaseRequest, params: Params) -> Any:
        return await self._channel_pause(params, True)

    async def channel_unpause(self, request: BaseRequest, params: Params) -> Any:
        return await self._channel_pause(params, False)

    # -- /config/:opt ---------------------------------------------------------------------

    async def config(self, request: BaseRequest, params: Params, opt: str) -> Any:
        opts = self.nsqd.opts
        if request.method == "PUT":
            body = await read_body(request, opts.max_msg_size)
            if not body:  # None (too big) or empty
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    value = jsonbound.loads(body)
                except ValueError as err:
                    raise HTTPError(400, "INVALID_VALUE") from err
                if value is None:
                    value = []
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise HTTPError(400, "INVALID_VALUE")
                opts.lookupd_tcp_addresses = value
                self.nsqd.lookupd_addresses_changed()
            elif opt == "log_level":
                try:
                    levelno = parse_log_level(body.decode("utf-8", "replace"))
                except ValueError as err:
                    raise HTTPError(400, "INVALID_VALUE") from err
                opts.log_level = next(k for k, v in LOG_LEVELS.items() if v == levelno)
                logging.getLogger(LOGGER_NAME).setLevel(levelno)
            else:
                raise HTTPError(400, "INVALID_OPTION")
        f = _config_fields().get(opt)
        if f is None:
            raise HTTPError(400, "INVALID_OPTION")
        return config_value(f, getattr(opts, f.name))


def _config_fields() -> dict[str, Field[Any]]:
    # ``config`` names the file the options came from; nsqd's Options has no such field.
    return {config_key(f): f for f in option_fields(Options) if f.name != "config"}


def config_value(f: Field[Any], value: Any) -> Any:
    """An option's value as nsqd's ``getOptByCfgName`` gives it to ``RespondV1``.

    Go durations are int64 ns; ``log_level``, ``tls_required`` and ``tls_min_version`` are Go
    integers; strings are written raw (not JSON), everything else is JSON.
    """
    kind = option_kind(f)
    if kind == "duration":
        return round(value * 1e9)
    if f.name == "log_level":
        return _GO_LOG_LEVELS.get(str(value).lower(), 2)
    if f.name == "tls_required":
        return _GO_TLS_REQUIRED.get(str(value), 0)
    if f.name == "tls_min_version":
        return _GO_TLS_VERSIONS.get(str(value).lower(), 0x0301)
    if kind == "floatlist":
        return [go_float(v) for v in value]
    if kind == "list":
        return list(value)
    return value


__all__ = ["API", "BOOL_PARAMS", "HTTPError", "Params", "get_stats"]
