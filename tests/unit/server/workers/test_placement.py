"""Where a topic and a producer's publishes are kept across workers (``Placement``)."""

from __future__ import annotations

from pynsqd.core.backend import DummyBackend
from pynsqd.core.topic import Topic
from pynsqd.server.workers.placement import Placement

from ...doubles import Owner
from ...fakeloop import FakeLoop


def a_topic() -> Topic:
    loop = FakeLoop()
    return Topic("orders", Owner(loop), loop, node_id=1, mem_queue_size=100, backend=DummyBackend())


def test_placement_keeps_bounded_topics_with_one_worker_and_retained_ones_everywhere() -> None:
    topic = a_topic()
    keeper = Placement(0, 3).keeper(topic.name)
    here = Placement(keeper, 3)
    other = Placement((keeper + 1) % 3, 3)
    other.place(topic, retained=True)
    assert topic.kept_by is None  # each worker appends to its own partition
    here.place(topic, retained=True)
    assert topic.kept_by is None
    replicated = Placement(1, 3, clustered=True)
    replicated.place(topic, retained=True)
    assert topic.kept_by is None  # every worker a member: its own partition, replicated
    replicated.place(topic, retained=False)
    assert topic.kept_by is None
    homes = [Placement(i, 3).home(b"producer-7") for i in range(3)]
    assert homes.count(None) == 1  # the home itself makes them
    (home,) = {h for h in homes if h is not None}
    assert homes[home] is None
    assert Placement().home(b"producer-7") is None  # one process
    # A replicated node routes a producer home as any other: its sequence in one partition.
    assert [Placement(i, 3, clustered=True).home(b"producer-7") for i in range(3)] == homes


def test_a_bound_keeps_a_plain_topic_with_its_keeper_but_not_a_retained_one() -> None:
    topic = a_topic()
    topic.max_depth = 10
    topic.refresh_bounds()
    keeper = Placement(0, 3).keeper(topic.name)
    other = Placement((keeper + 1) % 3, 3)
    other.place(topic, retained=False)
    assert topic.kept_by == keeper  # its bound is the node's
    other.place(topic, retained=True)
    assert topic.kept_by is None  # a partition per worker; the bound holds in each
