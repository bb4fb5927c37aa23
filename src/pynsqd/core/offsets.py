"""Where a replicated topic's message came from, and what a channel has done with them.

Theory of operation (``docs/replication.md``, "Channels across a failover"). A replicated
topic's messages carry IDs made from their place in the cluster: the origin node of their
partition and their log offset, ``%016x`` of ``1<<63 | origin<<53 | offset``. nsqd's own IDs
(``guid.py``) have a timestamp in the top bits and bit 63 clear until 2079, so the two kinds
never meet; a client sees 16 hex characters either way. Replicas copy records verbatim, so every
copy of a record has the same ID, and a channel can tell any message's partition and offset from
its ID alone (in memory, on disk, deferred, requeued), at no cost to anything else.

A channel keeps a ``DoneWindow`` per partition whose messages it holds: the offsets it is
responsible for (``[low, end)``; ``end`` None: open, the partition's hand-off still feeds it)
minus those it is done with (FIN, expired, dead-lettered, emptied). Mostly consumers finish in
order, so ``low`` moves and ``done`` stays a few ranges; what is done out of order is kept as
sorted ranges, at most ``MAX_RANGES`` (past that the highest are forgotten: they would be
delivered again after a takeover, never lost). The windows are checkpointed to etcd; after a
takeover the new node delivers exactly the pending offsets of the dead node's windows.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import pairwise
from typing import Any

#: Bit 63 marks an offset ID; 10 bits of origin node (nsqd's --node-id < 1024), 53 of offset.
OFFSET_BIT = 1 << 63
_ORIGIN_SHIFT = 53
OFFSET_MASK = (1 << _ORIGIN_SHIFT) - 1
#: First hex digits of an offset ID (bit 63 set).
_CODED = frozenset(b"89abcdef")
#: Out-of-order done ranges a window keeps (past that the highest are forgotten).
MAX_RANGES = 4096
#: Attempts a window remembers of messages that went back to the queue (REQ, timeout); past
#: that, a message's attempts start again after a takeover.
MAX_ATTEMPTS_KEPT = 10_000

__all__ = [
    "DoneWindow",
    "decode_offset_id",
    "is_offset_id",
    "offset_id",
    "offset_ids",
]


#: The last three hex digits of an ID: formatted once (as ``guid.py`` does).
_HEX3 = [b"%03x" % i for i in range(4096)]


def offset_ids(origin: int, first: int, n: int) -> list[bytes]:
    """IDs for offsets ``[first, first + n)`` of node ``origin``'s partition: the first 13
    hex digits formatted once per 4,096 offsets, the last 3 from a table (a third of the cost
    of formatting each)."""
    v = OFFSET_BIT | origin << _ORIGIN_SHIFT | first
    if n == 1:  # a single PUB
        return [b"%016x" % v]
    end = v + n
    out: list[bytes] = []
    while v < end:
        low = v & 0xFFF
        take = min(end - v, 4096 - low)
        prefix = b"%013x" % (v >> 12)
        out.extend([prefix + s for s in _HEX3[low : low + take]])
        v += take
    return out


def offset_id(origin: int, offset: int) -> bytes:
    return b"%016x" % (OFFSET_BIT | origin << _ORIGIN_SHIFT | offset)


def is_offset_id(msg_id: bytes) -> bool:
    return len(msg_id) == 16 and msg_id[0] in _CODED


def decode_offset_id(msg_id: bytes) -> tuple[int, int] | None:
    """(origin, offset) of an offset ID; None for any other ID."""
    if len(msg_id) != 16 or msg_id[0] not in _CODED:
        return None
    try:
        v = int(msg_id, 16)
    except ValueError:
        return None
    return (v >> _ORIGIN_SHIFT) & 0x3FF, v & OFFSET_MASK


class DoneWindow:
    """One channel's responsibility for one partition: pending = ``[low, end)`` minus
    ``done`` (sorted, disjoint, non-adjacent ``[start, stop)`` ranges above ``low``); and the
    attempts of pending messages that went back to the queue (a takeover keeps counting), and
    when those a REQ deferred are due (wall clock, ms: a takeover keeps them deferred)."""

    __slots__ = ("attempts", "changed", "done", "due", "end", "low")

    def __init__(
        self,
        low: int,
        end: int | None = None,
        done: list[list[int]] | None = None,
        attempts: dict[int, int] | None = None,
        due: dict[int, int] | None = None,
    ) -> None:
        self.low = low
        self.end = end
        self.done: list[list[int]] = done if done is not None else []
        self.attempts: dict[int, int] = attempts if attempts is not None else {}
        self.due: dict[int, int] = due if due is not None else {}
        self.changed = True

    def __repr__(self) -> str:
        return f"DoneWindow(low={self.low}, end={self.end}, done={self.done})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DoneWindow) and self.pending(None) == other.pending(None)

    __hash__ = None  # type: ignore[assignment]

    # -- marking ---------------------------------------------------------------------------

    def mark(self, off: int) -> None:
        """``off`` is done (a FIN, an expiry, a dead-lettering)."""
        low = self.low
        if off < low or (self.end is not None and off >= self.end):
            return
        self.changed = True
        if self.attempts:
            self.attempts.pop(off, None)
            self.due.pop(off, None)
        done = self.done
        if off == low:
            low += 1
            if done and done[0][0] == low:
                low = done.pop(0)[1]
            self.low = low
            return
        i = bisect_right(done, [off, OFFSET_MASK + 1])
        if i and done[i - 1][1] >= off:
            prev = done[i - 1]
            if prev[1] > off:
                return  # done already
            prev[1] = off + 1
            if i < len(done) and done[i][0] == off + 1:
                prev[1] = done.pop(i)[1]
            return
        if i < len(done) and done[i][0] == off + 1:
            done[i][0] = off
            return
        done.insert(i, [off, off + 1])
        if len(done) > MAX_RANGES:
            done.pop()  # forgotten: delivered again after a takeover, never lost

    def note_attempts(self, off: int, attempts: int, due_ms: int = 0) -> None:
        """A pending message went back to the queue after ``attempts`` deliveries; deferred
        until ``due_ms`` (wall clock) by a REQ with a delay, or due at once (0)."""
        if self.is_pending(off) and (
            off in self.attempts or len(self.attempts) < MAX_ATTEMPTS_KEPT
        ):
            self.attempts[off] = attempts
            if due_ms:
                self.due[off] = due_ms
            else:
                self.due.pop(off, None)
            self.changed = True

    def is_pending(self, off: int) -> bool:
        if off < self.low or (self.end is not None and off >= self.end):
            return False
        done = self.done
        if not done:
            return True
        i = bisect_right(done, [off, OFFSET_MASK + 1])
        return not (i and done[i - 1][1] > off)

    def done_below(self, offset: int) -> None:
        """Everything before ``offset`` is done (the channel was emptied)."""
        if offset <= self.low:
            return
        self.changed = True
        if self.end is not None:
            offset = min(offset, self.end)
        self.low = offset
        done = [r for r in self.done if r[1] > offset]
        if done and done[0][0] <= offset:
            self.low = done.pop(0)[1]
        self.done = done
        self._prune()

    def _prune(self) -> None:
        if self.attempts:
            self.attempts = {o: n for o, n in self.attempts.items() if self.is_pending(o)}
            self.due = {o: t for o, t in self.due.items() if o in self.attempts}

    def close(self) -> None:
        """Nothing is pending any more (another node took this responsibility over)."""
        self.end = self.low
        self.done = []
        self.attempts = {}
        self.due = {}
        self.changed = True

    def close_at(self, end: int) -> None:
        """Nothing from ``end`` on is pending (a partition sealed there)."""
        self._set(self.pending(end), min(self.low, end))
        self._prune()

    def reopen(self, start: int, stop: int) -> None:
        """``[start, stop)`` is pending again (a rewind put it back)."""
        self._set(_merge([*self.pending(None), (start, stop)]), start)

    # -- as ranges -------------------------------------------------------------------------

    def pending(self, upto: int | None) -> list[tuple[int, int | None]]:
        """The pending offsets as ranges, below ``upto`` (None: all; an open window's last
        range then ends with None)."""
        end = self.end
        if upto is not None:
            end = upto if end is None else min(end, upto)
        out: list[tuple[int, int | None]] = []
        cur = self.low
        for s, e in self.done:
            if end is not None and s >= end:
                break
            if s > cur:
                out.append((cur, s))
            cur = e
        if end is None:
            out.append((cur, None))
        elif cur < end:
            out.append((cur, end))
        return out

    def _set(self, pending: list[tuple[int, int | None]], empty_at: int) -> None:
        """Become the window pending exactly at ``pending`` (sorted, merged ranges; the last
        may be open); none: nothing pending, at ``empty_at``."""
        self.changed = True
        if not pending:
            self.low, self.end, self.done = empty_at, empty_at, []
            return
        self.low = pending[0][0]
        self.end = pending[-1][1]
        self.done = [[e1, s2] for (_, e1), (s2, _) in pairwise(pending) if e1 is not None]

    def union(self, other: DoneWindow) -> DoneWindow:
        """A window pending where either is."""
        w = DoneWindow(0)
        w._set(_merge(self.pending(None) + other.pending(None)), max(self.low, other.low))
        w.attempts = {**self.attempts, **other.attempts}
        for o, n in self.attempts.items():
            w.attempts[o] = max(n, w.attempts[o])
        w.due = {**self.due, **other.due}
        for o, t in self.due.items():
            w.due[o] = max(t, w.due[o])
        w._prune()
        return w

    def encode(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"low": self.low, "end": self.end, "done": self.done}
        if self.attempts:
            doc["attempts"] = {str(o): n for o, n in sorted(self.attempts.items())}
        if self.due:
            doc["due"] = {str(o): t for o, t in sorted(self.due.items())}
        return doc

    @classmethod
    def decode(cls, doc: Any) -> DoneWindow:
        """Raises ValueError."""
        try:
            low, end, done = doc["low"], doc["end"], doc["done"]
            ranges = [[int(s), int(e)] for s, e in done]
            attempts = {int(o): int(n) for o, n in doc.get("attempts", {}).items()}
            due = {int(o): int(t) for o, t in doc.get("due", {}).items()}
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"bad channel window {doc!r}") from err
        if not isinstance(low, int) or not (end is None or isinstance(end, int)):
            raise ValueError(f"bad channel window {doc!r}")
        return cls(low, end, ranges, attempts, due)


def _merge(ranges: list[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
    """Sorted union of ranges (an end of None: open)."""
    big = OFFSET_MASK + 1
    items = sorted((s, big if e is None else e) for s, e in ranges if e is None or e > s)
    out: list[list[int]] = []
    for s, e in items:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, None if e == big else e) for s, e in out]
