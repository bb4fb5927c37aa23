"""The background fsync engine: one thread that syncs every queue's and log's files.

Theory of operation. An fsync costs milliseconds, and the caller is an event loop serving every
client, so the syncs a disk queue or a retained log asks for on its own schedule
(``--sync-every`` > 1, the ``--sync-timeout`` tick) run here. An owner (a ``DiskQueue``, a
``TopicLog``) has one ``SyncSlot``. ``submit`` hands the engine duplicated descriptors to fsync
in order and, optionally, ``then``: what to do once they are on disk (a disk queue writes the
metadata snapshot taken when it asked). A slot has at most one waiting job: a newer request
adds its descriptors to it and replaces ``then`` (the newer snapshot supersedes the older, so
an older snapshot never overwrites a newer one). Jobs run one at a time, in request order.

One error contract: a failed job is logged, and its error is kept on the slot until the owner's
``take_sync_error`` (nsqd's ``--sync-timeout`` tick reports it: ``/ping`` turns unhealthy);
``failed`` stays set until the owner's next synchronous sync succeeds, so a close does not
skip its own. A synchronous sync (``--sync-every=1``, a roll, a close) first ``cancel``s the
waiting job (its snapshot is older) and waits for a running one.

The fsyncs that answers wait for (``--sync-every=1``'s group commit of a retained log, a
replicated leader's group fsync: ``storage/group_sync.py``; a follower's before it
acknowledges) run on the event loop's executor instead, one in flight per log and logs in
parallel (this engine runs one job at a time, and a coalesced job would drop a completion a
waiting OK or the commit point needs); they keep this contract: a failure is ``report``ed on
the log's slot (``/ping``), and nothing that waits on durability moves past it
(``TopicLog.fsync_job``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable

from . import durable

__all__ = ["SYNCER", "SyncSlot", "Syncer"]

log = logging.getLogger("pynsqd")


class SyncSlot:
    """One owner's place in the engine. Its fields are guarded by the engine's lock."""

    __slots__ = ("error", "failed", "fds", "label", "queued", "running", "then")

    def __init__(self, label: str) -> None:
        self.label = label  # for the log: "DISKQUEUE(t:c)", "TOPICLOG(t)"
        self.fds: list[int] = []  # the waiting job's duplicated descriptors
        self.then: Callable[[], None] | None = None
        self.queued = False
        self.running = False
        #: The last failed background sync, kept until ``take_error``.
        self.error: OSError | None = None
        #: A background sync failed since the owner's last good synchronous one.
        self.failed = False

    def take_error(self) -> OSError | None:
        err, self.error = self.error, None
        return err


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Syncer:
    """The thread that runs every slot's jobs, in request order."""

    def __init__(self, name: str = "pynsqd-sync") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[SyncSlot] = deque()
        self._thread: threading.Thread | None = None

    def submit(
        self, slot: SyncSlot, fds: list[int], then: Callable[[], None] | None = None
    ) -> None:
        """fsync ``fds`` (duplicates: the engine closes them), then run ``then``."""
        with self._cond:
            slot.fds.extend(fds)
            slot.then = then
            if not slot.queued:
                slot.queued = True
                self._queue.append(slot)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def report(self, slot: SyncSlot, err: OSError) -> None:
        """A sync of the slot's files that ran elsewhere failed (replication's, on the loop's
        executor; already logged): kept until the owner's ``take_sync_error``, as a failed job
        of this engine."""
        with self._cond:
            slot.error = err
            slot.failed = True

    def cancel(self, slot: SyncSlot) -> None:
        """Drop the slot's waiting job and wait until its running job (if any) has finished."""
        with self._cond:
            if slot.queued:
                slot.queued = False
                self._queue.remove(slot)
                _close_fds(slot.fds)
                slot.fds, slot.then = [], None
            while slot.running:
                self._cond.wait()

    def wait(self, slot: SyncSlot) -> None:
        """Wait until the slot has no waiting or running job."""
        with self._cond:
            while slot.queued or slot.running:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                slot = self._queue.popleft()
                fds, then = slot.fds, slot.then
                slot.fds, slot.then = [], None
                slot.queued = False
                slot.running = True
            try:
                for fd in fds:
                    durable.fsync(fd)
                if then is not None:
                    then()
            except OSError as exc:
                log.error("%s: failed to sync - %s", slot.label, exc)
                slot.error = exc
                slot.failed = True
            except Exception:  # a bug: logged, the thread goes on serving the others
                log.exception("%s: sync job failed", slot.label)
            finally:
                _close_fds(fds)
                with self._cond:
                    slot.running = False
                    self._cond.notify_all()


#: The process's one sync thread.
SYNCER = Syncer()
