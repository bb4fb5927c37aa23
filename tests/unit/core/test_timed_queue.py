"""The one timed priority queue: due order, lazy removal, one timer, bounded stale entries."""

from __future__ import annotations

from pynsqd.core.message import Message
from pynsqd.core.timed_queue import TimedQueue

from ..fakeloop import FakeLoop


def _msg(i: int) -> Message:
    return Message(b"%016x" % i, b"body", 0)


def _queue() -> tuple[FakeLoop, TimedQueue, list[list[bytes]]]:
    loop = FakeLoop()
    fired: list[list[bytes]] = []
    tq = TimedQueue(loop, lambda msgs: fired.append([m.id for m in msgs]))
    return loop, tq, fired


def test_fires_in_due_order_at_due_time() -> None:
    loop, tq, fired = _queue()
    a, b, c = _msg(1), _msg(2), _msg(3)
    tq.push(b, loop.now + 2.0)
    tq.push(a, loop.now + 1.0)
    tq.push(c, loop.now + 3.0)
    loop.advance(0.99)
    assert fired == []
    loop.advance(0.02)
    assert fired == [[a.id]]
    loop.advance(2.0)
    assert fired == [[a.id], [b.id], [c.id]]
    assert len(tq) == 0


def test_removed_entries_never_fire() -> None:
    loop, tq, fired = _queue()
    msgs = [_msg(i) for i in range(10)]
    tq.push_many(msgs, loop.now + 1.0)
    for m in msgs[::2]:
        tq.remove(m)
    assert len(tq) == 5
    loop.advance(1.5)
    assert fired == [[m.id for m in msgs[1::2]]]


def test_repush_moves_the_deadline() -> None:
    loop, tq, fired = _queue()
    m = _msg(1)
    tq.push(m, loop.now + 1.0)
    tq.remove(m)
    tq.push(m, loop.now + 5.0)  # a TOUCH
    loop.advance(2.0)
    assert fired == []
    loop.advance(4.0)
    assert fired == [[m.id]]


def test_one_timer_armed_at_the_earliest_due_time() -> None:
    loop, tq, _ = _queue()
    for i in range(100):
        tq.push(_msg(i), loop.now + 10.0 + i)
    assert loop.armed_timers == 1
    tq.push(_msg(1000), loop.now + 1.0)  # earlier: re-armed, the old timer cancelled
    assert loop.armed_timers == 1


def test_stale_entries_stay_bounded() -> None:
    loop, tq, _ = _queue()
    # Deliver and FIN a million messages long before their deadline, with ~100 in flight.
    window: list[Message] = []
    for i in range(200_000):
        m = _msg(i)
        tq.push(m, loop.now + 60.0)
        window.append(m)
        if len(window) > 100:
            tq.remove(window.pop(0))
    assert len(tq) == 100
    assert tq._refs <= 3 * 100 + 8192 + 1 and len(tq._heap) <= tq._refs


def test_clear_returns_live_messages_earliest_first() -> None:
    loop, tq, fired = _queue()
    a, b, c = _msg(1), _msg(2), _msg(3)
    tq.push(c, loop.now + 3)
    tq.push(a, loop.now + 1)
    tq.push(b, loop.now + 2)
    tq.remove(b)
    assert [m.id for m in tq.clear()] == [a.id, c.id]
    loop.advance(10)
    assert fired == []
    assert a.tq_seq == 0 and c.tq_seq == 0
