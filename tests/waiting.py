"""Waiting on observable state: the one poll loop of the test suite."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest


def until(cond: Callable[[], object], timeout: float = 20.0) -> bool:
    """Poll ``cond`` until it is true; False after ``timeout`` seconds (a guard against a hang,
    for a caller that reports the failure itself)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


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
