"""A fake event loop for the core: a clock that moves only when told, and ordered callbacks."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import Any


class Handle:
    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTask:
    """A task the test finishes by hand (``finish``); its coroutine never runs."""

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self._callbacks: list[Callable[[FakeTask], object]] = []
        self._result: Any = None
        self._exc: BaseException | None = None
        self._cancelled = False
        self.done = False

    def add_done_callback(self, cb: Callable[[FakeTask], object]) -> None:
        self._callbacks.append(cb)

    def cancel(self) -> None:
        self._cancelled = True
        self._end()

    def cancelled(self) -> bool:
        return self._cancelled

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> Any:
        return self._result

    def finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        self._result, self._exc = result, exc
        self._end()

    def _end(self) -> None:
        if self.done:
            return
        self.done = True
        self.coro.close()
        for cb in self._callbacks:
            cb(self)


class FakeLoop:
    def __init__(self) -> None:
        self.now = 1000.0
        self.tasks: list[FakeTask] = []
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

    def create_task(self, coro: Coroutine[Any, Any, Any]) -> FakeTask:
        task = FakeTask(coro)
        self.tasks.append(task)
        return task

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

    def run_turn(self) -> None:
        """Run the callbacks ready now, as one turn of a real loop; what they schedule waits
        for the next turn."""
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
