"""The background fsync engine: order, coalescing, cancel, one error contract."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pynsqd.storage.syncer import Syncer, SyncSlot


def test_jobs_run_in_order_and_a_waiting_job_takes_the_newer_then(tmp_path: Path) -> None:
    engine = Syncer("test-sync")
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    gate = threading.Event()
    ran: list[str] = []
    first, second = SyncSlot("first"), SyncSlot("second")
    engine.submit(first, [os.dup(fd)], lambda: (gate.wait(5), ran.append("first")))
    engine.submit(second, [os.dup(fd)], lambda: ran.append("old snapshot"))
    engine.submit(second, [os.dup(fd)], lambda: ran.append("new snapshot"))  # supersedes
    gate.set()
    engine.wait(second)
    assert ran == ["first", "new snapshot"]
    os.close(fd)


def test_a_failed_sync_is_kept_for_the_owner_once(tmp_path: Path) -> None:
    engine = Syncer("test-sync")
    slot = SyncSlot("TOPICLOG(t)")
    r, w = os.pipe()  # fsync of a pipe fails (EINVAL)
    engine.submit(slot, [os.dup(r)])
    engine.wait(slot)
    err = slot.take_error()
    assert isinstance(err, OSError) and slot.failed
    assert slot.take_error() is None
    os.close(r)
    os.close(w)


def test_cancel_drops_the_waiting_job_and_closes_its_descriptors(tmp_path: Path) -> None:
    engine = Syncer("test-sync")
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    gate = threading.Event()
    blocker, slot = SyncSlot("blocker"), SyncSlot("slot")
    engine.submit(blocker, [], lambda: gate.wait(5) and None)
    dup = os.dup(fd)
    ran: list[int] = []
    engine.submit(slot, [dup], lambda: ran.append(1))
    engine.cancel(slot)
    gate.set()
    engine.wait(blocker)
    assert ran == []
    try:
        os.fstat(dup)
        closed = False
    except OSError:
        closed = True
    assert closed
    os.close(fd)
