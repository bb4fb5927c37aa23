"""Group commit: ``--sync-every=1`` for retained logs without an fsync per publish on the loop.

Theory of operation. nsqd's ``--sync-every=1`` fsyncs after every write, before the OK. Done
on the event loop, one fsync per PUB or MPUB stalls every client for its length (0.4 ms on this
machine's disk, milliseconds on others), and sixteen publishers pay sixteen fsyncs a turn. Here
a log's append only asks (``request``); the fsync runs on the loop's executor, one in flight
per log, on a duplicate of the active segment's descriptor (then the hand-off position's), and
covers every record appended before it started. Appends that come while it runs ask again: the
next fsync starts when it ends and covers all of them at once (Kafka's and Redpanda's group
commit). A publish's OK waits for an fsync that covers its records (``TopicLog.wait_synced``,
carried by ``core/publish``'s ``WaitCommit``), so the promise is nsqd's: answered OK means on
disk. A failed fsync fails the publishes that waited on it (their records were written, their
durability is not known: ``TopicLog.sync_failed``, ``/ping``), and the next request tries again.

A replicated partition's leader runs its group fsync (durability=fsync) on an engine of its
own of this class (``cluster/leader.py``: ``then`` moves its commit point); a follower fsyncs
before it acknowledges (``cluster/follower.py``). A replicated topic's publish under
``--sync-every=1`` waits for the commit, then for this engine's fsync.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
from collections.abc import Callable
from typing import NamedTuple, Protocol

from . import durable

__all__ = ["GroupSync", "SyncJob", "SyncWaits", "Syncable"]

log = logging.getLogger("pynsqd")


def fsync_all(fds: list[int]) -> None:
    """fsync ``fds`` in order (off the loop), closing each; the first failure is raised once
    every descriptor is closed."""
    try:
        for fd in fds:
            durable.fsync(fd)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class SyncJob(NamedTuple):
    """An fsync of a log's active segment to run off the event loop (``TopicLog.fsync_job``):
    a duplicate descriptor, the end offset it covers, and the log's generation when it was
    taken (a truncation or restart since then makes it stale: ``synced_to`` ignores it)."""

    fd: int
    start: int
    end: int
    generation: int


class HandOff(Protocol):
    def dup_unsynced(self) -> int | None: ...


class Syncable(Protocol):
    """What the engine needs of a log (``storage/topiclog.TopicLog``)."""

    name: str

    @property
    def hand_off(self) -> HandOff: ...
    def fsync_job(self) -> SyncJob | None: ...
    def synced_to(self, job: SyncJob) -> None: ...
    def sync_failed(self, err: OSError, job: SyncJob) -> None: ...


class GroupSync:
    """The fsyncs of the logs of one event loop (a worker's)."""

    def __init__(self, fsync: Callable[[list[int]], None] = fsync_all) -> None:
        #: Runs on the executor (a test gives one that fails, as a disk's EIO would).
        self._fsync = fsync
        self._running: set[Syncable] = set()
        self._again: set[Syncable] = set()
        #: What to do once the next fsync of a log has ended, well or not (``request``).
        self._then: dict[Syncable, Callable[[], None]] = {}
        #: fsyncs run, and appends they covered: the group's size is ``appends / fsyncs``.
        self.fsyncs = 0
        self.requests = 0

    def request(self, tlog: Syncable, then: Callable[[], None] | None = None) -> None:
        """``tlog`` appended: an fsync now, or as soon as the one in flight ends; ``then``
        runs once that fsync has ended (its outcome is the log's: ``synced``)."""
        self.requests += 1
        if then is not None:
            self._then[tlog] = then
        if tlog in self._running:
            self._again.add(tlog)
            return
        self._start(tlog)

    def _start(self, tlog: Syncable) -> None:
        self._again.discard(tlog)
        job = tlog.fsync_job()
        if job is None:
            then = self._then.pop(tlog, None)
            if then is not None:
                then()
            return
        fds = [job.fd]
        handed = tlog.hand_off.dup_unsynced()
        if handed is not None:
            fds.append(handed)
        self._running.add(tlog)
        self.fsyncs += 1
        done = asyncio.get_running_loop().run_in_executor(None, self._fsync, fds)
        done.add_done_callback(lambda f: self._done(tlog, job, f))

    def _done(self, tlog: Syncable, job: SyncJob, done: asyncio.Future[None]) -> None:
        self._running.discard(tlog)
        err = None if done.cancelled() else done.exception()
        if err is None and not done.cancelled():
            tlog.synced_to(job)
        else:
            why = err if isinstance(err, OSError) else OSError(f"fsync did not run ({err!r})")
            log.error("TOPICLOG(%s): fsync failed - %s", tlog.name, why)
            tlog.sync_failed(why, job)
        again = tlog in self._again
        # Kept for the next fsync when one is asked for already; done with otherwise.
        then = self._then.get(tlog) if again else self._then.pop(tlog, None)
        if then is not None:
            then()
        if again:
            self._start(tlog)


class SyncWaits:
    """One log's publishes waiting for an fsync that covers their records, by end offset."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Callable[[str | None], None]]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, end: int, done: Callable[[str | None], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (end, self._seq, done))

    def reached(self, synced: int) -> None:
        """An fsync covered everything below ``synced``: those waiting on it are answered."""
        heap = self._heap
        while heap and heap[0][0] <= synced:
            heapq.heappop(heap)[2](None)

    def fail(self, why: str) -> None:
        """No fsync will cover them (it failed, or the log closed): each is told why."""
        heap, self._heap = self._heap, []
        for _end, _seq, done in sorted(heap):
            done(why)
