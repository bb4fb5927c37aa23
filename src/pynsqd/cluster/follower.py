"""The follower's side of a replicated partition: one fetch task per partition, pulling the
leader's records into this node's copy.

Theory of operation. Each partition this node follows has one fetch stream open to its leader
(a websocket on ``GET /topic/replicate``; ``cluster/fetch.py`` is the format): one request at a
time, with this replica's id, storage, epoch and last epoch; the offset asked for is this
replica's acknowledgement of all before it. The answer's records are checked (every header
and CRC, in one pass) and appended verbatim (``TopicLog.append_raw``: offsets, IDs and
timestamps as the leader wrote them), and the next fetch is sent at once. With durability
fsync a request is sent only once everything below its offset is fsynced: a failed fsync takes
the unsynced records back (Linux may drop the dirty pages of a failed fsync and call the next
one clean) and they are fetched again, backing off while the disk fails. The leader's answer
also carries its HW, which becomes this copy's committed offset, and its epoch history, which
this copy keeps (``storage/epochs.py``). ``TRUNCATE`` cuts this copy back to where the leader's
history says its last epoch ended; ``RESET`` starts it again at the leader's earliest offset
(retention there removed what this copy needs next). The task runs while the partition follows
the same epoch; the replicator starts it again (idempotently) on every tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable

import aiohttp

from ..log import LOGGER_NAME
from ..storage.durable import fsync_close
from ..storage.group_sync import SyncJob
from ..storage.topiclog import TopicLog
from .fetch import REPLICA_SECRET_HEADER, FetchAnswer, FetchRequest
from .membership import Membership
from .partition import Partition, Role

__all__ = ["Following"]

log = logging.getLogger(LOGGER_NAME)

#: How long a follower's fetch waits at the end of the leader's log for new records (ms).
FETCH_WAIT_MS = 500
FETCH_MAX_BYTES = 4 << 20
#: After a refusal (not or no longer the leader), the next try waits about one tick.
RETRY_AFTER = 0.25
#: After a failed append (a full disk), the same fetch again after this, doubling up to 2 s.
APPEND_RETRY = 0.1
#: A fetch not answered this long after its wait is over: the leader is gone or paused.
ANSWER_GRACE = 5.0
#: Seconds a closing stream waits for the leader's close (a paused leader answers none).
CLOSE_TIMEOUT = 1.0

PartitionKey = tuple[str, int]


class Following:
    """The fetch tasks of the partitions this node follows."""

    def __init__(self, member: Membership, kick: Callable[[], None] = lambda: None) -> None:
        self.member = member
        #: Read the cluster now: this origin caught up with the node serving its partition.
        self.kick = kick
        self._fetchers: dict[PartitionKey, tuple[int, asyncio.Task[None]]] = {}
        #: fsyncs or cuts failed in a row, per partition (the back-off and the log lines).
        self._sync_failures: dict[PartitionKey, int] = {}
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
        """Fetch from the leader of ``epoch`` until it is no longer the leader: one stream,
        opened again after a failure."""
        failures = 0
        while self._following(p, epoch):
            url = f"http://{p.leader_http}/topic/replicate"
            # ``leader``: the member asked (a node of several workers passes it there).
            query = {"topic": p.topic, "partition": str(p.origin), "leader": str(p.leader)}
            try:
                # An answer holds at least one record, which may be larger than max_bytes.
                largest = FETCH_MAX_BYTES + self.member.opts.max_msg_size + (1 << 16)
                async with self._get_session().ws_connect(
                    url,
                    params=query,
                    headers={REPLICA_SECRET_HEADER: self.member.secret},
                    max_msg_size=largest,
                    autoping=True,
                    timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT),
                ) as ws:
                    failures = 0
                    p.streaming = True
                    try:
                        await self._fetch_loop(p, epoch, ws)
                    finally:
                        p.streaming = False
                    return
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "CLUSTER: partition %s: fetch from %s failed - %s",
                        p.name,
                        p.leader_http,
                        err or type(err).__name__,
                    )
                await asyncio.sleep(min(0.05 * failures, 0.5))

    async def _synced_before_ack(
        self, p: Partition, epoch: int, loop: asyncio.AbstractEventLoop
    ) -> bool:
        """With durability fsync, the next request acknowledges every record below its offset
        (the leader commits on it): they are fsynced first. A failed fsync leaves what it
        covered unsafe (``TopicLog.unsafe_from``: the kernel may have dropped their pages and
        call the next fsync clean): it is cut and fetched again, backing off while the disk
        fails (this copy falls out of the in-sync set meanwhile). The fsync runs to its end
        and reports to the log even if this task is cancelled. Returns False when the
        partition is no longer followed at ``epoch``."""
        tlog = p.log
        key = (p.topic, p.origin)
        while self._following(p, epoch):
            cut = tlog.unsafe_from
            if cut is not None:
                try:
                    tlog.truncate(cut)
                    p.history.truncate(tlog.latest)
                except OSError as err:
                    await self._sync_trouble(p, key, f"cutting back to offset {cut} failed - {err}")
                    continue
                log.warning(
                    "CLUSTER: partition %s: offsets from %d are fetched again (their fsync failed)",
                    p.name,
                    cut,
                )
                continue
            if p.settings.durability != "fsync" or tlog.synced >= tlog.latest:
                return True
            job = tlog.fsync_job()
            if job is None:  # the log is closed
                return False
            done = loop.run_in_executor(None, fsync_close, job.fd)
            done.add_done_callback(functools.partial(_fsynced, tlog, job))
            try:
                await asyncio.shield(done)
            except OSError as err:
                await self._sync_trouble(p, key, f"fsync failed - {err}")
                continue
            failed = self._sync_failures.pop(key, 0)
            if failed:
                log.info(
                    "CLUSTER: partition %s: synced again at offset %d after %d failures",
                    p.name,
                    tlog.synced,
                    failed,
                )
        return False

    async def _sync_trouble(self, p: Partition, key: PartitionKey, what: str) -> None:
        """A failed fsync or cut: said on the first failure in a row, the 10th and every
        100th; then a pause that doubles up to 2 s."""
        failed = self._sync_failures[key] = self._sync_failures.get(key, 0) + 1
        if failed in (1, 10) or failed % 100 == 0:
            log.error(
                "CLUSTER: partition %s: %s; acknowledging nothing more until it works (this "
                "copy falls out of the in-sync set meanwhile; %d failures in a row)",
                p.name,
                what,
                failed,
            )
        await asyncio.sleep(min(APPEND_RETRY * 2 ** min(failed - 1, 5), 2.0))

    def _following(self, p: Partition, epoch: int) -> bool:
        return p.role is Role.FOLLOWER and p.epoch == epoch and not self._closing

    async def _fetch_loop(
        self, p: Partition, epoch: int, ws: aiohttp.ClientWebSocketResponse
    ) -> None:
        """One fetch at a time on the stream. Raises on a broken stream (opened again)."""
        tlog = p.log
        loop = asyncio.get_running_loop()
        #: Appends failed in a row (a full disk): one line when it starts, one when it ends.
        failed = 0
        while self._following(p, epoch):
            if tlog.holes:
                _fetch_holes_again(p)
            if not await self._synced_before_ack(p, epoch, loop):
                return
            req = FetchRequest(
                offset=tlog.latest,
                epoch=epoch,
                last_epoch=p.history.last_epoch,
                replica=self.member.node_id,
                storage=self.member.storage,
                wait_ms=FETCH_WAIT_MS,
                max_bytes=FETCH_MAX_BYTES,
            )
            await ws.send_bytes(req.encode())
            async with asyncio.timeout(FETCH_WAIT_MS / 1000 + ANSWER_GRACE):
                msg = await ws.receive()
            if msg.type is not aiohttp.WSMsgType.BINARY:
                raise ConnectionError(f"the leader closed the stream ({msg.type.name})")
            answer = FetchAnswer.decode(msg.data)
            if answer.status == 409:
                if answer.message == "TRUNCATE":
                    tlog.truncate(answer.truncate_to)
                    p.history.truncate(answer.truncate_to)
                    continue
                if answer.message == "RESET":
                    log.warning(
                        "CLUSTER: partition %s: %s no longer has offset %d; copying from %d",
                        p.name,
                        p.leader_http,
                        tlog.latest,
                        answer.start,
                    )
                    tlog.restart_at(answer.start)
                    p.history.truncate(-1)
                    continue
                self.kick()  # not (or no longer) the leader: the plan decides, now
                await asyncio.sleep(RETRY_AFTER)
                continue
            if answer.status != 200:
                log.warning(
                    "CLUSTER: partition %s: fetch answered %d %s",
                    p.name,
                    answer.status,
                    answer.message,
                )
                await asyncio.sleep(0.5)
                continue
            if not self._following(p, epoch):
                return
            try:
                if answer.records:
                    tlog.append_raw(answer.records)
                p.history.copy_from(answer.epochs, tlog.latest)
            except ValueError as err:
                log.error(
                    "CLUSTER: partition %s: records from %s refused - %s",
                    p.name,
                    p.leader_http,
                    err,
                )
                await asyncio.sleep(0.5)
                continue
            except OSError as err:
                # Nothing of the batch was kept (append_raw takes a short write back): the same
                # fetch again, backing off, while this copy falls behind and leaves the in-sync
                # set; the stream stays open.
                if not failed:
                    log.error(
                        "CLUSTER: partition %s: appending at offset %d failed - %s; retrying "
                        "(this copy falls out of the in-sync set until it can append)",
                        p.name,
                        tlog.latest,
                        err,
                    )
                failed += 1
                await asyncio.sleep(min(APPEND_RETRY * 2 ** min(failed - 1, 5), 2.0))
                continue
            if failed and answer.records:
                log.info(
                    "CLUSTER: partition %s: appending again at offset %d after %d failed tries",
                    p.name,
                    tlog.latest,
                    failed,
                )
                failed = 0
            p.leader_answered(answer.latest, answer.hw)
            tlog.hand_to(tlog.latest)
            if p.is_origin and tlog.latest >= answer.latest:
                self.kick()  # caught up: the take-back need not wait for the next tick


def _fetch_holes_again(p: Partition) -> None:
    """Damaged records in a closed segment (found at open, or when read since): the copy is
    cut at the first and fetches the rest again from its leader; it counts as having lost
    them until it holds them (``TopicLog.truncate(damaged=True)``). Raises OSError."""
    tlog = p.log
    hole = tlog.lost()
    if hole is None or hole[0] >= tlog.latest:
        return
    log.warning(
        "CLUSTER: partition %s: offsets %d-%d of this copy are damaged; fetching "
        "everything from %d again from %s",
        p.name,
        *hole,
        hole[0],
        p.leader_http,
    )
    tlog.truncate(hole[0], damaged=True)
    p.history.truncate(hole[0])


def _fsynced(tlog: TopicLog, job: SyncJob, done: asyncio.Future[None]) -> None:
    """A follower's fsync ended: its records count as synced, or as unsafe (reported to
    ``/ping``), whoever was waiting for it."""
    if done.cancelled():
        return
    err = done.exception()
    if err is None:
        tlog.synced_to(job)
    elif isinstance(err, OSError):
        tlog.sync_failed(err, job)
