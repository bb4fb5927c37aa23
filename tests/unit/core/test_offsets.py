"""Offset IDs and channel done-windows (``core/offsets.py``), against a plain set model."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.core.guid import GUIDFactory
from pynsqd.core.offsets import (
    MAX_RANGES,
    DoneWindow,
    decode_offset_id,
    is_offset_id,
    offset_id,
    offset_ids,
)


def test_offset_ids_round_trip_and_never_meet_nsqds_ids() -> None:
    ids = offset_ids(1023, (1 << 53) - 3, 3)
    assert [decode_offset_id(i) for i in ids] == [(1023, (1 << 53) - 3 + k) for k in range(3)]
    assert offset_id(7, 42) == offset_ids(7, 42, 1)[0]
    # Across 4,096-offset blocks (the prefix is formatted once per block).
    assert offset_ids(5, 4000, 9000) == [offset_id(5, o) for o in range(4000, 13000)]
    assert decode_offset_id(offset_id(0, 0)) == (0, 0)
    assert all(len(i) == 16 for i in ids)
    guids = GUIDFactory(1023).new_ids(5000)
    assert not any(is_offset_id(g) for g in guids)
    assert all(decode_offset_id(g) is None for g in guids)
    assert decode_offset_id(b"zzzzzzzzzzzzzzzz") is None
    assert decode_offset_id(b"8" * 15) is None


def pending_set(w: DoneWindow, upto: int) -> set[int]:
    out: set[int] = set()
    for s, e in w.pending(upto):
        out.update(range(s, upto if e is None else e))
    return out


ops = st.lists(
    st.one_of(
        st.tuples(st.just("mark"), st.integers(0, 80)),
        st.tuples(st.just("empty"), st.integers(0, 80)),
        st.tuples(st.just("reopen"), st.integers(0, 80), st.integers(0, 20)),
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(low=st.integers(0, 30), end=st.one_of(st.none(), st.integers(30, 90)), script=ops)
def test_a_window_is_what_a_set_would_say(low: int, end: int | None, script: list) -> None:
    upto = 100
    w = DoneWindow(low, end)
    model = set(range(low, upto if end is None else end))
    for op in script:
        if op[0] == "mark":
            w.mark(op[1])
            model.discard(op[1])
        elif op[0] == "empty":
            w.done_below(op[1])
            model = {o for o in model if o >= op[1]}
        else:
            start, n = op[1], op[2]
            w.reopen(start, start + n)
            model |= set(range(start, start + n))
        assert pending_set(w, upto) == model, (op, w)
        assert all(w.is_pending(o) == (o in model) for o in range(upto))
        back = DoneWindow.decode(w.encode())
        assert pending_set(back, upto) == model


@settings(max_examples=200, deadline=None)
@given(
    a=st.lists(st.integers(0, 60), max_size=40),
    b=st.lists(st.integers(0, 60), max_size=40),
    a_end=st.one_of(st.none(), st.integers(20, 70)),
)
def test_union_is_pending_where_either_is(a: list[int], b: list[int], a_end: int | None) -> None:
    wa, wb = DoneWindow(5, a_end), DoneWindow(10, 50)
    for o in a:
        wa.mark(o)
    for o in b:
        wb.mark(o)
    u = wa.union(wb)
    assert pending_set(u, 100) == pending_set(wa, 100) | pending_set(wb, 100)


def test_in_order_finishing_keeps_no_ranges_and_closing_ends_everything() -> None:
    w = DoneWindow(100)
    for o in [101, 102, 100, 103]:
        w.mark(o)
    assert (w.low, w.done) == (104, [])
    w.mark(110)
    assert w.pending(200) == [(104, 110), (111, 200)]
    w.close()
    assert w.pending(None) == [] and not w.is_pending(104)
    w.mark(104)  # nothing to do with it any more
    assert w.pending(None) == []


def test_too_many_holes_forget_the_highest_done_never_a_pending_one() -> None:
    w = DoneWindow(0)
    for o in range(1, 2 * (MAX_RANGES + 10), 2):
        w.mark(o)
    assert len(w.done) == MAX_RANGES
    assert all(w.is_pending(o) for o in range(0, 2 * (MAX_RANGES + 10), 2))
    assert not w.is_pending(1) and w.is_pending(2 * MAX_RANGES + 1)


def test_attempts_are_kept_for_pending_messages_and_merged_by_the_highest() -> None:
    w = DoneWindow(0)
    w.note_attempts(5, 2)
    w.note_attempts(7, 1)
    w.note_attempts(-1, 9)  # not pending: not kept
    back = DoneWindow.decode(w.encode())
    assert back.attempts == {5: 2, 7: 1}
    w.mark(5)
    assert w.attempts == {7: 1}
    other = DoneWindow(0, 20, attempts={7: 4, 9: 1})
    assert w.union(other).attempts == {7: 4, 9: 1}
    w.done_below(8)
    assert w.attempts == {}
    assert DoneWindow.decode({"low": 0, "end": None, "done": []}).attempts == {}


def test_a_reqs_due_time_is_kept_with_its_attempts_and_goes_with_them() -> None:
    w = DoneWindow(0)
    w.note_attempts(5, 1, due_ms=1_000)
    w.note_attempts(6, 1, due_ms=2_000)
    assert DoneWindow.decode(w.encode()).due == {5: 1_000, 6: 2_000}
    w.note_attempts(6, 2)  # REQ'd again with no delay: due at once
    assert w.due == {5: 1_000}
    assert w.union(DoneWindow(0, None, attempts={5: 1}, due={5: 3_000})).due == {5: 3_000}
    w.mark(5)  # FIN'd: nothing to keep
    assert w.due == {} and w.attempts == {6: 2}
    w.note_attempts(7, 1, due_ms=4_000)
    w.done_below(8)
    assert w.due == {}
    assert DoneWindow.decode({"low": 0, "end": None, "done": []}).due == {}


def test_a_replicated_channel_marks_notes_and_screens_by_offset_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a fake loop: FIN and expiry mark offsets done, a REQ notes attempts, and a message
    whose offset is no longer pending here (taken over) is dropped at delivery, counted."""
    from pynsqd.core.backend import DummyBackend
    from pynsqd.core.message import Message
    from pynsqd.core.topic import Topic
    from pynsqd.core.windows import set_window

    from ..doubles import Consumer, Owner
    from ..fakeloop import FakeLoop

    loop = FakeLoop()
    topic = Topic("t", Owner(loop), loop, node_id=1, mem_queue_size=100, backend=DummyBackend())
    ch = topic.get_channel("c")
    set_window(ch, 1, DoneWindow(0))
    set_window(ch, 2, DoneWindow(0, 10))
    msgs = [Message(i, b"x", 0) for i in offset_ids(1, 0, 5)] + [
        Message(i, b"y", 0) for i in offset_ids(2, 0, 3)
    ]
    c = Consumer(rdy=100)
    ch.add_client(c)
    ch.windows[2].close()  # partition 2's state went to another node
    ch.put_many(msgs)
    loop.run_ready()
    got = c.take()
    assert [decode_offset_id(m.id) for m in got] == [(1, o) for o in range(5)]
    assert ch.stale_count == 3
    ch.finish_many(c, [got[0].id, got[2].id])
    assert ch.windows[1].pending(5) == [(1, 2), (3, 5)]
    ch.requeue(c, got[1].id, 0)
    assert ch.windows[1].attempts == {1: 1} and ch.windows[1].due == {}
    loop.run_ready()
    assert [decode_offset_id(m.id) for m in c.take()] == [(1, 1)]
    # A REQ with a delay: the window keeps when it is due (wall clock, here a fixed one), for
    # a takeover.
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_000_000)
    ch.requeue(c, got[3].id, 60.0)
    assert ch.windows[1].due[3] == 1_700_000_000_000 + 60_000
