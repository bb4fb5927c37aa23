"""Looking into a channel (or a topic) without consuming it (pynsqd only: ``GET /channel/peek``,
``GET /topic/peek``). No I/O beyond the queue's own non-consuming read of its backend.

Theory of operation. A peek copies what it shows and changes nothing: queued messages are read
from the head of memory and of the disk queue without being taken (``MessageQueue.peek``), and
deferred and in-flight ones are listed from the channel's ledger with the due time and deadline
their timed-queue entries hold. Each list is bounded (``PEEK_MAX`` messages; a queue scanned
for requeued messages up to ``SCAN_MAX``), and each body is shown safely: UTF-8 text as is, any
other bytes as hex, cut at ``body_max`` bytes (``truncated``). Times are wall-clock unix
milliseconds (a deadline kept in loop time is converted with the clock pair the caller gives).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol import headers
from .message import Message

#: The most messages one peek lists of each kind.
PEEK_MAX = 1000
#: Queued messages looked at for requeued ones (attempts > 0).
SCAN_MAX = 10_000
BODY_DEFAULT = 256
BODY_MAX = 64 * 1024
KINDS = ("queued", "requeued", "deferred", "in_flight")


@dataclass(frozen=True)
class PeekRequest:
    n: int = 20
    newest: bool = False
    body_max: int = BODY_DEFAULT
    kinds: tuple[str, ...] = KINDS


@dataclass(frozen=True)
class Clock:
    """The loop's time and the wall clock (ns) read together: loop times to unix ms."""

    loop_now: float
    wall_ns: int

    def unix_ms(self, loop_time: float) -> int:
        return int(self.wall_ns / 1e6 + (loop_time - self.loop_now) * 1000)


def body_view(body: bytes, limit: int) -> dict[str, Any]:
    """``body`` for JSON: text when the whole body is UTF-8 (cut at ``limit`` bytes, on a
    character's boundary), else hex of its first ``limit`` bytes."""
    try:
        body.decode()
    except UnicodeDecodeError:
        shown, encoding = body[:limit].hex(), "hex"
    else:
        shown, encoding = body[:limit].decode(errors="ignore"), "utf-8"
    return {"size": len(body), "body": shown, "encoding": encoding, "truncated": len(body) > limit}


def row(msg: Message, body_max: int) -> dict[str, Any]:
    out = {
        "id": msg.id.decode(),
        "timestamp": msg.timestamp // 1_000_000,
        "timestamp_ns": msg.timestamp,  # exact: what lists merged over workers are ordered by
        "attempts": msg.attempts,
    }
    out.update(body_view(msg.body, body_max))
    if msg.headers:  # pynsqd's message headers (protocol/headers.py), each value shown safely
        try:
            pairs = headers.decode(msg.headers)
        except headers.HeaderError:
            out["headers_undecodable"] = msg.headers.hex()
        else:
            out["headers"] = [{"name": n, **body_view(v, body_max)} for n, v in pairs]
    return out


def _ordered(
    entries: Iterable[tuple[float, Message]], req: PeekRequest, key: str
) -> list[tuple[float, Message]]:
    """(due, message) pairs by ``key`` (``"due"`` or publish ``"timestamp"``), cut to n."""
    if key == "due":
        items = sorted(entries, key=lambda e: e[0], reverse=req.newest)
    else:
        items = sorted(entries, key=lambda e: e[1].timestamp, reverse=req.newest)
    return items[: req.n]


def lent(msg: Message) -> bool:
    """In flight to another worker's link (``--workers``): lent; that worker lists it (waiting
    for a consumer there, or in flight to one), so the node's answer has it once."""
    return msg.client is not None and msg.client.is_link


def peek_lent(waiting: Sequence[Message], req: PeekRequest) -> dict[str, list[dict[str, Any]]]:
    """The messages another worker lent this channel, waiting here for a consumer (in publish
    order): queued on the node as much as the channel's own."""
    ordered = list(reversed(waiting)) if req.newest else list(waiting)
    out: dict[str, list[dict[str, Any]]] = {}
    if "queued" in req.kinds:
        out["queued"] = [row(m, req.body_max) for m in ordered[: req.n]]
    if "requeued" in req.kinds:
        again = [m for m in ordered if m.attempts > 1][: req.n]
        out["requeued"] = [row(m, req.body_max) for m in again]
    return out


def peek_queue(queue: Any, req: PeekRequest) -> dict[str, list[dict[str, Any]]]:
    """A topic's or channel's queued (and requeued: attempts > 0) messages."""
    out: dict[str, list[dict[str, Any]]] = {}
    if "queued" in req.kinds:
        out["queued"] = [row(m, req.body_max) for m in queue.peek(req.n, newest=req.newest)]
    if "requeued" in req.kinds:
        scanned = queue.peek(SCAN_MAX, newest=req.newest)
        out["requeued"] = [row(m, req.body_max) for m in scanned if m.attempts][: req.n]
    return out


def peek_ledger(
    entries: list[tuple[float, Message]], req: PeekRequest, clock: Clock
) -> dict[str, list[dict[str, Any]]]:
    """A channel's deferred (with ``due``) and in-flight (with ``client_id``, ``delivered``
    and ``deadline``) messages, from its timed queue's live entries."""
    out: dict[str, list[dict[str, Any]]] = {}
    if "deferred" in req.kinds:
        deferred = [(due, m) for due, m in entries if m.client is None]
        out["deferred"] = [
            row(m, req.body_max) | {"due": clock.unix_ms(due)}
            for due, m in _ordered(deferred, req, "due")
        ]
    if "in_flight" in req.kinds:
        flying = [(due, m) for due, m in entries if m.client is not None and not lent(m)]
        out["in_flight"] = [
            row(m, req.body_max)
            | {
                "client_id": m.client.id if m.client is not None else 0,
                "delivered": clock.unix_ms(m.delivery_ts),
                "deadline": clock.unix_ms(due),
            }
            for due, m in _ordered(flying, req, "timestamp")
        ]
    return out
