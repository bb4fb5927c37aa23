"""``nsqd --workers N`` as real processes: one node to its clients, whichever worker a
connection lands on; admin calls seen by every worker; a worker killed with kill -9 loses
nothing acknowledged; SIGTERM and the supervisor's death stop every worker."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.internal.listener import port_free
from pynsqd.server.workers.supervisor import restart_pause

from ..disks import fill, tmpfs
from ..processes import NsqdProcess, alive, descendants
from ..waiting import wait_for
from ..wire import Conn, node_of

SERVING = re.compile(r"WORKERS: worker (\d+) \(pid (\d+)\) serving")
#: The supervisor's line once every worker serves and nsqlookupd lists the node.
READY = "WORKERS: ready:"


def worker_pids(node: NsqdProcess) -> dict[int, int]:
    """The live pid of each worker, from the supervisor's "serving" lines (the last wins)."""
    pids: dict[int, int] = {}
    for i, pid in SERVING.findall(node.output()):
        pids[int(i)] = int(pid)
    return pids


@contextlib.contextmanager
def started(tmp_path: Path, *flags: str, name: str = "nsqd") -> Iterator[NsqdProcess]:
    node = NsqdProcess(tmp_path / "data", tmp_path / f"{name}.log", *flags)
    count = workers_flag(flags)
    wait_for(  # every worker serves, and the node says it is ready (/ping OK)
        lambda: len(worker_pids(node)) == count and READY in node.output(), "the node to be ready"
    )
    try:
        yield node
    finally:
        node.stop()


def workers_flag(flags: tuple[str, ...]) -> int:
    return next(int(f.split("=")[1]) for f in flags if f.startswith("--workers="))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "nsqd.log").touch()
    return tmp_path


def publish_spread(
    node: NsqdProcess, topic: str, n_conns: int, per_conn: int, tag: str = ""
) -> set[bytes]:
    """Publish from ``n_conns`` connections open at once (they spread over the workers)."""
    conns = [node.connect() for _ in range(n_conns)]
    bodies: set[bytes] = set()
    try:
        for c in conns:
            c.identify()
        for i, c in enumerate(conns):
            batch = [f"{topic}{tag}-{i}-{j}".encode() for j in range(per_conn)]
            c.mpub(topic, batch)
            bodies.update(batch)
    finally:
        for c in conns:
            c.close()
    return bodies


def consume(c: Conn, n: int) -> list[tuple[bytes, bytes, int]]:
    """``n`` messages (id, body, attempts), each FIN'd."""
    out = []
    for _ in range(n):
        m = c.read_message()
        c.fin(m.id)
        out.append((m.id, m.body, m.attempts))
    return out


def call_on_worker(
    node: NsqdProcess, worker: int, method: str, path: str, body: bytes = b""
) -> tuple[int, bytes]:
    """A call made on one given worker's admin socket, as a client's (not a peer's) call."""

    found = re.search(r"their own sockets in (\S+)\)", node.output())
    assert found is not None
    conn = http.client.HTTPConnection("worker", timeout=10)
    conn.sock = _unix(f"{found.group(1)}/{worker}.admin")
    try:
        conn.request(method, path, body=body or None)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def on_worker(node: NsqdProcess, worker: int, path: str, body: bytes) -> None:
    """A POST made on one given worker: over its own admin socket (where the node's public
    sockets would let the kernel choose)."""
    status, text = call_on_worker(node, worker, "POST", path, body)
    assert status == 200, text


def publish_on_worker(node: NsqdProcess, worker: int, topic: str, bodies: list[bytes]) -> None:
    on_worker(node, worker, f"/mpub?topic={topic}", b"\n".join(bodies))


def _unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def test_one_consumer_connection_gets_what_every_worker_took(data: Path) -> None:
    with started(data, "--workers=3") as node:
        published = publish_spread(node, "spread", 30, 10)  # wherever the kernel puts them
        on_each = [[f"w{w}-{i}".encode() for i in range(20)] for w in range(3)]
        for w, bodies in enumerate(on_each):
            publish_on_worker(node, w, "spread", bodies)
            published |= set(bodies)
        with node.connect() as c:
            c.identify()
            c.sub("spread", "ch", rdy=25)
            got = consume(c, len(published))
            c.expect_nothing()
        bodies = [b for _, b, _ in got]
        assert sorted(bodies) == sorted(published)  # each once, on one connection
        assert len({node_of(i) for i, _, _ in got}) == 3  # from every worker
        stats = node.stats()
        (topic,) = stats["topics"]
        assert topic["message_count"] == len(published)  # summed over the workers
        (ch,) = topic["channels"]
        assert (ch["depth"], ch["in_flight_count"], ch["message_count"]) == (0, 0, len(published))
        assert [c["user_agent"] for c in ch["clients"]] == []  # the links are not clients
        status, text = node.http("GET", "/metrics")
        assert status == 200
        # One node in Prometheus too: the topic's count is every worker's, summed.
        assert f'nsq_topic_messages_total{{topic="spread"}} {float(len(published))}' in (
            text.decode()
        ), text.decode()[:3000]
        assert "nsq_build_info{" in text.decode() and "nsq_healthy 1.0" in text.decode()


def test_client_connections_spread_over_the_workers(data: Path) -> None:
    """Thirty connections opened one after another (each answered before the next): every one
    of three workers takes its share, whichever wakes first (the full suite once saw all 30
    land on one worker)."""
    with started(data, "--workers=3") as node:
        conns = [node.connect() for _ in range(30)]
        try:
            for c in conns:
                c.identify()
                c.pub("spread2", b"x")
            with node.connect() as c:
                c.identify()
                c.sub("spread2", "ch", rdy=30)
                ids = [c.read_message().id for _ in range(30)]
        finally:
            for c in conns:
                c.close()
        per_worker = [
            sum(1 for i in ids if node_of(i) == n) for n in sorted(set(map(node_of, ids)))
        ]
        assert len(per_worker) == 3 and min(per_worker) >= 8, per_worker


def test_after_a_subs_ok_every_worker_publishes_to_the_channel(data: Path) -> None:
    """nsqd's promise: what is published after a SUB's OK is that channel's. With workers the
    channel must then exist on every worker (found by pynsq's own test: a publish on another
    worker reached the channel made first, not the second, whose link was still opening)."""
    with started(data, "--workers=3") as node:
        for round_ in range(3):
            topic = f"fresh{round_}"
            with node.connect() as work, node.connect() as audit:
                work.identify()
                audit.identify()
                work.sub(topic, "work", rdy=50)
                audit.sub(topic, "audit", rdy=50)
                bodies = [f"{w}-{i}".encode() for w in range(3) for i in range(5)]
                for w in range(3):  # at once, on every worker
                    mine = b"\n".join(bodies[w * 5 : w * 5 + 5])
                    on_worker(node, w, f"/mpub?topic={topic}", mine)
                for c in (work, audit):
                    got = sorted(body for _, body, _ in consume(c, len(bodies)))
                    assert got == sorted(bodies)


def own_stats(node: NsqdProcess, worker: int) -> dict[str, Any]:
    """One worker's own /stats (asked as its peers ask it: not the node's sum)."""

    found = re.search(r"their own sockets in (\S+)\)", node.output())
    assert found is not None
    conn = http.client.HTTPConnection("worker", timeout=10)
    conn.sock = _unix(f"{found.group(1)}/{worker}.admin")
    try:
        conn.request("GET", "/stats?format=json", headers={"X-Pynsqd-Worker": "99"})
        r = conn.getresponse()
        assert r.status == 200
        result: dict[str, Any] = json.loads(r.read())
        return result
    finally:
        conn.close()


def consumer_worker(node: NsqdProcess, workers: int, topic: str) -> int:
    """The worker that holds the one client consumer of ``topic``."""
    for w in range(workers):
        for t in own_stats(node, w)["topics"]:
            for ch in t["channels"] if t["topic_name"] == topic else []:
                if any("worker-link" not in c["user_agent"] for c in ch["clients"]):
                    return w
    raise AssertionError(f"no worker holds a consumer of {topic}")


def test_a_consumer_gets_as_many_in_flight_as_its_rdy_from_another_worker(data: Path) -> None:
    """Found by pynsq's own suite against --workers 4 (test_conn_messages): a consumer with
    RDY 5, its 5 messages all on another worker, got 2 in flight and waited for ever (each of
    the three links asked for a third of its RDY, rounded up). nsqd puts all 5 in flight."""
    with started(data, "--workers=4") as node, node.connect() as c:
        c.identify()
        c.sub("held", "ch", rdy=5)
        w = consumer_worker(node, 4, "held")
        bodies = [b"held-%d" % i for i in range(5)]
        publish_on_worker(node, (w + 1) % 4, "held", bodies)
        got = [c.read_message().body for _ in bodies]  # none FIN'd
        assert sorted(got) == bodies
        c.expect_nothing()


def test_a_bounded_channel_holds_its_bound_for_the_node_not_for_each_worker(data: Path) -> None:
    """A channel with max_depth 12 and policy reject (``--max-channel-depth``, and one set by
    ``/channel/config``) takes 12 messages published through every worker, then refuses the
    next through any of them, as one process does: a bounded topic is kept by one worker (as
    a retained one), the others pass its publishes on."""
    flags = ("--workers=3", "--max-channel-depth=12", "--channel-bound-policy=reject")
    with started(data, *flags) as node:
        for topic in ("flagged", "configured"):
            with node.connect() as c:
                c.identify()
                c.sub(topic, "c", rdy=0)
            if topic == "configured":
                on_worker(node, 1, f"/channel/config?topic={topic}&channel=c&max_depth=12", b"")
            for w in range(3):
                publish_on_worker(node, w, topic, [b"%d-%d" % (w, i) for i in range(4)])
            for w in range(3):
                status, text = call_on_worker(node, w, "POST", f"/pub?topic={topic}", b"over")
                assert status == 503 and json.loads(text)["message"] == "QUEUE_FULL", text
            with node.connect() as p:
                p.identify()
                p.send(encode_pub(topic, b"over"))
                frame = p.read_frame()
                assert frame.data == b"E_PUB_FAILED PUB failed %s:c is full (12 of 12 messages)" % (
                    topic.encode()
                ), frame
            (t,) = [t for t in node.stats()["topics"] if t["topic_name"] == topic]
            (ch,) = t["channels"]
            assert ch["depth"] == 12


def test_req_and_touch_go_back_to_the_worker_that_holds_the_message(data: Path) -> None:
    with started(data, "--workers=2") as node:
        published = publish_spread(node, "req", 20, 5)
        with node.connect() as c:
            c.identify({"msg_timeout": 60000})
            c.sub("req", "ch", rdy=10)
            first: dict[bytes, bytes] = {}
            again: set[bytes] = set()
            while len(first) < len(published):
                m = c.read_message()
                if m.id in first:
                    assert m.attempts == 2 and m.body == first[m.id]
                    c.fin(m.id)
                    again.add(m.id)
                    continue
                first[m.id] = m.body
                c.touch(m.id)
                c.req(m.id, 0)
            finished = len(published)
            # Every REQ'd message comes back once more, with its attempts counted by its worker.
            seconds = consume_until_done(c, first, already=again)
            assert seconds == set(first)
            c.expect_nothing()
        (topic,) = node.stats()["topics"]
        (ch,) = topic["channels"]
        assert ch["requeue_count"] == finished
        assert (ch["depth"], ch["in_flight_count"]) == (0, 0)


def consume_until_done(c: Conn, first: dict[bytes, bytes], already: set[bytes]) -> set[bytes]:
    done = set(already)
    while len(done) < len(first):
        m = c.read_message()
        assert m.attempts == 2 and first[m.id] == m.body
        c.fin(m.id)
        done.add(m.id)
    return done


def test_admin_calls_take_effect_on_every_worker_and_answer_once(data: Path) -> None:
    with started(data, "--workers=3") as node:
        assert node.http("POST", "/topic/create?topic=adm")[0] == 200
        assert node.http("POST", "/channel/create?topic=adm&channel=ch")[0] == 200
        assert node.http("POST", "/channel/pause?topic=adm&channel=ch")[0] == 200
        published = publish_spread(node, "adm", 20, 5)
        with node.connect() as c:
            c.identify()
            c.sub("adm", "ch", rdy=200)
            c.expect_nothing(0.3)  # paused on every worker: nothing crosses either
            (ch,) = node.stats()["topics"][0]["channels"]
            assert ch["paused"] is True and ch["depth"] == len(published)
            assert node.http("POST", "/channel/unpause?topic=adm&channel=ch")[0] == 200
            got = consume(c, len(published))
            assert sorted(b for _, b, _ in got) == sorted(published)
        publish_spread(node, "adm", 10, 3)
        wait_for(lambda: node.stats()["topics"][0]["channels"][0]["depth"] == 30, "the depth")
        assert node.http("POST", "/channel/empty?topic=adm&channel=ch")[0] == 200
        assert node.stats()["topics"][0]["channels"][0]["depth"] == 0
        # PUT /config/:opt with its value in the body: on every worker (any one answers).
        before = node.http("GET", "/config/log_level")[1]
        conn = http.client.HTTPConnection("127.0.0.1", node.http_port)
        conn.request("PUT", "/config/log_level", body=b"warn")
        resp = conn.getresponse()
        warn = resp.read()
        conn.close()
        assert resp.status == 200 and warn != before, (resp.status, warn, before)
        for _ in range(6):  # whichever worker each request lands on
            assert node.http("GET", "/config/log_level") == (200, warn)
        # nsqd's answers, once: a missing topic is 404 from the worker asked.
        status, body = node.http("POST", "/topic/delete?topic=nope")
        assert (status, json.loads(body)) == (404, {"message": "TOPIC_NOT_FOUND"})
        assert node.http("POST", "/topic/delete?topic=adm")[0] == 200
        assert node.stats()["topics"] == []


def test_every_workers_log_line_names_the_client_or_the_worker_that_called(data: Path) -> None:
    """Issue 54: a call passed between workers was logged as ``GET /ping ()``. Now the worker
    that answers for another logs ``worker N``, and one that answers a client's call passed on
    logs the client's address; a client's own X-Pynsqd-* headers are not believed."""
    with started(data, "--workers=2") as node:
        for _ in range(4):  # whichever worker each lands on, /ping asks the other
            conn = http.client.HTTPConnection("127.0.0.1", node.http_port)
            conn.request("GET", "/ping", headers={"X-Pynsqd-Client": "forged:1"})
            assert conn.getresponse().read() == b"OK"
            conn.close()
        wait_for(lambda: node.output().count("GET /ping") >= 8, "every /ping logged")
        lines = [line for line in node.output().splitlines() if "GET /ping" in line]
        assert not [line for line in lines if "GET /ping ()" in line or "forged" in line], lines
        assert any("GET /ping (worker " in line for line in lines), lines
        assert any("GET /ping (127.0.0.1:" in line for line in lines), lines


def test_a_worker_killed_with_kill_9_loses_nothing_acknowledged(data: Path) -> None:
    flags = ("--workers=2", "--mem-queue-size=0", "--sync-every=1")
    with started(data, *flags) as node:
        published = publish_spread(node, "durable", 20, 10)
        infos = {call_on_worker(node, w, "GET", "/info") for w in range(2)}
        assert len(infos) == 1, infos  # one node: the same /info from every worker
        before = worker_pids(node)
        os.kill(before[1], signal.SIGKILL)
        wait_for(lambda: worker_pids(node).get(1, before[1]) != before[1], "worker 1 restarted")
        # ... a restarted worker's too (the node's start time, not the worker's).
        assert {call_on_worker(node, w, "GET", "/info") for w in range(2)} == infos
        ended = f"WORKERS: worker 1 (pid {before[1]}) ended (signal 9); starting it again\n"
        assert ended in node.output()
        published |= publish_spread(node, "durable", 5, 2, tag="after")
        with node.connect() as c:
            c.identify()
            c.sub("durable", "ch", rdy=50)
            got = consume(c, len(published))
            c.expect_nothing()
        bodies = [b for _, b, _ in got]
        assert set(bodies) == published, (published - set(bodies), len(bodies) - len(set(bodies)))
        assert len(bodies) == len(published)


def test_messages_in_flight_from_a_killed_worker_come_again(data: Path) -> None:
    """A consumer with messages in flight, and the worker that holds one of them killed with
    kill -9: every message arrives, whichever worker the consumer's connection is on (if it is
    the one killed, the consumer connects again), the one in flight at the kill too, once its
    worker is back, with its attempts counted (``--mem-queue-size=0``: ``docs/persistence.md``,
    "Messages in flight")."""
    flags = ("--workers=2", "--mem-queue-size=0", "--sync-every=1")
    with started(data, *flags) as node:
        published = publish_spread(node, "inflight", 20, 10)
        ids = {
            int(n): int(i)
            for i, n in re.findall(r"\[nsqd w(\d+)\][^\n]*INFO: ID: (\d+)", node.output())
        }
        pids = worker_pids(node)
        seen: set[bytes] = set()
        c = node.connect()
        c.identify({"msg_timeout": 60000})
        c.sub("inflight", "ch", rdy=30)
        m = c.read_message()  # in flight, not FIN'd: its worker dies now
        os.kill(pids[ids[node_of(m.id)]], signal.SIGKILL)
        deadline = time.monotonic() + 60
        held = m.body
        attempts: dict[bytes, int] = {}
        while not published <= seen and time.monotonic() < deadline:
            try:
                m = c.read_message()
                seen.add(m.body)
                attempts[m.body] = m.attempts
                c.fin(m.id)  # the connection's worker may be the one killed
            except (ConnectionError, OSError):
                c.close()
                wait_for(
                    lambda: (
                        len(worker_pids(node)) == 2 and all(map(alive, worker_pids(node).values()))
                    ),
                    "restart",
                )
                c = node.connect()
                c.identify({"msg_timeout": 60000})
                c.sub("inflight", "ch", rdy=30)
        c.close()
        assert not published - seen, (sorted(published - seen)[:20], node.output()[-3000:])
        assert attempts[held] >= 2  # delivered before the kill, and again after it


def test_sigterm_stops_every_worker_and_flushes_what_they_hold(data: Path) -> None:
    with started(data, "--workers=2") as node:  # messages in memory (--mem-queue-size 10000)
        published = publish_spread(node, "kept", 20, 5)
        pids = list(worker_pids(node).values())
        # Every process the supervisor made ends with it.
        below = descendants(node.p.pid)
        assert set(pids) <= below, (pids, below)
        assert node.stop() == 0
        assert not any(alive(p) for p in pids)
        wait_for(lambda: not any(alive(p) for p in below), "every process it made to end")
    with started(data, "--workers=2", name="again") as node, node.connect() as c:
        c.identify()
        c.sub("kept", "ch", rdy=50)
        got = consume(c, len(published))
        assert sorted(b for _, b, _ in got) == sorted(published)


def test_workers_stop_when_the_supervisor_is_killed(data: Path) -> None:
    """The node's ports are free as soon as the workers see their supervisor gone, before
    they have finished stopping (found by nsqjs's suite, which starts the next nsqd on the
    same ports the instant it has killed one: the workers held them while they shut down,
    a second with an idle keep-alive HTTP connection open)."""

    with started(data, "--workers=2") as node:
        pids = list(worker_pids(node).values())
        below = descendants(node.p.pid)  # every process the supervisor made
        idle = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=10)
        idle.request("GET", "/ping")
        assert idle.getresponse().read() == b"OK"  # kept open, idle
        node.p.kill()
        node.p.wait()

        wait_for(
            lambda: port_free(node.port) and port_free(node.http_port),
            "the node's ports to be free",
        )
        assert any(alive(p) for p in pids)  # a worker still stopping: it had let them go
        wait_for(lambda: not any(alive(p) for p in pids), "the workers to stop")
        wait_for(lambda: not any(alive(p) for p in below), "every process it made to end")
        assert "the supervisor is gone; stopping" in node.output()
        idle.close()


def test_one_worker_is_one_process_as_before(data: Path) -> None:
    node = NsqdProcess(data / "data", data / "nsqd.log", "--workers=1")
    try:
        with node.connect() as c:
            c.identify()
            c.pub("one", b"x")
        assert "WORKERS" not in node.output()
        assert (data / "data" / "one.diskqueue.meta.dat").exists() or not (
            data / "data" / "worker-0"
        ).exists()
    finally:
        node.stop()
    assert not (data / "data" / "worker-0").exists()


def serves_through_both(node: NsqdProcess, topic: str) -> None:
    """Publishes spread over both workers of ``node`` all reach one consumer."""
    bodies = publish_spread(node, topic, 6, 3)
    with node.connect() as c:
        c.identify()
        c.sub(topic, "ch", rdy=20)
        assert sorted(b for _, b, _ in consume(c, len(bodies))) == sorted(bodies)


def _children(pid: int, *, zombies: bool = False) -> set[int]:
    """``pid``'s live children, or (``zombies``) those ended that it has not reaped."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and (fields[0] == "Z") == zombies:
                    out.add(int(entry))
    return out


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_what_a_module_opens_for_the_process_is_each_forked_workers_own(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found running the power-loss tests with every node at ``--workers 2``: the fsync
    ledger's descriptor (``storage/durable.py``), opened when the supervisor imported the
    server, was closed in each forked worker (which keeps only its own descriptors) and its
    number reused: every retained log failed to open (EINVAL). Each process opens it at its
    first fsync now: both workers' fsyncs are recorded and every log opens."""
    ledger = data / "fsync.ledger"
    monkeypatch.setenv("PYNSQD_FSYNC_LEDGER", str(ledger))
    with started(data, "--workers=2", "--retention-time=1h", "--sync-every=1") as node:
        publish_spread(node, "t", 4, 10)

        def both_recorded() -> bool:
            text = ledger.read_text() if ledger.exists() else ""
            return "/worker-0/t.log/" in text and "/worker-1/t.log/" in text

        wait_for(both_recorded, "both workers' fsyncs in the ledger")
        assert "failed to open its log" not in node.output()


def test_workers_are_forked_by_the_supervisor_and_forked_again_when_killed(data: Path) -> None:
    """Each worker is the supervisor's own child, forked from it (the server imported once,
    not again per worker: its command line is the supervisor's, never ``python -m pynsqd``);
    one killed with kill -9 is forked again, and the node serves through it."""
    with started(data, "--workers=2") as node:
        supervisor = node.p.pid
        pids = worker_pids(node)
        own = Path(f"/proc/{supervisor}/cmdline").read_bytes()
        for pid in pids.values():
            assert _parent_of(pid) == supervisor
            assert Path(f"/proc/{pid}/cmdline").read_bytes() == own
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda: worker_pids(node).get(1, pids[1]) != pids[1], "worker 1 forked again")
        again = worker_pids(node)[1]
        assert _parent_of(again) == supervisor
        serves_through_both(node, "forked")
        assert "Traceback" not in node.output()


# What the supervisor holds less the killed worker's pipe and pidfd (closed once it is reaped),
# and then nothing left: its new pipe cannot be made; or two left: the pipe is made, the child
# forked, and no pidfd can watch it.
@pytest.mark.parametrize("spare", [-2, 0], ids=["no pipe", "no pidfd"])
def test_a_worker_that_cannot_be_forked_again_is_said_and_tried_again(
    data: Path, spare: int
) -> None:
    """The supervisor out of file descriptors (its limit lowered to what it holds, plus
    ``spare``, with ``prlimit`` from outside) when a killed worker is to be forked again: its
    pipe cannot be made, or the child is forked but no pidfd can watch it (it must not live
    on unwatched, nor stay a zombie). One clear line that names the worker and the error, no
    traceback, no hot loop; the limit raised again, the worker is forked again, the
    supervisor's children are its workers and nothing else, and the node serves through
    it."""
    import resource

    with started(data, "--workers=2") as node:
        supervisor = node.p.pid
        pids = worker_pids(node)
        held = len(os.listdir(f"/proc/{supervisor}/fd"))
        limits = resource.prlimit(supervisor, resource.RLIMIT_NOFILE)
        resource.prlimit(supervisor, resource.RLIMIT_NOFILE, (held + spare, limits[1]))
        try:
            os.kill(pids[1], signal.SIGKILL)
            said = "WORKERS: worker 1 could not be started again"
            wait_for(lambda: said in node.output(), "the supervisor to say why")
            line = next(x for x in node.output().splitlines() if said in x)
            assert "Too many open files" in line, line
            wait_for(lambda: node.output().count(said) >= 2, "a second try, after a pause")
            # No hot loop: the tries wait as the supervisor's decision says for failures in a
            # row (``restart_pause``, growing: tested without a clock in
            # tests/unit/server/workers/test_supervisor.py; the kill itself counts as the first
            # unless the worker had run STABLE_AFTER).
            pauses = [float(p) for p in re.findall(rf"{said} .*in ([0-9.]+)s", node.output())]
            assert any(pauses[:2] == [restart_pause(k), restart_pause(k + 1)] for k in (1, 2)), (
                pauses
            )
        finally:
            resource.prlimit(supervisor, resource.RLIMIT_NOFILE, limits)
        wait_for(lambda: worker_pids(node).get(1, pids[1]) != pids[1], "worker 1 forked again")
        wait_for(lambda: _children(supervisor) == set(worker_pids(node).values()), "no others")
        assert not _children(supervisor, zombies=True), "children forked and never reaped"
        serves_through_both(node, "refork")
        assert "Traceback" not in node.output()


def test_workers_refuse_a_count_that_is_not_a_number() -> None:

    from ..processes import NSQD

    r = subprocess.run([NSQD, "--workers=two"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "for flag -workers: must be a number" in r.stderr


def test_nsqlookupd_sees_one_node_with_every_workers_topics_and_channels(data: Path) -> None:
    from ..integration.lookupd_helpers import LookupdThread, get_json, http

    lookupd = LookupdThread()
    try:
        host, port = lookupd.tcp_address
        flags = ("--workers=3", f"--lookupd-tcp-address={host}:{port}", "--broadcast-address=n1")
        with started(data, *flags) as node:
            publish_spread(node, "seen", 12, 1)  # the topic is made on whichever workers
            with node.connect() as c:  # a channel made by a SUB on whichever worker
                c.identify()
                c.sub("seen", "sub-made", rdy=1)

                def registered() -> bool:  # 404 until worker 0 has registered the topic
                    status, body, _ = http(f"{lookupd.http_url}/lookup?topic=seen")
                    return status == 200 and "sub-made" in json.loads(body)["channels"]

                wait_for(registered, "the channel at nsqlookupd")
            doc = get_json(f"{lookupd.http_url}/nodes")
            assert [(p["broadcast_address"], p["tcp_port"]) for p in doc["producers"]] == [
                ("n1", node.port)
            ]
            assert get_json(f"{lookupd.http_url}/topics")["topics"] == ["seen"]
    finally:
        lookupd.stop()


@pytest.mark.parametrize("retained", [False, True], ids=["plain", "retained"])
def test_workers_killed_at_random_instants_under_load_lose_nothing_acknowledged(
    data: Path, retained: bool
) -> None:
    """Publishers on several connections publish without pause; workers are killed with
    kill -9 at random instants (three cycles); a publisher whose connection dies connects
    again (to whichever worker). Then one consumer drains the node: every message that was
    acknowledged is there. Retained (a partition per worker): every acknowledged message is
    in a partition too, once."""

    flags = ("--workers=3", "--mem-queue-size=0", "--sync-every=1")
    if retained:
        flags += ("--retention-time=1h",)
    with started(data, *flags) as node:
        acked: set[bytes] = set()
        lock = threading.Lock()
        stop = threading.Event()

        def publisher(n: int) -> None:
            seq = 0
            while not stop.is_set():
                try:
                    with node.connect() as c:
                        c.identify()
                        while not stop.is_set():
                            body = f"p{n}-{seq}".encode()
                            seq += 1
                            c.pub("soak", body)  # raises if the connection died first
                            with lock:
                                acked.add(body)
                except (ConnectionError, OSError, AssertionError):
                    continue

        threads = [threading.Thread(target=publisher, args=(n,), daemon=True) for n in range(6)]
        for t in threads:
            t.start()
        rng = random.Random(40)
        for cycle in range(3):
            wait_for(lambda c=cycle: len(acked) > 300 * (c + 1), "publishes to be acknowledged")
            pids = worker_pids(node)
            victim = rng.choice(sorted(pids))
            time.sleep(rng.random() * 0.05)  # a random instant in the stream of publishes
            os.kill(pids[victim], signal.SIGKILL)
            wait_for(
                lambda v=victim, p=pids[victim]: worker_pids(node).get(v) not in (None, p),
                "the killed worker to serve again",
            )
        stop.set()
        for t in threads:
            t.join(timeout=30)
        with lock:
            expected = set(acked)
        got: set[bytes] = set()
        with node.connect() as c:
            c.identify()
            c.sub("soak", "ch", rdy=200)
            while not expected <= got:
                m = c.read_message()
                got.add(m.body)
                c.fin(m.id)
        assert expected <= got
        if retained:
            from ..integration.servers import read_partitions

            parts = read_partitions(node, "soak")
            logged = [r.body for records in parts.values() for r in records]
            assert expected <= set(logged) and len(logged) == len(set(logged))
            assert len(parts) == 3


def test_lifecycle_and_dpub_hold_per_message_on_the_worker_that_has_it(data: Path) -> None:
    """max-attempts set once (made on every worker): a message REQ'd by a consumer on another
    worker is counted by the worker that holds it and dead-lettered there; its dead-letter
    topic's consumer gets every one. A DPUB made on one worker comes due there and reaches a
    consumer connected anywhere."""
    with started(data, "--workers=3") as node:
        status, _ = node.http("POST", "/channel/config?topic=life&channel=ch&max_attempts=2")
        assert status == 200
        bodies = {w: [f"w{w}-{i}".encode() for i in range(10)] for w in range(3)}
        for w, b in bodies.items():
            publish_on_worker(node, w, "life", b)
        everything = {x for b in bodies.values() for x in b}
        with node.connect() as c:
            c.identify()
            c.sub("life", "ch", rdy=30)
            attempts: dict[bytes, list[int]] = {}
            while sum(map(len, attempts.values())) < 2 * len(everything):
                m = c.read_message()
                attempts.setdefault(m.body, []).append(m.attempts)
                c.req(m.id, 0)  # never finished: after two deliveries it is dead-lettered
            c.expect_nothing(0.3)
        assert attempts == {b: [1, 2] for b in everything}
        with node.connect() as c:
            c.identify()
            c.sub("life.dead", "d", rdy=30)
            dead = {body for _, body, _ in consume(c, len(everything))}
        assert dead == everything
        (topic,) = [t for t in node.stats()["topics"] if t["topic_name"] == "life"]
        (ch,) = topic["channels"]
        assert ch["lifecycle"]["dead_letter_count"] == len(everything) and ch["depth"] == 0
        assert ch["lifecycle"]["max_attempts"] == 2

        with node.connect() as c:
            c.identify()
            c.sub("later", "ch", rdy=10)
            for w in range(3):
                on_worker(node, w, "/pub?topic=later&defer=300", f"due-{w}".encode())
            due = sorted(c.read_message().body for _ in range(3))
        assert due == [b"due-0", b"due-1", b"due-2"]


def test_ping_answers_for_the_node_whichever_worker_it_reaches(data: Path) -> None:
    """Worker 1's disk is full: a publish there fails and that worker is unhealthy. /ping is
    the node's health, so asked of worker 0 too it answers NOK, naming worker 1 (it answered
    OK there before: each worker spoke for itself, issue 40)."""
    with (
        tmpfs(data / "data" / "worker-1", "size=1m") as disk,
        started(data, "--workers=2", "--mem-queue-size=0") as node,
    ):
        assert call_on_worker(node, 0, "GET", "/ping") == (200, b"OK")
        fill(disk)
        status, _ = call_on_worker(node, 1, "POST", "/pub?topic=t", b"x" * 1000)
        assert status != 200
        status, body = call_on_worker(node, 1, "GET", "/ping")
        assert status == 500 and body.startswith(b"NOK - "), body
        status, body = call_on_worker(node, 0, "GET", "/ping")
        assert status == 500 and body.startswith(b"NOK - ") and body.endswith(b"(worker 1)"), body


# -- retained topics: one log per topic, kept by one worker -----------------------------------


def keeper(topic: str, workers: int) -> int:
    """The worker that keeps a retained topic's log (``Placement.keeper``)."""

    return zlib.crc32(topic.encode()) % workers


def log_dirs_with_segments(data: Path, topic: str) -> list[int]:
    return sorted(
        int(d.parent.name.removeprefix("worker-"))
        for d in data.glob(f"data/worker-*/{topic}.log")
        if any(d.glob("*.log"))
    )


def test_a_retained_topic_is_a_partition_per_worker_read_and_rewound_by_partition(
    data: Path,
) -> None:
    """With --retention-time, each worker appends what it takes (TCP PUB, MPUB, DPUB and HTTP)
    to its own log: a partition named by its node id, with dense offsets of its own. Every
    worker answers /topic/offsets with every partition; a read, a rewind or a channel made at
    an offset names its partition (without one: PARTITION_REQUIRED), one made at a time is
    made in every partition; together the partitions hold each message once."""
    from ..integration.servers import offsets, read_partitions

    flags = ("--workers=3", "--retention-time=1h", "--mem-queue-size=0", "--sync-every=1")
    with started(data, *flags) as node:
        published = publish_spread(node, "kept", 24, 5)
        for w in range(3):
            bodies = [f"http-w{w}-{i}".encode() for i in range(4)]
            publish_on_worker(node, w, "kept", bodies)
            published |= set(bodies)
        with node.connect() as c:
            c.identify()
            c.pub("kept", b"single")
            c.dpub("kept", 50, b"deferred")
        published |= {b"single", b"deferred"}
        assert log_dirs_with_segments(data, "kept") == [0, 1, 2]  # every worker appended
        answers = {call_on_worker(node, w, "GET", "/topic/offsets?topic=kept") for w in range(3)}
        ((status, text),) = answers  # the same answer from every worker
        doc = json.loads(text)
        base = doc["node_id"]
        assert status == 200 and doc["latest"] == len(published), text
        assert [p["partition"] for p in doc["partitions"]] == [base, base + 1, base + 2]
        parts = read_partitions(node, "kept")
        for p in doc["partitions"]:
            records = parts[p["partition"]]
            assert [r.offset for r in records] == list(range(p["latest"])), p
            assert p["latest"] >= 4  # its worker's HTTP publishes at least
        everything = [r.body for records in parts.values() for r in records]
        assert sorted(everything) == sorted(published)  # each once
        (topic,) = node.stats()["topics"]
        assert topic["message_count"] == len(published)
        assert topic["log"]["latest_offset"] == len(published)
        assert [p["partition"] for p in topic["log"]["partitions"]] == [base, base + 1, base + 2]
        assert node.http("GET", "/topic/log?topic=kept&offset=0")[0] == 400
        with node.connect() as c:
            c.identify()
            c.sub("kept", "ch", rdy=40)
            got = consume(c, len(published))
            assert sorted(b for _, b, _ in got) == sorted(published)
            status, text = call_on_worker(
                node, 0, "POST", "/channel/rewind?topic=kept&channel=ch&offset=1"
            )
            assert status == 400 and b"PARTITION_REQUIRED" in text, text
            # A partition's rewind, asked of a worker that does not own it, is made by its
            # worker; the consumer (wherever it is) gets its records again.
            last = base + 2
            status, text = call_on_worker(
                node, 0, "POST", f"/channel/rewind?topic=kept&channel=ch&offset=1&partition={last}"
            )
            again = [r.body for r in parts[last][1:]]
            assert status == 200 and json.loads(text)["count"] == len(again), text
            assert sorted(b for _, b, _ in consume(c, len(again))) == sorted(again)
            c.expect_nothing()
            # At a time: every partition's records from then.
            status, text = call_on_worker(
                node, 1, "POST", "/channel/rewind?topic=kept&channel=ch&timestamp=0"
            )
            assert status == 200 and json.loads(text)["count"] == len(published), text
            assert sorted(b for _, b, _ in consume(c, len(published))) == sorted(published)
            c.expect_nothing()
        status, text = call_on_worker(
            node, 2, "POST", f"/channel/create?topic=kept&channel=late&offset=2&partition={base}"
        )
        late = [r.body for r in parts[base][2:]]
        assert status == 200 and json.loads(text)["count"] == len(late), text
        with node.connect() as c:
            c.identify()
            c.sub("kept", "late", rdy=40)
            assert sorted(b for _, b, _ in consume(c, len(late))) == sorted(late)
            c.expect_nothing()
        assert offsets(node, "kept")["latest"] == len(published)


def test_per_topic_retention_and_idempotent_publishes_across_workers(data: Path) -> None:
    """``POST /topic/retention`` asked of any worker gives the topic one log; an idempotent
    publish retried through another worker is written once (one dedup index, the keeper's);
    a bad sequence is refused with the keeper's error line, on the client's connection."""
    with started(data, "--workers=3") as node:
        assert node.http("POST", "/topic/create?topic=ordered")[0] == 200
        other = (keeper("ordered", 3) + 1) % 3
        status, text = call_on_worker(node, other, "POST", "/topic/retention?topic=ordered&time=1h")
        assert status == 200, text
        for w in range(3):
            status, text = call_on_worker(
                node, w, "POST", "/pub?topic=ordered&producer=p&seq=0", b"x"
            )
            assert status == 200, text
        status, text = call_on_worker(node, other, "GET", "/topic/offsets?topic=ordered")
        assert status == 200 and json.loads(text)["latest"] == 1, text
        conns = [node.connect() for _ in range(6)]  # over the workers
        try:
            answers = []
            for c in conns:
                c.identify({"idempotent_publish": True})
                c.send(b"PUB ordered p 1\n" + (1).to_bytes(4, "big") + b"y")
                answers.append(c.read_response())
            # Written once; each retry's OK (through the keeper's link or not) says so.
            assert answers == [b"OK"] + [b"OK DUPLICATES 1"] * 5
            conns[0].send(b"PUB ordered p 9\n" + (1).to_bytes(4, "big") + b"z")
            assert conns[0].read_error().startswith(b"E_BAD_SEQUENCE "), "a gap is refused"
            conns[0].expect_closed()
            conns[1].send(b"PUB ordered p 2\n" + (1).to_bytes(4, "big") + b"z")
            assert conns[1].read_response() == b"OK"  # the refusal closed no one else
        finally:
            for c in conns:
                c.close()
        (topic,) = node.stats()["topics"]
        assert topic["log"]["latest_offset"] == 3 and topic["log"]["duplicate_count"] == 7
        # Retention off, asked of a worker that does not keep the log: the keeper moves its
        # backlog to its queue; nothing is lost.
        status, text = call_on_worker(
            node, other, "POST", "/topic/retention?topic=ordered&time=0&bytes=0"
        )
        assert status == 200, text
        assert node.http("GET", "/topic/offsets?topic=ordered")[0] == 400
        with node.connect() as c:
            c.identify()
            c.sub("ordered", "ch", rdy=10)
            assert sorted(b for _, b, _ in consume(c, 3)) == [b"x", b"y", b"z"]


class Publishing:
    """``count`` threads each publishing single PUBs of unique bodies (``<tag><i>-<n>``) to
    ``topic`` on a connection of its own until ``stop``: ``acked`` holds the bodies answered
    OK, ``refused`` the other answers (the thread connects again after each, and after a
    dropped connection)."""

    def __init__(self, node: NsqdProcess, topic: str, tag: str, count: int) -> None:

        self.node, self.topic, self.tag = node, topic, tag
        self.acked: set[bytes] = set()
        self.refused: list[bytes] = []
        #: (body, answer) of each publish not answered OK.
        self.answers: list[tuple[bytes, bytes]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)
        ]
        for t in self._threads:
            t.start()

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                with self.node.connect() as c:
                    c.identify()
                    while not self._stop.is_set():
                        body = f"{self.tag}{i}-{n}".encode()
                        n += 1
                        c.send(encode_pub(self.topic, body))
                        frame = c.read_frame()
                        if frame.data != b"OK":
                            self.refused.append(frame.data)
                            self.answers.append((body, frame.data))
                            break
                        self.acked.add(body)
            except (ConnectionError, OSError):
                continue

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def test_a_worker_of_a_retained_topic_killed_with_kill_9_loses_nothing_acknowledged(
    data: Path,
) -> None:
    """kill -9 of a worker while four connections publish to a retained topic (each worker
    appending to its own partition): each publish is answered OK (in a partition) or fails,
    never OK and lost, and nothing is written twice; an E_PUB_FAILED that says "publish
    again" (not written) only for what is in no partition (issue 56: such answers had been
    given for written publishes)."""
    from ..integration.servers import read_partitions

    flags = ("--workers=3", "--retention-time=1h", "--mem-queue-size=0", "--sync-every=1")
    with started(data, *flags) as node:
        pubs = Publishing(node, "guarded", "p", 4)
        acked = pubs.acked
        wait_for(lambda: len(acked) > 200, "publishes before the kill")
        before = worker_pids(node)
        os.kill(before[1], signal.SIGKILL)
        wait_for(lambda: worker_pids(node).get(1, before[1]) != before[1], "worker 1 restarted")
        count = len(acked)
        wait_for(lambda: len(acked) > count + 200, "publishes after the restart")
        pubs.stop()
        assert all(f.startswith(b"E_PUB_FAILED ") for f in pubs.refused), pubs.refused
        logged = [r.body for records in read_partitions(node, "guarded").values() for r in records]
        assert acked <= set(logged), sorted(acked - set(logged))[:10]
        assert len(logged) == len(set(logged))  # each written once
        said_not_written = {b for b, why in pubs.answers if b"publish again" in why}
        assert not said_not_written & set(logged), [w for b, w in pubs.answers if b in logged]


def encode_pub(topic: str, body: bytes) -> bytes:
    from pynsqd.protocol import encode

    return encode.pub(topic, body)


def test_a_full_disk_under_one_workers_partition_fails_its_publishes_with_its_error(
    data: Path,
) -> None:
    """Worker k's disk is full: a retained publish it takes is refused with its own answer
    (HTTP 503, TCP ``E_PUB_FAILED`` naming the disk), never an OK, while the other worker's
    partition takes its publishes; the node's /ping names worker k; room again, k takes them."""
    from ..integration.servers import read_partitions

    k, other = 1, 0
    with (
        tmpfs(data / "data" / f"worker-{k}", "size=1m") as disk,
        started(data, "--workers=2", "--retention-time=1h", "--mem-queue-size=0") as node,
    ):
        assert call_on_worker(node, k, "POST", "/pub?topic=full", b"before")[0] == 200
        filler = fill(disk)
        status, text = call_on_worker(node, k, "POST", "/pub?topic=full", b"x" * 4000)
        assert status == 503, (status, text)
        assert call_on_worker(node, other, "POST", "/pub?topic=full", b"elsewhere")[0] == 200
        conns = [node.connect() for _ in range(6)]  # some land on each worker
        try:
            answers = []
            for c in conns:
                c.identify()
                c.send(encode_pub("full", b"y" * 4000))
            for c in conns:
                frame = c.read_frame()
                answers.append(frame.data)
            for answer in answers:
                assert answer == b"OK" or (
                    answer.startswith(b"E_PUB_FAILED PUB failed ") and b"No space left" in answer
                ), answer
        finally:
            for c in conns:
                c.close()
        status, body = call_on_worker(node, other, "GET", "/ping")
        assert status == 500 and body.endswith(b"(worker %d)" % k), body
        assert "Traceback" not in node.output()
        os.unlink(filler)
        assert call_on_worker(node, k, "POST", "/pub?topic=full", b"after")[0] == 200
        parts = read_partitions(node, "full")
        oks = answers.count(b"OK")
        assert sorted(len(r) for r in parts.values()) == sorted([2, 1 + oks])
        bodies = [r.body for records in parts.values() for r in records]
        assert {b"before", b"after", b"elsewhere"} <= set(bodies)
        assert b"x" * 4000 not in bodies


def test_retention_and_rewinds_raced_against_publishes_and_a_kill_lose_nothing(
    data: Path,
) -> None:
    """Retention turned on and off, a channel bound set and lifted, and rewinds, asked of
    every worker in turn while three connections publish, and the keeper killed with kill -9
    midway: no admin call answers 500, no traceback, and every acknowledged message reaches
    the consumer (at least once)."""
    flags = ("--workers=3", "--mem-queue-size=0", "--sync-every=1")
    with started(data, *flags) as node:
        with node.connect() as c:
            c.identify()
            c.sub("race", "ch", rdy=0)  # the channel exists before the first publish
        pubs = Publishing(node, "race", "r", 3)
        acked = pubs.acked
        k = keeper("race", 3)
        answers: list[int] = []
        for step in range(9):
            w = step % 3
            if step == 4:
                before = worker_pids(node)
                os.kill(before[k], signal.SIGKILL)
            seen = len(acked)
            wait_for(lambda seen=seen: len(acked) > seen + 20, "publishes between the calls")
            for path in (
                "/topic/retention?topic=race&time=1h",
                "/channel/config?topic=race&channel=ch&max_depth=1000000",  # kept by one
                "/channel/rewind?topic=race&channel=ch&timestamp=0",  # every partition
                "/topic/retention?topic=race&time=0&bytes=0",
                "/channel/config?topic=race&channel=ch&max_depth=0",  # spread again
            ):
                with contextlib.suppress(OSError):  # the worker asked is the one killed
                    answers.append(call_on_worker(node, w, "POST", path)[0])
        pubs.stop()
        assert 500 not in answers and 200 in answers, answers
        assert "Traceback" not in node.output()
        got: set[bytes] = set()
        with node.connect() as c:
            c.identify()
            c.sub("race", "ch", rdy=100)
            while not acked <= got:
                m = c.read_message()
                c.fin(m.id)
                got.add(m.body)


#: kill -9 cycles of a random worker of a random replicated node (scripts/replication-faults
#: runs them ten times over).
WORKER_KILLS = max(1, round(3 * float(os.environ.get("PYNSQD_FAULT_SCALE", "1"))))


@pytest.mark.timeout(900)  # scaled by PYNSQD_FAULT_SCALE
def test_replicated_nodes_with_workers_under_kill_9_lose_nothing_acknowledged(
    tmp_path: Path, etcd: Any
) -> None:
    """Three replicated nodes of two workers each (replicas=3, acks=all): every worker is a
    member of the cluster (node ids 10 and 11, 20 and 21, 30 and 31), each with its own
    partition, replicated to the other nodes; publishes are appended by the worker they land
    on (TCP, HTTP) and answered once committed; followers' fetch streams and the cluster's
    calls reach the member they name through either worker. Worker 0 of node 1 killed with
    kill -9 under two producers: the checker finds nothing acknowledged lost, no partition
    offset holding two records. Then a random worker of a random node killed at a random
    instant, ``WORKER_KILLS`` times (only its partition moves), and a node's supervisor
    killed with kill -9 (its workers stop; the node is started again)."""

    import aiohttp

    from pynsqd.cluster.fetch import FetchAnswer, FetchRequest

    from ..integration.replication_harness import (
        Cluster,
        History,
        check,
        producing,
        replicate,
        wait_in_sync,
    )

    cluster = Cluster(tmp_path, etcd, 3, "--workers=2", "--mem-queue-size=0", "--sync-every=1")
    members = [m for n in cluster.nodes for m in n.member_ids]
    assert members == [10, 11, 20, 21, 30, 31]
    try:
        for n in cluster.nodes:
            assert n.proc is not None
            wait_for(lambda n=n: len(worker_pids(n.proc)) == 2, "both workers to serve")
        replicate(cluster)  # every member's partition led by it, three in sync
        one = cluster.node(1)
        assert one.proc is not None
        # Asked of either worker: the node's answer, every copy it holds named by its member
        # (one copy of each of the six partitions: the copies went to three hosts).
        answers = [
            json.loads(call_on_worker(one.proc, w, "GET", "/topic/replication?topic=orders")[1])
            for w in (0, 1)
        ]
        for a in answers:
            assert sorted(q["partition"] for q in a["partitions"]) == members
            assert {q["node_id"] for q in a["partitions"]} <= {10, 11}
            assert {q["node_id"] for q in a["partitions"] if q["role"] == "leader"} == {10, 11}
        infos = [json.loads(call_on_worker(one.proc, w, "GET", "/info")[1]) for w in (0, 1)]
        assert infos[0]["cluster"]["nodes"] == infos[1]["cluster"]["nodes"] == members
        (stats,) = one.json("GET", "/stats?format=json&topic=orders")["topics"]
        assert [q["partition"] for q in stats["replication"]["partitions"]] == members
        # HTTP publishes made on worker 1 are worker 1's partition, acknowledged once
        # committed; TCP connections open at once spread over both workers' partitions.
        history = History()
        on_one = [f"http-w1-{i}".encode() for i in range(20)]
        history.invoked.update(on_one)
        publish_on_worker(one.proc, 1, "orders", on_one)
        history.ok.update(on_one)
        spread = publish_spread(one.proc, "orders", 8, 25, tag="tcp")
        history.invoked |= spread
        history.ok |= spread
        offsets = {
            p["partition"]: p["committed"]
            for p in one.json("GET", "/topic/offsets?topic=orders")["partitions"]
        }
        assert offsets[11] >= len(on_one) and offsets[10] > 0, offsets

        async def fetch_on_worker_1(partition: int, leader: int) -> list[FetchAnswer]:
            """A fetch stream opened on worker 1's socket for ``leader``'s partition: it is
            answered by that member (asked at epoch 0, it names its epoch; asked again at
            that epoch it refuses a node that holds no copy)."""
            found = re.search(r"their own sockets in (\S+)\)", one.proc.output())
            assert found is not None
            connector = aiohttp.UnixConnector(path=f"{found.group(1)}/1.admin")
            url = f"http://worker/topic/replicate?topic=orders&partition={partition}"
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.ws_connect(f"{url}&leader={leader}") as ws,
            ):
                out, epoch = [], 0
                for _ in range(2):
                    await ws.send_bytes(FetchRequest(0, epoch, 0, 99, "", 0, 1 << 20).encode())
                    msg = await asyncio.wait_for(ws.receive(), 10)
                    out.append(FetchAnswer.decode(msg.data))
                    epoch = out[-1].epoch
                return out

        # Consumers on both workers: each message once.
        got = consume_spread(one.proc, "orders", 4, len(on_one) + len(spread))
        assert sorted(got) == sorted(set(on_one) | spread)  # each once
        led = {q["partition"]: q for q in answers[1]["partitions"] if q["role"] == "leader"}
        for partition in (10, 11):  # worker 0's through worker 1, and worker 1's own
            first, second = asyncio.run(fetch_on_worker_1(partition, partition))
            assert (first.status, first.message) == (409, "EPOCH_MISMATCH"), first
            assert first.epoch == led[partition]["epoch"]
            assert (second.status, second.message) == (409, "NOT_REPLICA"), second

        with producing(cluster, history):
            wait_for(lambda: len(history.ok) > len(spread) + 300, "publishes before the kill")
            before = worker_pids(one.proc)
            os.kill(before[0], signal.SIGKILL)
            wait_for(
                lambda: worker_pids(one.proc).get(0, before[0]) != before[0],
                "worker 0 of node 1 restarted",
            )
            wait_in_sync(cluster, "orders", 10)
            # Both workers of the restarted node take publishes again.
            again = publish_spread(one.proc, "orders", 8, 25, tag="again")
            history.invoked |= again
            history.ok |= again
            count = len(history.ok)
            wait_for(lambda: len(history.ok) > count + 300, "publishes after the restart")
            seed = random.randrange(1 << 30)
            rng = random.Random(seed)
            for cycle in range(WORKER_KILLS):
                victim = rng.choice(cluster.nodes)
                assert victim.proc is not None
                w = rng.choice((0, 1))
                # A random instant: after a random number of further acknowledged publishes.
                at = len(history.ok) + rng.randrange(1, 300)
                wait_for(lambda at=at: len(history.ok) > at, f"publishes (seed {seed})")
                pids = worker_pids(victim.proc)
                os.kill(pids[w], signal.SIGKILL)
                wait_for(
                    lambda v=victim, w=w, pids=pids: worker_pids(v.proc).get(w) != pids[w],
                    f"cycle {cycle}: worker {w} of node {victim.node_id} restarted (seed {seed})",
                )
                wait_in_sync(cluster, "orders", victim.member_ids[w])
            # kill -9 of a node's supervisor: its workers stop within seconds, none serving on.
            two = cluster.node(2)
            assert two.proc is not None
            pids = worker_pids(two.proc)
            two.kill()
            wait_for(
                lambda: not any(alive(p) for p in pids.values()),
                "node 2's workers to stop after its supervisor's kill -9",
                timeout=10,
            )
            two.start()
            wait_for(lambda: two.joined, "node 2 to join again", 60)
            for member in two.member_ids:
                wait_in_sync(cluster, "orders", member)
            count = len(history.ok)
            wait_for(lambda: len(history.ok) > count + 300, "publishes after node 2's restart")
        reads = {
            (origin, f"node{n.node_id}"): cluster.read_partition("orders", origin, n)
            for origin in members
            for n in cluster.nodes
        }
        verdict = check(history, reads)
        assert verdict.lost == [], verdict.lost[:10]
        assert verdict.unexpected == [] and verdict.inconsistent == []
        assert set(on_one) | spread | again <= {b for rs in reads.values() for _, _, b in rs}
        # Both of node 1's members appended (its spread connections landed on both).
        assert reads[(10, "node1")] and reads[(11, "node1")]
    finally:
        cluster.stop()


def consume_spread(node: NsqdProcess, topic: str, n_conns: int, want: int) -> list[bytes]:
    """``want`` messages of ``topic``'s channel ``ch`` read (and FIN'd) over ``n_conns``
    consumer connections open at once (they spread over the workers)."""

    conns = [node.connect() for _ in range(n_conns)]
    got: list[bytes] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 30  # a guard against a hang, not a wait

    def read(c: Conn) -> None:
        while time.monotonic() < deadline:
            with lock:
                if len(got) >= want:
                    return
            try:
                m = c.read_message()
            except (TimeoutError, OSError):
                continue
            c.fin(m.id)
            with lock:
                got.append(m.body)

    try:
        for c in conns:
            c.identify()
            c.sub(topic, "ch", rdy=10)
            c.sock.settimeout(0.5)  # a reader looks at the count between reads
        threads = [threading.Thread(target=read, args=(c,), daemon=True) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
    finally:
        for c in conns:
            c.close()
    return got


def test_a_log_read_of_every_partition_carries_the_readers_secret(data: Path) -> None:
    """With --auth-http-address, /topic/offsets without a partition is asked of every worker:
    each is asked with the reader's secret (the header form too), so a reader granted
    subscribe gets every partition, and one without a secret is refused as by one process."""
    from ..integration.secure_client import AuthServer

    authd = AuthServer()  # grants publish and subscribe on topics matching ^allowed
    flags = ("--workers=2", "--retention-time=1h", f"--auth-http-address={authd.address}")
    try:
        with started(data, *flags) as node:
            path = "/topic/offsets?topic=allowed_t"
            for w in range(2):
                on_worker(node, w, "/topic/create?topic=allowed_t", b"")
            status, text = call_on_worker(node, 0, "GET", path)
            assert status == 401 and b"AUTH_REQUIRED" in text, text
            conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=10)
            try:
                conn.request("GET", path, headers={"X-Nsq-Auth-Secret": "s3cret"})
                r = conn.getresponse()
                body = r.read()
            finally:
                conn.close()
            assert r.status == 200, body
            assert len(json.loads(body)["partitions"]) == 2
    finally:
        authd.close()


def test_a_partition_that_is_no_node_id_or_not_this_nodes_is_one_clear_answer(
    data: Path,
) -> None:
    """``partition=`` on a node of several workers: a value that is no node id is 400
    INVALID_ARG_PARTITION, another node's id 404 PARTITION_NOT_FOUND naming this node's, on
    every log endpoint; never a 500 or a traceback."""
    with started(data, "--workers=2", "--retention-time=1h") as node:
        assert node.http("POST", "/topic/create?topic=t")[0] == 200
        base = json.loads(node.http("GET", "/topic/offsets?topic=t")[1])["node_id"]
        for path in (
            "GET /topic/offsets?topic=t",
            "GET /topic/log?topic=t&offset=0",
            "POST /topic/reader?topic=t&reader=r&offset=0",
            "POST /channel/rewind?topic=t&channel=c&offset=0",
            "POST /channel/create?topic=t&channel=c&offset=0",
        ):
            method, url = path.split(" ")
            for bad in ("abc", "-1", "1024", "99999", "1e3", "", "%C2%B2", "%D9%A3"):  # ², ٣
                status, text = node.http(method, f"{url}&partition={bad}")
                assert status == 400 and b"INVALID_ARG_PARTITION" in text, (path, bad, text)
            other = (base + 5) % 1024
            status, text = node.http(method, f"{url}&partition={other}")
            assert status == 404 and b"PARTITION_NOT_FOUND" in text, (path, text)
            assert json.loads(text)["partitions"] == [base, (base + 1) % 1024]
        assert "Traceback" not in node.output()
