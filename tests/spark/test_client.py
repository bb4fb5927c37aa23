"""The blocking NSQ client and the driver-side consumer pool, against a real nsqd (no Spark)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pynsqd.client import (
    ClientOptions,
    Connection,
    NsqConnectionError,
    NsqError,
    NsqLookupError,
    Reactor,
    lookup_nodes,
    lookup_producers,
    parse_address,
)
from pynsqd_spark.consumer import ConsumerPool, NsqSourceError
from pynsqd_spark.options import LogOptions, NsqOptionError, SinkOptions, SourceOptions
from pynsqd_spark.sink import Publisher, chunk_bodies

from ..processes import free_port
from ..waiting import wait_for
from .conftest import NsqdProcess


def test_parse_address() -> None:
    assert parse_address("h:1") == ("h", 1)
    assert parse_address("h") == ("h", 4150)
    assert parse_address("[::1]:7") == ("::1", 7)
    for bad in ("", "h:x", "h:0", ":5"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_publish_and_errors(nsqd_proc: NsqdProcess) -> None:
    with Connection(nsqd_proc.tcp_address).connect() as c:
        assert c.identify_response["max_rdy_count"] == 2500
        c.pub("t", b"one")
        c.mpub("t", [b"two", b"three"])
        c.dpub("t", 10, b"four")
        with pytest.raises(NsqError) as err:
            c.pub("bad!", b"x")
        assert err.value.code == "E_BAD_TOPIC"
        assert err.value.fatal
        assert c.closed
    assert nsqd_proc.topic_stats("t")["message_count"] == 4  # type: ignore[index]


def test_connect_refused_names_the_address() -> None:
    addr = f"127.0.0.1:{free_port()}"
    with pytest.raises(NsqConnectionError, match=addr):
        Connection(addr, ClientOptions(connect_timeout=2)).connect()


@pytest.fixture(params=["thread", "reactor"])
def reactor(request: pytest.FixtureRequest) -> Iterator[Reactor | None]:
    """Subscribers read on a thread of their own, or on a shared Reactor."""
    if request.param == "thread":
        yield None
        return
    r = Reactor()
    yield r
    r.stop()
    assert not r.alive


def test_subscribe_fin_touch_req_and_heartbeats(
    nsqd_proc: NsqdProcess, reactor: Reactor | None
) -> None:
    got: list[tuple[int, bytes, bytes]] = []
    errors: list[NsqError] = []
    closed = threading.Event()

    def on_messages(
        conn: Connection, ts: list[int], att: list[int], ids: list[bytes], bodies: list[bytes]
    ) -> None:
        got.extend(zip(att, ids, bodies, strict=True))

    opts = ClientOptions(heartbeat_interval_ms=1000, msg_timeout_ms=5000)
    nsqd_proc.publish("s", [b"a", b"b", b"c"])
    with Connection(nsqd_proc.tcp_address, opts).connect() as sub:
        sub.subscribe(
            "s",
            "ch",
            on_messages,
            lambda c: closed.set(),
            lambda c, e: errors.append(e),
            rdy=10,
            reactor=reactor,
        )
        wait_for(lambda: len(got) == 3, "3 messages")
        assert sorted(b for _, _, b in got) == [b"a", b"b", b"c"]
        assert all(a == 1 for a, _, _ in got)
        ids = {b: i for _, i, b in got}
        sub.touch(ids[b"a"])
        sub.req(ids[b"b"], 0)  # comes back with attempts=2
        wait_for(lambda: len(got) == 4, "the requeued message")
        assert got[3][0] == 2 and got[3][2] == b"b"
        sub.fin_many([ids[b"a"], ids[b"c"], got[3][1]])
        sub.fin(ids[b"a"])  # already finished: a non-fatal E_FIN_FAILED
        wait_for(lambda: bool(errors), "E_FIN_FAILED")
        assert errors[0].code == "E_FIN_FAILED" and not errors[0].fatal
        # Idle across several heartbeat intervals: the reader answers with NOP, the connection
        # lives on. (A request/response connection has no reader: idle, nsqd drops it.)
        time.sleep(2.5)
        nsqd_proc.publish("s", [b"d"])
        wait_for(lambda: len(got) == 5, "a message after the idle time")
        sub.fin(got[4][1])
        assert not closed.is_set()
    nsqd_proc.wait_drained("s", "ch")
    wait_for(closed.is_set, "the reader thread's close callback")


class _Lookupd(http.server.BaseHTTPRequestHandler):
    producers: dict[str, list[dict[str, Any]]] = {}

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/nodes":
            status, body = 200, {"producers": [p for ps in self.producers.values() for p in ps]}
        elif path == "/lookup":
            topic = query.removeprefix("topic=")
            if topic in self.producers:
                status, body = 200, {"channels": [], "producers": self.producers[topic]}
            else:
                status, body = 404, {"message": "TOPIC_NOT_FOUND"}
        else:
            status, body = 404, {"message": "NOT_FOUND"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_lookupd() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Lookupd)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_lookup(fake_lookupd: str) -> None:
    p = {"broadcast_address": "10.0.0.1", "tcp_port": 4150, "http_port": 4151}
    _Lookupd.producers = {"t": [p]}
    assert lookup_producers([fake_lookupd], "t") == ["10.0.0.1:4150"]
    assert lookup_producers([fake_lookupd, "http://" + fake_lookupd], "nope") == []
    assert lookup_nodes([fake_lookupd]) == ["10.0.0.1:4150"]
    with pytest.raises(NsqLookupError):
        lookup_producers([f"127.0.0.1:{free_port()}"], "t", timeout=2)


def source_options(**kw: str) -> SourceOptions:
    return SourceOptions.parse({"topic": "t", "channel": "c", **kw})


def test_option_errors_name_the_option() -> None:
    with pytest.raises(NsqOptionError, match="'topic'"):
        SourceOptions.parse({"channel": "c", "nsqdTcpAddresses": "h:1"})
    with pytest.raises(NsqOptionError, match="'channel'"):
        SourceOptions.parse({"topic": "t", "nsqdTcpAddresses": "h:1"})
    with pytest.raises(NsqOptionError, match="nsqdTcpAddresses"):
        SourceOptions.parse({"topic": "t", "channel": "c"})
    with pytest.raises(NsqOptionError, match="maxMessagesPerBatch"):
        source_options(nsqdTcpAddresses="h:1", maxmessagesperbatch="0")
    with pytest.raises(NsqOptionError, match="'topic'"):
        source_options(nsqdTcpAddresses="h:1", topic="no spaces")
    with pytest.raises(NsqOptionError, match="'topic'"):
        SinkOptions.parse({"nsqdTcpAddresses": "h:1"}, has_topic_column=False)
    with pytest.raises(NsqOptionError, match="oversize"):
        SinkOptions.parse({"topic": "t", "nsqdTcpAddresses": "h:1", "oversize": "x"}, False)
    opts = SinkOptions.parse({"nsqdTcpAddresses": "h:1"}, has_topic_column=True)
    assert opts.topic is None and opts.nsqd_addresses == ["h:1"]


def test_chunk_bodies_respects_count_and_size() -> None:
    bodies = [b"x" * n for n in (10, 10, 10, 30, 1, 1)]
    lengths = [len(b) for b in bodies]
    chunks = chunk_bodies(bodies, lengths, max_count=2, max_body=1000)
    assert [len(c) for c in chunks] == [2, 2, 2]
    chunks = chunk_bodies(bodies, lengths, max_count=100, max_body=4 + 3 * 14)
    assert [len(c) for c in chunks] == [3, 2, 1]
    assert [b for c in chunks for b in c] == bodies
    for c in chunks:
        assert 4 + sum(4 + len(b) for b in c) <= 4 + 3 * 14 or len(c) == 1


def test_publisher_fails_over_to_the_next_node(nsqd_proc: NsqdProcess) -> None:
    dead = f"127.0.0.1:{free_port()}"
    opts = SinkOptions.parse(
        {
            "topic": "p",
            "nsqdTcpAddresses": f"{dead},{nsqd_proc.tcp_address}",
            "retryBackoffMs": "1",
        },
        False,
    )
    pub = Publisher(opts, start_index=0)
    pub.publish("p", [[b"1", b"2"], [b"3"]])
    pub.flush()
    pub.close()
    assert pub.retries == 1 and pub.used == [nsqd_proc.tcp_address]
    assert nsqd_proc.topic_stats("p")["message_count"] == 3  # type: ignore[index]


def test_consumer_pool_take_commit_and_fairness(nsqd_proc: NsqdProcess) -> None:
    nsqd_proc.publish("t", [b"%04d" % i for i in range(1000)])
    opts = source_options(
        nsqdTcpAddresses=nsqd_proc.tcp_address, maxInFlight="400", connectionsPerNode="2"
    )
    before = {t.name for t in threading.enumerate()}
    pool = ConsumerPool(opts)
    pool.start()
    try:
        assert pool.node_connections(nsqd_proc.tcp_address) == 2
        # Both connections are read on one selector thread, not a reader thread each.
        new = sorted(t.name for t in threading.enumerate() if t.name not in before)
        assert new == ["nsq-maintain", "nsq-source-reader"]
        wait_for(lambda: pool.buffered() == 400, "400 buffered (RDY 200 x 2)")
        assert pool.take(1, max_rows=150, max_bytes=10**9) == 150
        per_conn = sorted(len(p.ids) for p in pool.parts(1) or [])
        assert per_conn == [75, 75]  # a fair share of each connection
        assert pool.take(2, max_rows=10**6, max_bytes=20) == 5  # 4-byte bodies: 20 bytes
        assert pool.has_uncommitted(2) and pool.pending_after(1) == 2
        seen: set[bytes] = set()
        seq = 2
        for p in (pool.parts(1) or []) + (pool.parts(2) or []):
            seen.update(p.bodies)
        assert pool.commit(2) == 155
        while len(seen) < 1000:
            wait_for(lambda: pool.buffered() > 0, "more messages")
            seq += 1
            pool.take(seq, 10**6, 10**9)
            for p in pool.parts(seq) or []:
                seen.update(p.bodies)
            pool.commit(seq)
        assert not pool.has_uncommitted(seq)
        nsqd_proc.wait_drained("t", "c")
        assert pool.stats.fin_lost == 0
    finally:
        pool.close()


def test_consumer_pool_cutoff_and_release(nsqd_proc: NsqdProcess) -> None:
    nsqd_proc.publish("t", [b"old"] * 5)
    pool = ConsumerPool(source_options(nsqdTcpAddresses=nsqd_proc.tcp_address))
    pool.start()
    try:
        wait_for(lambda: pool.buffered() == 5, "5 buffered")
        pool.cutoff_ns = time.time_ns()
        nsqd_proc.publish("t", [b"new"] * 3)
        wait_for(lambda: pool.buffered() == 8, "8 buffered")
        assert pool.take(1, 100, 10**9) == 5
        assert {b for p in pool.parts(1) or [] for b in p.bodies} == {b"old"}
        assert pool.take(2, 100, 10**9) == 0
        pool.commit(1)
        assert pool.release_all() == 3
    finally:
        pool.close()

    # All three are back in the channel. (requeue_count may be higher than 3: between the RDY 0
    # sent to a sibling connection and the REQ on another socket, nsqd may hand the sibling a
    # requeued message, which comes back again when the pool closes.)
    def back() -> bool:
        ch = nsqd_proc.channel_stats("t", "c")
        return ch is not None and ch["depth"] == 3 and ch["in_flight_count"] == 0

    wait_for(back, "the 3 released messages back in the channel")
    ch = nsqd_proc.channel_stats("t", "c")
    assert ch is not None and ch["requeue_count"] >= 3


def test_consumer_pool_unreachable_names_the_option() -> None:
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(NsqSourceError, match="nsqdTcpAddresses"):
        ConsumerPool(source_options(nsqdTcpAddresses=dead, connectTimeoutMs="2000")).start()
    with pytest.raises(NsqSourceError, match="nsqlookupdHttpAddresses"):
        ConsumerPool(source_options(nsqlookupdHttpAddresses=dead, connectTimeoutMs="2000")).start()


def test_touch_keeps_a_slow_batch_in_flight(nsqd_proc: NsqdProcess) -> None:
    nsqd_proc.publish("slow", [b"%d" % i for i in range(50)])
    # A 3 s timeout and a TOUCH every 250 ms: a touch may come late on a loaded machine (a
    # full run once saw the 1 s timeout pass before the 50 were buffered), never 11 late.
    opts = source_options(
        topic="slow",
        nsqdTcpAddresses=nsqd_proc.tcp_address,
        msgTimeoutMs="3000",
        touchIntervalMs="250",
    )
    pool = ConsumerPool(opts)
    pool.start()
    try:
        wait_for(lambda: pool.buffered() == 50, "50 buffered")
        assert pool.take(1, 20, 10**9) == 20
        time.sleep(6.5)  # a "batch" far longer than msg_timeout: TOUCH keeps everything ours
        assert pool.buffered() == 30  # nothing timed out and came back
        pool.commit(1)
        pool.take(2, 100, 10**9)
        pool.commit(2)
        nsqd_proc.wait_drained("slow", "c")
    finally:
        pool.close()
    ch = nsqd_proc.channel_stats("slow", "c")
    assert ch is not None and ch["timeout_count"] == 0 and pool.stats.touched > 0


def test_tls(start_nsqd: Any, tmp_path: Any, reactor: Reactor | None) -> None:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_file, key_file, cert_file = tmp_path / "ca.pem", tmp_path / "key.pem", tmp_path / "cert.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    nsqd = start_nsqd(f"--tls-cert={cert_file}", f"--tls-key={key_file}", "--tls-required=true")
    opts = ClientOptions(tls=True, tls_ca_file=str(ca_file))
    got: list[bytes] = []
    with Connection(nsqd.tcp_address, opts).connect() as c:
        c.pub("tls", b"secret")
        # Some 3 MB: many TLS records, read as the socket becomes readable.
        c.mpub("tls", [b"%05d" % i + b"x" * 1000 for i in range(3000)])
    with Connection(nsqd.tcp_address, opts).connect() as c:
        c.subscribe(
            "tls",
            "c",
            lambda conn, ts, att, ids, bodies: (got.extend(bodies), conn.fin_many(ids)),
            rdy=500,
            reactor=reactor,
        )
        # 3 MB over TLS: a guard of 60 s (a loaded suite once took over 20).
        wait_for(lambda: len(got) == 3001, "the messages over TLS", 60)
        assert got[0] == b"secret" and sorted(got[1:]) == [
            b"%05d" % i + b"x" * 1000 for i in range(3000)
        ]
    with Connection(nsqd.tcp_address).connect() as plain, pytest.raises(NsqError) as err:
        plain.pub("tls", b"x")
    assert err.value.code == "E_INVALID"


def test_unknown_source_options_are_refused_with_the_valid_ones() -> None:
    base = {"topic": "t", "channel": "c", "nsqdTcpAddresses": "h:1"}
    with pytest.raises(NsqOptionError) as info:
        SourceOptions.parse({**base, "startingOffsets": "earliest", "bogusOption": "1"})
    message = str(info.value)
    assert "unknown option(s) 'bogusoption', 'startingoffsets' for mode 'channel'" in message
    assert "maxMessagesPerBatch" in message and "nsqdTcpAddresses" in message
    SourceOptions.parse({**base, "mode": "channel", "MAXMESSAGESPERBATCH": "5"})  # any case


def test_a_misspelled_option_is_named_first_with_the_nearest_valid_name() -> None:
    """Issue 41: ``chanel`` was reported as "option 'channel' is required"."""
    with pytest.raises(NsqOptionError) as info:
        SourceOptions.parse({"topic": "t", "chanel": "c", "nsqdTcpAddresses": "h:1"})
    assert str(info.value).startswith(
        "unknown option(s) 'chanel' for mode 'channel' ('chanel': did you mean 'channel'?)"
    )
    with pytest.raises(NsqOptionError, match="'nsqdtcpadress': did you mean 'nsqdTcpAddresses'"):
        SourceOptions.parse({"topic": "t", "channel": "c", "nsqdTcpAdress": "h:1"})
    with pytest.raises(NsqOptionError, match="'startingofsets': did you mean 'startingOffsets'"):
        LogOptions.parse({"topic": "t", "nsqdHttpAddresses": "h:1", "startingOfsets": "x"})
    with pytest.raises(NsqOptionError, match="'topik': did you mean 'topic'"):
        SinkOptions.parse({"topik": "t", "nsqdTcpAddresses": "h:1"}, has_topic_column=True)


def test_a_workers_python_without_the_package_is_one_line() -> None:
    """A Python that cannot import pynsqd_spark (PYSPARK_PYTHON unset, so Spark runs the
    system's python3): register() says what to set in one line; each task failed with a
    40-line ModuleNotFoundError."""
    import shutil
    import subprocess
    import sys

    import pytest

    from pynsqd_spark import check_workers_python

    check_workers_python(sys.executable)  # this one has it
    other = shutil.which("python3", path="/usr/bin:/bin")
    if other is None or subprocess.run([other, "-c", "import pynsqd_spark"]).returncode == 0:
        pytest.skip("no interpreter without pynsqd_spark on this machine")
    with pytest.raises(RuntimeError, match=r"cannot import pynsqd_spark: set PYSPARK_PYTHON"):
        check_workers_python(other)
    with pytest.raises(RuntimeError, match=r"'no-such-python'"):
        check_workers_python("no-such-python")


def test_a_checkpoint_keyed_by_a_workers_storage_id_goes_on_in_its_partition() -> None:
    """A query of an older version read a ``--workers`` node's retained topic as one log, kept
    by one worker, keyed by that worker's storage id; that log is now the worker's partition
    (its offsets unchanged): the checkpoint's key is read as the partition's, not as a log that
    is gone (which would start the partition again from ``startingOffsets``)."""
    from pynsqd.client.logs import _partition
    from pynsqd_spark.log_source import _rekey

    entry = {"partition": 618, "role": "leader", "epoch": 0, "isr": [617], "earliest": 0}
    logs = {
        "node/617": _partition(
            "node/617",
            [("h:1", 617, {**entry, "partition": 617, "committed": 5, "storage_id": "w0"})],
        ),
        "node/618": _partition(
            "node/618", [("h:1", 617, {**entry, "committed": 9, "storage_id": "w1"})]
        ),
    }
    assert logs["node/618"].aliases == ("w1",)
    assert _rekey({"w1": 7, "node/617": 2}, logs) == {"node/618": 7, "node/617": 2}
