"""statsd push received on a real UDP socket: nsqd's metric names, types and packet sizes."""

from __future__ import annotations

import socket
from collections.abc import Callable

from tests.conftest import ServerThread

from ..waiting import wait_for
from .servers import request


def receive_until(sock: socket.socket, done: Callable[[list[str]], bool]) -> list[bytes]:
    packets: list[bytes] = []
    lines: list[str] = []
    while not done(lines):
        data = sock.recv(65536)
        packets.append(data)
        lines += data.decode().splitlines()
    return packets


def test_statsd_push(make_nsqd: Callable[..., ServerThread]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(10)
        check_statsd_push(make_nsqd, sock)


def check_statsd_push(make_nsqd: Callable[..., ServerThread], sock: socket.socket) -> None:
    port = sock.getsockname()[1]
    server = make_nsqd(
        statsd_address=f"127.0.0.1:{port}",
        statsd_interval=0.2,
        statsd_udp_packet_size=200,
        statsd_exclude_ephemeral=True,
        broadcast_address="my.host",
        e2e_processing_latency_percentiles=[0.999],
    )
    prefix = f"nsq.my_host_{server.http_port}."
    expected = {
        prefix + line
        for line in (
            "topic.t.message_count:3|c",
            "topic.t.message_bytes:6|c",
            "topic.t.depth:0|g",
            "topic.t.backend_depth:0|g",
            "topic.t.channel.c.message_count:3|c",
            "topic.t.channel.c.depth:0|g",
            "topic.t.channel.c.backend_depth:0|g",
            "topic.t.channel.c.in_flight_count:0|g",
            "topic.t.channel.c.deferred_count:0|g",
            "topic.t.channel.c.requeue_count:0|c",
            "topic.t.channel.c.timeout_count:0|c",
            "topic.t.channel.c.clients:1|g",
        )
    }
    with server.connect() as sub, server.connect() as sub_eph:
        sub.sub("t", "c", rdy=5)
        sub_eph.sub("t", "e#ephemeral", rdy=0)
        request(server, "POST", "/mpub?topic=t", b"ab\ncd\nef")
        for m in sub.read_messages(3):
            sub.fin(m.id)
        # Counters and gauges can come in different pushes (a push may precede the FINs).
        e2e = (
            f"{prefix}topic.t.e2e_processing_latency_100:",
            f"{prefix}topic.t.channel.c.e2e_processing_latency_100:",
        )
        mem = [f"{prefix}mem.{k}:" for k in ("heap_objects", "gc_pause_usec_99", "gc_runs")]
        # Everything asserted below, which may span several pushes.
        packets = receive_until(
            sock,
            lambda lines: (
                expected <= set(lines)
                and all(any(line.startswith(k) for line in lines) for k in (*e2e, *mem))
            ),
        )
    lines = [line for p in packets for line in p.decode().splitlines()]
    for packet in packets:
        assert len(packet) <= 200
        assert packet.endswith(b"\n")
    assert all(line.startswith(prefix) for line in lines)
    # 0.999 -> "%.0f" of 99.9 -> 100 (nsqd's rounding).
    assert any(line.startswith(f"{prefix}topic.t.e2e_processing_latency_100:") for line in lines)
    assert any(
        line.startswith(f"{prefix}topic.t.channel.c.e2e_processing_latency_100:") for line in lines
    )
    for key in ("heap_objects", "heap_in_use_bytes", "gc_pause_usec_99", "next_gc_bytes"):
        assert any(line.startswith(f"{prefix}mem.{key}:") and line.endswith("|g") for line in lines)
    assert any(line.startswith(f"{prefix}mem.gc_runs:") and line.endswith("|c") for line in lines)
    assert not any("#ephemeral" in line for line in lines)
    # Counters are deltas: a later push says 0 new messages.
    receive_until(sock, lambda ls: f"{prefix}topic.t.message_count:0|c" in ls)


def test_statsd_prefix_and_packing() -> None:
    from pynsqd.http.statsd import pack_packets, statsd_prefix

    assert statsd_prefix("nsq.%s", "10.0.0.1", 4151) == "nsq.10_0_0_1_4151."
    assert statsd_prefix("app.", "h", 1) == "app."
    assert statsd_prefix("app", "h", 1) == "app."
    assert statsd_prefix("", "h", 1) == ""
    lines = [f"k{i}:{i}|g\n" for i in range(100)]
    packets = pack_packets(lines, 50)
    assert all(len(p) <= 50 for p in packets)
    assert b"".join(packets) == "".join(lines).encode()
    assert all(p.endswith(b"\n") for p in packets)


def test_no_statsd_task_without_address(nsqd: ServerThread) -> None:
    wait_for(lambda: nsqd.nsqd.http is not None)
    assert nsqd.call(lambda: nsqd.nsqd.http._statsd_task) is None  # type: ignore[union-attr]
