"""The samples nsqadmin's charts draw: a few minutes per page, kept by the server.

Theory of operation. Go's nsqadmin draws history only from Graphite. Here every API answer for
the topics list, a topic or a channel records one sample (time, depth, message count) under its
key before it is sent, at most one per ``MIN_GAP`` seconds, and carries the key's samples of the
last ``KEEP`` seconds: the pages draw them, so a reload (or a second browser) starts with the
history instead of an empty chart. Nothing is polled in the background: a page nobody looks at
costs nothing, and its samples age out. Bounded: ``MAX_KEYS`` keys (the least recently used
goes), ``KEEP / MIN_GAP`` samples per key.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

__all__ = ["History"]

KEEP = 300.0  # seconds of samples kept per key
MIN_GAP = 1.0  # seconds between two samples of one key
MAX_KEYS = 1000


class History:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._series: OrderedDict[str, deque[tuple[float, int, int]]] = OrderedDict()

    def add(self, key: str, depth: int, count: int) -> list[list[float]]:
        """Record a sample of ``key`` (unless the last is under ``MIN_GAP`` old); return the
        key's samples as ``[unix ms, depth, message count]``, oldest first."""
        now = self.clock()
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = deque()
            while len(self._series) > MAX_KEYS:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(key)
        if not series or now - series[-1][0] >= MIN_GAP:
            series.append((now, depth, count))
        while series and series[0][0] < now - KEEP:
            series.popleft()
        return [[round(t * 1000), d, c] for t, d, c in series]

    def __len__(self) -> int:
        return len(self._series)
