"""Idempotent publishing: what a retained topic's log remembers of who published what.

Theory of operation. A publisher that wants its retries recognised gives each message an
identity: a **producer id** (its own name, 1..128 of ``[A-Za-z0-9._:-]``) and a **sequence
number**, consecutive per producer and topic (Kafka's idempotent producer, KIP-98). The identity
is written into the message's log record (``protocol/log_record.py``, ``IDENTIFIED``), so it is
on disk with the message, copied with it by replication, and this index is rebuilt from the log
after a crash: it can never remember a message the log lost, nor forget one the log kept (within
its window).

Per topic partition the index keeps, for each producer seen in its window, the sequence numbers
it holds as one run (``base`` .. ``high``), each with its record's offset. A publish of
sequences ``first .. first + n - 1``:

- from an unknown producer (new, or forgotten): all new, whatever ``first`` is;
- ``first <= high``: the leading ``high - first + 1`` are duplicates, answered OK and not
  written again (the rest are new); the caller reads their records back (by the offsets the
  verdict gives) and a body that differs is ``E_CONFLICT`` (a different message under the
  same identity: a bug in the publisher);
- ``first > high + 1``: a gap, ``E_BAD_SEQUENCE`` (accepting it would make the skipped numbers
  look published: a later retry of them would be dropped as a duplicate and lost).

Why a producer and a sequence rather than a key per message (NATS JetStream's ``Nats-Msg-Id``):
an MPUB of n messages carries one identity (the first number), the memory is a few words per
append plus one small object per producer rather than a key per message, and a gap is
detected instead of silently accepted. A sequence below ``base`` (older than the window) of a
producer still known counts as a duplicate: numbers are consecutive, so it was written.

The window: a producer is remembered for ``window_ns`` after its last publish, whatever is
written meanwhile (Kafka's ``producer.id.expiration.ms``); the offsets of its numbers (for the
body check) only while their records are among the newest ``max_records`` of the partition.
A producer with none left there is **idle** (``go_idle``: its ``high`` and last publish time,
a few hundred bytes): a retry of any number up to ``high`` is still a duplicate, without the
body check. A producer silent for the window is forgotten; its next publish is taken as new
whatever its number (documented: a retry later than that may be written twice). Memory is
bounded by ``max_records`` and ``MAX_PRODUCERS`` (the least recently seen producer is
forgotten first): a segment of offsets and a window entry per append, about 500 bytes an
active producer, about 420 an idle one (``docs/exactly-once.md`` has the figures).
``storage/producers.py`` writes the producers down at each segment roll, so a log read back
after a start still knows those whose records all precede the count window (``remember``).

No I/O here: ``storage/topiclog.py`` owns an index, feeds it what it appends (and what a
replica copies), and rebuilds it by reading its records back; ``core/topic.py`` asks it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import deque
from typing import NamedTuple

__all__ = [
    "DEFAULT_RECORDS",
    "DEFAULT_WINDOW_NS",
    "MAX_SEQUENCE",
    "NEW",
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
    #: The offsets of the last ``len(offsets)`` duplicates (those in the window): the caller
    #: reads their bodies back to tell a retry from a conflict.
    offsets: tuple[int, ...] = ()


#: The verdict of a publish that repeats nothing.
NEW = Verdict(0, -1)


class _Producer:
    """One producer's numbers in the window, ``base`` .. ``high``, and where they are in the
    log: as segments of consecutive offsets (an MPUB is one; so are PUBs that nothing came
    between), each its first number and first offset. Offsets only grow."""

    __slots__ = ("base", "high", "last_run", "name", "next_offset", "offs", "seqs", "start", "ts")

    def __init__(self, name: bytes, base: int, ts: int = 0) -> None:
        self.name = name
        self.base = base
        self.high = base - 1
        #: When it last published (ns): it is remembered until then + the window's time.
        self.ts = ts
        #: The segments, from ``start`` on: first sequence number, first offset.
        self.seqs = array("q")
        self.offs = array("q")
        self.start = 0
        self.last_run: _Run | None = None
        #: The offset right after its newest message's.
        self.next_offset = -1

    @property
    def held(self) -> int:
        return self.high - self.base + 1

    @property
    def oldest_offset(self) -> int:
        """Where its oldest message in the window is (``base`` is in segment ``start``)."""
        return self.offs[self.start] + self.base - self.seqs[self.start]

    def offset_of(self, seq: int) -> int:
        k = bisect_right(self.seqs, seq, self.start) - 1
        return self.offs[k] + seq - self.seqs[k]

    def add(self, first: int, n: int, first_offset: int) -> None:
        """Numbers ``first`` (``high + 1``) on, at offsets ``first_offset`` on."""
        if self.held and self.next_offset == first_offset:
            self.high += n  # right after its last one: the same segment
        else:
            self.seqs.append(first)
            self.offs.append(first_offset)
            self.high = first + n - 1
        self.next_offset = first_offset + n

    def below(self, floor: int, limit: int) -> int:
        """How many of its oldest (at most ``limit``) are at offsets below ``floor``."""
        n, seq, k, last = 0, self.base, self.start, len(self.seqs) - 1
        while n < limit and seq <= self.high:
            while k < last and self.seqs[k + 1] <= seq:
                k += 1
            end = self.seqs[k + 1] if k < last else self.high + 1  # this segment's end
            off = self.offs[k] + seq - self.seqs[k]
            take = min(end - seq, limit - n, max(floor - off, 0))
            n += take
            if seq + take < end:
                break
            seq = end
        return n

    def go_idle(self) -> None:
        """None of its numbers is in the count window any more: keep ``high`` (and ``ts``)
        only, a few dozen bytes, so a retry of any number up to it is still a duplicate."""
        self.base = self.high + 1
        self.seqs, self.offs, self.start = array("q"), array("q"), 0
        self.last_run = None
        self.next_offset = -1

    def drop(self, n: int) -> None:
        """Forget the ``n`` oldest."""
        self.base += min(n, self.held)
        last = len(self.seqs) - 1
        while self.start < last and self.seqs[self.start + 1] <= self.base:
            self.start += 1
        if self.start > 1024 and self.start * 2 > len(self.seqs):
            del self.seqs[: self.start]
            del self.offs[: self.start]
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
        #: Producers none of whose numbers is in the count window (``_Producer.go_idle``),
        #: in the order they left it (their last publishes' order): forgotten by time.
        self.idle: dict[bytes, _Producer] = {}
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
        count: int,
        now_ns: int,
        latest: int,
        *,
        gaps: bool = False,
    ) -> Verdict:
        """What a publish of ``count`` messages numbered from ``first`` is. Raises
        DedupError (a gap). ``latest``: the log's next offset (the count window ends there).
        ``gaps``: a gap is no error here (the caller judges it over several partitions)."""
        self.expire(now_ns, latest)
        p = self.producers.get(producer)
        if p is None:
            return NEW
        high = p.high
        if first > high + 1:
            if gaps:
                return NEW
            raise gap_error(producer, first, high)
        dups = min(count, high - first + 1)
        if not dups:
            return NEW
        # Numbers below ``base`` are older than the window: published, bodies not kept.
        lo = max(first, p.base)
        stop = first + dups
        if lo >= stop:
            return Verdict(dups, -1)
        offsets = tuple(p.offset_of(seq) for seq in range(lo, stop))
        return Verdict(dups, offsets[-1], offsets)

    def record(
        self, producer: bytes, first: int, count: int, first_offset: int, ts_ns: int
    ) -> None:
        """The log appended ``count`` messages numbered from ``first`` at offsets
        ``first_offset`` on."""
        n = count
        if not n:
            return
        p = self.producers.get(producer)
        if p is not None and first != p.high + 1:
            # Not the next numbers (a log rebuilt across a gap the rules never let in, or a
            # producer that came back after being forgotten): start its run again.
            self.held -= p.held
            p.drop(p.held)
            p.last_run = None
            self.idle.pop(producer, None)
            p = None
        if p is None:
            p = self.producers[producer] = _Producer(producer, first)
        elif not p.held:
            self.idle.pop(producer, None)  # back in the count window
        p.ts = max(p.ts, ts_ns)
        p.add(first, n, first_offset)
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

    def remember(self, producer: bytes, high: int, ts: int) -> None:
        """A producer known from a snapshot (``storage/producers.py``) and not from the
        records read back: idle, its numbers up to ``high`` published."""
        if producer not in self.producers:
            p = self.producers[producer] = _Producer(producer, high + 1, ts)
            self.idle[producer] = p

    def states(self) -> list[tuple[bytes, int, int]]:
        """Every producer remembered: (name, highest number, last publish ns)."""
        return [(p.name, p.high, p.ts) for p in self.producers.values()]

    def _expire_idle(self, oldest_ts: int) -> None:
        idle = self.idle
        while idle:
            p = next(iter(idle.values()))
            if p.ts >= oldest_ts and len(self.producers) <= self.max_producers:
                return
            del idle[p.name]
            del self.producers[p.name]

    def expire(self, now_ns: int, latest: int) -> None:
        """Forget what left the window: bodies more than ``max_records`` records before
        ``latest`` (the producer itself stays, idle), producers whose last publish is older
        than ``window_ns``, and the least recently seen beyond ``max_producers``."""
        runs = self._runs
        floor = latest - self.max_records
        oldest_ts = now_ns - self.window_ns
        if self.idle:
            self._expire_idle(oldest_ts)
        if not runs:
            return
        front = runs[0]
        if (
            front.ts >= oldest_ts
            and len(self.producers) <= self.max_producers
            and front.producer.held
            and front.producer.oldest_offset >= floor
            and self.producers.get(front.producer.name) is front.producer
        ):
            return  # the common case, on every publish: nothing has left the window
        while runs:
            run = runs[0]
            p, count, ts = run.producer, run.count, run.ts
            if p.held == 0 or self.producers.get(p.name) is not p:
                runs.popleft()  # its producer started again or went
                continue
            idle = False
            if ts < oldest_ts or (len(self.producers) > self.max_producers and p.last_run is run):
                # Aged out; or too many producers and this one's newest run is the oldest
                # (the least recently seen producer goes whole).
                n = min(count, p.held)
            elif len(self.producers) > self.max_producers:
                n = min(count, p.held)  # older runs of a producer seen since: their entries
            else:
                # Entries below the count floor, from the front of this run (a producer's
                # offsets only grow): their bodies go, the producer stays (by time).
                n = p.below(floor, min(count, p.held))
                if not n:
                    break
                idle = True
            p.drop(n)
            self.held -= n
            if n >= count:
                runs.popleft()
            else:
                run.count = count - n
            if not p.held:
                if idle and p.ts >= oldest_ts:
                    p.go_idle()
                    self.idle[p.name] = p
                else:
                    del self.producers[p.name]
                    p.last_run = None  # no cycle left for the garbage collector
            if n < count:
                break
