"""A channel's ledger of messages out of its queue (``core/in_flight.py``), on a fake clock:
an ID in flight once, second copies waiting behind it, deadlines in one timed queue, and
what a stopping channel keeps."""

from __future__ import annotations

import pytest

from pynsqd.core.errors import NotInFlight, NotOwner
from pynsqd.core.in_flight import InFlight
from pynsqd.core.message import Message

from ..doubles import Consumer
from ..fakeloop import FakeLoop


def msg(i: int) -> Message:
    return Message(b"%016d" % i, b"body", 0)


def test_an_id_flies_once_and_its_second_copy_waits_behind_it() -> None:
    loop = FakeLoop()
    due: list[Message] = []
    ledger = InFlight(loop, due.extend)
    a, b = Consumer(), Consumer()
    first, again, other = msg(1), msg(1), msg(2)
    flew = ledger.fly([first, again, other], a, now=0.0, deadline=5.0)
    assert flew == [first, other] and ledger.waiting() == 1
    assert first.attempts == 1 and first.client is a
    with pytest.raises(NotOwner):
        ledger.take(b, first.id)
    with pytest.raises(NotInFlight):
        ledger.take(a, b"%016d" % 9)
    done, err = ledger.finish_many(a, [first.id, b"%016d" % 9, other.id], None, 0)
    assert done == 1 and isinstance(err, NotInFlight)  # the rest is not looked at
    assert other.id in ledger.flying and first.client is None
    assert ledger.release([first.id]) == [again] and ledger.waiting() == 0


def test_deadlines_and_deferrals_come_due_in_one_timed_queue() -> None:
    loop = FakeLoop()
    due: list[Message] = []
    ledger = InFlight(loop, due.extend)
    c = Consumer()
    flying, later = msg(1), msg(2)
    now = loop.time()
    ledger.fly([flying], c, now=now, deadline=now + 5.0)
    ledger.defer(later, now + 3.0)
    ledger.retime(flying, now + 8.0)  # TOUCH
    loop.advance(4.0)
    assert due == [later]
    loop.advance(5.0)
    assert due == [later, flying]


def test_a_stopping_channel_keeps_what_was_in_flight_deferred_and_behind() -> None:
    loop = FakeLoop()
    ledger = InFlight(loop, lambda msgs: None)
    c = Consumer()
    flying, copy, deferred, lent = msg(1), msg(1), msg(2), msg(3)
    now = loop.time()
    ledger.fly([flying, copy, lent], c, now=now, deadline=now + 5.0)
    ledger.defer(deferred, now + 2.0)
    kept = ledger.keep_at_exit(now=now, now_ns=1_000, lent={lent.id})
    assert kept == [deferred, flying, copy]  # by due time, the copies behind last
    assert deferred.defer_until_ns == 1_000 + 2_000_000_000 and flying.defer_until_ns == 0
    assert not (ledger.flying or ledger.deferred or ledger.behind)
