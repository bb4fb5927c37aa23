"""A replicated node of several workers: which worker answers a call about the cluster.

Theory of operation. With ``--etcd-endpoints`` every worker is a member of the cluster of its
own (node id ``--node-id`` + its index, ``docs/replication.md``): its own partition of each
retained topic, the copies of other members' partitions placed on it, its lease, its
checkpoints. Every member registers the node's shared addresses, so a call about the cluster
that reaches the node lands on whichever worker the kernel handed the connection to; this
module passes it to the worker that can answer it (``AdminLinks`` carries it there):

- a follower's fetch stream (``/topic/replicate``, a websocket) to the member it asks for
  (``leader=<node id>``; without it, the worker whose own partition it names, else worker 0);
- a call about a partition's log (``partition=P``, ``AdminLinks.routed``): to the worker whose
  own partition P is, else to the worker that holds a copy of P (asked in turn);
- ``GET /topic/offsets`` and ``GET /topic/replication`` without a partition: every worker's
  answer in one, each copy named by the member that holds it (``node_id``), so a reader sees
  the node as the members it is;
- ``/info``: worker 0's (the node's first id); ``POST /topic/replication``: made by the
  worker asked (any member writes the settings to etcd).
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ...http.replay import partition_id
from ...http.stats import by_partition
from ...internal.httpapi import HTTPError

if TYPE_CHECKING:
    from aiohttp.web import StreamResponse
    from aiohttp.web_request import BaseRequest

Handler = Callable[["BaseRequest", Any], Awaitable[Any]]


class Links(Protocol):
    """What the members' routing uses of the worker's admin links (``admin.AdminLinks``)."""

    index: int
    #: The node id of worker 0's member (``--node-id`` less this worker's index).
    base: int

    def peers(self) -> list[int]: ...
    async def ask_alone(
        self, peer: int, path_qs: str, request: BaseRequest
    ) -> tuple[int, bytes]: ...
    async def every_partition(self, request: BaseRequest) -> Any: ...
    async def proxy(
        self, peer: int, request: BaseRequest, body: bytes | None
    ) -> StreamResponse: ...
    async def proxy_websocket(self, peer: int, request: BaseRequest) -> Any: ...


class Members:
    """The members of this node (its workers) as the cluster's calls see them."""

    def __init__(self, links: Links, count: int) -> None:
        self.links = links
        self.count = count

    def worker_of(self, node_id: int | None) -> int | None:
        """The worker whose member has ``node_id`` (None: not one of this node's)."""
        if node_id is None:
            return None
        index = (node_id - self.links.base) % 1024
        return index if index < self.count else None

    async def holder(self, request: BaseRequest, topic: str, partition: int) -> int | None:
        """The worker holding a copy of another node's ``partition`` of ``topic`` (None: none
        does), asked in turn: this one first."""
        order = [self.links.index, *self.links.peers()]
        query = urllib.parse.urlencode({"topic": topic, "partition": str(partition)})
        for worker in order:
            status, _ = await self.links.ask_alone(worker, "/topic/offsets?" + query, request)
            if status == 200:
                return worker
        return None

    async def routed(self, request: BaseRequest, params: Any, handler: Handler) -> Any:
        """A call about a topic's log on a replicated node, with ``partition=`` or
        ``/topic/offsets`` without it (``AdminLinks.routed``)."""
        partition = partition_id(params)
        if partition is None:  # /topic/offsets: a replicated topic's copies, or each log
            doc = await self.every_member(request, params, handler)
            if doc.get("cluster") is None:
                return await self.links.every_partition(request)
            return doc
        worker = self.worker_of(partition)
        if worker is None:
            worker = await self.holder(request, request.query.get("topic", ""), partition)
            if worker is None:
                raise HTTPError(404, "PARTITION_NOT_FOUND")
        if worker == self.links.index:
            return await handler(request, params)
        return await self.links.proxy(worker, request, None)

    async def on_member(self, request: BaseRequest, params: Any, handler: Handler) -> Any:
        """A call about the cluster (``AdminLinks.on_member``)."""
        path = request.path
        if path == "/topic/replicate":
            query = request.query
            leader = self.worker_of(_int(query.get("leader")))
            worker = leader if leader is not None else self.worker_of(partition_id(params))
            worker = 0 if worker is None else worker
            if worker == self.links.index:
                return await handler(request, params)
            return await self.links.proxy_websocket(worker, request)
        if path == "/topic/replication" and request.method == "GET":
            return await self.every_member(request, params, handler)
        if path == "/info" and self.links.index != 0:
            return await self.links.proxy(0, request, None)
        return await handler(request, params)

    async def every_member(
        self, request: BaseRequest, params: Any, handler: Handler
    ) -> dict[str, Any]:
        """Every worker's answer in one: this worker's, with the others' partitions (each
        copy named by its member, ``node_id``) and node addresses added. A topic no worker
        knows is the first refusal."""
        here: Any
        try:
            here = await handler(request, params)
        except HTTPError as err:
            here = err
        peers = self.links.peers()
        answers = await asyncio.gather(
            *(self.links.ask_alone(p, request.path_qs, request) for p in peers)
        )
        docs = [here] if isinstance(here, dict) else []
        for peer, (status, text) in zip(peers, answers, strict=True):
            if status == 200:
                docs.append(json.loads(text))
            elif status <= 0:
                raise HTTPError(
                    503, "WORKER_UNAVAILABLE", {"reason": f"worker {peer} did not answer"}
                )
        if not docs:
            assert isinstance(here, HTTPError)
            raise here
        return merge_members(docs)


def merge_members(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One node's answer from its members': the first's, with every member's partitions (in
    partition order) and node addresses."""
    out = dict(docs[0])
    partitions = [q for d in docs for q in d.get("partitions", ())]
    if partitions or "partitions" in out:
        out["partitions"] = by_partition(partitions)
    nodes: dict[str, str] = {}
    for d in docs:
        nodes.update(d.get("nodes") or {})
    if "nodes" in out:
        out["nodes"] = dict(sorted(nodes.items(), key=lambda kv: int(kv[0])))
    return out


def _int(value: str | None) -> int | None:
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 4:
        return None
    return int(value)
