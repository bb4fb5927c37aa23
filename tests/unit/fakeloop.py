"""A fake event loop for the core: a clock that moves only when told, and ordered callbacks."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class Handle:
    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    def __init__(self) -> None:
        self.now = 1000.0
        self._soon: list[Handle] = []
        self._timers: list[tuple[float, int, Handle]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[[], object], /) -> Handle:
        h = Handle(self.now, callback)
        self._soon.append(h)
        return h

    def call_at(self, when: float, callback: Callable[[], object], /) -> Handle:
        h = Handle(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), h))
        return h

    def call_later(self, delay: float, callback: Callable[[], object], /) -> Handle:
        return self.call_at(self.now + delay, callback)

    @property
    def armed_timers(self) -> int:
        return sum(not h.cancelled for _, _, h in self._timers)

    def run_ready(self) -> None:
        """Run call_soon callbacks until none are left (one 'turn' and what it schedules)."""
        while self._soon:
            batch, self._soon = self._soon, []
            for h in batch:
                if not h.cancelled:
                    h.callback()

    def advance(self, seconds: float) -> None:
        """Move the clock, firing due timers in order (and what they schedule)."""
        end = self.now + seconds
        self.run_ready()
        while self._timers and self._timers[0][0] <= end:
            when, _, h = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not h.cancelled:
                h.callback()
            self.run_ready()
        self.now = end
        self.run_ready()
