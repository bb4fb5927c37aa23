"""Looking into a queue on the HTTP port (pynsqd only; nsqd has no such endpoint):

- ``GET /channel/peek?topic=T&channel=C`` its queued, requeued (queued with attempts > 0),
  deferred (with ``due``) and in-flight messages (with the consumer, ``delivered`` and
  ``deadline``), and its ``depth``, ``in_flight_count`` and ``deferred_count``;
- ``GET /topic/peek?topic=T`` the topic's queued and requeued messages (not yet handed to its
  channels: a topic with no channel, a dead-letter topic's backlog).

Options: ``n`` (per kind, 1 to 1000, default 20), ``order=oldest|newest`` (publish time; a
deferred message by its due time), ``body_max`` (bytes shown of each body, 0 to 65536, default
256; UTF-8 as text, anything else as hex), ``kind`` (a comma list of ``queued``,
``requeued``, ``deferred``, ``in_flight``; default all). Nothing is consumed, reordered or
delayed (``core/peek.py``). With ``--workers`` the answer is the node's: every worker's
lists merged and cut to ``n``. A bad option is a 400 naming it (``INVALID_ARG_N``).
"""

from __future__ import annotations

import re
import time
from typing import Any

from aiohttp.web_request import BaseRequest

from ..core.peek import (
    BODY_DEFAULT,
    BODY_MAX,
    KINDS,
    PEEK_MAX,
    Clock,
    PeekRequest,
    lent,
    peek_ledger,
    peek_lent,
    peek_queue,
)
from ..internal import jsonbound
from ..internal.httpapi import HTTPError, Params, topic_arg, topic_channel_args
from .host import NSQDHost

_UINT = re.compile(r"[0-9]{1,6}")
#: How each kind's merged list (``--workers``) is ordered.
_KEYS = {
    "queued": "timestamp_ns",
    "requeued": "timestamp_ns",
    "in_flight": "timestamp_ns",
    "deferred": "due",
}


def _bounded(params: Params, name: str, default: int, low: int, high: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    if not _UINT.fullmatch(text) or not low <= int(text) <= high:
        raise HTTPError(400, f"INVALID_ARG_{name.upper()}")
    return int(text)


def peek_request(params: Params) -> PeekRequest:
    q = params.checked()
    order = q.get("order") or "oldest"
    if order not in ("oldest", "newest"):
        raise HTTPError(400, "INVALID_ARG_ORDER")
    kind = q.get("kind")
    kinds = tuple(kind.split(",")) if kind else KINDS
    if not all(k in KINDS for k in kinds):
        raise HTTPError(400, "INVALID_ARG_KIND")
    return PeekRequest(
        n=_bounded(q, "n", 20, 1, PEEK_MAX),
        newest=order == "newest",
        body_max=_bounded(q, "body_max", BODY_DEFAULT, 0, BODY_MAX),
        kinds=kinds,
    )


class PeekAPI:
    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd

    async def channel(self, request: BaseRequest, params: Params) -> Any:
        req = peek_request(params)
        topic_name, channel_name = topic_channel_args(params.checked())
        topic = self.nsqd.get_existing_topic(topic_name)
        channel = topic.channels.get(channel_name) if topic is not None else None
        if channel is None:  # with --workers, the channel may be on another worker only
            out: dict[str, Any] = {"depth": 0, "in_flight_count": 0, "deferred_count": 0}
            out |= {k: [] for k in req.kinds}
            found = False
        else:
            ledger = channel.ledger
            waiting = channel.lending.queue if channel.lending is not None else ()
            out = {
                "depth": channel.depth + len(waiting),
                "in_flight_count": sum(not lent(m) for m in ledger.flying.values()),
                "deferred_count": len(ledger.deferred),
            }
            out |= peek_queue(channel.queue, req)
            for kind, rows in peek_lent(waiting, req).items():
                out[kind] += rows  # ordered and cut to n with the other workers' (``_node``)
            clock = Clock(self.nsqd.loop.time(), time.time_ns())
            out |= peek_ledger(ledger.tq.live_entries(), req, clock)
            for r in out.get("in_flight", []):
                client = self.nsqd.clients.get(r.pop("client_id"))
                r["client"] = client.remote_address if client is not None else ""
            found = True
        found = await self._node(request, out, req, found)
        if not found:
            raise HTTPError(404, "TOPIC_NOT_FOUND" if topic is None else "CHANNEL_NOT_FOUND")
        return {"topic": topic_name, "channel": channel_name} | out

    async def topic(self, request: BaseRequest, params: Params) -> Any:
        req = peek_request(params)
        name = topic_arg(params, "INVALID_TOPIC")
        req = PeekRequest(
            req.n, req.newest, req.body_max, tuple(k for k in req.kinds if "queued" in k)
        )
        topic = self.nsqd.get_existing_topic(name)
        out: dict[str, Any] = {"depth": 0} | {k: [] for k in req.kinds}
        if topic is not None:
            out = {"depth": len(topic.queue)} | peek_queue(topic.queue, req)
        if not await self._node(request, out, req, topic is not None):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return {"topic": name} | out

    async def _node(
        self, request: BaseRequest, out: dict[str, Any], req: PeekRequest, found: bool
    ) -> bool:
        """``--workers``: every other worker's answer merged into ``out`` (counts summed, each
        list ordered again and cut to ``n``); whether any worker had it."""
        answers = await self.nsqd.workers.admin.peer_answers(request, request.path_qs)
        for text in answers or []:
            try:
                doc = jsonbound.loads(text)
            except ValueError:
                continue
            if not isinstance(doc, dict):
                continue
            found = True
            for key, value in doc.items():
                if (isinstance(value, int) and key in out and isinstance(out[key], int)) or (
                    isinstance(value, list) and key in out
                ):
                    out[key] += value
        for kind in req.kinds:
            key = _KEYS[kind]
            out[kind] = sorted(out.get(kind, []), key=lambda r: r[key], reverse=req.newest)[: req.n]
        return found
