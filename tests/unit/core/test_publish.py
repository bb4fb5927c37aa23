"""The one publish decision (``core/publish.py``): every outcome, on real topics (in memory and
with a real log on disk) and a gate that answers as a replicated node's would; no sockets.

The answers' table is checked against the answers nsqd and pynsqd gave before the decision had
one home (the TCP error lines and the HTTP status, text and JSON)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from pynsqd.core.backend import DummyBackend
from pynsqd.core.channel import Channel
from pynsqd.core.dedup import DedupError
from pynsqd.core.errors import NotYetWritable, PublishRefused, QueueFull
from pynsqd.core.message import Message
from pynsqd.core.publish import (
    REFUSALS,
    Done,
    Forward,
    Refusal,
    Refused,
    WaitCommit,
    WaitWritable,
    decide,
    http_error,
    not_committed,
    tcp_error,
)
from pynsqd.core.topic import Topic
from pynsqd.storage.topiclog import TopicLog

from ..fakeloop import FakeLoop


class Owner:
    """The nsqd side of a topic, as little as a publish needs."""

    def __init__(self, loop: FakeLoop) -> None:
        self.loop = loop

    def make_channel(self, topic: Topic, name: str) -> Channel:
        return Channel(
            topic, name, self.loop, mem_queue_size=100, backend=DummyBackend(), max_msg_timeout=9
        )

    def channel_deleted(self, topic: Topic, channel: Channel) -> None:
        pass

    def topic_emptied_of_channels(self, topic: Topic) -> None:
        pass

    def dead_letter(
        self, topic: Topic, channel: Channel, msgs: list[Message]
    ) -> OSError | QueueFull | None:
        return None

    def metadata_changed(self) -> None:
        pass


class Gate:
    """A replicated node's gate and commit point: what ``Replicator`` answers a publish."""

    def __init__(self, *, replicated: bool = True, committed_to: int = 0) -> None:
        self.replicated = replicated
        self.committed_to = committed_to
        #: What the gate raises next (once).
        self.raises: Exception | None = None
        self.gated: list[str] = []

    @property
    def publishing(self) -> Gate:
        return self

    def gate(self, topic: str) -> bool:
        self.gated.append(topic)
        err, self.raises = self.raises, None
        if err is not None:
            raise err
        return self.replicated

    def committed(self, topic: str, end: int) -> bool:
        return end <= self.committed_to

    def wait(self, topic: str, end: int, done: Callable[[str | None], None]) -> None:
        """Answered at once: committed if the commit point is past ``end``."""
        done(None if end <= self.committed_to else f"{topic} not committed to {end}")


def waits(outcome: object) -> tuple[int, int, int]:
    """A ``WaitCommit``'s (end, duplicates, written)."""
    assert isinstance(outcome, WaitCommit), outcome
    return outcome.end, outcome.duplicates, outcome.written


def memory_topic(name: str = "t") -> Topic:
    loop = FakeLoop()
    return Topic(name, Owner(loop), loop, node_id=1, mem_queue_size=100, backend=DummyBackend())


@pytest.fixture
def retained(tmp_path: Path) -> Topic:
    topic = memory_topic()
    topic.log = TopicLog(
        str(tmp_path / "t.log"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    return topic


def test_a_plain_publish_is_done_without_an_offset() -> None:
    topic = memory_topic()
    assert decide(topic, [b"a", b"b"]) == Done(-1, 0, 2)
    assert topic.message_count == 2 and topic.depth == 2


def test_a_retained_publish_is_done_with_the_offset_past_it(retained: Topic) -> None:
    assert decide(retained, [b"a", b"b", b"c"]) == Done(3, 0, 3)
    assert decide(retained, [b"d"]) == Done(4, 0, 1)
    assert decide(retained, [b"e"], 5_000) == Done(5, 0, 1)


def test_an_empty_publish_is_done_and_writes_nothing(retained: Topic) -> None:
    assert decide(retained, []) == Done()
    assert retained.message_count == 0


def test_an_exiting_topic_refuses_before_anything_else(retained: Topic) -> None:
    retained.exiting = True
    retained.kept_by = 2
    out = decide(retained, [b"a"], replication=Gate())
    assert isinstance(out, Refused) and out.why is Refusal.EXITING
    assert str(tcp_error("MPUB", out)) == "E_MPUB_FAILED MPUB failed exiting"
    assert http_error(out) == (503, "EXITING", None)


def test_a_topic_kept_by_another_worker_is_forwarded_unless_it_came_over_a_link() -> None:
    topic = memory_topic()
    topic.kept_by = 3
    gate = Gate()
    assert decide(topic, [b"a"], replication=gate) == Forward(3)
    assert gate.gated == [] and topic.message_count == 0  # decided before the gate and put
    assert decide(topic, [b"a"], forwarded=True) == Done(-1, 0, 1)


def test_an_identified_publish_goes_to_its_producers_home_worker(retained: Topic) -> None:
    """--workers: a retained topic is every worker's, but a producer's sequence lives in one
    partition: its publishes are made by its home worker (``Placement.home``); a plain one,
    one that came over a link and one whose home is here are made here."""
    homes = {b"far": 2, b"near": None}
    home = homes.__getitem__
    assert decide(retained, [b"a"], identity=(b"far", 1), home=home) == Forward(2)
    assert retained.message_count == 0
    assert decide(retained, [b"a"], identity=(b"far", 1), home=home, forwarded=True) == Done(
        1, 0, 1
    )
    assert decide(retained, [b"b"], identity=(b"near", 1), home=home) == Done(2, 0, 1)
    assert decide(retained, [b"c"], home=home) == Done(3, 0, 1)
    plain = memory_topic()  # no log: refused here (identities need one), not forwarded
    assert not isinstance(decide(plain, [b"a"], identity=(b"far", 1), home=home), Forward)


def test_an_identified_publish_reports_its_duplicates(retained: Topic) -> None:
    assert decide(retained, [b"a", b"b"], identity=(b"p", 1)) == Done(2, 0, 2)
    # A retry of both and one more: the two are not written again.
    assert decide(retained, [b"a", b"b", b"c"], identity=(b"p", 1)) == Done(3, 2, 1)
    # All duplicates: the end is past the last duplicate's record, nothing written.
    assert decide(retained, [b"b"], identity=(b"p", 2)) == Done(2, 1, 0)
    assert retained.message_count == 3


def test_identity_refusals_keep_their_own_codes(retained: Topic) -> None:
    assert isinstance(decide(retained, [b"a"], identity=(b"p", 1)), Done)
    out = decide(retained, [b"other"], identity=(b"p", 1))
    assert isinstance(out, Refused) and out.why is Refusal.IDENTITY
    assert out.code == "E_CONFLICT"
    assert tcp_error("PUB", out).code == "E_CONFLICT"
    assert http_error(out)[:2] == (409, "CONFLICT")
    # The dedup index's "try again" takes the command's name on TCP, 503 on HTTP.
    again = Refused(Refusal.IDENTITY, "not settled", "E_PUB_FAILED", error=DedupError("x", "y"))
    assert tcp_error("DPUB", again).code == "E_DPUB_FAILED"
    assert http_error(again) == (503, "PUB_FAILED", {"reason": "not settled"})
    bad = Refused(Refusal.IDENTITY, "expected 2", "E_BAD_SEQUENCE")
    assert tcp_error("PUB", bad).code == "E_BAD_SEQUENCE"
    assert http_error(bad) == (400, "BAD_SEQUENCE", {"reason": "expected 2"})


def test_an_identified_publish_to_a_topic_without_a_log_is_refused() -> None:
    out = decide(memory_topic("plain"), [b"a"], identity=(b"p", 1))
    assert isinstance(out, Refused) and out.why is Refusal.NOT_RETAINED
    err = tcp_error("PUB", out)
    assert err.code == "E_NOT_RETAINED" and err.desc.startswith("PUB failed topic plain keeps")
    status, text, extra = http_error(out)
    assert (status, text) == (400, "NOT_RETAINED") and "plain" in (extra or {})["reason"]


def test_a_full_bounded_queue_refuses_and_stores_nothing() -> None:
    topic = memory_topic()
    topic.max_depth = 5
    topic.refresh_bounds()
    assert decide(topic, [b"m"] * 5) == Done(-1, 0, 5)
    out = decide(topic, [b"a"])
    assert isinstance(out, Refused) and out.why is Refusal.QUEUE_FULL
    assert topic.message_count == 5
    assert str(tcp_error("PUB", out)) == "E_PUB_FAILED PUB failed t is full (5 of 5 messages)"
    assert http_error(out) == (503, "QUEUE_FULL", {"queue": "t", "depth": 5, "max_depth": 5})


def test_a_failed_disk_write_is_refused_with_the_error(retained: Topic) -> None:
    assert retained.log is not None
    retained.log.close()
    out = decide(retained, [b"a"])
    assert isinstance(out, Refused) and out.why is Refusal.DISK
    assert isinstance(out.error, OSError)
    assert tcp_error("PUB", out).code == "E_PUB_FAILED"
    assert http_error(out) == (503, "EXITING", None)


def test_the_gate_refusal_names_its_own_code(retained: Topic) -> None:
    gate = Gate()
    gate.raises = PublishRefused("this node has not joined the cluster yet", "NOT_JOINED")
    out = decide(retained, [b"a"], replication=gate)
    assert isinstance(out, Refused) and out.why is Refusal.NOT_HERE
    assert retained.message_count == 0
    assert str(tcp_error("PUB", out)) == (
        "E_PUB_FAILED PUB failed this node has not joined the cluster yet"
    )
    assert http_error(out) == (
        503,
        "NOT_JOINED",
        {"reason": "this node has not joined the cluster yet"},
    )


def test_a_partition_being_taken_back_waits_and_writes_nothing(retained: Topic) -> None:
    gate = Gate()
    gate.raises = NotYetWritable("t")
    assert decide(retained, [b"a"], replication=gate) == WaitWritable()
    assert retained.message_count == 0
    # Decided again once writable: written, and waits for its commit.
    assert waits(decide(retained, [b"a"], replication=gate)) == (1, 0, 1)


def test_a_replicated_publish_waits_for_its_commit_unless_committed(retained: Topic) -> None:
    gate = Gate(committed_to=0)
    outcome = decide(retained, [b"a", b"b"], replication=gate)
    assert waits(outcome) == (2, 0, 2)
    assert isinstance(outcome, WaitCommit)
    answers: list[str | None] = []
    outcome.wait(answers.append)  # the replication's wait, for this topic and end
    assert answers == ["t not committed to 2"]
    gate.committed_to = 2
    # A retry of what is committed is answered at once; new records wait.
    assert waits(decide(retained, [b"x"], identity=(b"p", 1), replication=gate)) == (3, 0, 1)
    gate.committed_to = 3
    assert decide(retained, [b"x"], identity=(b"p", 1), replication=gate) == Done(3, 1, 0)


def test_a_topic_the_gate_does_not_replicate_is_done_at_once(retained: Topic) -> None:
    assert decide(retained, [b"a"], replication=Gate(replicated=False)) == Done(1, 0, 1)


def test_a_wait_that_ended_without_it_is_answered_alike_on_both_protocols() -> None:
    out = not_committed("not committed in --replication-timeout=5s")
    assert str(tcp_error("MPUB", out)) == (
        "E_MPUB_FAILED MPUB failed not committed in --replication-timeout=5s"
    )
    assert http_error(out) == (
        503,
        "PUB_FAILED",
        {"reason": "not committed in --replication-timeout=5s"},
    )


def test_every_refusal_has_a_row_or_its_own_codes() -> None:
    assert set(REFUSALS) == set(Refusal) - {Refusal.IDENTITY}
    for row in REFUSALS.values():
        assert row.tcp.startswith("E_") and 400 <= row.status < 600


def test_an_identified_publish_past_the_last_sequence_number_is_refused(retained: Topic) -> None:
    """An MPUB numbered from 2^63-1 would store 2^63, which PUB and HTTP refuse and 64-bit
    readers overflow on (issue 56): refused whole, nothing written; the last number itself
    is taken."""
    last = (1 << 63) - 1
    out = decide(retained, [b"a", b"b"], identity=(b"p", last))
    assert isinstance(out, Refused) and out.code == "E_BAD_SEQUENCE"
    assert retained.message_count == 0
    assert str(tcp_error("MPUB", out)) == (
        f"E_BAD_SEQUENCE MPUB failed producer p sequences {last}-{last + 1} pass the last "
        f"sequence number, {last}"
    )
    assert http_error(out)[:2] == (400, "BAD_SEQUENCE")
    assert decide(retained, [b"a"], identity=(b"p", last)) == Done(1, 0, 1)


@pytest.mark.parametrize("kind", ["memory", "retained"])
def test_a_backlog_shrinks_while_publishers_add_more_than_a_batch_every_turn(
    kind: str, tmp_path: Path
) -> None:
    """Found by Go's bench tools against one core (issue 53 item 3): messages published
    before the channel existed waited in the topic, and every publish after them queued
    behind them; the topic handed its channels one batch (1,024) a loop turn while 16 MPUB
    connections added 3,200, so the backlog grew for as long as they published and the
    consumers, with RDY to spare, got a third of what was accepted. Each turn now hands over
    a batch on top of what was added since the last."""
    loop = FakeLoop()
    topic = Topic("t", Owner(loop), loop, node_id=1, mem_queue_size=1 << 20, backend=DummyBackend())
    if kind == "retained":
        topic.log = TopicLog(
            str(tmp_path / "t.log"),
            segment_bytes=1 << 24,
            sync_every=1000,
            logger=logging.getLogger(),
        )
    topic.put_bodies([b"before the channel"] * 5000)
    topic.get_channel("ch")
    depths = []
    for _turn in range(8):
        for _conn in range(16):
            topic.put_bodies([b"m"] * 200)
        loop.run_turn()
        depths.append(topic.depth)
    assert depths[-1] == 0, depths
    assert depths == sorted(depths, reverse=True), depths  # never grew
