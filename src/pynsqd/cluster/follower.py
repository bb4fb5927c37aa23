"""The follower's side of a replicated partition: one fetch task per partition, pulling the
leader's records into this node's copy.

Theory of operation. A fetch is ``GET /topic/log`` on the leader with ``replica``, ``storage``,
``epoch`` and ``last_epoch``; the offset asked for is this replica's acknowledgement of all
before it. The answer's records are checked (every header and CRC, in one pass) and appended
verbatim (``TopicLog.append_raw``: offsets, IDs and timestamps as the leader wrote them), fsynced
when the topic's durability is fsync, and the next fetch is sent at once. The leader's answer also
carries its HW, which becomes this copy's committed offset, and its epoch history, which this copy
keeps (``storage/epochs.py``). A ``409 TRUNCATE`` cuts this copy back to where the leader's
history says its last epoch ended; ``409 RESET`` starts it again at the leader's earliest offset
(retention there removed what this copy needs next). The task runs while the partition follows
the same epoch; the replicator starts it again (idempotently) on every tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import aiohttp

from ..storage.durable import fsync_close
from .membership import Membership
from .partition import Partition, Role

__all__ = ["Following"]

log = logging.getLogger("pynsqd")

#: How long a follower's fetch waits at the end of the leader's log for new records (ms).
FETCH_WAIT_MS = 500
FETCH_MAX_BYTES = 4 << 20
#: After a refusal (not or no longer the leader), the next try waits about one tick.
RETRY_AFTER = 0.25

PartitionKey = tuple[str, int]


class Following:
    """The fetch tasks of the partitions this node follows."""

    def __init__(self, member: Membership) -> None:
        self.member = member
        self._fetchers: dict[PartitionKey, tuple[int, asyncio.Task[None]]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closing = False

    def start(self, p: Partition) -> None:
        """Fetch for ``p`` at its current epoch (a no-op when that fetch runs)."""
        key = (p.topic, p.origin)
        running = self._fetchers.get(key)
        if running is not None and running[0] == p.epoch and not running[1].done():
            return
        self.stop(key)
        self._fetchers[key] = (p.epoch, asyncio.create_task(self._follow_logged(p, p.epoch)))

    def stop(self, key: PartitionKey) -> None:
        running = self._fetchers.pop(key, None)
        if running is not None:
            running[1].cancel()

    async def close(self) -> None:
        self._closing = True
        tasks = [t for _, t in self._fetchers.values()]
        self._fetchers.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._session is not None:
            await self._session.close()

    async def _follow_logged(self, p: Partition, epoch: int) -> None:
        try:
            await self._follow(p, epoch)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # logged; the next tick starts the fetch again
            log.error("CLUSTER: partition %s: fetching stopped - %s", p.name, err)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FETCH_WAIT_MS / 1000 + 5)
            )
        return self._session

    async def _follow(self, p: Partition, epoch: int) -> None:
        """Fetch from the leader of ``epoch`` until it is no longer the leader."""
        tlog = p.log
        loop = asyncio.get_running_loop()
        failures = 0
        while p.role is Role.FOLLOWER and p.epoch == epoch and not self._closing:
            query = {
                "topic": p.topic,
                "partition": str(p.origin),
                "offset": str(tlog.latest),
                "replica": str(self.member.node_id),
                "storage": self.member.storage,
                "epoch": str(epoch),
                "last_epoch": str(p.history.last_epoch),
                "wait_ms": str(FETCH_WAIT_MS),
                "max_bytes": str(FETCH_MAX_BYTES),
            }
            try:
                async with self._get_session().get(
                    f"http://{p.leader_http}/topic/log", params=query
                ) as resp:
                    body = await resp.read()
                    headers = resp.headers
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "CLUSTER: partition %s: fetch from %s failed - %s",
                        p.name,
                        p.leader_http,
                        err,
                    )
                await asyncio.sleep(min(0.05 * failures, 0.5))
                continue
            failures = 0
            if status == 409:
                doc = json.loads(body or b"{}")
                if doc.get("message") == "TRUNCATE":
                    to = int(doc["truncate_to"])
                    tlog.truncate(to)
                    p.history.truncate(to)
                    continue
                if doc.get("message") == "RESET":
                    start = int(doc["start"])
                    log.warning(
                        "CLUSTER: partition %s: %s no longer has offset %d; copying from %d",
                        p.name,
                        p.leader_http,
                        tlog.latest,
                        start,
                    )
                    tlog.restart_at(start)
                    p.history.truncate(-1)
                    continue
                await asyncio.sleep(RETRY_AFTER)  # not (or no longer) the leader: the plan decides
                continue
            if status != 200:
                log.warning(
                    "CLUSTER: partition %s: fetch answered %d %s", p.name, status, body[:200]
                )
                await asyncio.sleep(0.5)
                continue
            if p.role is not Role.FOLLOWER or p.epoch != epoch:
                return
            try:
                if body:
                    tlog.append_raw(body)
                entries = [(int(e), int(s)) for e, s in json.loads(headers["X-Nsq-Epochs"])]
                p.history.copy_from(entries, tlog.latest)
            except ValueError as err:
                log.error(
                    "CLUSTER: partition %s: records from %s refused - %s",
                    p.name,
                    p.leader_http,
                    err,
                )
                await asyncio.sleep(0.5)
                continue
            if p.settings.durability == "fsync":
                job = tlog.fsync_fd()
                if job is not None:
                    await loop.run_in_executor(None, fsync_close, job[0])
                    tlog.synced_to(job[1])
            p.leader_latest = int(headers.get("X-Nsq-Latest", "-1"))
            p.hw = max(p.hw, min(int(headers.get("X-Nsq-High-Watermark", "0")), tlog.latest))
            tlog.committed = p.hw
            tlog.handed = tlog.latest
