"""The readers of a retained log that keep their own offsets (a Spark query in log mode), as
they report them: where each has committed to, so that ``/stats``, ``/metrics`` and nsqadmin
show how far behind it is. No I/O.

Theory of operation. A log reader (``pynsqd_spark``'s log source, or anything reading
``GET /topic/log``) keeps its offsets itself: Spark in its checkpoint, which the broker never
sees (SPARK-27549 for Kafka). Here the reader tells the node what it committed
(``POST /topic/reader``) after each batch; the node keeps the last report of each reader by
name and shows its lag, the log's latest offset less its committed one. Nothing here moves,
holds or prunes the log: a report is a view, and retention goes on as set (a reader far behind
finds its records pruned and says which, ``failOnDataLoss``). A node keeps at most
``MAX_READERS`` per log (the one heard from least recently goes first) and forgets one not
heard from in ``READER_TTL``; it keeps them in memory only: after a restart a reader shows again
at its next commit.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The most readers one log shows; a report from one more forgets the stalest.
MAX_READERS = 64
#: A reader not heard from for this long (seconds) is no longer shown.
READER_TTL = 24 * 3600.0
#: The longest name a reader may report under.
MAX_NAME = 128


@dataclass(slots=True)
class Reader:
    committed: int
    #: When it last reported (wall clock, seconds).
    at: float


class Readers:
    """One log's readers by name."""

    __slots__ = ("_by_name",)

    def __init__(self) -> None:
        self._by_name: dict[str, Reader] = {}

    def commit(self, name: str, offset: int, now: float) -> None:
        """``name`` has read the log below ``offset`` (its commit); an older report than the
        one kept (a batch replayed after a driver restart) moves it back, as its checkpoint
        did."""
        by_name = self._by_name
        if name not in by_name and len(by_name) >= MAX_READERS:
            del by_name[min(by_name, key=lambda n: by_name[n].at)]
        by_name[name] = Reader(offset, now)

    def describe(self, latest: int, now: float) -> list[dict[str, int | float | str]]:
        """Each reader heard from within ``READER_TTL``, by name: its committed offset and its
        lag behind ``latest`` (the log's next offset)."""
        for name in [n for n, r in self._by_name.items() if now - r.at > READER_TTL]:
            del self._by_name[name]
        return [
            {
                "reader": name,
                "committed": r.committed,
                "lag": max(0, latest - r.committed),
                "updated": round(r.at, 3),
            }
            for name, r in sorted(self._by_name.items())
        ]

    def __len__(self) -> int:
        return len(self._by_name)


__all__ = ["MAX_NAME", "MAX_READERS", "READER_TTL", "Reader", "Readers"]
