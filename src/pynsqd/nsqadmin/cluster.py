"""What nsqadmin knows of the cluster: the nsqd nodes (from nsqlookupd or the flags) and their
``/stats``, aggregated per topic and channel; and the actions, sent to every node that has the
topic. A node that does not answer is reported in ``errors``, never a failure of the page."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import urllib.parse
from collections.abc import Callable
from functools import partial
from typing import Any

import aiohttp

from ..client import ClientOptions, producer_address, producers_of, topics_of
from ..client.cluster import CHANNEL_COUNTERS
from .options import AdminOptions
from .views import channel_view, node_view, topic_view

COUNTERS = CHANNEL_COUNTERS


def _field(key: str, row: dict[str, Any]) -> Any:
    return row.get(key, 0)


def _url(address: str, path: str) -> str:
    """An address as given (``https://host:port`` for a TLS node) or ``host:port`` (http)."""
    return f"{address.rstrip('/')}{path}" if "://" in address else f"http://{address}{path}"


def _node(producer: dict[str, Any]) -> str:
    """An nsqlookupd producer's nsqd HTTP address (``pynsqd.client``'s reading of it)."""
    return producer_address(producer, "http_port") or "?"


def client_tls(opts: AdminOptions) -> ssl.SSLContext | bool:
    """The HTTP client's TLS for https:// addresses (``--http-client-tls-*``), built as the
    client package builds every TLS context; True: the system's defaults. Raises OSError
    naming an unreadable file, ssl.SSLError."""
    if not (
        opts.http_client_tls_root_ca_file
        or opts.http_client_tls_cert
        or opts.http_client_tls_insecure_skip_verify
    ):
        return True
    return ClientOptions(
        tls_verify=not opts.http_client_tls_insecure_skip_verify,
        tls_ca_file=opts.http_client_tls_root_ca_file or None,
        tls_cert_file=opts.http_client_tls_cert or None,
        tls_key_file=opts.http_client_tls_key or None,
    ).ssl_context()


#: The lists of ``GET /channel/peek``, and what each is ordered by (oldest first).
PEEK_KINDS = {
    "queued": "timestamp_ns",
    "requeued": "timestamp_ns",
    "deferred": "due",
    "in_flight": "timestamp_ns",
}

#: How long a node that stopped answering is still listed, as down (then it is forgotten).
FORGET_DOWN_AFTER = 3600.0


class Cluster:
    def __init__(self, opts: AdminOptions, clock: Callable[[], float] = time.time) -> None:
        self.opts = opts
        self._session: aiohttp.ClientSession | None = None
        self.clock = clock
        #: Each node's last ``/nodes`` row, and when it last answered: a node that stops
        #: answering (dead, or dropped by nsqlookupd as it died) is listed as down.
        self.last_rows: dict[str, tuple[float, dict[str, Any]]] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            opts = self.opts
            timeout = aiohttp.ClientTimeout(
                total=opts.http_client_request_timeout,
                sock_connect=opts.http_client_connect_timeout,
            )
            self._session = aiohttp.ClientSession(
                timeout=timeout,
                headers={"Accept": "application/vnd.nsq; version=1.0"},
                connector=aiohttp.TCPConnector(ssl=client_tls(opts)),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, address: str, path: str) -> Any:
        async with self.session.get(_url(address, path)) as r:
            if r.status != 200:
                raise RuntimeError(f"{address}{path}: HTTP {r.status} {await r.text()}")
            doc = await r.json(content_type=None)
        return doc.get("data", doc) if isinstance(doc, dict) and "data" in doc else doc

    async def _post(self, address: str, path: str) -> str | None:
        try:
            async with self.session.post(_url(address, path)) as r:
                if r.status != 200:
                    return f"{address}: HTTP {r.status} {(await r.text()).strip()}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return f"{address}: {e}"
        return None

    # -- reading ---------------------------------------------------------------------------

    async def listings(self) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """Each nsqlookupd's ``/nodes`` producers, by lookupd (those that answered); and the
        errors. The one read of nsqlookupd the node list, /nodes and /lookup share."""
        out: dict[str, list[dict[str, Any]]] = {}
        errors: list[str] = []
        for lookupd in self.opts.lookupd_http_addresses:
            try:
                doc = await self._get(lookupd, "/nodes")
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as e:
                errors.append(f"nsqlookupd {lookupd}: {e}")
                continue
            out[lookupd] = producers_of(doc)
        return out, errors

    async def nodes(
        self, listings: dict[str, list[dict[str, Any]]] | None = None
    ) -> tuple[list[str], list[str]]:
        """The nsqd HTTP addresses (given, then from every nsqlookupd: ``listings``, read now
        when not given) and the errors."""
        errors: list[str] = []
        if listings is None:
            listings, errors = await self.listings()
        nodes = list(self.opts.nsqd_http_addresses)
        for producers in listings.values():
            for p in producers:
                node = _node(p)
                if node not in nodes:
                    nodes.append(node)
        return nodes, errors

    async def stats(
        self, listings: dict[str, list[dict[str, Any]]] | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """Every node's /stats (JSON), by node; and the errors."""
        nodes, errors = await self.nodes(listings)

        async def one(node: str) -> tuple[str, Any]:
            try:
                return node, await self._get(node, "/stats?format=json")
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as e:
                return node, e

        out: dict[str, Any] = {}
        for node, result in await asyncio.gather(*(one(n) for n in nodes)):
            if isinstance(result, Exception):
                errors.append(f"nsqd {node}: {result}")
            else:
                out[node] = result
        return out, errors

    async def topics(self) -> dict[str, Any]:
        stats, errors = await self.stats()
        topics: dict[str, dict[str, Any]] = {}
        for node, s in stats.items():
            for t in s.get("topics") or []:
                agg = topics.setdefault(
                    t["topic_name"],
                    {
                        "topic": t["topic_name"],
                        "depth": 0,
                        "message_count": 0,
                        "paused": False,
                        "channels": set(),
                        "nodes": [],
                    },
                )
                agg["depth"] += t.get("depth", 0)
                agg["message_count"] += t.get("message_count", 0)
                agg["paused"] = agg["paused"] or bool(t.get("paused"))
                agg["channels"].update(c["channel_name"] for c in t.get("channels") or [])
                agg["nodes"].append(node)
        # Topics nsqlookupd knows that no node has yet (made by the create form): listed, as
        # inactive, so that what was just created is there (Go lists them on /lookup only).
        for lookupd in self.opts.lookupd_http_addresses:
            try:
                doc = await self._get(lookupd, "/topics")
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
                continue
            for name in topics_of(doc):
                if name not in topics:
                    topics[name] = {
                        "topic": name,
                        "depth": 0,
                        "message_count": 0,
                        "paused": False,
                        "channels": set(),
                        "nodes": [],
                        "inactive": True,
                    }
        rows = []
        for name in sorted(topics):
            agg = topics[name]
            rows.append({**agg, "channels": len(agg["channels"])})
        return {"topics": rows, "errors": errors}

    async def topic(self, name: str) -> dict[str, Any] | None:
        stats, errors = await self.stats()
        return topic_view(name, stats, errors)

    async def channel(self, topic: str, name: str) -> dict[str, Any] | None:
        stats, errors = await self.stats()
        return channel_view(topic, name, stats, errors)

    async def peek(
        self, topic: str, channel: str, nodes: list[str], n: int = 20
    ) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """What waits in the channel (or, with ``channel`` "", in the topic: not yet handed to
        a channel) on ``nodes`` (pynsqd's ``GET /channel/peek``, ``/topic/peek``), each
        list merged over the nodes (each row names its ``node``) and cut to ``n``; and the
        errors (a Go nsqd has no peek)."""
        args = {"topic": topic, "channel": channel} if channel else {"topic": topic}
        path = "/channel/peek?" if channel else "/topic/peek?"
        query = path + urllib.parse.urlencode(args | {"n": n})
        merged: dict[str, list[dict[str, Any]]] = {k: [] for k in PEEK_KINDS}
        errors: list[str] = []

        async def one(node: str) -> tuple[str, Any]:
            try:
                return node, await self._get(node, query)
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as e:
                return node, e

        for node, doc in await asyncio.gather(*(one(x) for x in nodes)):
            if not isinstance(doc, dict):
                errors.append(f"nsqd {node}: no peek ({doc})")
                continue
            for kind, key in PEEK_KINDS.items():
                got = doc.get(kind)
                rows = [r | {"node": node} for r in got or [] if isinstance(r, dict)]
                merged[kind] = sorted(merged[kind] + rows, key=partial(_field, key))[:n]
        return merged, errors

    async def lookup(self) -> dict[str, Any]:
        """What every nsqlookupd knows: its nodes, with their topics and tombstones."""
        lookupds: list[dict[str, Any]] = []
        listings, errors = await self.listings()
        for lookupd, listed in listings.items():
            producers = []
            for p in listed:
                topics = p.get("topics") or []
                stones = p.get("tombstones") or [False] * len(topics)
                producers.append(
                    {
                        "node": _node(p),
                        "version": p.get("version", ""),
                        "topics": [
                            {"topic": t, "tombstoned": bool(s)}
                            for t, s in zip(topics, stones, strict=False)
                        ],
                    }
                )
            lookupds.append({"lookupd": lookupd, "producers": producers})
        inactive = await self.inactive_topics(lookupds) if lookupds else []
        return {"lookupds": lookupds, "inactive_topics": inactive, "errors": errors}

    async def node_rows(self) -> dict[str, Any]:
        """``/nodes``: each nsqd's hostname, broadcast address, ports and version (its
        ``/info``), health and topic count (``/stats``), and how many nsqlookupd list it."""
        listings, errors = await self.listings()
        stats, more = await self.stats(listings)
        errors += more
        listed: dict[str, int] = {}
        for producers in listings.values():
            for p in producers:
                listed[_node(p)] = listed.get(_node(p), 0) + 1

        async def info(node: str) -> dict[str, Any]:
            try:
                doc = await self._get(node, "/info")
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
                return {}
            return doc if isinstance(doc, dict) else {}

        infos = await asyncio.gather(*(info(n) for n in stats))
        rows = []
        now = self.clock()
        for (node, s), i in zip(stats.items(), infos, strict=True):
            rows.append(
                {
                    "node": node,
                    "hostname": i.get("hostname", ""),
                    "broadcast_address": i.get("broadcast_address", ""),
                    "tcp_port": i.get("tcp_port", 0),
                    "http_port": i.get("http_port", 0),
                    "version": s.get("version", ""),
                    "health": s.get("health", ""),
                    "start_time": s.get("start_time", 0),
                    "topics": len(s.get("topics") or []),
                    "lookupd_connections": listed.get(node, 0),
                    "down_since": 0,
                }
            )
            self.last_rows[node] = (now, rows[-1])
        return {"nodes": rows + self._down(set(stats), listed, now), "errors": errors}

    def _down(self, up: set[str], listed: dict[str, int], now: float) -> list[dict[str, Any]]:
        """The nodes that answered before and do not now: their last row, marked down (its
        health says since when); forgotten ``FORGET_DOWN_AFTER`` after their last answer."""
        rows = []
        for node, (seen, row) in list(self.last_rows.items()):
            if node in up:
                continue
            if now - seen > FORGET_DOWN_AFTER:
                del self.last_rows[node]
                continue
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seen))
            rows.append(
                row
                | {
                    "health": f"DOWN - no answer since {since}",
                    "down_since": int(seen),
                    "lookupd_connections": listed.get(node, 0),
                }
            )
        return rows

    async def node(self, name: str) -> dict[str, Any] | None:
        """``/nodes/<node>``: one nsqd's topics, channels and clients (its ``/stats``)."""
        nodes, errors = await self.nodes()
        if name not in nodes:
            return None
        try:
            s = await self._get(name, "/stats?format=json")
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as e:
            return {
                "node": name,
                "topics": [],
                "channels": [],
                "clients": [],
                "errors": [*errors, f"nsqd {name}: {e}"],
            }
        return node_view(name, s, errors)

    async def inactive_topics(self, lookupds: list[dict[str, Any]]) -> list[str]:
        """Topics nsqlookupd knows (``/topics``) that no registered node lists: Go's /lookup
        notice. ``lookupds`` is ``lookup()``'s answer (each lookupd's nodes and their topics),
        so this costs one request per nsqlookupd, whatever the number of topics."""
        produced = {t["topic"] for lk in lookupds for p in lk["producers"] for t in p["topics"]}
        known: list[str] = []
        for lookupd in self.opts.lookupd_http_addresses:
            try:
                doc = await self._get(lookupd, "/topics")
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
                continue
            known += [t for t in topics_of(doc) if t not in known]
        return [t for t in known if t not in produced]

    async def create(self, topic: str, channel: str) -> list[str]:
        """Create ``topic`` (and ``channel``) as Go's nsqadmin does: in every nsqlookupd, so
        that consumers and producers find it before a node has it; with ``--nsqd-http-address``
        only, on every nsqd. The errors."""
        targets = self.opts.lookupd_http_addresses or self.opts.nsqd_http_addresses
        errors = []
        for target in targets:
            err = await self._post(
                target, f"/topic/create?{urllib.parse.urlencode({'topic': topic})}"
            )
            if not err and channel:
                query = urllib.parse.urlencode({"topic": topic, "channel": channel})
                err = await self._post(target, f"/channel/create?{query}")
            if err:
                errors.append(err)
        return errors

    async def tombstone(self, node: str, topic: str) -> list[str]:
        """nsqlookupd's ``/topic/tombstone`` on every lookupd: ``node`` stops being a producer
        of ``topic`` there for a while (so that it can be deleted from the node)."""
        query = urllib.parse.urlencode({"topic": topic, "node": node})
        errors = []
        for lookupd in self.opts.lookupd_http_addresses:
            err = await self._post(lookupd, f"/topic/tombstone?{query}")
            if err:
                errors.append(err)
        return errors

    async def notify(self, note: dict[str, Any]) -> None:
        """``--notification-http-endpoint``: a JSON note of an admin action (failures logged)."""
        url = self.opts.notification_http_endpoint
        if not url:
            return
        try:
            async with self.session.post(url, json=note) as r:
                if r.status >= 300:
                    raise RuntimeError(f"HTTP {r.status}")
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as e:
            logging.getLogger("pynsqd.nsqadmin").warning("notification to %s failed - %s", url, e)

    # -- acting ----------------------------------------------------------------------------

    async def act(self, topic: str, channel: str, action: str) -> list[str]:
        """``pause``, ``unpause``, ``empty`` or ``delete`` on every node that has the topic;
        the errors (a topic deleted everywhere is also removed from every nsqlookupd)."""
        stats, errors = await self.stats()

        def has(s: Any) -> bool:
            for t in s.get("topics") or []:
                if t["topic_name"] == topic:
                    return not channel or any(
                        c["channel_name"] == channel for c in t.get("channels") or []
                    )
            return False

        targets = [node for node, s in stats.items() if has(s)]
        query = {"topic": topic, **({"channel": channel} if channel else {})}
        path = f"/{'channel' if channel else 'topic'}/{action}?{urllib.parse.urlencode(query)}"
        results = await asyncio.gather(*(self._post(n, path) for n in targets))
        errors += [r for r in results if r]
        if action == "delete":
            for lookupd in self.opts.lookupd_http_addresses:
                err = await self._post(lookupd, path)
                if err:
                    errors.append(err)
        return errors
