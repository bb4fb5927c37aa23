"""Running real NSQ client libraries in a test: pynsq (tornado, on asyncio) and gnsq (gevent),
each under a hard timeout, whichever test module uses them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

#: A guard against a hang, not a wait: a 3-node replicated run on a loaded 2-core machine
#: took over 30 s.
HARD_TIMEOUT = 120.0


def run_tornado(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on a fresh asyncio loop (tornado's IOLoop wraps it) with a hard timeout."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), HARD_TIMEOUT))
    finally:
        # Let closed connections finish closing; pending reconnect timers die with the loop.
        loop.run_until_complete(asyncio.sleep(0.05))
        loop.close()


def gnsq_wait(gevent: Any, count: Callable[[], int], want: int, what: str) -> None:
    """Poll until ``count()`` reaches ``want`` (gevent yields meanwhile); fail only when it has
    not moved for 30 s (a hang: on a loaded machine a replicated node's commits are slower,
    and the whole takes longer)."""
    last, since = count(), time.monotonic()
    while last < want:
        gevent.sleep(0.01)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 30:
            pytest.fail(f"{last} of {want} {what}, none more in 30 s")


@contextlib.contextmanager
def gnsq_running(gevent: Any, *clients: Any) -> Iterator[None]:
    """Run the body under the hard timeout; close and join the gnsq clients whatever happens."""
    try:
        with gevent.Timeout(HARD_TIMEOUT):
            yield
    finally:
        for c in clients:
            c.close()
        for c in clients:
            c.join(timeout=5)
