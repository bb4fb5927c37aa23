"""Waiting for an event with a timeout, without losing a cancellation.

``asyncio.wait_for(event.wait(), timeout)`` on Python 3.11 returns normally when the task is
cancelled after the event was set but before the task ran again (CPython gh-86296, fixed in
3.12): a loop around it then never stops, and a server never exits. ``asyncio.timeout`` keeps
the cancellation.
"""

from __future__ import annotations

import asyncio

__all__ = ["wait_set"]


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass: whether it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
