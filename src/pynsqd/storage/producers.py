"""Idempotent publishing's producers across restarts: a snapshot at each segment roll.

Theory of operation. ``core/dedup.py`` keeps each producer by time (its last publish plus the
window), long after its records left the count window; the index is rebuilt from the log after
a start (``log_reader.read_identities``), and the log's newest ``max_records`` records alone do
not name a producer that published before them. So when a segment closes, the log writes what
the index knows of every producer (name, highest sequence number, last publish time) as of the
new segment's base offset, in ``<base, 20 digits>.producers`` (Kafka's producer-state
snapshots). A rebuild loads the newest snapshot at or below the log's end, reads the records
from there (or from the count window's start, if that is earlier) back into the index, and adds
the snapshot's producers the records did not name. A replica's copy rolls its own segments and
writes its own snapshots, so a failover keeps the producers as a restart does.

Format: one JSON line ``{"offset": O, "producers": [[name, high, ts_ns], ...]}`` and the
CRC-32 of that line in hex on the next; written atomically (``storage/atomic.py``). The two
newest are kept; a truncation removes those past the new end. An unreadable snapshot (a flipped
bit) is logged and the next older one is used: it can make a retry older than the window be
written twice, never stop the log from opening.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import zlib
from collections.abc import Iterable
from typing import Protocol

from ..core.dedup import DEFAULT_RECORDS, DEFAULT_WINDOW_NS, Dedup
from ..protocol.log_record import Follow
from . import log_reader
from .atomic import write_atomic

__all__ = ["ProducerIndex", "Snapshot", "exists", "load", "remove_after", "write"]

_NAME = re.compile(r"^(\d{20})\.producers$")
#: Snapshots kept: the newest and the one before it.
KEEP = 2

Snapshot = tuple[int, list[tuple[bytes, int, int]]]


def _offsets(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m is not None)


def exists(directory: str) -> bool:
    return bool(_offsets(directory))


def _path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}.producers")


def write(directory: str, offset: int, states: Iterable[tuple[bytes, int, int]]) -> None:
    """The producers as of ``offset`` (every record below it counted); older snapshots but
    the one before go. Raises OSError."""
    line = json.dumps(
        {"offset": offset, "producers": [[n.decode(), h, t] for n, h, t in states]},
        separators=(",", ":"),
    ).encode()
    write_atomic(_path(directory, offset), b"%s\n%08x\n" % (line, zlib.crc32(line)))
    for old in _offsets(directory)[:-KEEP]:
        with contextlib.suppress(OSError):
            os.unlink(_path(directory, old))


def _read(path: str) -> Snapshot:
    with open(path, "rb") as f:
        line, _, crc = f.read().partition(b"\n")
    if crc.strip() != b"%08x" % zlib.crc32(line):
        raise ValueError("checksum mismatch")
    doc = json.loads(line)
    producers = [(str(n).encode(), int(h), int(t)) for n, h, t in doc["producers"]]
    return int(doc["offset"]), producers


def load(directory: str, latest: int, name: str, logger: logging.Logger) -> Snapshot | None:
    """The newest readable snapshot at or below ``latest``, or None."""
    for offset in reversed(_offsets(directory)):
        if offset > latest:
            continue
        path = _path(directory, offset)
        try:
            return _read(path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            logger.error(
                "TOPICLOG(%s): unreadable %s (%s); idempotent publishing uses an older one",
                name,
                path,
                err,
            )
    return None


def remove_after(directory: str, end: int) -> None:
    """The log was cut to ``end``: snapshots of offsets past it describe records gone."""
    for offset in _offsets(directory):
        if offset > end:
            with contextlib.suppress(OSError):
                os.unlink(_path(directory, offset))


class IndexedLog(log_reader.Readable, Protocol):
    """What the index needs of its log (``TopicLog``)."""

    directory: str
    retention_time: float


class ProducerIndex:
    """One log's idempotent-publishing index (``core/dedup.Dedup``): its window, built by
    reading the log back the first time it is asked for (after a start, a truncation), kept by
    every append (``dedup``, ``follow``: the log's appends feed them), written down at each
    roll."""

    def __init__(self, tlog: IndexedLog) -> None:
        self.tlog = tlog
        self.records = DEFAULT_RECORDS
        self.window_ns = DEFAULT_WINDOW_NS
        self.dedup: Dedup | None = None
        #: While the index is kept: what an IDENTIFIED_NEXT record at the log's end continues.
        self.follow: Follow | None = None
        #: Snapshots exist here: a roll writes one even before the index is asked for.
        self.snapshots = exists(tlog.directory)

    def forget(self) -> None:
        """Records were taken back: read again when next asked."""
        self.dedup = self.follow = None

    def expiry(self) -> int:
        """How long a producer is remembered after its last publish (ns): the window's time,
        or the log's retention time when that is shorter."""
        if self.tlog.retention_time:
            return min(self.window_ns, int(self.tlog.retention_time * 1e9))
        return self.window_ns

    def get(self, now_ns: int | None = None) -> Dedup:
        if self.dedup is not None:
            return self.dedup
        tlog, started = self.tlog, time.monotonic()
        dedup = Dedup(self.records, self.expiry())
        offset = tlog.latest - dedup.max_records
        # Producers whose records all precede the count window are in the newest snapshot:
        # read from there, if that is earlier, so that every producer's last number since is
        # counted; then add those the records did not name.
        snapshot = load(tlog.directory, tlog.latest, tlog.name, tlog.log)
        if snapshot is not None:
            offset = min(offset, snapshot[0])
        self.follow = log_reader.read_identities(tlog, dedup, offset)
        for name, high, ts in snapshot[1] if snapshot is not None else ():
            dedup.remember(name, high, ts)
        dedup.expire(time.time_ns() if now_ns is None else now_ns, tlog.latest)
        if dedup.producers:
            tlog.log.info(
                "TOPICLOG(%s): %d producers remembered for idempotent publishing, %d of their "
                "publishes in the count window (read in %.0f ms)",
                tlog.name,
                len(dedup.producers),
                dedup.held,
                (time.monotonic() - started) * 1000,
            )
        self.dedup = dedup
        return dedup

    def set_window(self, records: int, window_ns: int) -> None:
        """``POST /topic/config``'s ``dedup_records`` and ``dedup_window``."""
        if (records, window_ns) == (self.records, self.window_ns):
            return
        grew = records > self.records or window_ns > self.window_ns
        self.records, self.window_ns = records, window_ns
        if self.dedup is not None:
            if grew:
                self.forget()  # read again: what was forgotten may be back in the window
            else:
                self.dedup.max_records = records
                self.dedup.window_ns = self.expiry()
                self.dedup.expire(time.time_ns(), self.tlog.latest)

    def at_roll(self, offset: int) -> None:
        """A segment closed at ``offset``: every producer the index knows, written down (built
        first if a snapshot says this log has producers)."""
        if self.dedup is None and not self.snapshots:
            return
        dedup = self.get()
        dedup.expire(time.time_ns(), offset)
        try:
            write(self.tlog.directory, offset, dedup.states())
            self.snapshots = True
        except OSError as err:  # a restart reads more of the log back; nothing is lost
            self.tlog.log.warning(
                "TOPICLOG(%s): failed to write its producers at offset %d - %s",
                self.tlog.name,
                offset,
                err,
            )
