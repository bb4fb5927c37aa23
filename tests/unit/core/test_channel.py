"""Channel and topic semantics on a fake clock, without sockets."""

from __future__ import annotations

import time

import pytest

from pynsqd.core.backend import DummyBackend
from pynsqd.core.errors import NotInFlight, NotOwner, TooManyConsumers
from pynsqd.core.message import Message
from pynsqd.protocol.errors import ClientError, FatalClientError
from pynsqd.server.protocol_v2 import channel_error

from ..doubles import Consumer, _publish, _topic
from ..fakeloop import FakeLoop


def test_rdy_is_a_window_never_decremented() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    c = Consumer(rdy=2)
    ch.add_client(c)
    _publish(loop, topic, 5)
    first = c.take()
    assert len(first) == 2 and c.in_flight_count == 2
    ch.finish_many(c, [first[0].id])
    loop.run_ready()
    assert len(c.take()) == 1  # one FIN opens the window by one
    assert c.rdy == 2


def test_competing_consumers_share_and_fanout_copies_per_channel() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    a, b = Consumer(rdy=100), Consumer(rdy=100)
    ch1 = topic.get_channel("c1")
    ch1.add_client(a)
    ch1.add_client(b)
    ch2 = topic.get_channel("c2")
    c = Consumer(rdy=100)
    ch2.add_client(c)
    _publish(loop, topic, 10)
    got_a, got_b, got_c = a.take(), b.take(), c.take()
    assert got_a and got_b, "both consumers of one channel get messages"
    assert sorted(m.body for m in got_a + got_b) == sorted(m.body for m in got_c)
    assert len(got_c) == 10
    # Each channel has its own copy (state), sharing the body bytes.
    by_id = {m.id: m for m in got_a + got_b}
    for m in got_c:
        assert by_id[m.id] is not m and by_id[m.id].body is m.body


def test_topic_without_channels_keeps_messages_until_one_appears() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop, mem=10)
    _publish(loop, topic, 25)  # 10 in memory, 15 in the backend
    assert topic.depth == 25
    ch = topic.get_channel("c")
    loop.run_ready()
    assert topic.depth == 0 and ch.depth == 25
    c = Consumer(rdy=100)
    ch.add_client(c)
    ch.schedule_pump()
    loop.run_ready()
    assert sorted(m.body for m in c.take()) == sorted(b"m%d" % i for i in range(25))


def test_timeout_redelivers_with_attempts_counted() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    c = Consumer(rdy=1, msg_timeout=5.0)
    ch.add_client(c)
    _publish(loop, topic, 1)
    (m,) = c.take()
    assert m.attempts == 1
    loop.advance(4.9)
    assert c.take() == []
    loop.advance(0.2)
    (again,) = c.take()
    assert again.id == m.id and again.attempts == 2
    assert ch.timeout_count == 1 and c.in_flight_count == 1


def test_req_now_and_deferred() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    c = Consumer(rdy=1)
    ch.add_client(c)
    _publish(loop, topic, 1)
    (m,) = c.take()
    ch.requeue(c, m.id, 0)
    loop.run_ready()
    (m2,) = c.take()
    assert m2.id == m.id and m2.attempts == 2
    ch.requeue(c, m.id, 3.0)
    loop.advance(2.9)
    assert c.take() == [] and len(ch.deferred) == 1
    loop.advance(0.2)
    (m3,) = c.take()
    assert m3.attempts == 3 and ch.requeue_count == 2 and not ch.deferred


def test_fin_errors_are_non_fatal_and_exact() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    a, b = Consumer(rdy=1), Consumer(rdy=0)
    ch.add_client(a)
    ch.add_client(b)
    _publish(loop, topic, 1)
    (m,) = a.take()
    with pytest.raises(NotOwner) as owner:
        ch.finish_many(b, [m.id])
    assert owner.value.msg_id == m.id
    with pytest.raises(NotInFlight):
        ch.finish_many(a, [b"0000000000000000"])
    with pytest.raises(NotInFlight) as second:
        ch.finish_many(a, [m.id, m.id])  # the first is finished, the second is not in flight
    assert second.value.msg_id == m.id and a.finish_count == 1
    # and as nsqd words them on the wire
    assert channel_error("FIN", owner.value, b"").wire == (
        b"E_FIN_FAILED FIN " + m.id + b" failed client does not own message"
    )
    assert (
        channel_error("FIN", second.value, b"").wire
        == b"E_FIN_FAILED FIN " + m.id + b" failed ID not in flight"
    )
    assert isinstance(channel_error("FIN", second.value, b""), ClientError)  # not fatal, as nsqd


def test_touch_extends_but_is_capped_at_max_msg_timeout() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    ch.max_msg_timeout = 10.0
    c = Consumer(rdy=1, msg_timeout=4.0)
    ch.add_client(c)
    _publish(loop, topic, 1)
    (m,) = c.take()
    for _ in range(3):  # touch at 3, 6, 9 s: deadline min(now + 4, 0 + 10)
        loop.advance(3.0)
        ch.touch(c, m.id)
    assert c.take() == []
    loop.advance(1.1)  # t = 10.1 > the 10 s cap
    assert [x.id for x in c.take()] == [m.id]


def test_disconnect_requeues_in_flight_at_once() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    a, b = Consumer(rdy=5), Consumer(rdy=0)
    ch.add_client(a)
    ch.add_client(b)
    _publish(loop, topic, 3)
    assert len(a.take()) == 3
    ch.remove_client(a)
    b.rdy = 5
    ch.schedule_pump()
    loop.run_ready()  # no clock movement: the messages came back at once
    got = b.take()
    assert len(got) == 3 and all(m.attempts == 2 for m in got)
    assert all(m.client is b for m in ch.in_flight.values()) and a.in_flight_count == 0


def test_ephemeral_channel_and_topic_go_with_their_last_user() -> None:
    loop = FakeLoop()
    topic, owner = _topic(loop, "t#ephemeral")
    ch = topic.get_channel("c#ephemeral")
    c = Consumer(rdy=1)
    ch.add_client(c)
    ch.remove_client(c)
    assert "c#ephemeral" not in topic.channels
    assert owner.deleted_topics == ["t#ephemeral"]


def test_ephemeral_overflow_is_dropped() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop, "t#ephemeral", mem=5)
    _publish(loop, topic, 8)
    assert topic.depth == 5


def test_pause_stops_delivery_and_empty_clears_in_flight() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    c = Consumer(rdy=2)
    ch.add_client(c)
    ch.pause()
    _publish(loop, topic, 4)
    assert c.take() == [] and ch.depth == 4
    ch.unpause()
    loop.run_ready()
    assert len(c.take()) == 2
    ch.empty()
    assert ch.depth == 0 and not ch.in_flight and c.in_flight_count == 0


def test_max_consumers() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    ch.max_consumers = 1
    ch.add_client(Consumer())
    with pytest.raises(TooManyConsumers) as e:
        ch.add_client(Consumer())
    wire = channel_error("SUB", e.value, b"")
    assert isinstance(wire, FatalClientError)
    assert wire.wire == b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1"


def test_dpub_is_deferred_per_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    c = Consumer(rdy=5)
    ch.add_client(c)
    start_ns = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: start_ns)
    topic.put_bodies([b"later"], defer_ms=2000)
    loop.run_ready()
    assert c.take() == [] and len(ch.deferred) == 1 and ch.message_count == 1
    # The timer fires, but the wall clock says 0.5 ms early: not yet.
    monkeypatch.setattr(time, "time_ns", lambda: start_ns + 1_999_500_000)
    loop.advance(2.0015)
    assert c.take() == [] and len(ch.deferred) == 1
    monkeypatch.setattr(time, "time_ns", lambda: start_ns + 2_000_000_000)
    loop.advance(0.002)
    assert [m.body for m in c.take()] == [b"later"]


def test_spilled_messages_are_not_starved() -> None:
    loop = FakeLoop()
    topic, _ = _topic(loop, mem=4)
    ch = topic.get_channel("c")
    _publish(loop, topic, 10)  # 4 in memory, 6 in the backend
    c = Consumer(rdy=1)
    ch.add_client(c)
    seen: list[bytes] = []
    for i in range(10):
        ch.schedule_pump()
        loop.run_ready()
        (m,) = c.take()
        seen.append(m.body)
        ch.finish_many(c, [m.id])
        topic.put_bodies([b"new%d" % i])  # steady load keeps memory full
        loop.run_ready()
    assert any(b.startswith(b"m") and int(b[1:]) >= 4 for b in seen), seen


def test_the_queue_counts_its_bytes_only_when_asked_and_exactly() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pynsqd.core.message import Message
    from pynsqd.core.queue import MessageQueue

    ops = st.lists(
        st.tuples(
            st.sampled_from(["put", "keep", "front", "take", "take_memory", "drain", "empty"]),
            st.integers(0, 6),
        ),
        max_size=40,
    )

    @settings(max_examples=200, deadline=None)
    @given(ops)
    def check(sequence: list[tuple[str, int]]) -> None:
        q = MessageQueue(8, DummyBackend())
        q.count_bytes(True)
        serial = 0
        for op, n in sequence:
            msgs = [Message(b"%016d" % (serial + i), b"x" * (serial + i), 0) for i in range(n)]
            serial += n
            if op == "put":
                q.put_many(msgs)
            elif op == "keep":
                q.keep_many(msgs)
            elif op == "front":
                q.put_front(msgs)
            elif op == "take":
                q.take(n, max_bytes=n * 3)
            elif op == "take_memory":
                q.take_memory(n)
            elif op == "drain":
                q.drain_memory()
            else:
                q.empty()
            assert q.mem_bytes == sum(len(m.body) for m in q._mem)

    check()


def test_messages_made_many_at_once_are_what_the_class_makes() -> None:
    # Message.many fills each slot itself (object.__new__, then one loop): every slot must be
    # set, to what __init__ sets.
    ids = [b"%016x" % i for i in range(3)]
    bodies = [b"a", b"bb", b""]
    made = Message.many(ids, bodies, 1234)
    want = [Message(i, b, 1234) for i, b in zip(ids, bodies, strict=True)]
    for m, w in zip(made, want, strict=True):
        assert type(m) is Message
        for slot in Message.__slots__:
            assert getattr(m, slot) == getattr(w, slot), slot
    with pytest.raises(ValueError):
        Message.many(ids, bodies[:2], 1)


def test_a_replicated_channels_windows_change_only_through_its_methods() -> None:
    """What ``cluster/checkpoints.py`` asks of a channel: track a partition, take a restored
    or merged window, give up what another node adopted, and drop its offset-ID messages for
    a rebuild (the log puts them back)."""
    from pynsqd.core.offsets import DoneWindow, offset_id
    from pynsqd.core.windows import (
        adopted_below,
        drop_offset_messages,
        merge_window,
        set_window,
        track_partition,
    )

    loop = FakeLoop()
    topic, _ = _topic(loop)
    ch = topic.get_channel("c")
    assert ch.windows is None
    track_partition(ch, 1, 10)
    track_partition(ch, 1, 99)  # kept: already responsible
    assert ch.windows is not None and ch.windows[1].low == 10
    merge_window(ch, 2, DoneWindow(5, 20))
    merge_window(ch, 2, DoneWindow(15, 30))
    assert (ch.windows[2].low, ch.windows[2].end) == (5, 30)
    adopted_below(ch, 2, 30, own=False)  # another partition: closed
    assert ch.windows[2].pending(None) == []
    adopted_below(ch, 1, 50, own=True)  # its own partition: its from 50 on
    assert ch.windows[1].pending(None) == [(50, None)]
    set_window(ch, 1, DoneWindow(7))
    assert ch.windows[1].low == 7
    plain = [Message(b"%016x" % i, b"p", 1) for i in range(3)]
    coded = [Message(offset_id(1, i), b"o", 1) for i in range(5)]
    ch.put_many(plain[:2] + coded + plain[2:])
    deferred = [Message(offset_id(1, 9), b"d", 1), Message(b"%016x" % 9, b"d", 1)]
    for m in deferred:
        m.defer_until_ns = time.time_ns() + 10**12
    ch.put_deferred(deferred)
    steps = list(drop_offset_messages(ch, batch=3))
    assert steps == [3, 3, 2, 0]  # eight queued, read three at a time, then done
    assert sorted(m.id for m in ch.queue.take(100)) == sorted(m.id for m in plain)
    assert list(ch.deferred) == [b"%016x" % 9]  # only the offset-ID one left
