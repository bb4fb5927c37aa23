"""``core/peek.py`` without I/O: bodies shown safely, loop times as wall-clock milliseconds,
deferred and in-flight messages told apart and ordered."""

from __future__ import annotations

from pynsqd.core.message import Message
from pynsqd.core.peek import Clock, PeekRequest, body_view, peek_ledger


class Client:
    id = 7
    is_link = False


def test_bodies_are_text_when_utf8_else_hex_and_cut() -> None:
    assert body_view(b"hello", 3) == {
        "size": 5,
        "body": "hel",
        "encoding": "utf-8",
        "truncated": True,
    }
    assert body_view("héllo".encode(), 2)["body"] == "h"  # never half a character
    assert body_view(b"\xff\x00ab", 2) == {
        "size": 4,
        "body": "ff00",
        "encoding": "hex",
        "truncated": True,
    }
    assert body_view(b"", 10) == {"size": 0, "body": "", "encoding": "utf-8", "truncated": False}


def test_deferred_by_due_time_in_flight_by_publish_time() -> None:
    clock = Clock(loop_now=100.0, wall_ns=1_700_000_000_000_000_000)
    late, soon, old, new = (Message(b"%016d" % i, b"b", i * 10**9) for i in range(4))
    old.client = new.client = Client()  # type: ignore[assignment]
    old.delivery_ts = new.delivery_ts = 99.0
    entries = [(160.0, late), (130.0, soon), (130.5, new), (101.0, old)]
    doc = peek_ledger(entries, PeekRequest(n=10), clock)
    assert [r["due"] for r in doc["deferred"]] == [
        1_700_000_000_000 + 30_000,
        1_700_000_000_000 + 60_000,
    ]
    assert [r["timestamp"] for r in doc["in_flight"]] == [2000, 3000]
    assert doc["in_flight"][0]["client_id"] == 7
    assert doc["in_flight"][0]["delivered"] == 1_700_000_000_000 - 1000
    newest = peek_ledger(entries, PeekRequest(n=1, newest=True, kinds=("deferred",)), clock)
    assert newest == {"deferred": [newest["deferred"][0]]} and newest["deferred"][0]["due"] == (
        1_700_000_000_000 + 60_000
    )
