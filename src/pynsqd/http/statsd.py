"""statsd push (nsqd's ``statsdLoop``, ``internal/statsd``, ``internal/writers``).

Every ``--statsd-interval`` the stats are turned into ``<prefix><stat>:<value>|c`` (counters:
the change since the last push) and ``|g`` (gauges) lines, packed into UDP datagrams of at most
``--statsd-udp-packet-size`` bytes without splitting a line, and the datagrams are spread
evenly over ``interval - 1s``, as nsqd's spread writer does. It is an asyncio task on nsqd's
loop; the stats are read from the live objects in one go and sent without blocking.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..internal.listener import split_host_port
from ..internal.memstats import mem_stats
from ..log import LOGGER_NAME
from .host import NSQDHost
from .stats import get_stats

log = logging.getLogger(LOGGER_NAME)
_EPHEMERAL = "#ephemeral"


def host_key(address: str) -> str:
    """statsd's ``HostKey``: ``.`` and ``:`` become ``_``."""
    return address.replace(".", "_").replace(":", "_")


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    """nsqd's prefix: ``%s`` → ``<broadcast_address>_<http_port>``, with a trailing ``.``."""
    if not template:
        return ""
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    prefix = template.replace("%s", host_key(f"{host}:{http_port}"))
    return prefix if prefix.endswith(".") else prefix + "."


def pack_packets(lines: list[str], packet_size: int) -> list[bytes]:
    """nsqd's ``BoundaryBufferedWriter``: whole lines, at most ``packet_size`` bytes each."""
    packets: list[bytes] = []
    buf = bytearray()
    for line in lines:
        data = line.encode()
        if buf and len(buf) + len(data) > packet_size:
            packets.append(bytes(buf))
            buf.clear()
        buf += data
    if buf:
        packets.append(bytes(buf))
    return packets


class StatsdPusher:
    """Builds each push's lines, remembering the last counters to send deltas."""

    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd
        self._last_topics: dict[str, dict[str, Any]] = {}
        self._last_gc_runs = 0

    def lines(self, prefix: str) -> list[str]:
        opts = self.nsqd.opts
        exclude_ephemeral = opts.statsd_exclude_ephemeral
        out: list[str] = []

        def incr(stat: str, value: int) -> None:
            out.append(f"{prefix}{stat}:{value}|c\n")

        def gauge(stat: str, value: int) -> None:
            out.append(f"{prefix}{stat}:{value}|g\n")

        topics, _ = get_stats(self.nsqd, include_clients=False)
        last_topics = self._last_topics
        for topic in topics or []:
            name = topic["topic_name"]
            if exclude_ephemeral and name.endswith(_EPHEMERAL):
                continue
            last = last_topics.get(name, {})
            incr(
                f"topic.{name}.message_count", topic["message_count"] - last.get("message_count", 0)
            )
            incr(
                f"topic.{name}.message_bytes", topic["message_bytes"] - last.get("message_bytes", 0)
            )
            gauge(f"topic.{name}.depth", topic["depth"])
            gauge(f"topic.{name}.backend_depth", topic["backend_depth"])
            for item in topic["e2e_processing_latency"]["percentiles"] or []:
                pct = f"{item['quantile'] * 100.0:.0f}"
                gauge(f"topic.{name}.e2e_processing_latency_{pct}", int(item["value"]))
            last_channels = {c["channel_name"]: c for c in last.get("channels", [])}
            for ch in topic["channels"]:
                cname = ch["channel_name"]
                if exclude_ephemeral and cname.endswith(_EPHEMERAL):
                    continue
                lc = last_channels.get(cname, {})
                base = f"topic.{name}.channel.{cname}"
                incr(f"{base}.message_count", ch["message_count"] - lc.get("message_count", 0))
                gauge(f"{base}.depth", ch["depth"])
                gauge(f"{base}.backend_depth", ch["backend_depth"])
                gauge(f"{base}.in_flight_count", ch["in_flight_count"])
                gauge(f"{base}.deferred_count", ch["deferred_count"])
                incr(f"{base}.requeue_count", ch["requeue_count"] - lc.get("requeue_count", 0))
                incr(f"{base}.timeout_count", ch["timeout_count"] - lc.get("timeout_count", 0))
                gauge(f"{base}.clients", ch["client_count"])
                for item in ch["e2e_processing_latency"]["percentiles"] or []:
                    pct = f"{item['quantile'] * 100.0:.0f}"
                    gauge(f"{base}.e2e_processing_latency_{pct}", int(item["value"]))
        self._last_topics = {t["topic_name"]: t for t in topics or []}

        if opts.statsd_mem_stats:
            ms = mem_stats()
            for key in (
                "heap_objects",
                "heap_idle_bytes",
                "heap_in_use_bytes",
                "heap_released_bytes",
                "gc_pause_usec_100",
                "gc_pause_usec_99",
                "gc_pause_usec_95",
                "next_gc_bytes",
            ):
                gauge(f"mem.{key}", ms[key])
            incr("mem.gc_runs", ms["gc_total_runs"] - self._last_gc_runs)
            self._last_gc_runs = ms["gc_total_runs"]
        return out

    async def push(self, address: str, prefix: str, interval: float) -> None:
        loop = asyncio.get_running_loop()
        packets = pack_packets(self.lines(prefix), self.nsqd.opts.statsd_udp_packet_size)
        host, port = split_host_port(address)
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, remote_addr=(host, port)
        )
        try:
            log.info("STATSD: pushing stats to %s", address)
            spread = interval - 1.0
            pause = spread / len(packets) if packets and spread > 0 else 0.0
            for i, packet in enumerate(packets):
                transport.sendto(packet)
                if pause and i < len(packets) - 1:
                    await asyncio.sleep(pause)
        finally:
            transport.close()

    async def run(self) -> None:
        """Push every interval until cancelled (nsqd's ticker: the first push after one)."""
        loop = asyncio.get_running_loop()
        opts = self.nsqd.opts
        interval = opts.statsd_interval
        next_push = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_push - loop.time()))
            next_push += interval
            prefix = statsd_prefix(opts.statsd_prefix, opts.broadcast_address, self.http_port())
            try:
                await self.push(opts.statsd_address, prefix, interval)
            except (OSError, ValueError) as err:
                log.error("STATSD: failed to push to %s - %s", opts.statsd_address, err)
            if loop.time() > next_push:  # a slow spread: skip ticks, as Go's ticker does
                next_push = loop.time() + interval

    def http_port(self) -> int:
        opts = self.nsqd.opts
        if opts.broadcast_http_port:
            return opts.broadcast_http_port
        address = self.nsqd.http_address
        try:
            return split_host_port(address)[1] if address else 0
        except ValueError:
            return 0
