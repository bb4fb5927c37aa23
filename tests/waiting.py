"""Waiting on observable state: the one poll loop of the test suite."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

#: Polls start 10 ms apart and back off to this: a short wait ends at once, and a long one (an
#: election, a Spark batch) asks ``cond`` (often an HTTP request to a server, answered on its
#: loop) 10 times a second rather than 100: on a 2-core machine running the suite, every poll
#: is CPU taken from the processes being waited for.
POLL_MAX = 0.1


def polls() -> Iterator[float]:
    """The pauses between two polls: 10 ms, growing by half each time, to ``POLL_MAX``."""
    pause = 0.01
    while True:
        yield pause
        pause = min(POLL_MAX, pause * 1.5)


def until(cond: Callable[[], object], timeout: float = 20.0) -> bool:
    """Poll ``cond`` until it is true; False after ``timeout`` seconds (a guard against a hang,
    for a caller that reports the failure itself)."""
    deadline = time.monotonic() + timeout
    for pause in polls():
        if cond():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
    raise AssertionError("unreachable")


def wait_for(
    cond: Callable[[], object], what: str = "the condition", timeout: float = 20.0
) -> None:
    """Poll ``cond`` until it is true; fail naming ``what`` after ``timeout`` seconds (a guard
    against a hang, not a synchronisation)."""
    if not until(cond, timeout):
        pytest.fail(f"timed out waiting for {what}")


async def wait_for_async(
    cond: Callable[[], object], what: str = "the condition", timeout: float = 20.0
) -> None:
    """``wait_for`` inside a running event loop (the loop goes on between polls)."""
    deadline = time.monotonic() + timeout
    for pause in polls():
        if cond():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(pause)


async def wait_progress_async(
    count: Callable[[], int], target: int, what: str = "the count", stall: float = 20.0
) -> None:
    """Until ``count()`` reaches ``target``; fail naming ``what`` only when it has not moved
    for ``stall`` seconds (a hang), however long the whole takes: a loaded machine makes each
    step slower, never a stalled count move."""
    last, since = count(), time.monotonic()
    while last < target:
        await asyncio.sleep(0.01)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            pytest.fail(
                f"timed out waiting for {what}: {last} of {target}, no progress in {stall:g} s"
            )
