"""Replayable topics on the HTTP port (pynsqd; nsqd has none of these endpoints).

- ``GET /topic/offsets?topic=T[&timestamp=<unix ms>]``: earliest and latest (next to be written)
  offsets, log size and segments, retention, and which log it is (``storage_id``: the data
  directory's, whatever address reached it; ``instance``: this process's); with ``timestamp``,
  ``offset`` is the first offset published at or after it. For a replicated topic also
  ``cluster``, ``node_id``, ``partitions`` (those this node holds, each with its role,
  leader, in-sync set, earliest, committed and latest offsets) and ``nodes`` (every live
  node's HTTP address by id: where the other copies are).
- ``GET /topic/log?topic=T&offset=N[&max_messages=M][&max_bytes=B]``: the records from N on,
  as stored (``storage/topiclog.py`` documents the framing), streamed with a Content-Length; the
  ``X-Nsq-*`` headers give the first offset, the next offset to ask for, the count, earliest,
  latest and the storage id. At ``latest`` the body is empty: the reader is caught up. One
  answer covers at most ``MAX_SEGMENTS_PER_READ`` segment files (each held open only until its
  part is sent), all answers together at most a quarter of the open-file limit (``503
  TOO_MANY_LOG_READERS`` when none is left), and a reader that takes no part of the body for
  ``WRITE_TIMEOUT`` is disconnected, so a stalled reader never pins files or the space of
  pruned segments.
- ``POST /topic/reader?topic=T&reader=NAME&offset=N[&partition=P]``: a reader that keeps its own
  offsets (a Spark query in log mode) reports that it has committed the log below N; ``/stats``
  (the topic's ``log`` and its partitions: ``readers``), ``/metrics`` and nsqadmin show it
  with its lag. It moves, holds and prunes nothing (``storage/readers.py``).
- ``POST /topic/retention?topic=T[&time=24h][&bytes=N]``: the topic's own retention (kept across
  restarts); both 0 stops its log and removes it.
- ``POST /channel/rewind?topic=T&channel=C&offset=N`` (or ``&timestamp=<unix ms>``): every
  retained message from there is put into C again, with its original ID, body and timestamp.
  ``POST /channel/create`` takes the same ``offset``/``timestamp`` to start a channel in the past.

With ``--auth-http-address``, the two reading endpoints need an auth secret
(``X-Nsq-Auth-Secret`` header or ``secret`` parameter) granted ``subscribe`` on the topic.

Errors are nsqd-style JSON: ``{"message":"OFFSET_OUT_OF_RANGE","earliest":e,"latest":l}``,
``TOPIC_NOT_RETAINED``, ``INVALID_ARG_OFFSET`` and so on; never a 500 for bad input.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import resource
import time
from typing import Any

from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from ..core.replay import Conflict, Replayed
from ..internal.gotext import format_duration, parse_duration
from ..internal.httpapi import HTTPError, Params, topic_arg
from ..internal.names import is_valid_name
from ..log import LOGGER_NAME
from ..storage.readers import MAX_NAME as MAX_READER_NAME
from ..storage.topiclog import LogRange, OffsetOutOfRange, TopicLog
from .host import NSQDHost

log = logging.getLogger(LOGGER_NAME)

_UINT = re.compile(r"[0-9]{1,19}")
#: With --auth-http-address, the auth secret of a log reader (or the ``secret`` parameter).
SECRET_HEADER = "X-Nsq-Auth-Secret"
DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_BYTES = 16 << 20
MAX_BYTES = 256 << 20
_CHUNK = 1 << 20
#: Segments one /topic/log response covers at most. Each is an open descriptor until its part
#: of the body is written, so a read over many small segments ends early (X-Nsq-Next-Offset
#: says where to go on) instead of holding hundreds of files.
MAX_SEGMENTS_PER_READ = 8
#: Descriptors all /topic/log responses together may hold: a quarter of RLIMIT_NOFILE, at
#: most this many. A read that finds none left is answered 503 TOO_MANY_LOG_READERS.
MAX_LOG_READ_FDS = 256
#: Seconds one chunk (1 MiB) of a /topic/log body may take to drain to the reader: a reader
#: slower than about 100 KiB/s, or one that stops reading, is disconnected, so it lets go of
#: its files (and of the disk space of segments that retention removed meanwhile) within
#: about this long.
WRITE_TIMEOUT = 10.0


def _uint(params: Params, key: str, default: int | None = None, *, low: int = 0) -> int:
    text = params.get(key)
    if text is None:
        if default is None:
            raise HTTPError(400, f"MISSING_ARG_{key.upper()}")
        return default
    if not _UINT.fullmatch(text) or int(text) >= 1 << 63 or int(text) < low:
        raise HTTPError(400, f"INVALID_ARG_{key.upper()}")
    return int(text)


class ReplayAPI:
    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        cap = MAX_LOG_READ_FDS if soft == resource.RLIM_INFINITY else soft // 4
        #: Descriptors /topic/log responses may hold at once, and how many they hold now.
        self.read_fd_limit = max(MAX_SEGMENTS_PER_READ, min(MAX_LOG_READ_FDS, cap))
        self.read_fds = 0

    # -- helpers --------------------------------------------------------------------------

    def _topic_name(self, params: Params) -> str:
        return topic_arg(params)

    def _log(self, name: str) -> TopicLog:
        if self.nsqd.get_existing_topic(name) is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        topic_log = self.nsqd.retention.get(name)
        if topic_log is None:
            raise HTTPError(400, "TOPIC_NOT_RETAINED")
        return topic_log

    @staticmethod
    def _out_of_range(err: OffsetOutOfRange) -> HTTPError:
        return HTTPError(
            400, "OFFSET_OUT_OF_RANGE", {"earliest": err.earliest, "latest": err.latest}
        )

    def _start_offset(self, topic_log: TopicLog, params: Params) -> int:
        """``offset`` or ``timestamp`` (unix ms), checked against the retained range."""
        if params.get("timestamp") is not None:
            if params.get("offset") is not None:
                raise HTTPError(400, "INVALID_ARG_OFFSET_AND_TIMESTAMP")
            ts_ms = _uint(params, "timestamp")
            return topic_log.offset_for_time(ts_ms * 1_000_000)
        offset = _uint(params, "offset")
        try:
            topic_log.check_offset(offset)
        except OffsetOutOfRange as err:
            raise self._out_of_range(err) from err
        return offset

    def _describe(self, name: str, topic_log: TopicLog) -> dict[str, Any]:
        return {
            "topic": name,
            "earliest": topic_log.earliest,
            "latest": topic_log.visible,
            "bytes": topic_log.size,
            "segments": topic_log.segment_count,
            "retention_time": format_duration(topic_log.retention_time),
            "retention_bytes": topic_log.retention_bytes,
            # Which log this is, whatever address reached it (``storage/identity.py``).
            "storage_id": self.nsqd.storage_id,
            "instance": self.nsqd.instance,
        }

    # -- handlers -------------------------------------------------------------------------

    async def _authorize(self, request: BaseRequest, params: Params, topic: str) -> None:
        await authorize_log_read(self.nsqd, request, params, topic)

    def _partition_log(self, name: str, params: Params) -> TopicLog:
        """``partition=<origin node id>``: this node's copy of that node's partition of a
        replicated topic; without it (or this node's own id), the topic's own log."""
        origin = partition_id(params)
        if origin is None or origin == self.nsqd.opts.node_id:
            return self._log(name)
        replication = self.nsqd.replication
        topic_log = replication.read_log(name, origin) if replication is not None else None
        if topic_log is None:
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        return topic_log

    async def offsets(self, request: BaseRequest, params: Params) -> Any:
        name = self._topic_name(params)
        await self._authorize(request, params, name)
        topic_log = self._partition_log(name, params)
        doc = self._describe(name, topic_log)
        if params.get("timestamp") is not None:
            doc["offset"] = topic_log.offset_for_time(_uint(params, "timestamp") * 1_000_000)
        replication = self.nsqd.replication
        held = replication.describe(name) if replication is not None else []
        if replication is not None and held and partition_id(params) is None:
            # A replicated topic: which partitions this node holds, and how far each is
            # committed (a reader keys them by partition and reads any in-sync copy).
            doc["cluster"] = self.nsqd.opts.cluster_name
            doc["node_id"] = self.nsqd.opts.node_id
            doc["partitions"] = held
            doc["nodes"] = replication.node_addresses()
        return doc

    async def read(self, request: BaseRequest, params: Params) -> Any:
        name = self._topic_name(params)
        await self._authorize(request, params, name)
        topic_log = self._partition_log(name, params)
        limit = topic_log.visible  # a replicated partition: what is committed
        offset = _uint(params, "offset")
        max_messages = _uint(params, "max_messages", DEFAULT_MAX_MESSAGES, low=1)
        max_bytes = min(_uint(params, "max_bytes", DEFAULT_MAX_BYTES, low=1), MAX_BYTES)
        try:
            topic_log.check_offset(offset)
            max_segments = min(MAX_SEGMENTS_PER_READ, self.read_fd_limit - self.read_fds)
            if max_segments <= 0 and offset < limit:
                raise HTTPError(503, "TOO_MANY_LOG_READERS")
            ranges = topic_log.read_ranges(offset, limit, max_messages, max_bytes, max_segments)
        except OffsetOutOfRange as err:
            raise self._out_of_range(err) from err
        nxt = ranges[-1].next if ranges else offset
        # Open the (at most MAX_SEGMENTS_PER_READ) files before the first await: retention may
        # remove a segment meanwhile, and an open file stays readable. Each is closed as soon as
        # its part of the body is written.
        files: list[tuple[int, LogRange]] = []
        try:
            for rng in ranges:
                files.append((os.open(rng.path, os.O_RDONLY | os.O_CLOEXEC), rng))
        except OSError as err:
            if err.errno in (errno.EMFILE, errno.ENFILE) and files:
                # Out of descriptors: a shorter answer (the reader goes on from its next).
                log.warning("TOPIC(%s): log read cut short - %s", name, err)
                ranges = ranges[: len(files)]
                nxt = ranges[-1].next
            else:
                for fd, _ in files:
                    os.close(fd)
                log.error("TOPIC(%s): failed to read its log - %s", name, err)
                if err.errno in (errno.EMFILE, errno.ENFILE):
                    raise HTTPError(503, "TOO_MANY_LOG_READERS") from err
                raise HTTPError(500, "INTERNAL_ERROR") from err
        total = sum(r.end - r.start for r in ranges)
        resp = StreamResponse(status=200)
        resp.content_type = "application/octet-stream"
        resp.content_length = total
        resp.headers["X-Nsq-First-Offset"] = str(ranges[0].first if ranges else nxt)
        resp.headers["X-Nsq-Next-Offset"] = str(nxt)
        resp.headers["X-Nsq-Count"] = str(sum(r.count for r in ranges))
        resp.headers["X-Nsq-Earliest"] = str(topic_log.earliest)
        resp.headers["X-Nsq-Latest"] = str(limit)
        resp.headers["X-Nsq-Storage-Id"] = self.nsqd.storage_id
        self.read_fds += len(files)
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await resp.prepare(request)
            while files:
                fd, rng = files[0]
                pos = rng.start
                while pos < rng.end:
                    chunk = os.pread(fd, min(_CHUNK, rng.end - pos), pos)
                    if not chunk:
                        raise OSError(f"{rng.path} ended early at byte {pos}")
                    # aiohttp has no write timeout: write() waits in drain() for as long as
                    # the reader does not read.
                    async with asyncio.timeout(WRITE_TIMEOUT):
                        await resp.write(chunk)
                    pos += len(chunk)
                del files[0]
                self.read_fds -= 1
                os.close(fd)
            async with asyncio.timeout(WRITE_TIMEOUT):
                await resp.write_eof()
        except TimeoutError:
            log.warning(
                "TOPIC(%s): log reader %s stopped reading for %ss, disconnected",
                name,
                request.remote,
                WRITE_TIMEOUT,
            )
            if request.transport is not None:
                request.transport.abort()  # drop what is buffered for it, close now
        except (ConnectionError, asyncio.CancelledError):
            pass  # the reader went away: nothing to undo
        finally:
            self.read_fds -= len(files)
            for fd, _ in files:
                os.close(fd)
        return resp

    async def reader(self, request: BaseRequest, params: Params) -> Any:
        """``POST /topic/reader``: a reader that keeps its own offsets (a Spark query) says
        what it has committed; ``/stats`` shows it with its lag (``storage/readers.py``)."""
        name = self._topic_name(params)
        await self._authorize(request, params, name)
        reader = params.get("reader")
        if reader is None:
            raise HTTPError(400, "MISSING_ARG_READER")
        if not 0 < len(reader) <= MAX_READER_NAME or not reader.isprintable():
            raise HTTPError(400, "INVALID_ARG_READER")
        topic_log = self._partition_log(name, params)
        offset = _uint(params, "offset")
        if offset > topic_log.latest:
            raise self._out_of_range(OffsetOutOfRange(offset, topic_log.earliest, topic_log.latest))
        topic_log.readers.commit(reader, offset, time.time())
        return {"reader": reader, "committed": offset, "lag": max(0, topic_log.visible - offset)}

    async def retention(self, request: BaseRequest, params: Params) -> Any:
        name = self._topic_name(params)
        text = params.get("time")
        seconds = 0.0
        if text is not None:
            try:
                seconds = parse_duration(text)
            except ValueError:
                raise HTTPError(400, "INVALID_ARG_TIME") from None
            if seconds < 0:
                raise HTTPError(400, "INVALID_ARG_TIME")
        size = _uint(params, "bytes", 0)
        if self.nsqd.exiting:
            raise HTTPError(503, "EXITING")
        try:
            self.nsqd.retention.change(self.nsqd.get_topic(name), seconds, size)
        except Conflict as err:
            raise HTTPError(409, err.token) from err
        except OSError as err:
            # Nothing is half done: a backlog that could not all move stays served by the
            # log (what moved is in the topic's queue), and asking again finishes the move.
            log.error("TOPIC(%s): retention not changed - %s", name, err)
            status = 507 if err.errno in (errno.ENOSPC, errno.EDQUOT) else 500
            raise HTTPError(status, "RETENTION_NOT_CHANGED", {"error": str(err)}) from err
        topic_log = self.nsqd.retention.get(name)
        if topic_log is None:
            return {"topic": name, "retention_time": "0s", "retention_bytes": 0}
        return self._describe(name, topic_log)

    async def rewind(self, request: BaseRequest, params: Params) -> Any:
        name = self._topic_name(params)
        channel_name = params.get("channel")
        if channel_name is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel_name):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        topic_log = self._log(name)
        start = self._start_offset(topic_log, params)
        topic = self.nsqd.get_existing_topic(name)
        channel = topic.channels.get(channel_name) if topic is not None else None
        if topic is None or channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        try:
            result = await self.nsqd.retention.rewinds.rewind(topic, channel, start)
        except Conflict as err:
            raise HTTPError(409, err.token) from err
        except OSError as err:  # its progress file could not be made: nothing was put back
            log.error("CHANNEL(%s:%s): rewind not started - %s", name, channel_name, err)
            raise HTTPError(500, "INTERNAL_ERROR", {"error": str(err)}) from err
        return self.answer(result)

    @staticmethod
    def answer(result: Replayed) -> dict[str, Any]:
        """What a rewind put back; one that ended early is a 409 (503 while nsqd stops) that
        says how far it got, so the caller can ask again from ``next``."""
        doc = {"offset": result.offset, "next": result.next, "count": result.count}
        if result.stopped is not None:
            raise HTTPError(503 if result.stopped == "EXITING" else 409, result.stopped, doc)
        return doc

    def start_offset_for_new_channel(self, name: str, params: Params) -> int | None:
        """``/channel/create`` with ``offset`` or ``timestamp``: where to start (checked before
        the channel is created); None without them."""
        if params.get("offset") is None and params.get("timestamp") is None:
            return None
        origin = partition_id(params)
        if origin is not None and origin != self.nsqd.opts.node_id:
            # --workers: another worker's partition starts there (``AdminLinks.routed``);
            # this one, asked by it, makes the channel plain.
            if self.nsqd.workers.placement.count > 1:
                return None
            raise HTTPError(404, "PARTITION_NOT_FOUND")
        return self._start_offset(self._log(name), params)


__all__ = ["ReplayAPI"]


async def authorize_log_read(
    nsqd: NSQDHost, request: BaseRequest, params: Params, topic: str
) -> None:
    """A log read's authorization (``--auth-http-address``): the secret from the header or
    ``secret=``. Raises ``HTTPError`` 401/403."""
    secret = request.headers.get(SECRET_HEADER) or params.get("secret") or ""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    remote_ip = peer[0] if isinstance(peer, tuple) else ""
    tls = request.transport is not None and (
        request.transport.get_extra_info("sslcontext") is not None
    )
    error = await nsqd.authorize_log_read(topic, secret, remote_ip, tls)
    if error is not None:
        raise HTTPError(403 if error == "UNAUTHORIZED" else 401, error)


def partition_id(params: Params) -> int | None:
    """``partition=``: a node id, 0-1023 (``--node-id``'s range); None when absent. Raises
    ``HTTPError`` 400 ``INVALID_ARG_PARTITION``."""
    text = params.get("partition")
    if text is None:
        return None
    if not _UINT.fullmatch(text) or int(text) >= 1024:
        raise HTTPError(400, "INVALID_ARG_PARTITION")
    return int(text)
