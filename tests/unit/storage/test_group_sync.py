"""The group commit of ``--sync-every=1`` (``storage/group_sync.py``) on a real log and disk,
in a real event loop: one fsync covers every append made before it started, the OK waits for
it, and a failed fsync fails what waited on it and everything after it."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

from pynsqd.core.message import Message
from pynsqd.storage.group_sync import GroupSync, fsync_all
from pynsqd.storage.topiclog import TopicLog


def open_log(path: Path, group: GroupSync) -> TopicLog:
    tlog = TopicLog(str(path), segment_bytes=1 << 24, sync_every=1, logger=logging.getLogger())
    tlog.group = group
    return tlog


def batch(n: int, tag: int) -> list[Message]:
    return [Message(b"%016d" % (tag * 1000 + i), b"x" * 200, 1) for i in range(n)]


async def publish(tlog: TopicLog, msgs: list[Message]) -> str | None:
    """Append, then wait as ``core/publish`` makes a publish wait: the answer's reason."""
    end = tlog.append(msgs) + len(msgs)
    wait = tlog.sync_wait(end)
    if wait is None:
        return None
    answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
    wait(answer.set_result)
    return await answer


def test_one_fsync_covers_every_append_of_a_turn_and_the_ok_waits_for_it(
    tmp_path: Path,
) -> None:
    group = GroupSync()
    tlog = open_log(tmp_path / "t.log", group)

    async def main() -> None:
        # Sixteen publishers' MPUBs in one turn of the loop, as from sixteen connections.
        answers = await asyncio.gather(*(publish(tlog, batch(200, c)) for c in range(16)))
        assert answers == [None] * 16
        assert tlog.synced == tlog.latest == 3200
        # The first append started an fsync; the 15 made while it ran share the next.
        assert group.requests == 16 and group.fsyncs <= 2, (group.requests, group.fsyncs)
        assert tlog.sync_wait(tlog.latest) is None  # synced: nothing to wait for

    asyncio.run(main())
    tlog.close()


def test_a_failed_fsync_fails_its_publishes_and_every_later_one(tmp_path: Path) -> None:
    failing = True

    def fsync(fds: list[int]) -> None:
        """The engine's fsync, or a disk's EIO (which no real disk here gives on demand)."""
        if not failing:
            fsync_all(fds)
            return
        for fd in fds:
            os.close(fd)
        raise OSError(errno.EIO, "Input/output error")

    group = GroupSync(fsync)
    tlog = open_log(tmp_path / "t.log", group)

    async def main() -> None:
        nonlocal failing
        why = await publish(tlog, batch(10, 1))
        assert why is not None and "fsync that would cover it failed" in why, why
        assert "Input/output error" in why
        assert isinstance(tlog.take_sync_error(), OSError)  # /ping says so
        # The disk may have dropped those pages and call the next fsync clean: nothing
        # after them is answered OK, even once fsyncs succeed again.
        failing = False
        why = await publish(tlog, batch(10, 2))
        assert why is not None and "earlier fsync of this log failed" in why, why

    asyncio.run(main())
    tlog.close()


def test_a_log_closed_with_publishes_waiting_answers_them(tmp_path: Path) -> None:
    group = GroupSync()
    tlog = open_log(tmp_path / "t.log", group)

    async def main() -> None:
        end = tlog.append(batch(5, 1)) + 5
        wait = tlog.sync_wait(end)
        assert wait is not None
        answers: list[str | None] = []
        wait(answers.append)
        tlog.close()  # its own fsync covers them: answered OK
        assert answers == [None]

    asyncio.run(main())
