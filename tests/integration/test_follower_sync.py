"""A follower never acknowledges a record it has not fsynced (durability fsync), even when an
fsync fails; and a leader's group fsync that finishes after its log was cut back marks nothing
synced. The follower fetches over a real websocket from a small leader on 127.0.0.1 that
records what each request acknowledges; the failing fsync is the fault injected (a real disk
that fails an fsync on demand is not at hand)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from pynsqd.cluster import follower as follower_mod
from pynsqd.cluster.fetch import FetchAnswer, FetchRequest
from pynsqd.cluster.follower import Following
from pynsqd.cluster.partition import Partition
from pynsqd.cluster.settings import ReplicationSettings
from pynsqd.core.message import Message
from pynsqd.storage.epochs import EpochHistory
from pynsqd.storage.topiclog import TopicLog

EPOCH = 7
N = 5


def _log(path: Path) -> TopicLog:
    return TopicLog(str(path), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger())


def test_a_follower_acknowledges_only_what_it_has_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader_log = _log(tmp_path / "leader")
    leader_log.append([Message(b"%016d" % i, b"body %d" % i, 1) for i in range(N)])
    leader_log.sync()
    records = Path(leader_log.segments[0].path).read_bytes()

    # What the follower's fsyncs did, in order: the first one fails (EIO).
    fsyncs: list[str] = []
    real_fsync_close = follower_mod.fsync_close

    def failing_once(fd: int) -> None:
        if not fsyncs:
            os.close(fd)
            fsyncs.append("failed")
            raise OSError(errno.EIO, "Input/output error")
        real_fsync_close(fd)
        fsyncs.append("ok")

    monkeypatch.setattr(follower_mod, "fsync_close", failing_once)

    # Each request's offset acknowledges everything below it: (offset, fsyncs done by then).
    acked: list[tuple[int, list[str]]] = []
    done = asyncio.Event()

    async def replicate(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is not WSMsgType.BINARY:
                break
            req = FetchRequest.decode(msg.data)
            acked.append((req.offset, list(fsyncs)))
            if req.offset >= N:
                done.set()
                await asyncio.sleep(0.05)  # the follower's next request waits here
            body = records if req.offset == 0 else b""
            answer = FetchAnswer(
                200, epoch=EPOCH, hw=req.offset, latest=N, epochs=[(EPOCH, 0)], records=body
            )
            await ws.send_bytes(answer.encode())
        return ws

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/topic/replicate", replicate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        copy = _log(tmp_path / "copy")
        settings = ReplicationSettings(replicas=2, min_insync=2, durability="fsync")
        p = Partition("t", 2, (1, "a"), copy, EpochHistory(copy.directory), settings)
        p.follow(2, f"127.0.0.1:{port}", epoch=EPOCH)
        member: Any = SimpleNamespace(
            node_id=1, storage="a", secret="", opts=SimpleNamespace(max_msg_size=1 << 20)
        )
        following = Following(member)
        following.start(p)
        try:
            await asyncio.wait_for(done.wait(), 30)
        finally:
            await following.close()
            await runner.cleanup()
            reported.append(copy.take_sync_error())
            copy.close()

    reported: list[OSError | None] = []
    asyncio.run(main())
    assert fsyncs[0] == "failed"
    # The failure reaches nsqd's health (/ping) as a failed background sync does.
    assert isinstance(reported[0], OSError) and reported[0].errno == errno.EIO
    for offset, synced in acked:
        if offset > 0:
            assert synced and synced[-1] == "ok", (offset, synced, acked)
    assert acked[-1][0] == N
    assert acked[0][0] == 0 and acked[1][0] == 0, acked  # the unsynced records fetched again


def test_a_group_fsync_that_ends_after_a_truncation_marks_nothing_synced(tmp_path: Path) -> None:
    tlog = _log(tmp_path / "t")
    tlog.sync_every = 1000  # appends leave the fsync to the caller's job
    tlog.append([Message(b"%016d" % i, b"x", 1) for i in range(4)])
    job = tlog.fsync_job()
    assert job is not None and job.end == 4
    os.close(job.fd)  # (the fsync itself ran, off the loop)
    tlog.truncate(1)  # stepped down: the new leader's history cut the log back
    tlog.append([Message(b"%016d" % i, b"y", 1) for i in range(5)])
    synced_before = tlog.synced
    tlog.synced_to(job)  # the old fsync's completion arrives now
    assert tlog.synced == synced_before <= 1
    job2 = tlog.fsync_job()
    assert job2 is not None and job2.end == 6
    os.close(job2.fd)
    tlog.synced_to(job2)
    assert tlog.synced == 6
    tlog.close()


def test_after_a_failed_fsync_nothing_counts_as_synced_until_it_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fsync the kernel may have dropped the pages and call the next fsync
    clean: what the failed one covered stays unsafe until the log is cut there. A cut whose
    own fsync fails leaves the log's state as the file's (found in review: it used to keep
    the old end while the file was shorter), and is finished by the next try."""
    from pynsqd.storage import durable, topiclog

    tlog = _log(tmp_path / "t")
    tlog.sync_every = 1000
    tlog.append([Message(b"%016d" % i, b"x", 1) for i in range(4)])
    job = tlog.fsync_job()
    assert job is not None and (job.start, job.end) == (0, 4)
    os.close(job.fd)
    tlog.sync_failed(OSError(errno.EIO, "Input/output error"), job)
    assert tlog.unsafe_from == 0
    tlog.append([Message(b"%016d" % i, b"y", 1) for i in range(2)])
    later = tlog.fsync_job()
    assert later is not None
    os.close(later.fd)
    tlog.synced_to(later)  # "clean": still nothing past the unsafe point
    assert tlog.synced == 0

    calls = []

    def failing_fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        durable_fsync(fd)

    durable_fsync = durable.fsync
    monkeypatch.setattr(topiclog.durable, "fsync", failing_fsync)
    with pytest.raises(OSError):
        tlog.truncate(0)
    segment = Path(tlog.segments[-1].path)
    assert tlog.latest == 0 and segment.stat().st_size == 0  # the log is what the file is
    assert tlog.unsafe_from == 0
    assert tlog.truncate(0) == 0 and tlog.unsafe_from is None  # the cut, finished
    tlog.append([Message(b"%016d" % i, b"z", 1) for i in range(3)])
    again = tlog.fsync_job()
    assert again is not None
    os.close(again.fd)
    tlog.synced_to(again)
    assert tlog.synced == 3
    tlog.close()
