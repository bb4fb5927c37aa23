"""A channel's kept disk queue (``--mem-queue-size=0``; ``storage/in_flight_journal.py``): after a
crash at any point between operations, every message read and not done with comes back (with
its attempts), and none done with does; the files are kept only while the floor needs them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pynsqd.core.message import Message
from pynsqd.core.queue import MessageQueue
from pynsqd.storage import in_flight_journal
from pynsqd.storage.diskqueue import DiskQueue
from pynsqd.storage.message_backend import DiskBackend


def backend(path: Path, file_bytes: int = 1 << 20) -> DiskBackend:
    dq = DiskQueue(
        "t:c",
        str(path),
        max_bytes_per_file=file_bytes,
        min_msg_size=26,
        max_msg_size=1 << 20,
        sync_every=1,
        sync_timeout=2.0,
    )
    return DiskBackend(dq, keep_in_flight=True)


def msg(i: int) -> Message:
    return Message(b"%016d" % i, b"body-%05d" % i, 1_000_000 + i)


def drain(b: DiskBackend) -> list[Message]:
    out: list[Message] = []
    while True:
        got = b.read_many(7)
        if not got:
            return out
        out += got


@pytest.mark.parametrize("slack", [65536, 6], ids=["appended", "compacted"])
def test_a_crash_between_any_two_operations_brings_back_exactly_what_was_not_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slack: int
) -> None:
    monkeypatch.setattr(in_flight_journal, "_SLACK", slack)
    rng = random.Random(7)
    for case in range(40):
        path = tmp_path / str(case)
        path.mkdir()
        b = backend(path, file_bytes=rng.choice([200, 1000, 1 << 20]))
        b.put_many([msg(i) for i in range(60)])
        undone = {m.id for m in (msg(i) for i in range(60))}
        out: dict[bytes, Message] = {}
        tries: dict[bytes, int] = {}
        nxt = 60
        for _ in range(rng.randrange(1, 25)):
            op = rng.random()
            if op < 0.4:  # a delivery
                got = b.read_many(rng.randrange(1, 8))
                for m in got:
                    m.attempts += 1
                    tries[m.id] = m.attempts
                    out[m.id] = m
                if got:
                    assert b.journal is not None
                    b.journal.delivered(got)
            elif op < 0.75 and out:  # FINs, in any order
                done = rng.sample(sorted(out), rng.randrange(1, len(out) + 1))
                assert b.journal is not None
                b.journal.settled(done)
                for i in done:
                    del out[i]
                    undone.discard(i)
            elif op < 0.9 and out:  # a REQ: stored again, then done with
                i = rng.choice(sorted(out))
                b.put_many([out.pop(i)])
                assert b.journal is not None
                b.journal.settled([i])
            else:  # a publish
                b.put_many([msg(nxt)])
                undone.add(msg(nxt).id)
                nxt += 1
        # kill -9: nothing closed; what was written is what a restart finds
        again = drain(backend(path))
        ids = [m.id for m in again]
        assert sorted(ids) == sorted(undone), case
        for m in again:
            assert m.attempts >= tries.get(m.id, 0) or m.id not in out, case


def test_the_floor_keeps_files_until_it_passes_them_and_a_clean_close_leaves_no_journal(
    tmp_path: Path,
) -> None:
    b = backend(tmp_path, file_bytes=200)
    b.put_many([msg(i) for i in range(40)])
    first = b.read_many(1)
    rest = drain(b)
    files = sorted(p.name for p in tmp_path.glob("t:c.diskqueue.0*.dat"))
    assert len(files) > 3  # every file kept: the first message is not done with
    assert b.journal is not None
    b.journal.settled([m.id for m in rest])
    assert sorted(p.name for p in tmp_path.glob("t:c.diskqueue.0*.dat")) == files
    b.journal.settled([first[0].id])  # the floor moves to the reader
    assert sorted(p.name for p in tmp_path.glob("t:c.diskqueue.0*.dat")) == files
    b.dq.sync()  # the next sync stores it: the files before it go
    left = sorted(p.name for p in tmp_path.glob("t:c.diskqueue.0*.dat"))
    assert len(left) == 1
    b.close()
    assert not (tmp_path / "t:c.diskqueue.inflight.dat").exists()
    assert drain(backend(tmp_path)) == []


def test_messages_dropped_by_a_bound_stay_dropped_after_a_crash(tmp_path: Path) -> None:
    """drop-oldest reads from the backend and drops: done with, not outstanding for ever."""
    b = backend(tmp_path)
    q = MessageQueue(0, b, b.journal)
    q.put_many([msg(i) for i in range(5)])
    assert q.drop_oldest(2) == 2
    assert sorted(m.id for m in drain(backend(tmp_path))) == [msg(i).id for i in range(2, 5)]
