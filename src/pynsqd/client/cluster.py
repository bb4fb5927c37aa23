"""The cluster's HTTP side: nsqlookupd (which nodes have a topic) and nsqd's HTTP API (a
channel's depth, a replayable topic's offsets and log), for the tools, the Spark connector and
the tests. Blocking (urllib), every answer read through the bounded JSON reader, every record
of a log checked (``protocol/log_record.py``).

Addresses are ``host:port`` (IPv6 hosts in brackets), or with a scheme (``http://host:port``);
lookupd's producers become ``broadcast_address`` (else ``hostname``) ``:`` port.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..internal import jsonbound
from ..protocol.log_record import Follow, LogRecord, scan_records
from .errors import NsqError, NsqLookupError
from .options import ClientOptions

__all__ = [
    "CHANNEL_COUNTERS",
    "DamagedRecord",
    "LogChunk",
    "LogOffsetOutOfRange",
    "NodeHTTPError",
    "channel_depth",
    "channel_stats",
    "find_nodes",
    "lookup_http_addresses",
    "lookup_nodes",
    "lookup_producers",
    "lookup_topics",
    "node_stats",
    "producer_address",
    "producers_of",
    "read_log",
    "report_reader",
    "topic_offsets",
    "topics_of",
]

#: A channel's counters in nsqd's ``/stats`` that are summed over nodes (nsqadmin,
#: ``nsq_stat``).
CHANNEL_COUNTERS = (
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
)

ACCEPT = "application/vnd.nsq; version=1.0"
#: The header nsqd reads a log reader's auth secret from (``http/replay.py``).
SECRET_HEADER = "X-Nsq-Auth-Secret"


class NodeHTTPError(NsqError):
    """nsqd's HTTP API answered with an error: ``status`` and its text."""

    def __init__(self, node: str, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}", text, node)
        self.node, self.status, self.text = node, status, text


class LogOffsetOutOfRange(NsqError):
    """The offset asked for is outside what the node retains: ``[earliest, latest]``."""

    def __init__(self, node: str, offset: int, earliest: int, latest: int) -> None:
        super().__init__(
            "OFFSET_OUT_OF_RANGE", f"offset {offset} is outside [{earliest}, {latest}]", node
        )
        self.node, self.offset, self.earliest, self.latest = node, offset, earliest, latest


class DamagedRecord(NsqError):
    """A record of a log read failed its checksum (or was cut): nothing after it is used."""

    def __init__(self, node: str, topic: str, what: str) -> None:
        super().__init__("DAMAGED_RECORD", f"topic {topic}: {what}", node)


@dataclass(frozen=True)
class LogChunk:
    """One ``GET /topic/log`` answer: checked records from ``first`` (after a gap, past the
    offset asked for), and ``next``, the offset to ask for next."""

    first: int
    next: int
    earliest: int
    latest: int
    records: list[LogRecord]
    #: Which log answered (the node's storage id; empty from a node too old to say).
    storage_id: str = ""


def _url(address: str, path: str, query: dict[str, str], *, tls: bool = False) -> str:
    base = address.strip().rstrip("/")
    if "://" not in base:
        base = ("https://" if tls else "http://") + base
    qs = urllib.parse.urlencode(query)
    return f"{base}{path}" + (f"?{qs}" if qs else "")


def _get(url: str, opts: ClientOptions, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body). Raises OSError when the node cannot be reached."""
    headers = {"Accept": ACCEPT}
    if opts.auth_secret:
        headers[SECRET_HEADER] = opts.auth_secret
    req = urllib.request.Request(url, headers=headers, method=method)
    context = opts.shared_ssl_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=opts.timeout, context=context) as r:
            return int(r.status), {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), {}, e.read()


def _get_json(url: str, opts: ClientOptions) -> tuple[int, Any]:
    status, _, body = _get(url, opts)
    try:
        return status, jsonbound.loads(body or b"null")
    except ValueError:
        if status == 200:
            raise
        return status, None


# -- nsqlookupd ---------------------------------------------------------------------------------
# The one reader of nsqlookupd's answers: the tools, nsq_stat, the Spark connector and
# (through the parsers, over its own async HTTP) nsqadmin.


def producer_address(p: dict[str, Any], port_key: str = "tcp_port") -> str | None:
    """A lookupd producer's ``host:port`` (``broadcast_address``, else ``hostname``; IPv6 in
    brackets) for ``port_key`` (``tcp_port`` or ``http_port``); None when it lacks one."""
    host = p.get("broadcast_address") or p.get("hostname")
    port = p.get(port_key)
    if not (host and port):
        return None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def producers_of(body: Any) -> list[dict[str, Any]]:
    """The producers of a ``/lookup`` or ``/nodes`` answer."""
    if not isinstance(body, dict):
        return []
    # The V1 envelope is the plain object; very old nsqlookupd wrapped it in "data".
    producers = body.get("producers", (body.get("data") or {}).get("producers"))
    return [p for p in producers or [] if isinstance(p, dict)]


def topics_of(body: Any) -> list[str]:
    """The topics of a ``/topics`` answer."""
    if not isinstance(body, dict):
        return []
    topics = body.get("topics", (body.get("data") or {}).get("topics"))
    return [t for t in topics or [] if isinstance(t, str)]


def _ask_all(
    lookupd_addresses: Sequence[str],
    path: str,
    query: dict[str, str],
    timeout: float,
    *,
    not_found_ok: bool,
) -> list[Any]:
    """The answer of every lookupd that answers ``path``. Raises NsqLookupError when none
    did (with ``not_found_ok``, a 404 is an empty answer: no node has the topic yet)."""
    bodies: list[Any] = []
    errors: list[str] = []
    answered = False
    opts = ClientOptions(timeout=timeout)
    for lookupd in lookupd_addresses:
        url = _url(lookupd, path, query)
        try:
            status, body = _get_json(url, opts)
        except (OSError, ValueError) as e:
            errors.append(f"{url}: {e}")
            continue
        if status == 404 and not_found_ok:  # TOPIC_NOT_FOUND: nobody has the topic (yet)
            answered = True
            continue
        if status != 200 or not isinstance(body, dict):
            errors.append(f"{url}: HTTP {status} {body}")
            continue
        answered = True
        bodies.append(body)
    if not answered:
        raise NsqLookupError("no nsqlookupd answered: " + "; ".join(errors))
    return bodies


def _query_all(
    lookupd_addresses: Sequence[str], path: str, query: dict[str, str], timeout: float
) -> list[dict[str, Any]]:
    """The producers every lookupd that answers lists. Raises NsqLookupError when none
    answered (a 404, no node has the topic yet, is an answer)."""
    bodies = _ask_all(lookupd_addresses, path, query, timeout, not_found_ok=True)
    return [p for body in bodies for p in producers_of(body)]


def _addresses(producers: list[dict[str, Any]], port_key: str) -> list[str]:
    out: list[str] = []
    for p in producers:
        addr = producer_address(p, port_key)
        if addr and addr not in out:
            out.append(addr)
    return out


def lookup_producers(
    lookupd_addresses: Sequence[str], topic: str, timeout: float = 5.0
) -> list[str]:
    """``host:port`` TCP addresses of the nsqd nodes that have ``topic``, from every lookupd.

    An empty list when the topic is unknown; NsqLookupError when no lookupd answered at all.
    """
    found = _query_all(lookupd_addresses, "/lookup", {"topic": topic}, timeout)
    return _addresses(found, "tcp_port")


def lookup_topics(lookupd_addresses: Sequence[str], timeout: float = 5.0) -> list[str]:
    """Every topic the lookupds know (``/topics``), in order of first mention. Raises
    NsqLookupError when none answered."""
    found: list[str] = []
    for body in _ask_all(lookupd_addresses, "/topics", {}, timeout, not_found_ok=False):
        found += [t for t in topics_of(body) if t not in found]
    return found


def lookup_nodes(lookupd_addresses: Sequence[str], timeout: float = 5.0) -> list[str]:
    """``host:port`` TCP addresses of every nsqd registered with the lookupds (``/nodes``)."""
    return _addresses(_query_all(lookupd_addresses, "/nodes", {}, timeout), "tcp_port")


def lookup_http_addresses(
    lookupd_addresses: Sequence[str], topic: str, timeout: float = 5.0
) -> dict[str, str]:
    """``{TCP address: HTTP address}`` of the nsqd nodes that have ``topic``, from every
    lookupd that answers. NsqLookupError when none answered."""
    out: dict[str, str] = {}
    for p in _query_all(lookupd_addresses, "/lookup", {"topic": topic}, timeout):
        tcp, http = producer_address(p, "tcp_port"), producer_address(p, "http_port")
        if tcp and http:
            out.setdefault(tcp, http)
    return out


def find_nodes(
    given: Sequence[str],
    lookupd_addresses: Sequence[str],
    topic: str,
    timeout: float = 5.0,
    *,
    port: str = "tcp",
    every_node: bool = False,
    sort_found: bool = False,
) -> tuple[list[str], NsqLookupError | None]:
    """The nodes to use: ``given`` first, then those the lookupds list for ``topic`` (and,
    with ``every_node``, every registered node), each once; ``port`` picks their TCP or HTTP
    address; ``sort_found`` sorts what the lookupds named (every caller then sees one list).
    A lookupd failure is returned beside the given nodes, for the caller to raise (nothing
    given: nothing could be known) or log in its own words."""
    nodes = list(dict.fromkeys(given))
    if not lookupd_addresses:
        return nodes, None
    key = f"{port}_port"
    try:
        producers = _query_all(lookupd_addresses, "/lookup", {"topic": topic}, timeout)
        if every_node:
            producers += _query_all(lookupd_addresses, "/nodes", {}, timeout)
    except NsqLookupError as e:
        return nodes, e
    found = [a for a in _addresses(producers, key) if a not in nodes]
    return nodes + (sorted(found) if sort_found else found), None


# -- nsqd's HTTP API ----------------------------------------------------------------------------


def node_stats(
    http_address: str,
    opts: ClientOptions,
    *,
    topic: str | None = None,
    channel: str | None = None,
) -> dict[str, Any]:
    """One nsqd's ``/stats`` (JSON; narrowed to ``topic`` and ``channel`` when given).
    Raises ConnectionError (unreachable), NodeHTTPError or ValueError (not its JSON)."""
    query = {"format": "json"}
    if topic is not None:
        query["topic"] = topic
    if channel is not None:
        query["channel"] = channel
    status, _, body = _node_get(http_address, "/stats", query, opts)
    if status != 200:
        raise NodeHTTPError(http_address, status, body.decode(errors="replace")[:200])
    doc = jsonbound.loads(body)
    if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
        doc = doc["data"]  # very old nsqd's envelope
    if not isinstance(doc, dict):
        raise ValueError(f"nsqd {http_address}: /stats is not a JSON object")
    return doc


def channel_stats(
    http_address: str, topic: str, channel: str, opts: ClientOptions
) -> dict[str, Any] | None:
    """A channel's entry of one nsqd's ``/stats`` (None: the node has no such channel).
    Raises as ``node_stats``."""
    for t in node_stats(http_address, opts, topic=topic, channel=channel).get("topics") or []:
        if not isinstance(t, dict) or t.get("topic_name") != topic:
            continue
        for c in t.get("channels") or []:
            if isinstance(c, dict) and c.get("channel_name") == channel:
                return c
    return None


def channel_depth(http_address: str, topic: str, channel: str, timeout: float = 5.0) -> int | None:
    """A channel's ``depth`` on one nsqd (its ``/stats``), or None if it does not answer or
    has no such channel."""
    try:
        c = channel_stats(http_address, topic, channel, ClientOptions(timeout=timeout))
    except (NsqError, ConnectionError, ValueError):
        return None
    return None if c is None else int(c.get("depth", 0))


def _node_get(
    node: str, path: str, query: dict[str, str], opts: ClientOptions, method: str = "GET"
) -> Any:
    try:
        return _get(_url(node, path, query, tls=opts.tls), opts, method)
    except OSError as e:
        raise ConnectionError(f"nsqd {node} unreachable - {e}") from None


def report_reader(
    node: str,
    topic: str,
    reader: str,
    offset: int,
    opts: ClientOptions,
    *,
    partition: int | None = None,
) -> None:
    """``POST /topic/reader``: a reader that keeps its own offsets tells the node it has
    committed the log (or its copy of ``partition``) below ``offset``, for its lag in
    ``/stats``. Raises NodeHTTPError with the node's own error, ConnectionError."""
    query = {"topic": topic, "reader": reader, "offset": str(offset)}
    if partition is not None:
        query["partition"] = str(partition)
    status, _, body = _node_get(node, "/topic/reader", query, opts, "POST")
    if status != 200:
        raise NodeHTTPError(node, status, body.decode(errors="replace"))


def topic_offsets(
    node: str,
    topic: str,
    opts: ClientOptions,
    timestamp_ms: int | None = None,
    *,
    partition: int | None = None,
) -> dict[str, Any]:
    """``GET /topic/offsets`` of a replayable topic on one node (``earliest``, ``latest``;
    with ``timestamp_ms``, ``offset``: the first published at or after it). Raises
    NodeHTTPError with the node's own error, ConnectionError when it cannot be reached."""
    query = {"topic": topic}
    if timestamp_ms is not None:
        query["timestamp"] = str(timestamp_ms)
    if partition is not None:
        query["partition"] = str(partition)
    status, _, body = _node_get(node, "/topic/offsets", query, opts)
    if status != 200:
        raise NodeHTTPError(node, status, body.decode(errors="replace"))
    doc = jsonbound.loads(body)
    if not isinstance(doc, dict):
        raise NodeHTTPError(node, status, "not a JSON object")
    return doc


def read_log(
    node: str,
    topic: str,
    offset: int,
    opts: ClientOptions,
    *,
    max_messages: int = 10_000,
    max_bytes: int = 16 << 20,
    partition: int | None = None,
    follow: Follow | None = None,
) -> LogChunk:
    """One ``GET /topic/log`` from ``offset``: its records, each checksum checked. Raises
    LogOffsetOutOfRange, NodeHTTPError, NsqError (a damaged record), ConnectionError.
    ``follow``: ``follow_after`` the record read before (an idempotent MPUB's identity goes on
    across reads)."""
    query = {
        "topic": topic,
        "offset": str(offset),
        "max_messages": str(max_messages),
        "max_bytes": str(max_bytes),
    }
    if partition is not None:  # a replicated topic: this node's copy of that partition
        query["partition"] = str(partition)
    status, headers, body = _node_get(node, "/topic/log", query, opts)
    if status == 400 and b"OFFSET_OUT_OF_RANGE" in body:
        doc = jsonbound.loads(body)
        raise LogOffsetOutOfRange(node, offset, int(doc["earliest"]), int(doc["latest"]))
    if status != 200:
        raise NodeHTTPError(node, status, body.decode(errors="replace"))
    records, damaged = scan_records(body, follow=follow)
    if damaged is not None:
        raise DamagedRecord(node, topic, str(damaged))
    return LogChunk(
        first=int(headers.get("x-nsq-first-offset", offset)),
        next=int(headers.get("x-nsq-next-offset", offset)),
        earliest=int(headers.get("x-nsq-earliest", 0)),
        latest=int(headers.get("x-nsq-latest", 0)),
        records=records,
        storage_id=headers.get("x-nsq-storage-id", ""),
    )
