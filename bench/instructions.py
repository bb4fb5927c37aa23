"""Instructions per message of in-process pubsub: the server's Python cost, deterministically.

    .venv/bin/python bench/instructions.py [--cycles 100] [--size 200] [--batch 200] [--time]
                                           [--headers none|negotiated|small|two]

Each cycle sends one MPUB of ``--batch`` messages of ``--size`` bytes through a real
``ClientV2``: its parser, the topic, the channel, and delivery frames to two subscribing
``ClientV2`` s, whose FINs then come back through their own parsers. It runs on the unit tests'
fake loop, with transports that keep what is written: no socket, no kernel, no event loop.

Under valgrind's callgrind, the instruction counts of two run lengths are subtracted, so
start-up cancels out. The harness's own work (finding the IDs in the frames, writing the FINs)
is counted the same way and subtracted too. Instruction counts do not depend on what else the
machine is doing; timings on a shared two-core VM move 10-30% from minute to minute. Issue 31's
changes were guided by this count. ``--time`` prints nanoseconds per message as well (the
minimum of 7 runs). ``--headers``: the publisher and both consumers negotiate message headers
(``docs/headers.md``) and each body carries a block: ``negotiated`` an empty one, ``small``
``tenant`` and ``kind`` (25 bytes), ``two`` its own ``traceparent`` and a ``tenant`` (84 bytes),
as ``bench/headers.py`` publishes them; the counts say what headers cost in instructions, where
that bench's timings on this VM move by several percent from round to round.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.unit.doubles import Context, Transport  # noqa: E402
from tests.unit.fakeloop import FakeLoop  # noqa: E402

from pynsqd.core.backend import DummyBackend  # noqa: E402
from pynsqd.core.channel import Channel  # noqa: E402
from pynsqd.core.topic import Topic  # noqa: E402
from pynsqd.protocol import encode, headers  # noqa: E402
from pynsqd.protocol.frames import FRAME_TYPE_MESSAGE, encode_message_frame  # noqa: E402
from pynsqd.server.protocol_v2 import ClientV2  # noqa: E402
from pynsqd.server.workers.link import WorkerLink  # noqa: E402

_FRAME = struct.Struct(">ll")


class Sink(Transport):
    """Keeps each write whole (the IDs are read from them between cycles)."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


def fins_for(data: bytes) -> bytes:
    """The FINs a consumer sends for every message frame in ``data``: the harness's work."""
    ids = []
    p = 0
    while p < len(data):
        size, frame_type = _FRAME.unpack_from(data, p)
        if frame_type == FRAME_TYPE_MESSAGE:
            ids.append(data[p + 18 : p + 34])
        p += 4 + size
    return b"".join(b"FIN %s\n" % i for i in ids)


def _context(loop: FakeLoop) -> Context:
    """A fake nsqd whose channels keep everything in memory."""
    ctx = Context(loop, mem_queue_size=1_000_000)
    ctx.make_channel = lambda topic, name: Channel(  # type: ignore[method-assign]
        topic,
        name,
        loop,
        mem_queue_size=1_000_000,
        backend=DummyBackend(),
        max_msg_timeout=ctx.opts.max_msg_timeout,
    )
    return ctx


#: What IDENTIFY asks with ``--headers`` other than ``none``.
NEGOTIATE = {"feature_negotiation": True, "headers": True}
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def bodies(size: int, batch: int, kind: str) -> list[bytes]:
    """One MPUB's bodies for ``--headers`` ``kind``."""
    body = b"x" * size
    if kind == "none":
        return [body] * batch
    if kind == "negotiated":
        return [headers.join_body(b"", body)] * batch
    out = []
    for i in range(batch):
        if kind == "small":
            pairs = [("tenant", b"acme"), ("kind", b"o%04d" % i)]
        else:
            trace = TRACEPARENT[:36] + b"%016x" % i + TRACEPARENT[52:]
            pairs = [("traceparent", trace), ("tenant", b"acme")]
        out.append(headers.join_body(headers.encode(pairs), body))
    return out


class Pubsub:
    def __init__(self, size: int, batch: int, kind: str = "none") -> None:
        # As nsqd runs (internal/process.py): long-lived objects frozen, young collections rare.
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        self.loop = loop = FakeLoop()
        self.ctx = _context(loop)
        ident = encode.identify(NEGOTIATE if kind != "none" else {})
        self.publisher = self._connect(Transport())
        self.publisher.transport.write = lambda data: None  # type: ignore[union-attr]
        self.publisher.data_received(ident)
        loop.run_ready()
        self.subs = []
        for _ in range(2):
            sink = Sink()
            client = self._connect(sink)
            client.data_received(ident + encode.sub("t", "c") + encode.rdy(2500))
            loop.run_ready()
            sink.chunks.clear()
            self.subs.append((client, sink))
        self.mpub = encode.mpub("t", bodies(size, batch, kind))
        self.batch = batch
        self.kind = kind

    def _connect(self, transport: Transport) -> ClientV2:
        client = ClientV2(self.ctx)  # type: ignore[arg-type]
        client.connection_made(transport)  # type: ignore[arg-type]
        client.data_received(b"  V2")
        return client

    def run(self, cycles: int) -> float:
        """``cycles`` MPUB-deliver-FIN cycles; seconds spent in the server's code."""
        spent = 0.0
        clock = time.perf_counter
        for _ in range(cycles):
            t0 = clock()
            self.publisher.data_received(self.mpub)
            self.settle()
            for client, _ in self.subs:
                client.flush()  # what the flush timer does (the fake clock does not move here)
            spent += clock() - t0
            fins = [(c, fins_for(b"".join(s.chunks))) for c, s in self.subs]
            for _, sink in self.subs:
                sink.chunks.clear()
            t0 = clock()
            for client, data in fins:
                if data:
                    client.data_received(data)
            self.settle()
            spent += clock() - t0
        return spent

    def settle(self) -> None:
        """Run what the last input made ready."""
        self.loop.run_ready()

    def check(self, cycles: int) -> None:
        """Every message published was delivered and FIN'd (a broken harness measures less)."""
        topic: Topic = self.ctx.get_topic("t")
        channel = topic.channels["c"]
        sent = sum(c.message_count for c, _ in self.subs)
        finished = sum(c.finish_count for c, _ in self.subs)
        negotiated = [c.headers is not None for c in (self.publisher, *(c for c, _ in self.subs))]
        if negotiated != [self.kind != "none"] * 3:
            raise SystemExit(f"harness broken: headers negotiated {negotiated} for {self.kind}")
        if not sent == finished == topic.message_count or channel.depth or channel.in_flight:
            raise SystemExit(
                f"harness broken: published {topic.message_count}, delivered {sent}, "
                f"finished {finished}, depth {channel.depth}"
            )


class _Workers:
    """What a relay asks of its worker (``server/workers.Workers``), for the bench."""

    def __init__(self, ctx: Context) -> None:
        self.opts = ctx.opts
        self.loop = ctx.loop
        self.index = 0

    def peers(self) -> list[int]:
        return [1]

    def link_path(self, peer: int) -> str:
        return ""


class Pipe(Transport):
    """One direction of a link's unix socket: writes are handed over by ``pump``."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        return data


class CrossPubsub(Pubsub):
    """``--cross``: the MPUB lands on worker B; both consumers are on worker A, so every
    message crosses: B delivers it to A's link, A lends it to its consumers, their FINs go back
    over the link (``server/workers/relay.py``, ``core/lending.py``). Two fake loops, no sockets."""

    def __init__(self, size: int, batch: int, kind: str = "none") -> None:
        from pynsqd.core.lending import Lending
        from pynsqd.server.workers.relay import Link, Relay

        super().__init__(size, batch, kind)  # worker A: its two consumers, subscribed
        a_ctx, a_loop = self.ctx, self.loop
        self.b_loop = b_loop = FakeLoop()
        self.b_ctx = b_ctx = _context(b_loop)
        self.ctx, self.loop = b_ctx, b_loop
        self.publisher = self._connect(Transport())  # publishes on worker B
        self.publisher.transport.write = lambda data: None  # type: ignore[union-attr]
        self.ctx, self.loop = a_ctx, a_loop
        self.to_b, self.to_a = Pipe(), Pipe()
        self.b_link = WorkerLink(b_ctx)  # type: ignore[arg-type]
        self.b_link.connection_made(self.to_a)  # type: ignore[arg-type]
        channel = a_ctx.get_topic("t").channels["c"]
        self.relay = relay = Relay(_Workers(a_ctx), channel)  # type: ignore[arg-type]
        channel.lending = Lending(relay)
        self.link = link = Link(relay, 1)
        relay.links[1] = link
        link.connection_made(self.to_b)  # type: ignore[arg-type]
        self.pump_links()

    def pump_links(self) -> None:
        """Bytes across the link both ways until neither side has more."""
        while True:
            self.b_loop.run_ready()
            self.b_link.flush()
            down, up = self.to_a.take(), self.to_b.take()
            if not down and not up:
                return
            if up:
                self.b_link.data_received(up)
            if down:
                self.link.data_received(down)
            self.loop.run_ready()

    def settle(self) -> None:
        self.loop.run_ready()
        self.pump_links()

    def check(self, cycles: int) -> None:
        b_topic: Topic = self.b_ctx.get_topic("t")
        b_channel = b_topic.channels["c"]
        finished = sum(c.finish_count for c, _ in self.subs)
        if finished != b_topic.message_count or b_channel.depth or b_channel.in_flight:
            raise SystemExit(
                f"harness broken: published {b_topic.message_count} on B, finished {finished}"
                f" on A, B's depth {b_channel.depth}, in flight {len(b_channel.in_flight)}"
            )


class _Forwarding:
    """Worker A's side of ``--workers`` for ``--forward``: its publishes go over one link."""

    def __init__(self, link: object) -> None:
        from pynsqd.server.workers.placement import Placement

        self.link = link
        #: Worker A of two: where an identified publish's producer lives (none here).
        self.placement = Placement(0, 2)

    def channel_everywhere(self, topic: str, channel: str) -> None:
        return None

    def forward(self, peer: int, command: bytes, done: object) -> None:
        self.link.send(command, done)  # type: ignore[attr-defined]


class ForwardPubsub(Pubsub):
    """``--forward``: the MPUB lands on worker A, which does not keep the topic (a bounded one,
    or a retained one on a replicated node):
    A passes it to worker B over a forward link (``server/workers/forward.py``) and answers with B's
    answer; both consumers are on B. What it adds to ``Pubsub`` is the hop. Two fake loops."""

    def __init__(self, size: int, batch: int, kind: str = "none") -> None:
        from pynsqd.server.workers.forward import ForwardLink

        super().__init__(size, batch, kind)  # worker B: the topic, its two consumers
        b_ctx, b_loop = self.ctx, self.loop
        self.a_loop = a_loop = FakeLoop()
        self.a_ctx = a_ctx = _context(a_loop)
        self.to_b, self.to_a = Pipe(), Pipe()
        self.b_link = WorkerLink(b_ctx)  # type: ignore[arg-type]
        self.b_link.connection_made(self.to_a)  # type: ignore[arg-type]
        self.fwd = ForwardLink(1, lambda link: None)
        self.fwd.connection_made(self.to_b)  # type: ignore[arg-type]
        a_ctx.workers = _Forwarding(self.fwd)  # type: ignore[assignment]
        a_ctx.get_topic("t").kept_by = 1  # B keeps its log
        self.ctx, self.loop = a_ctx, a_loop
        self.publisher = self._connect(Transport())  # publishes on worker A
        self.answers = Sink()
        self.publisher.transport.write = self.answers.write  # type: ignore[union-attr]
        self.ctx, self.loop = b_ctx, b_loop
        self.pump_links()

    def pump_links(self) -> None:
        """Bytes across the link both ways until neither side has more."""
        while True:
            self.a_loop.run_ready()
            self.loop.run_ready()
            self.b_link.flush()
            down, up = self.to_b.take(), self.to_a.take()
            if not down and not up:
                return
            if down:
                self.b_link.data_received(down)
            if up:
                self.fwd.data_received(up)

    def settle(self) -> None:
        self.pump_links()

    def check(self, cycles: int) -> None:
        super().check(cycles)
        self.publisher.flush()
        oks = b"".join(self.answers.chunks).count(b"OK")
        if oks != cycles or self.a_ctx.get_topic("t").message_count:
            raise SystemExit(f"harness broken: {oks} OKs on A for {cycles} MPUBs")


def harness_only(size: int, batch: int, cycles: int) -> None:
    """The harness's per-cycle work alone, over frames like the server's."""
    frames = [
        b"".join(encode_message_frame(1, 1, b"%016x" % i, b"x" * size) for i in range(n))
        for n in (batch // 2, batch - batch // 2)
    ]
    for _ in range(cycles):
        for data in frames:
            fins_for(data)


def instructions(args: argparse.Namespace, what: str) -> float:
    """Instructions per message for ``what`` (pubsub or harness), from two run lengths."""
    counts = []
    for cycles in (args.cycles // 5, args.cycles // 5 + args.cycles):
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--inner",
            what,
            "--cycles",
            str(cycles),
            "--size",
            str(args.size),
            "--batch",
            str(args.batch),
            *(["--cross"] if args.cross and what == "pubsub" else []),
            *(["--forward"] if args.forward and what == "pubsub" else []),
            *(["--headers", args.headers] if what == "pubsub" else []),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict and set layouts each run
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stderr
        found = re.search(r"Collected : (\d+)", out)
        if found is None:
            raise SystemExit(f"callgrind printed no count:\n{out[-2000:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (args.cycles * args.batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cycles", type=int, default=100, help="MPUB-deliver-FIN cycles counted")
    ap.add_argument("--size", type=int, default=200, help="message size in bytes")
    ap.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    ap.add_argument("--time", action="store_true", help="also print ns per message (min of 7)")
    ap.add_argument(
        "--cross",
        action="store_true",
        help="--workers: every message crosses from the worker it was published on to the "
        "consumers' worker",
    )
    ap.add_argument(
        "--forward",
        action="store_true",
        help="--workers with a retained topic: every MPUB lands on a worker that does not keep "
        "the topic's log and is passed to the one that does (the consumers' worker)",
    )
    ap.add_argument(
        "--headers",
        choices=["none", "negotiated", "small", "two"],
        default="none",
        help="message headers, negotiated by the publisher and both consumers (above)",
    )
    ap.add_argument("--inner", choices=["pubsub", "harness"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner == "harness":
        harness_only(args.size, args.batch, args.cycles)
        return 0
    kind = CrossPubsub if args.cross else ForwardPubsub if args.forward else Pubsub
    if (args.cross or args.forward) and args.headers != "none":
        ap.error("--headers: with --cross or --forward not measured yet")
    if args.inner == "pubsub":
        bench = kind(args.size, args.batch, args.headers)
        bench.run(args.cycles)
        bench.check(args.cycles)
        return 0
    bench = kind(args.size, args.batch, args.headers)
    bench.run(20)
    bench.check(20)
    where = ", every message crossing workers" if args.cross else ""
    if args.headers != "none":
        where = f", headers: {args.headers}"
    if args.forward:
        where = ", every MPUB passed to the worker that keeps the topic's log"
    print(
        f"in-process pubsub, {args.batch} x {args.size}-byte messages per MPUB, 2 consumers{where}"
    )
    if args.time:
        best = min(bench.run(args.cycles) for _ in range(7))
        print(f"  {best / (args.cycles * args.batch) * 1e9:,.0f} ns per message (min of 7)")
    if shutil.which("valgrind") is None:
        print("  valgrind not found: no instruction counts (Debian: apt install valgrind)")
        return 0 if args.time else 1
    total = instructions(args, "pubsub")
    harness = instructions(args, "harness")
    print(f"  {total - harness:,.0f} instructions per message in the server's code")
    print(
        f"  ({total:,.0f} with the harness's own {harness:,.0f}; callgrind, {os.uname().machine})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
