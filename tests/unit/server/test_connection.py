"""The V2 connection without sockets: a fake loop whose clock moves only when told, a transport
that records what is written, and real topics and channels of the core.

Heartbeats, the client timeout, output buffering, msg_timeout, REQ and TOUCH are all about time;
here they take none.
"""

from __future__ import annotations

import zlib
from typing import Any

import snappy

from pynsqd.core.message import Message as CoreMessage
from pynsqd.protocol import encode
from pynsqd.protocol.frames import (
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MESSAGE_FRAME_STARTS,
    Frame,
    Message,
    decode_message,
    encode_message_frame,
    message_frame_start,
)
from pynsqd.server.protocol_v2 import FLUSH_DELAY, ClientV2
from pynsqd.server.workers.link import WorkerLink

from ..doubles import Context, Transport
from ..fakeloop import FakeLoop

HEARTBEAT = Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
OK = Frame(FRAME_TYPE_RESPONSE, b"OK")


def connect(ctx: Context) -> tuple[ClientV2, Transport]:
    client = ClientV2(ctx)  # type: ignore[arg-type]
    transport = Transport()
    client.connection_made(transport)  # type: ignore[arg-type]
    client.data_received(b"  V2")
    return client, transport


def send(client: ClientV2, loop: FakeLoop, data: bytes) -> None:
    client.data_received(data)
    loop.run_ready()


def messages(frames: list[Frame]) -> list[Message]:
    return [decode_message(f.data) for f in frames if f.frame_type == FRAME_TYPE_MESSAGE]


def subscriber(
    ctx: Context, loop: FakeLoop, rdy: int, **identify: Any
) -> tuple[ClientV2, Transport]:
    client, t = connect(ctx)
    send(client, loop, encode.identify(identify) + encode.sub("t", "c") + encode.rdy(rdy))
    t.frames()  # the OKs
    return client, t


def publish(ctx: Context, loop: FakeLoop, body: bytes) -> None:
    ctx.get_topic("t").put_bodies([body])
    loop.run_ready()


# -- heartbeats and the client timeout ----------------------------------------------------------


def test_heartbeats_and_client_timeout() -> None:
    loop = FakeLoop()
    ctx = Context(loop)
    silent, ts = connect(ctx)
    alive, ta = connect(ctx)
    for c in (silent, alive):
        send(c, loop, encode.identify({"heartbeat_interval": 1000}))
    assert ts.frames() == ta.frames() == [OK]
    for _ in range(3):  # the one that answers every heartbeat stays
        loop.advance(1.0)
        assert ta.frames() == [HEARTBEAT]
        send(alive, loop, encode.nop())
    assert not ta.closed
    # the silent one got its heartbeats and was closed after two intervals without a command
    assert ts.closed
    assert ts.frames() == [HEARTBEAT]


def test_a_trickled_half_command_does_not_keep_a_connection_alive() -> None:
    # nsqd's read deadline restarts per command, not per byte.
    loop = FakeLoop()
    ctx = Context(loop)
    c, t = connect(ctx)
    send(c, loop, encode.identify({"heartbeat_interval": 1000}))
    send(c, loop, b"PUB t\n\x00\x00\x01\x00")  # a 256-byte body, then a byte every 0.3 s
    for _ in range(7):
        loop.advance(0.3)
        send(c, loop, b"x")
    assert t.closed  # 2.1 s: past two 1 s intervals since the last whole command


def test_no_heartbeats_when_disabled() -> None:
    loop = FakeLoop()
    ctx = Context(loop)
    c, t = connect(ctx)
    send(c, loop, encode.identify({"heartbeat_interval": -1}))
    loop.advance(3600)
    assert t.frames() == [OK] and not t.closed


# -- output buffering ---------------------------------------------------------------------------


def test_a_lone_message_goes_out_after_a_millisecond_not_the_buffer_timeout() -> None:
    # output_buffer_timeout is an upper bound, not a wait (nsqd waits for its ticker, about
    # output_buffer_timeout, here 1 s).
    loop = FakeLoop()
    ctx = Context(loop)
    _, t = subscriber(ctx, loop, rdy=10, output_buffer_timeout=1000)
    publish(ctx, loop, b"lone")
    assert t.frames() == []  # waits a moment for more
    loop.advance(FLUSH_DELAY)
    assert [m.body for m in messages(t.frames())] == [b"lone"]


def test_output_buffer_timeout_minus_one_writes_at_once() -> None:
    loop = FakeLoop()
    ctx = Context(loop)
    _, t = subscriber(ctx, loop, rdy=10, output_buffer_timeout=-1)
    publish(ctx, loop, b"now")
    loop.advance(0)
    assert [m.body for m in messages(t.frames())] == [b"now"]


def test_a_burst_is_one_write() -> None:
    loop = FakeLoop()
    ctx = Context(loop)
    _, t = subscriber(ctx, loop, rdy=100, output_buffer_timeout=1000)
    writes: list[bytes] = []
    real_write = t.write

    def counting_write(data: bytes) -> None:
        writes.append(data)
        real_write(data)

    t.write = counting_write  # type: ignore[method-assign]
    topic = ctx.get_topic("t")
    for i in range(10):  # PUBs over several loop turns within the flush delay
        topic.put_bodies([b"m%d" % i])
        loop.run_ready()
    loop.advance(FLUSH_DELAY / 2)
    for i in range(10, 20):
        topic.put_bodies([b"m%d" % i])
        loop.run_ready()
    assert writes == []
    loop.advance(FLUSH_DELAY / 2)
    assert len(writes) == 1
    assert [m.body for m in messages(t.frames())] == [b"m%d" % i for i in range(20)]


def test_output_buffer_flushes_at_once_when_the_client_is_no_longer_ready() -> None:
    loop = FakeLoop()
    ctx = Context(loop)
    _, t = subscriber(ctx, loop, rdy=1, output_buffer_timeout=1000)
    publish(ctx, loop, b"last one it takes")
    assert [m.body for m in messages(t.frames())] == [b"last one it takes"]


def test_message_frames_built_from_cached_parts_are_nsqds_frames() -> None:
    # send_messages builds a frame from parts (its start by body size, timestamp + attempts once
    # per run that shares them, id, body): byte for byte what nsqd writes, whatever mix of
    # sizes, timestamps and attempts a batch holds.
    loop = FakeLoop()
    ctx = Context(loop)
    client, t = subscriber(ctx, loop, rdy=100)
    writes: list[bytes] = []
    t.write = writes.append  # type: ignore[method-assign]
    batch = [
        CoreMessage(b"%016x" % i, b"b%d" % i * (1 + i % 4), 1_000 + i // 3, attempts=i % 3 // 2)
        for i in range(40)
    ]
    client.send_messages(batch)
    client.flush()
    assert writes == [
        b"".join(encode_message_frame(m.timestamp, m.attempts, m.id, m.body) for m in batch)
    ]


def test_cached_frame_starts_are_bounded() -> None:
    for n in range(1, 10_000):
        assert message_frame_start(n) == encode_message_frame(0, 0, b"i" * 16, b"x" * n)[:8]
        assert len(MESSAGE_FRAME_STARTS) <= 4096


# -- msg_timeout, REQ, TOUCH ----------------------------------------------------------------------


def test_msg_timeout_redelivers() -> None:
    loop = FakeLoop()
    ctx = Context(loop)
    _, t = subscriber(ctx, loop, rdy=1, msg_timeout=1000)
    publish(ctx, loop, b"slow")
    (first,) = messages(t.frames())
    loop.advance(0.999)
    assert t.frames() == []
    loop.advance(0.001)
    (again,) = messages(t.frames())
    assert (again.id, again.body, again.attempts) == (first.id, b"slow", 2)
    assert ctx.topics["t"].channels["c"].timeout_count == 1


def test_req_with_a_timeout_defers_the_message() -> None:
    loop = FakeLoop()
    ctx = Context(loop)
    c, t = subscriber(ctx, loop, rdy=5)
    publish(ctx, loop, b"later")
    loop.advance(0.25)  # the output buffer timeout
    (m,) = messages(t.frames())
    send(c, loop, encode.req(m.id, 1000))
    publish(ctx, loop, b"now")
    loop.advance(0.25)
    assert [x.body for x in messages(t.frames())] == [b"now"]  # the deferred one waits
    loop.advance(0.7)
    assert t.frames() == []  # due 1 s after its REQ
    loop.advance(0.3 + 0.25)  # due, then the output buffer timeout
    (m2,) = messages(t.frames())
    assert (m2.id, m2.attempts) == (m.id, 2)


def test_touch_extends_the_deadline_up_to_max_msg_timeout() -> None:
    loop = FakeLoop()
    ctx = Context(loop, max_msg_timeout=2.0)
    c, t = subscriber(ctx, loop, rdy=1, msg_timeout=1000)
    publish(ctx, loop, b"touched")
    (m,) = messages(t.frames())
    for _ in range(3):  # every 0.6 s: past the 1 s msg_timeout, within the 2 s cap
        loop.advance(0.6)
        send(c, loop, encode.touch(m.id))
        assert t.frames() == []
    # at 1.8 s its deadline is min(1.8 + 1, 0 + 2): the cap wins, so it comes back at 2 s
    loop.advance(0.195)
    assert t.frames() == []
    loop.advance(0.01)  # (float sums of 0.6 are not exact: a few ms either side)
    (again,) = messages(t.frames())
    assert (again.id, again.attempts) == (m.id, 2)
    channel = ctx.topics["t"].channels["c"]
    assert channel.timeout_count == 1


# -- the pipeline: upgrade, trailing data, bounded inflate ----------------------------------------


def identify_then_snappy_commands() -> bytes:
    comp = snappy.StreamCompressor()
    wire = encode.identify({"feature_negotiation": True, "snappy": True})
    return wire + comp.compress(encode.pub("t", b"after identify") + encode.nop())


def test_compressed_commands_in_the_same_read_as_identify_are_run() -> None:
    # The parser stops after IDENTIFY; what it buffered goes through the new snappy layer.
    loop = FakeLoop()
    ctx = Context(loop, snappy=True)
    whole, tw = connect(ctx)
    send(whole, loop, identify_then_snappy_commands())
    bytewise, tb = connect(ctx)
    wire = identify_then_snappy_commands()
    for i in range(len(wire)):
        send(bytewise, loop, wire[i : i + 1])
    for c, t in ((whole, tw), (bytewise, tb)):
        assert c.snappy and not t.closed
        assert c.pub_counts == {"t": 1}
    assert ctx.topics["t"].depth == 2


def test_a_deflate_bomb_is_inflated_one_piece_per_loop_turn() -> None:
    loop = FakeLoop()
    ctx = Context(loop, deflate=True, max_msg_size=8 << 20)
    c, t = connect(ctx)
    send(c, loop, encode.identify({"feature_negotiation": True, "deflate": True}))
    body = b"\0" * (3 << 20)
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    c.data_received(z.compress(encode.pub("t", body)) + z.flush(zlib.Z_SYNC_FLUSH))
    assert not t.reading  # one piece inflated; reading stops until the next turn
    assert "t" not in ctx.topics
    loop.run_ready()
    assert t.reading and not t.closed
    assert ctx.topics["t"].depth == 1


# -- a link between workers: answers in order while publishes wait for their commit ------------


class CountingLog:
    """A retained log that only counts (what the commit wait reads of one)."""

    def __init__(self) -> None:
        self.latest = self.handed = self.visible = 0

    def append(self, msgs: list[CoreMessage], identity: Any = None) -> int:
        first, self.latest = self.latest, self.latest + len(msgs)
        return first

    def sync_wait(self, end: int) -> None:
        return None  # synced as it appends (no group commit)


class Commits:
    """Replication as a publish sees it: topics named r* wait for a commit the test gives."""

    def __init__(self) -> None:
        self.publishing = self
        self.waiting: list[tuple[str, Any]] = []

    def gate(self, topic: str) -> bool:
        return topic.startswith("r")

    def committed(self, topic: str, end: int) -> bool:
        return False

    def wait(self, topic: str, end: int, done: Any) -> None:
        self.waiting.append((topic, done))


def test_a_link_answers_in_order_while_its_publishes_wait_for_their_commits() -> None:
    """Worker 0 of a replicated node takes the other workers' publishes over one link each,
    answered in the order they came (``server/workers/forward.py`` matches them so). A publish that
    waits for its commit holds back the answers behind it, not the publishes: they go on,
    and a commit that comes out of order answers nothing before its turn."""
    loop = FakeLoop()
    ctx = Context(loop)
    commits = ctx.replication = Commits()  # type: ignore[assignment]
    for name in ("r1", "r2"):
        ctx.get_topic(name).log = CountingLog()  # type: ignore[assignment]
    link = WorkerLink(ctx)  # type: ignore[arg-type]
    t = Transport()
    link.connection_made(t)  # type: ignore[arg-type]
    send(link, loop, b"  V2" + encode.pub("r1", b"a") + encode.pub("r2", b"b"))
    send(link, loop, encode.pub("plain", b"c"))  # not replicated: known at once
    assert t.frames() == []
    assert [topic for topic, _ in commits.waiting] == ["r1", "r2"]  # both taken meanwhile
    (_, r1_a), (_, r2_b) = commits.waiting
    r2_b(None)  # r2 commits first: its answer waits for r1's
    loop.run_ready()
    assert t.frames() == []
    r1_a(None)
    loop.run_ready()
    assert t.frames() == [OK, OK, OK]
    # A publish that fails its wait is refused on the link, which goes on (it carries other
    # clients' publishes); the one behind it is answered after it.
    commits.waiting.clear()
    send(link, loop, encode.pub("r1", b"d") + encode.pub("r1", b"e"))
    (_, d), (_, e) = commits.waiting
    e(None)
    d("--replication-timeout=5s passed before 2 of 3 replicas had it")
    loop.run_ready()
    frames = t.frames()
    assert [f.data for f in frames] == [
        b"E_PUB_FAILED PUB failed --replication-timeout=5s passed before 2 of 3 replicas had it",
        b"OK",
    ]
    assert not t.closed and t.reading
    assert ctx.get_topic("r1").message_count == 3
