"""A loop that waits for an event with a timeout stops when it is cancelled, even when the event
is set in the same turn. Python 3.11's ``asyncio.wait_for`` swallows a cancellation that arrives
after the awaited event was set and before the waiting task runs again (CPython gh-86296): a
node's replication loop (``cluster/etcd.every``) then ran on after SIGTERM, and nsqd never
exited (found in a fresh-clone suite run: a replicated node ignored SIGTERM for 8 minutes)."""

from __future__ import annotations

import asyncio

from pynsqd.cluster.etcd import every
from pynsqd.internal.waits import wait_set


def test_every_stops_when_cancelled_as_it_is_woken() -> None:
    async def main() -> bool:
        wake = asyncio.Event()
        steps = 0

        async def step() -> None:
            nonlocal steps
            steps += 1

        task = asyncio.create_task(every(3600, step, "test", wake))
        await asyncio.sleep(0)  # waiting for the wake-up
        wake.set()
        await asyncio.sleep(0)  # the event's waiter is done; the loop's task is not yet resumed
        task.cancel()
        for _ in range(3):  # a cancelled task ends within a turn or two; a loop that lost it
            await asyncio.sleep(0)  # calls its step and waits an hour again instead
        return task.done() and task.cancelled()

    assert asyncio.run(main())


def test_wait_set_answers_whether_the_event_was_set() -> None:
    async def main() -> tuple[bool, bool, bool]:
        event = asyncio.Event()
        timed_out = await wait_set(event, 0)  # not set, and no time to wait
        asyncio.get_running_loop().call_soon(event.set)
        woken = await wait_set(event, 3600)
        already = await wait_set(event, 0)
        return timed_out, woken, already

    assert asyncio.run(main()) == (False, True, True)
