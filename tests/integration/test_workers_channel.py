"""A channel across workers is one channel (``--workers 4``, real processes).

Messages published through every worker before a consumer subscribes are offered to it in one
nsqd's order (publish order), whichever worker its connection landed on; and go-nsq's consumer
pattern (a message REQ'd again and again while others wait, the consumer stopping at its last
attempt) sees every message, as from one nsqd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..processes import NsqdProcess
from ..waiting import wait_for
from ..wire import Conn, node_of

WORKERS = 4


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NsqdProcess]:
    n = NsqdProcess(tmp_path / "data", tmp_path / "nsqd.log", f"--workers={WORKERS}")
    try:
        wait_for(lambda: n.http("GET", "/ping")[0] == 200, "every worker to serve")
        yield n
    finally:
        n.stop()


def publishers(node: NsqdProcess, n: int) -> list[Conn]:
    """``n`` connections open at once: they spread over the workers."""
    conns = [node.connect() for _ in range(n)]
    for c in conns:
        c.identify()
    return conns


def test_a_consumer_gets_what_every_worker_holds_in_publish_order(node: NsqdProcess) -> None:
    conns = publishers(node, 8)
    bodies = []
    try:
        for i in range(32):  # one at a time, each answered before the next: publish order
            body = b"m%02d" % i
            conns[(i * 3) % len(conns)].pub("ordered", body)
            bodies.append(body)
    finally:
        for c in conns:
            c.close()
    with node.connect() as c:
        c.identify()
        c.sub("ordered", "ch", rdy=len(bodies))
        got = c.read_messages(len(bodies))
        for m in got:
            c.fin(m.id)
    assert len({node_of(m.id) for m in got}) > 1  # they were on several workers
    assert [m.body for m in got] == bodies


def test_go_nsq_consumer_pattern_sees_every_message_before_its_failing_one_runs_out(
    node: NsqdProcess,
) -> None:
    """go-nsq's consumer test: messages published, then a consumer (RDY 1) that REQs one
    message with no delay at each of its attempts and stops at the attempt past
    max_attempts (5); every other message must have reached it by then. The failing message
    is published through the consumer's own connection, so it is on the consumer's worker,
    and the others through connections spread over the workers."""
    conns = publishers(node, 6)
    goods = [b"good-%d" % i for i in range(len(conns))]
    with node.connect() as c:
        c.identify()
        try:
            for conn, body in zip(conns, goods, strict=True):
                conn.pub("gonsq", body)
        finally:
            for conn in conns:
                conn.close()
        c.pub("gonsq", b"TOBEFAILED")
        c.sub("gonsq", "ch", rdy=1)
        seen: list[bytes] = []
        while True:
            m = c.read_message()
            if m.body == b"TOBEFAILED":
                if m.attempts > 5:  # go-nsq: LogFailedMessage, FIN, Stop
                    c.fin(m.id)
                    break
                c.req(m.id, 0)
            else:
                seen.append(m.body)
                c.fin(m.id)
    assert sorted(seen) == goods
