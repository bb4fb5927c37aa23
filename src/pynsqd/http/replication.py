"""Replicated topics on the HTTP port (pynsqd; ``docs/replication.md``).

- ``POST /topic/replication?topic=T[&replicas=3][&min_insync=2][&acks=all|leader]
  [&durability=fsync|pagecache]``: the topic's replication settings, kept in etcd for every node
  of the cluster (what is not given keeps its value, else the ``--replicas``/``--replication-*``
  flags). Needs ``--etcd-endpoints`` and a retained topic (``--retention-*`` or
  ``POST /topic/retention``): a 400 names what is missing.
- ``GET /topic/replication?topic=T``: the settings and the partitions of T this node holds a copy
  of: role, leader, epoch, in-sync set, committed offset and each follower's lag.
- ``GET /topic/replicate?topic=T&partition=N`` (a websocket): a follower's fetches from the
  partition's leader, one message each way per fetch (``cluster/fetch.py`` is the format,
  ``cluster/leader.py`` the answer). Log reads are authorized as ``/topic/log``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType
from aiohttp.web_request import BaseRequest
from aiohttp.web_ws import WebSocketResponse

from ..cluster.etcd import EtcdError
from ..cluster.fetch import MAX_REQUEST_BYTES, REPLICA_SECRET_HEADER, FetchAnswer, FetchRequest
from ..cluster.settings import ReplicationSettings, SettingsError
from ..internal.httpapi import HTTPError, Params, topic_arg
from ..log import LOGGER_NAME
from .host import NSQDHost
from .replay import authorize_log_read, partition_id

if TYPE_CHECKING:
    from ..cluster.replicator import Replicator

log = logging.getLogger(LOGGER_NAME)

#: Seconds a closing stream waits for the other side's close.
CLOSE_TIMEOUT = 1.0


class ReplicationAPI:
    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd
        #: The followers' open fetch streams: closed when nsqd stops.
        self.streams: set[WebSocketResponse] = set()

    def _topic(self, params: Params) -> tuple[str, Replicator]:
        name = topic_arg(params)
        replication = self.nsqd.replication
        if replication is None:
            raise HTTPError(
                400, "REPLICATION_NEEDS_ETCD", {"reason": "nsqd runs without --etcd-endpoints"}
            )
        return name, replication

    def _describe(self, name: str, replication: Replicator) -> dict[str, Any]:
        settings = replication.settings_for(name) or replication.defaults
        return {
            "topic": name,
            **dataclasses.asdict(settings),
            "partitions": replication.describe(name),
        }

    async def get(self, request: BaseRequest, params: Params) -> Any:
        name, replication = self._topic(params)
        if self.nsqd.get_existing_topic(name) is None and not replication.describe(name):
            try:
                anywhere = await replication.replicated_anywhere(name)
            except EtcdError as err:
                raise HTTPError(503, "ETCD_UNAVAILABLE", {"reason": str(err)}) from err
            if not anywhere:  # not here, not replicated anywhere, no copy held here
                raise HTTPError(404, "TOPIC_NOT_FOUND")
        return self._describe(name, replication)

    async def set(self, request: BaseRequest, params: Params) -> Any:
        name, replication = self._topic(params)
        try:  # bad settings create nothing
            ReplicationSettings.parse(
                params.get, replication.settings_for(name) or replication.defaults
            )
        except SettingsError as err:
            raise HTTPError(400, err.code, {"reason": str(err)}) from err
        # A missing topic is created, as /pub and /topic/create do (the first documented
        # command used to answer 404 TOPIC_NOT_FOUND).
        self.nsqd.get_topic(name)
        wanted = params.get("replicas")
        if self.nsqd.retention.get(name) is None and wanted not in (None, "1"):
            raise HTTPError(
                400,
                "REPLICATION_NEEDS_RETENTION",
                {"reason": "replication copies the retained log: POST /topic/retention first"},
            )
        try:
            settings = await replication.set_settings(name, params.get)
        except SettingsError as err:
            raise HTTPError(400, err.code, {"reason": str(err)}) from err
        except EtcdError as err:
            raise HTTPError(503, "ETCD_UNAVAILABLE", {"reason": str(err)}) from err
        answer = self._describe(name, replication)
        live = len(replication.node_addresses())
        if settings.replicas > live:
            answer["warning"] = (
                f"replicas={settings.replicas} but {live} nodes are live: its partitions are "
                f"placed on {live} and gain copies as nodes join"
            )
        return answer

    async def replicate(self, request: BaseRequest, params: Params) -> Any:
        """A follower's fetch stream: one ``FetchRequest`` in, one ``FetchAnswer`` out, until
        either side closes. Errors before the stream opens are ordinary HTTP answers."""
        name, replication = self._topic(params)
        origin = partition_id(params)
        if origin is None:
            raise HTTPError(400, "INVALID_ARG_PARTITION")
        if not replication.member.is_replica(request.headers.get(REPLICA_SECRET_HEADER, "")):
            await authorize_log_read(self.nsqd, request, params, name)
        # No compression (the records go as stored); a close waits a second at most for the
        # follower's answer (a paused follower must not hold up a stopping nsqd).
        ws = WebSocketResponse(
            max_msg_size=MAX_REQUEST_BYTES, autoping=True, compress=False, timeout=CLOSE_TIMEOUT
        )
        if not ws.can_prepare(request).ok:
            raise HTTPError(400, "WEBSOCKET_REQUIRED")
        try:
            await ws.prepare(request)
        except ConnectionError:  # the follower went while its stream opened: it fetches again
            return ws
        self.streams.add(ws)
        req: FetchRequest | None = None
        try:
            async for msg in ws:
                if msg.type is not WSMsgType.BINARY:
                    break
                try:
                    req = FetchRequest.decode(msg.data)
                except ValueError as err:
                    await ws.send_bytes(FetchAnswer(400, "INVALID_ARG_FETCH").encode())
                    log.warning("CLUSTER: fetch stream for %s/%d refused - %s", name, origin, err)
                    break
                answer = await replication.leading.fetch(name, origin, req)  # a follower's fetch
                await ws.send_bytes(answer.encode())
        except ConnectionError:
            pass  # the follower went: it reconnects, here or to the next leader
        finally:
            self.streams.discard(ws)
            if req is not None:
                replication.leading.stream_closed(name, origin, req)
            await ws.close()
        return ws

    async def close(self) -> None:
        """nsqd stops: its followers' streams end now (they fetch from the next leader)."""
        await asyncio.gather(*(ws.close() for ws in list(self.streams)))
