"""Idempotent publishing: what a retained topic's log remembers of who published what.

Theory of operation. A publisher that wants its retries recognised gives each message an
identity: a **producer id** (its own name, 1..128 of ``[A-Za-z0-9._:-]``) and a **sequence
number**, consecutive per producer and topic (Kafka's idempotent producer, KIP-98). The identity
is written into the message's log record (``protocol/log_record.py``, ``IDENTIFIED``), so it is
on disk with the message, copied with it by replication, and this index is rebuilt from the log
after a crash: it can never remember a message the log lost, nor forget one the log kept (within
its window).

Per topic partition the index keeps, for each producer seen in its window, the sequence numbers
it holds as one run (``base`` .. ``high``), each with the CRC-32 of its body and its offset. A
publish of sequences ``first .. first + n - 1``:

- from an unknown producer (new, or forgotten): all new, whatever ``first`` is;
- ``first <= high``: the leading ``high - first + 1`` are duplicates, answered OK and not
  written again (the rest are new); a duplicate whose body's CRC differs from the one held is
  ``E_CONFLICT`` (a different message under the same identity: a bug in the publisher);
- ``first > high + 1``: a gap, ``E_BAD_SEQUENCE`` (accepting it would make the skipped numbers
  look published: a later retry of them would be dropped as a duplicate and lost).

Why a producer and a sequence rather than a key per message (NATS JetStream's ``Nats-Msg-Id``):
an MPUB of n messages carries one identity (the first number), the memory is 12 bytes per
message held plus one small object per producer rather than a key per message, and a gap is
detected instead of silently accepted. A sequence below ``base`` (older than the window) of a
producer still known counts as a duplicate: numbers are consecutive, so it was written.

The window: an identity is remembered while its record is among the newest ``max_records``
records of the partition and younger than ``window_ns``. A producer with nothing left in the
window is forgotten; its next publish is taken as new whatever its number (documented: a
retry later than the window may be written twice). Memory is bounded by ``max_records`` and
``MAX_PRODUCERS`` (the least recently seen producer is forgotten first): 12 bytes a message
held, about 480 bytes a producer (``docs/exactly-once.md`` has the figures).

No I/O here: ``storage/topiclog.py`` owns an index, feeds it what it appends (and what a
replica copies), and rebuilds it by reading its records back; ``core/topic.py`` asks it.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import NamedTuple

__all__ = [
    "DEFAULT_RECORDS",
    "DEFAULT_WINDOW_NS",
    "MAX_SEQUENCE",
    "Dedup",
    "DedupError",
    "Verdict",
    "gap_error",
]

#: The window's defaults (per topic: ``POST /topic/config?dedup_records=&dedup_window=``).
DEFAULT_RECORDS = 100_000
DEFAULT_WINDOW_NS = 24 * 3600 * 10**9
#: The most producers a partition remembers (the least recently seen is forgotten first): what
#: a client that names a new producer for every message can make a topic hold.
MAX_PRODUCERS = 10_000
#: The largest sequence number (an int64 in the log record).
MAX_SEQUENCE = (1 << 63) - 1


def gap_error(producer: bytes, first: int, high: int) -> DedupError:
    return DedupError(
        "E_BAD_SEQUENCE",
        f"producer {producer.decode()} sequence {first} is not the next one "
        f"(expected {high + 1}, or a number already published)",
    )


class DedupError(Exception):
    """A publish whose identity cannot be taken: ``code`` is nsqd-style (``E_BAD_SEQUENCE``,
    ``E_CONFLICT``), the text says what was expected."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


class Verdict(NamedTuple):
    #: How many leading messages of the publish the partition already holds.
    duplicates: int
    #: The offset of the last of them; -1 when there are none, or it is older than the window.
    last_offset: int


class _Producer:
    __slots__ = ("base", "crcs", "last_run", "name", "offsets", "start")

    def __init__(self, name: bytes, base: int) -> None:
        self.name = name
        #: The sequence number of ``crcs[start]``.
        self.base = base
        self.start = 0
        self.crcs = array("I")
        self.offsets = array("q")
        self.last_run: _Run | None = None

    @property
    def held(self) -> int:
        return len(self.crcs) - self.start

    @property
    def high(self) -> int:
        return self.base + self.held - 1

    def drop(self, n: int) -> None:
        """Forget the ``n`` oldest."""
        n = min(n, self.held)
        self.start += n
        self.base += n
        if self.start > 1024 and self.start * 2 > len(self.crcs):
            del self.crcs[: self.start]
            del self.offsets[: self.start]
            self.start = 0


class _Run:
    """Consecutive appends of one producer: how many, and the newest one's timestamp."""

    __slots__ = ("count", "producer", "ts")

    def __init__(self, producer: _Producer, count: int, ts: int) -> None:
        self.producer, self.count, self.ts = producer, count, ts


class Dedup:
    """The identities one partition's log holds, in its window."""

    def __init__(
        self,
        max_records: int = DEFAULT_RECORDS,
        window_ns: int = DEFAULT_WINDOW_NS,
        max_producers: int = MAX_PRODUCERS,
    ):
        self.max_records = max_records
        self.window_ns = window_ns
        self.max_producers = max_producers
        self.producers: dict[bytes, _Producer] = {}
        #: Runs of appends, oldest first.
        self._runs: deque[_Run] = deque()
        self.held = 0

    def __len__(self) -> int:
        return self.held

    def high(self, producer: bytes) -> int | None:
        """The producer's highest sequence number held; None: not known."""
        p = self.producers.get(producer)
        return None if p is None else p.high

    def check(
        self,
        producer: bytes,
        first: int,
        crcs: list[int],
        now_ns: int,
        latest: int,
        *,
        gaps: bool = False,
    ) -> Verdict:
        """What a publish of ``len(crcs)`` messages numbered from ``first`` is. Raises
        DedupError. ``latest``: the log's next offset (the count window ends there).
        ``gaps``: a gap is no error here (the caller judges it over several partitions)."""
        self.expire(now_ns, latest)
        p = self.producers.get(producer)
        if p is None:
            return Verdict(0, -1)
        high = p.high
        if first > high + 1:
            if gaps:
                return Verdict(0, -1)
            raise gap_error(producer, first, high)
        dups = min(len(crcs), high - first + 1)
        last = -1
        for i in range(dups):
            seq = first + i
            if seq < p.base:
                continue  # older than the window: published, its body no longer known
            at = p.start + seq - p.base
            if p.crcs[at] != crcs[i]:
                raise DedupError(
                    "E_CONFLICT",
                    f"producer {producer.decode()} sequence {seq} was published with a "
                    "different body",
                )
            last = p.offsets[at]
        return Verdict(dups, last)

    def record(
        self, producer: bytes, first: int, crcs: list[int], first_offset: int, ts_ns: int
    ) -> None:
        """The log appended these (at offsets ``first_offset`` on)."""
        n = len(crcs)
        if not n:
            return
        p = self.producers.get(producer)
        if p is not None and first != p.high + 1:
            # Not the next numbers (a log rebuilt across a gap the rules never let in, or a
            # producer that came back after being forgotten): start its run again.
            self.held -= p.held
            p.drop(p.held)
            p.last_run = None
            p = None
        if p is None:
            p = self.producers[producer] = _Producer(producer, first)
        p.crcs.extend(crcs)
        p.offsets.extend(range(first_offset, first_offset + n))
        self.held += n
        runs = self._runs
        if runs and runs[-1].producer is p:
            last = runs[-1]
            last.count += n
            last.ts = max(last.ts, ts_ns)
        else:
            p.last_run = _Run(p, n, ts_ns)
            runs.append(p.last_run)
        self.expire(ts_ns, first_offset + n)

    def expire(self, now_ns: int, latest: int) -> None:
        """Forget what left the window: older than ``window_ns``, or more than
        ``max_records`` records before ``latest``."""
        runs = self._runs
        floor = latest - self.max_records
        oldest_ts = now_ns - self.window_ns
        while runs:
            run = runs[0]
            p, count, ts = run.producer, run.count, run.ts
            if p.held == 0 or self.producers.get(p.name) is not p:
                runs.popleft()  # its producer started again or went
                continue
            if ts < oldest_ts or (len(self.producers) > self.max_producers and p.last_run is run):
                # Aged out; or too many producers and this one's newest run is the oldest
                # (the least recently seen producer goes whole).
                n = min(count, p.held)
            elif len(self.producers) > self.max_producers:
                n = min(count, p.held)  # older runs of a producer seen since: their entries
            else:
                # Entries below the count floor, from the front of this run.
                n = 0
                offsets, at = p.offsets, p.start
                while n < count and n < p.held and offsets[at + n] < floor:
                    n += 1
                if not n:
                    break
            p.drop(n)
            self.held -= n
            if n >= count:
                runs.popleft()
            else:
                run.count = count - n
            if not p.held:
                del self.producers[p.name]
                p.last_run = None  # no cycle left for the garbage collector
            if n < count:
                break

    def clear(self) -> None:
        self.producers.clear()
        self._runs.clear()
        self.held = 0
