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
import zlib
from collections.abc import Iterable

from .atomic import write_atomic

__all__ = ["Snapshot", "exists", "load", "remove_after", "write"]

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
