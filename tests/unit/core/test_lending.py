"""A channel's lent messages (``--workers``: ``core/lending.py``) on a fake clock: delivered
with the channel's own, oldest first, and every end of one (FIN, REQ, timeout, its consumer
leaving, TOUCH) goes back to the link it came by, never into this channel's queue; and
``/stats`` of several workers summed (``http/stats.merge_stats``)."""

from __future__ import annotations

from pynsqd.core.lending import Lending
from pynsqd.core.message import Message
from pynsqd.http.stats import merge_stats

from ..doubles import Consumer, _publish, _topic
from ..fakeloop import FakeLoop


class Link:
    """A lender that records what goes back to it."""

    def __init__(self) -> None:
        self.fins: list[bytes] = []
        self.reqs: list[tuple[bytes, int]] = []
        self.touches: list[bytes] = []

    def fin(self, ids: list[bytes]) -> None:
        self.fins.extend(ids)

    def req(self, msg_id: bytes, timeout_ms: int) -> None:
        self.reqs.append((msg_id, timeout_ms))

    def touch(self, msg_id: bytes) -> None:
        self.touches.append(msg_id)


class Demand:
    def __init__(self) -> None:
        self.changes = 0
        self.consumers = 0

    def demand_changed(self) -> None:
        self.changes += 1

    def consumers_changed(self) -> None:
        self.consumers += 1


#: Published after everything the tests publish here (a message's age is its publish time).
LATER = 2**62


def lent(n: int, prefix: bytes = b"L", ts: int = LATER, first: int = 0) -> list[Message]:
    return [
        Message(b"%016x" % (0xF000 + first + i), prefix + b"%d" % (first + i), ts + i, attempts=1)
        for i in range(n)
    ]


def setup(rdy: int = 10, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    loop = FakeLoop()
    topic, _owner = _topic(loop)
    ch = topic.get_channel("c")
    demand = Demand()
    ch.lending = Lending(demand)
    consumer = Consumer(rdy=rdy, msg_timeout=timeout)
    ch.add_client(consumer)
    return loop, topic, ch, demand, consumer


def test_own_messages_first_then_lent_ones_and_fin_goes_back() -> None:
    loop, topic, ch, demand, consumer = setup(rdy=3)
    assert demand.consumers == 1
    link = Link()
    ch.lending.add(lent(2), link)  # type: ignore[union-attr]
    ch.schedule_pump()  # as the relay does
    _publish(loop, topic, 2)
    loop.run_ready()
    got = consumer.take()
    assert [m.body for m in got] == [b"m0", b"m1", b"L0"]  # the channel's own are older
    assert got[2].attempts == 1  # counted by the worker that lent it, not again here
    ch.finish_many(consumer, [m.id for m in got])
    loop.run_ready()
    assert link.fins == [got[2].id]
    (last,) = consumer.take()
    assert last.body == b"L1"
    assert demand.changes > 0


def test_lent_and_own_messages_are_handed_out_in_publish_order() -> None:
    """One nsqd's order over the workers: lent messages published before this worker's own go
    first, those after them after; lent batches arriving out of order are merged in."""
    loop, topic, ch, _demand, consumer = setup(rdy=0)
    link = Link()
    _publish(loop, topic, 2)  # m0, m1: published now
    now = next(ch.queue.oldest()).timestamp  # type: ignore[arg-type]
    ch.lending.add(lent(2, ts=now + 10, first=2), link)  # type: ignore[union-attr]
    ch.lending.add(lent(2, ts=now - 10), link)  # type: ignore[union-attr]  # older: merged in
    loop.run_ready()
    consumer.rdy = 6
    ch.schedule_pump()
    loop.run_ready()
    assert [m.body for m in consumer.take()] == [b"L0", b"L1", b"m0", b"m1", b"L2", b"L3"]


def test_finely_interleaved_queues_go_out_in_order_in_one_write_per_consumer() -> None:
    """Messages published through two workers at once alternate in age: each pump hands a
    consumer its whole window, merged in publish order, in one write (not a write per run)."""
    loop, topic, ch, _demand, consumer = setup(rdy=0)
    _publish(loop, topic, 6)
    own = list(ch.queue.oldest() or [])
    for i, m in enumerate(own):
        m.timestamp = 1000 + 2 * i  # m0 < L0 < m1 < L1 ...
    ch.lending.add(  # type: ignore[union-attr]
        [Message(b"%016x" % (0xF000 + i), b"L%d" % i, 1001 + 2 * i, attempts=1) for i in range(6)],
        Link(),
    )
    writes: list[int] = []
    send = consumer.send_messages

    def counted(msgs: list[Message]) -> None:
        writes.append(len(msgs))
        send(msgs)

    consumer.send_messages = counted  # type: ignore[method-assign]
    consumer.rdy = 9
    ch.schedule_pump()
    loop.run_ready()
    got = [m.body for m in consumer.take()]
    assert got == [b"m0", b"L0", b"m1", b"L1", b"m2", b"L2", b"m3", b"L3", b"m4"]
    assert writes == [9]


def test_a_requeued_own_message_goes_behind_lent_ones_published_before_its_requeue() -> None:
    """go-nsq's pattern: the consumer REQs this worker's message at once, again and again;
    the messages other workers lent (published before) reach it before the REQ'd one again."""
    loop, topic, ch, _demand, consumer = setup(rdy=1)
    _publish(loop, topic, 1)
    loop.run_ready()
    (failing,) = consumer.take()
    link = Link()
    ch.lending.add(lent(2, ts=failing.timestamp - 100), link)  # type: ignore[union-attr]
    ch.requeue(consumer, failing.id, 0.0)
    loop.run_ready()
    seen = []
    for _ in range(3):
        (m,) = consumer.take()
        seen.append(m.body)
        ch.finish_many(consumer, [m.id])
        loop.run_ready()
    assert seen == [b"L0", b"L1", failing.body]


def test_req_timeout_and_a_leaving_consumer_give_lent_messages_back() -> None:
    loop, _topic, ch, _demand, consumer = setup(rdy=3, timeout=5.0)
    link = Link()
    ch.lending.add(lent(3), link)  # type: ignore[union-attr]
    ch.schedule_pump()  # as the relay does
    loop.run_ready()
    a, b, c = consumer.take()
    ch.touch(consumer, a.id)
    assert link.touches == [a.id]
    ch.requeue(consumer, a.id, 2.0)
    assert link.reqs == [(a.id, 2000)]
    loop.advance(5.1)  # b and c time out here: back to their worker, not into this queue
    assert sorted(link.reqs[1:]) == sorted([(b.id, 0), (c.id, 0)])
    assert ch.depth == 0 and not ch.in_flight and ch.requeue_count == 0
    ch.lending.add(lent(1, b"M"), link)  # type: ignore[union-attr]
    ch.schedule_pump()  # as the relay does
    loop.run_ready()
    (d,) = consumer.take()
    ch.remove_client(consumer)
    assert link.reqs[-1] == (d.id, 0)
    assert ch.depth == 0


def test_lent_messages_go_to_this_workers_consumers_never_on_to_another_link() -> None:
    """A lent message is not lent again: another worker's link is a consumer of this channel
    too, but what this channel holds for a third worker goes only to its own consumers. Lent
    on, it could come back by a link of its own (w1 to w3 to w0 to w3): the second copy took
    the first one's lender, the FIN of the first went nowhere, and the worker that kept it
    held it in flight for 15 minutes (pynsq's requeue test under --workers 4, retained: some
    messages redelivered 11 times, others never finished)."""
    loop, _topic, ch, _demand, consumer = setup(rdy=1)
    other = Consumer(rdy=5)  # a link from another worker: RDY as its worker's consumers want
    other.is_link = True
    ch.add_client(other)
    link = Link()
    ch.lending.add(lent(3), link)  # type: ignore[union-attr]
    ch.schedule_pump()  # as the relay does
    loop.run_ready()
    assert other.take() == []  # never on to another worker
    (a,) = consumer.take()
    ch.finish_many(consumer, [a.id])
    loop.run_ready()
    assert link.fins == [a.id]
    (b,) = consumer.take()
    assert b.body == b"L1"
    assert ch.lending.queue and other.take() == []  # type: ignore[union-attr]


def test_a_closed_links_messages_are_dropped_here_not_kept() -> None:
    loop, _topic, ch, _demand, consumer = setup(rdy=1, timeout=5.0)
    link = Link()
    ch.lending.add(lent(3), link)  # type: ignore[union-attr]
    ch.schedule_pump()  # as the relay does
    loop.run_ready()
    assert len(consumer.take()) == 1
    ch.lending.forget(link)  # type: ignore[union-attr]
    loop.advance(5.1)  # a times out: its worker already took it back; nothing kept here
    assert link.reqs == [] and ch.depth == 0 and not ch.in_flight
    loop.run_ready()
    assert consumer.take() == []  # the two that waited here went with the link


def test_a_channel_closed_keeps_no_lent_message_on_its_disk() -> None:
    loop, topic, ch, _demand, consumer = setup(rdy=5)
    ch.lending.add(lent(2), Link())  # type: ignore[union-attr]
    ch.schedule_pump()  # as the relay does
    _publish(loop, topic, 1)
    loop.run_ready()
    assert len(consumer.take()) == 3
    ch.close(delete=False)
    assert [m.body for m in ch.queue.backend.read_many(10)] == [b"m0"]


def test_stats_of_workers_are_summed_and_links_are_not_clients() -> None:
    link_client = {"user_agent": "pynsqd-worker-link/0.1.0", "in_flight_count": 4}
    real = {"user_agent": "pynsq/0.9", "in_flight_count": 4}
    w0 = [
        {
            "topic_name": "t",
            "depth": 1,
            "paused": False,
            "channels": [
                {
                    "channel_name": "c",
                    "depth": 2,
                    "in_flight_count": 4,
                    "clients": [real],
                    "lifecycle": {"max_attempts": 2, "dead_letter_count": 3},
                }
            ],
        }
    ]
    w1 = [
        {
            "topic_name": "t",
            "depth": 3,
            "paused": False,
            "channels": [
                {
                    "channel_name": "c",
                    "depth": 5,
                    "in_flight_count": 4,
                    "clients": [link_client],
                    "lifecycle": {"max_attempts": 2, "dead_letter_count": 4},
                },
                {"channel_name": "d", "depth": 1, "in_flight_count": 0, "clients": []},
            ],
        },
        {"topic_name": "a", "depth": 0, "paused": True, "channels": []},
    ]
    topics, producers = merge_stats([(w0, None), (w1, [link_client, real])])
    assert topics is not None
    assert [t["topic_name"] for t in topics] == ["a", "t"]
    t = topics[1]
    assert t["depth"] == 4 and t["paused"] is False
    # d is on one worker of two (being made on the other): not the node's yet.
    (c,) = t["channels"]
    # The link's 4 in flight are the 4 the consumer holds: counted once.
    assert (c["depth"], c["in_flight_count"], c["clients"]) == (7, 4, [real])
    assert c["lifecycle"] == {"max_attempts": 2, "dead_letter_count": 7}  # a setting, a count
    assert producers == [real]
    assert merge_stats([(None, None), (None, None)]) == (None, None)


def test_workers_option_counts_and_auto() -> None:
    import pytest

    from pynsqd.internal.checks import check_workers, usable_cores, workers_count

    assert check_workers("auto") == "auto" and check_workers("04") == "4"
    for bad in ("0", "-1", "257", "two", ""):
        with pytest.raises(ValueError):
            check_workers(bad)
    assert workers_count("3") == 3
    assert workers_count("auto") == usable_cores() >= 1


def test_a_worker_with_more_than_its_share_lets_the_others_accept(tmp_path: object) -> None:
    """``Workers.admit``'s arithmetic over the shared counts (``ConnectionCounts``): a worker
    takes the next connection while it holds no more than one more than the least loaded live
    worker; one that is down counts as full."""
    import os

    from pynsqd.server.workers.spec import ConnectionCounts

    path = os.path.join(str(tmp_path), "counts")
    counts = ConnectionCounts.create(path, 3)
    assert counts.least_but(0) == ConnectionCounts.DOWN  # nobody up: worker 0 takes them
    other = ConnectionCounts(path, 3)  # another worker's view of the same file
    counts.set(0, 4)
    other.set(1, 2)
    assert counts.least_but(0) == 2  # worker 2 is down: not counted
    assert other.least_but(1) == 4
    other.set(2, 3)
    assert counts.least_but(0) == 2 and counts.least_but(2) == 2
    counts.set(1, ConnectionCounts.DOWN)  # the supervisor saw worker 1 exit
    assert counts.least_but(0) == 3
    counts.close()
    other.close()


def test_a_lenders_waiting_messages_go_back_when_its_worker_gets_consumers() -> None:
    """A link to a worker without consumers keeps messages waiting here; once that worker's
    copy has consumers of its own, what waits (not what is in flight) goes back to it."""
    loop, _topic, ch, _demand, consumer = setup(rdy=1)
    one, other = Link(), Link()
    ch.lending.add(lent(3), one)  # type: ignore[union-attr]
    ch.lending.add(lent(1, prefix=b"O", first=10), other)  # type: ignore[union-attr]
    ch.schedule_pump()
    loop.run_ready()
    (flying,) = consumer.take()
    assert flying.body == b"L0"
    ch.lending.give_back_waiting(one)  # type: ignore[union-attr]
    assert [i for i, _ in one.reqs] == [b"%016x" % (0xF000 + i) for i in (1, 2)]
    assert [m.body for m in ch.lending.queue] == [b"O10"]  # type: ignore[union-attr]
    ch.finish_many(consumer, [flying.id])  # the one in flight still ends at its lender
    assert one.fins == [flying.id]
