"""Retained logs: which topics keep one, opening them, turning retention on and off.

Theory of operation. A topic retains (keeps a ``TopicLog`` in ``<data-path>/<topic>.log/``) when
its own setting (``retention.json`` there, from ``POST /topic/retention``) or else the flags
(``--retention-time`` / ``--retention-bytes``) give it a bound. This module is the one owner of
those logs in the server: it builds every ``TopicLog``, attaches it to its topic when nsqd
creates the topic, syncs and prunes them on the ``--sync-timeout`` tick, and moves a log's
backlog out when retention goes off.

Turning retention off never loses a message. The log is the topic's queue: its backlog
``[handed, latest)`` has reached no channel yet, so it moves to the topic's own disk queue
first, a batch at a time, ``handed`` saved after each batch is stored (a crash repeats a
batch, never skips one). Only when all of it moved, and the setting is saved, does the log go.
If a batch cannot be stored (a full disk), the move stops there: what moved is in the topic's
queue, the rest is still in the log, retention stays on, and the caller gets the error; asking
again once there is room finishes the move. At start-up, a topic whose retention is off but
whose log still holds a backlog gets the same move; if it fails, the log stays attached and
serves that backlog, and the next start tries again.

Rewinds (``POST /channel/rewind``, ``/channel/create?offset=``) put the retained messages from an
offset up to the latest one at the time of the call back into a channel, with their IDs, a
batch per loop turn. Their progress is kept in ``rewind.<stop>.<channel>`` in the log's
directory (``storage/position.py``: the next offset to put back, saved after each batch), so a
crash mid-way resumes at the next start instead of leaving a partial replay no one knows of.
A rewind ends early, with what it put back so far, if its channel or topic is deleted; when
nsqd stops, it answers so too and goes on at the next start. Turning retention off is refused
while one runs. A channel created at an offset is the
same replay, except when it is the topic's only channel: then the topic's own hand-off simply
restarts at that offset (``Topic.restart_hand_off``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping

from ..core.channel import Channel
from ..core.dedup import Dedup
from ..core.message import Message
from ..core.replay import Conflict, Replayed
from ..core.topic import Topic
from ..options import Options
from ..storage.position import PositionFile
from ..storage.topiclog import (
    RETENTION_FILE,
    OffsetOutOfRange,
    TopicLog,
    read_retention,
    write_retention,
)

log = logging.getLogger("pynsqd")

#: Messages moved from a log's backlog to the topic's queue per write.
MOVE_BATCH = 1024
#: Messages put back into a channel per loop turn by a rewind (about a millisecond of work).
REWIND_BATCH = 1024
#: Seconds between two progress lines of a long replay.
PROGRESS_EVERY = 5.0
_REWIND_FILE = re.compile(r"^rewind\.(\d{1,19})\.(.+)$")


def _has_segments(directory: str) -> bool:
    """Whether a log directory holds a log (not only its retention setting)."""
    try:
        return any(n.endswith(".log") for n in os.listdir(directory))
    except OSError:
        return False


class BacklogNotMoved(OSError):
    """Retention could not go off: part of the log's backlog could not be stored elsewhere."""


class Retention:
    """The retained logs of one nsqd, by topic name."""

    def __init__(
        self,
        opts: Options,
        data_path: str,
        *,
        on_write: Callable[[OSError | None], None],
        on_error: Callable[[BaseException | None], None],
        exiting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.opts = opts
        self.data_path = data_path
        self._on_write = on_write  # every append's outcome (nsqd's /ping health)
        self._on_error = on_error
        self._exiting = exiting
        self.logs: dict[str, TopicLog] = {}
        #: ``--workers``: the worker that keeps a topic's log when it is another one (None:
        #: this one). Set by the worker (``Workers.elsewhere``); one process keeps every log.
        self.elsewhere: Callable[[str], int | None] = lambda name: None
        #: Told when a topic's retention went off here: where its queue is kept may change
        #: (``NSQD.place``: a bounded topic stays with one worker).
        self.placed: Callable[[Topic], None] = lambda topic: None
        #: Copies of other nodes' partitions (replicated topics), by "topic/origin".
        self.replicas: dict[str, TopicLog] = {}
        #: Running rewinds, by (topic, channel).
        self._rewinds: set[tuple[str, str]] = set()
        self._resumed: set[asyncio.Task[Replayed]] = set()

    def directory(self, name: str) -> str:
        return os.path.join(self.data_path, f"{name}.log")

    def setting(self, name: str) -> tuple[float, int]:
        """A topic's retention (seconds, bytes): its own setting, else the flags'."""
        try:
            own = read_retention(self.directory(name))
        except ValueError as err:
            log.error("TOPIC(%s): %s; using --retention-time/--retention-bytes", name, err)
            own = None
        return own if own is not None else (self.opts.retention_time, self.opts.retention_bytes)

    def get(self, name: str) -> TopicLog | None:
        return self.logs.get(name)

    def forget(self, name: str) -> None:
        """The topic was deleted (it closed its log)."""
        self.logs.pop(name, None)

    def drop_replica(self, topic: str, origin: int) -> None:
        """This node's copy of another node's partition of ``topic`` is no longer kept (the
        topic was deleted there): closed, its files removed."""
        tlog = self.replicas.pop(f"{topic}/{origin}", None)
        if tlog is None:
            return
        try:
            tlog.delete()
        except OSError as err:
            log.error(
                "TOPIC(%s): failed to remove its copy of node %d's log - %s", topic, origin, err
            )

    def open_replica(self, topic: str, origin: int) -> TopicLog:
        """This node's copy of another node's partition of ``topic`` (``cluster/``), kept in
        ``replicas/<origin>/<topic>/`` with the flags' retention. Raises OSError."""
        key = f"{topic}/{origin}"
        tlog = self.replicas.get(key)
        if tlog is None:
            path = os.path.join(self.data_path, "replicas", str(origin), topic)
            tlog = self._open(topic, path)
            tlog.retention_time = self.opts.retention_time
            tlog.retention_bytes = self.opts.retention_bytes
            tlog.hand_to(tlog.latest)  # a replica's channels are not fed from it
            self.replicas[key] = tlog
        return tlog

    def _open(self, name: str, directory: str | None = None) -> TopicLog:
        """The one place a ``TopicLog`` is built. Raises OSError."""
        return TopicLog(
            directory or self.directory(name),
            segment_bytes=self.opts.max_bytes_per_file,
            sync_every=self.opts.sync_every,
            logger=log,
            name=name,
        )

    def attach(self, topic: Topic) -> None:
        """A topic was created: give it its log if it retains; if it does not but its log
        still holds a backlog, move that to its queue."""
        seconds, size = self.setting(topic.name)
        keeper = self.elsewhere(topic.name) if seconds or size else None
        topic.kept_by = keeper
        if not (seconds or size) or keeper is not None:
            # No log here: none wanted, or another worker of this node keeps it (a log left
            # here by a run with another --workers count gives its backlog to the queue).
            if _has_segments(self.directory(topic.name)):
                self._release_at_start(topic)
            return
        try:
            topic_log = self._open(topic.name)
        except OSError as err:
            # Publishing must not go on without the log it promises: every PUB fails (and
            # /ping is unhealthy) until the log can be opened.
            log.error("TOPIC(%s): failed to open its log - %s", topic.name, err)
            self._on_error(err)
            topic.log = UnavailableLog(err)
            return
        topic_log.retention_time, topic_log.retention_bytes = seconds, size
        self._serve(topic, topic_log)
        log.info(
            "TOPIC(%s): log open, offsets %d-%d (retention %ss, %d bytes)",
            topic.name,
            topic_log.earliest,
            topic_log.latest,
            seconds,
            size,
        )

    def _serve(self, topic: Topic, topic_log: TopicLog) -> None:
        topic_log.on_write = self._on_write
        topic_log.prune()
        topic.log = topic_log
        self.logs[topic.name] = topic_log

    def _release_at_start(self, topic: Topic) -> None:
        try:
            old = self._open(topic.name)
        except OSError as err:
            log.error("TOPIC(%s): failed to open its old log - %s", topic.name, err)
            return
        try:
            moved = self._move_backlog(topic, old)
        except BacklogNotMoved as err:
            log.error(
                "TOPIC(%s): retention is off, but %s; the log stays open and serves it until "
                "the next start",
                topic.name,
                err,
            )
            self._serve(topic, old)  # no bound set: nothing is pruned
            topic.schedule_drain()
            return
        # The files stay: retention off does not delete data it did not decide to.
        old.close()
        if moved:
            log.warning(
                "TOPIC(%s): retention is off; moved the %d messages its log held for channels "
                "to its queue",
                topic.name,
                moved,
            )
            topic.schedule_drain()

    def _move_backlog(self, topic: Topic, topic_log: TopicLog) -> int:
        """Move ``[handed, latest)`` into the topic's disk queue, a batch at a time, ``handed``
        saved after each batch is stored. Raises ``BacklogNotMoved`` (what moved stays moved)."""
        moved = 0
        backend = topic.queue.backend
        while topic_log.handed < topic_log.latest:
            msgs: list[Message]
            msgs, nxt = topic_log.read_messages(topic_log.handed, MOVE_BATCH)
            try:
                if msgs:
                    backend.put_many(msgs)
                topic_log.hand_to(nxt)
                topic_log.save_handed()
            except OSError as err:
                left = topic_log.latest - topic_log.handed
                raise BacklogNotMoved(
                    err.errno,
                    f"{left} messages of its log's backlog could not be moved to its queue "
                    f"({moved} were) - {err.strerror or err}",
                ) from err
            moved += len(msgs)
        return moved

    def change(self, topic: Topic, seconds: float, size: int) -> None:
        """``POST /topic/retention``: the topic's own setting, kept across restarts; 0 and 0
        stop its log (its backlog moved to the topic's queue first) and remove it. Raises
        OSError (``BacklogNotMoved``: retention is still on)."""
        name = topic.name
        current = self.logs.get(name)
        if seconds or size:
            write_retention(self.directory(name), seconds, size)
            if current is None:
                self.attach(topic)
            else:
                current.retention_time, current.retention_bytes = seconds, size
                current.prune()
            return
        if current is None:
            write_retention(self.directory(name), 0.0, 0)
            topic.kept_by = None
            self.placed(topic)
            return
        if any(t == name for t, _ in self._rewinds):
            raise Conflict("REWIND_IN_PROGRESS")
        try:
            moved = self._move_backlog(topic, current)
        finally:
            topic.schedule_drain()  # what moved is the topic's queue's now
        write_retention(self.directory(name), 0.0, 0)  # OSError: still on, nothing lost
        topic.log = None
        del self.logs[name]
        current.delete(keep=(RETENTION_FILE,))
        log.info("TOPIC(%s): retention off, log removed (%d waiting moved)", name, moved)

    # -- rewinds ---------------------------------------------------------------------------

    async def create_at(self, topic: Topic, channel: Channel, start: int) -> Replayed:
        """A channel just created (nothing awaited since) starts at ``start`` of the log: it
        gets ``[start, latest)`` and then what follows, each message once."""
        tlog = topic.log
        assert isinstance(tlog, TopicLog)
        bounded = channel.bounds.on
        if len(topic.channels) == 1 and not len(topic.queue) and not bounded:
            _reopen(topic, channel, start, tlog.handed)
            topic.restart_hand_off(start)  # the backlog is its alone: no replay needed
            return Replayed(start, tlog.latest, tlog.latest - start)
        topic.skip_log_before(channel, tlog.latest)  # the replay gives it all before that
        return await self.rewind(topic, channel, start)

    async def rewind(
        self, topic: Topic, channel: Channel, start: int, stop: int | None = None
    ) -> Replayed:
        """Put ``[start, stop)`` (``stop``: the latest offset now) back into ``channel``.
        Raises ``Conflict`` while another rewind of the channel runs."""
        tlog = topic.log
        assert isinstance(tlog, TopicLog)
        key = (topic.name, channel.name)
        if key in self._rewinds:
            raise Conflict("REWIND_IN_PROGRESS")
        stop = tlog.latest if stop is None else stop
        marker = os.path.join(tlog.directory, f"rewind.{stop}.{channel.name}")
        progress = PositionFile(marker)  # OSError: nothing started
        _reopen(topic, channel, start, stop)
        self._rewinds.add(key)
        resume = False
        try:
            progress.save(start, sync=tlog.sync_every <= 1)
            result = await self._replay(topic, channel, tlog, start, stop, progress)
            resume = result.stopped == "EXITING"  # nsqd stops: it goes on at the next start
            return result
        finally:
            self._rewinds.discard(key)
            progress.close()
            if not resume:
                with contextlib.suppress(OSError):
                    os.unlink(marker)

    async def _replay(
        self,
        topic: Topic,
        channel: Channel,
        tlog: TopicLog,
        start: int,
        stop: int,
        progress: PositionFile,
    ) -> Replayed:
        """A rewind's (and a create-at-offset's) put-back: bounds as for a publisher, progress
        saved per batch, stopped by whatever ends the rewind."""
        result = await self.put_back(
            topic,
            channel,
            tlog,
            [(start, stop)],
            stopped_by=lambda: self._rewind_stopped(topic, channel, tlog),
            as_publisher=True,
            progress=progress,
        )
        log.info(
            "CHANNEL(%s:%s): rewound to offset %d, %d messages put back (offsets %d-%d)%s",
            topic.name,
            channel.name,
            start,
            result.count,
            start,
            result.next - 1,
            f"; stopped early: {result.stopped}" if result.stopped else "",
        )
        return result

    async def replay_ranges(
        self,
        topic: Topic,
        channel: Channel,
        tlog: TopicLog,
        ranges: list[tuple[int, int]],
        attempts: Mapping[int, int] | None = None,
        due: Mapping[int, int] | None = None,
    ) -> int:
        """Put the messages at ``ranges`` of ``tlog`` (a topic's log or a copy of another
        node's partition) into ``channel`` with their IDs, attempts and due times: a channel
        taking over a partition's pending messages (``cluster/checkpoints.py``). The ranges are
        committed offsets (visible or not yet: a node restarting knows its high watermark again
        only once its followers fetch); acknowledged messages, so a bound cannot refuse them.
        Returns how many were put back."""
        result = await self.put_back(
            topic,
            channel,
            tlog,
            ranges,
            stopped_by=lambda: self._adoption_stopped(topic, channel),
            as_publisher=False,
            attempts=attempts,
            due=due,
        )
        return result.count

    async def put_back(
        self,
        topic: Topic,
        channel: Channel,
        tlog: TopicLog,
        ranges: list[tuple[int, int]],
        *,
        stopped_by: Callable[[], str | None],
        as_publisher: bool,
        progress: PositionFile | None = None,
        attempts: Mapping[int, int] | None = None,
        due: Mapping[int, int] | None = None,
    ) -> Replayed:
        """The one routine that puts a log's records back into a channel: rewind,
        create-at-offset and a replicated channel's adoption or rebuild. A batch per loop turn
        (``read_messages``: checksums checked, DPUB due times kept, offsets as the log holds
        them, gaps included); ``stopped_by`` is asked before each batch. ``as_publisher``: a
        channel bound with policy reject takes what fits and stops (``CHANNEL_FULL``), as it
        would for a publisher; otherwise (acknowledged messages) a bound cannot refuse them.
        drop-oldest trims as after any publish. ``progress``: saved after each batch (a crash
        goes on from it). ``attempts``/``due``: by offset, deliveries so far and when a REQ's
        delay ends (wall clock, ms), for a takeover to go on from. Offsets retention removed
        are skipped and said so; a long run says how far it is every ``PROGRESS_EVERY``
        seconds."""
        first = ranges[0][0] if ranges else 0
        offset, count = first, 0
        total = sum(stop - start for start, stop in ranges)
        said = time.monotonic()
        stopped: str | None = None
        bounded = channel.bounds.on
        for start, stop in ranges:
            offset = start
            if offset < tlog.earliest:
                log.warning(
                    "CHANNEL(%s:%s): offsets %d-%d are no longer retained; not put back",
                    topic.name,
                    channel.name,
                    offset,
                    min(stop, tlog.earliest) - 1,
                )
                offset = min(tlog.earliest, stop)
            while offset < stop:
                stopped = stopped_by()
                if stopped is not None:
                    break
                offsets: list[int] = []
                try:
                    msgs, nxt = tlog.read_messages(offset, REWIND_BATCH, upto=stop, out=offsets)
                except OffsetOutOfRange:
                    break  # retention removed the rest meanwhile
                except OSError as err:
                    log.error(
                        "CHANNEL(%s:%s): failed to read offsets from %d - %s",
                        topic.name,
                        channel.name,
                        offset,
                        err,
                    )
                    stopped = "REWIND_INTERRUPTED"
                    break
                if not msgs or nxt <= offset:
                    offset = max(offset, min(nxt, stop))
                    break
                if as_publisher and bounded and channel.bounds.policy == "reject":
                    fit = channel.bounds.fitting(msgs)
                    if fit < len(msgs):  # what a publisher could not add, this cannot either
                        msgs, stopped = msgs[:fit], "CHANNEL_FULL"
                        nxt = offsets[fit] if fit < len(offsets) else nxt
                if attempts:  # a REQ's due time is kept only beside its attempts
                    for off, m in zip(offsets, msgs, strict=False):
                        m.attempts = attempts.get(off, 0)
                        if due and off in due:
                            m.defer_until_ns = due[off] * 1_000_000
                if msgs:
                    # kept in memory if the disk fails: never lost
                    kept = channel.put_many(msgs, mixed=not as_publisher)
                    if kept is not None:
                        log.error(
                            "CHANNEL(%s:%s): failed to store - %s", topic.name, channel.name, kept
                        )
                    if bounded and channel.bounds.policy == "drop-oldest":
                        channel.bounds.trim()
                    count += len(msgs)
                offset = nxt
                if stopped is not None:
                    break
                if progress is not None:
                    try:
                        progress.save(offset, sync=tlog.sync_every <= 1)
                    except OSError as err:  # a crash would repeat from an earlier offset
                        log.error(
                            "CHANNEL(%s:%s): failed to save its rewind's progress - %s",
                            topic.name,
                            channel.name,
                            err,
                        )
                if time.monotonic() - said >= PROGRESS_EVERY:
                    said = time.monotonic()
                    log.info(
                        "CHANNEL(%s:%s): %d of %d messages put back",
                        topic.name,
                        channel.name,
                        count,
                        total,
                    )
                await asyncio.sleep(0)
            # A read failure ends a rewind; an adoption goes on with its next range.
            if stopped is not None and (as_publisher or stopped != "REWIND_INTERRUPTED"):
                break
        return Replayed(first, offset, count, stopped)

    def _adoption_stopped(self, topic: Topic, channel: Channel) -> str | None:
        if channel.exiting or topic.channels.get(channel.name) is not channel:
            return "CHANNEL_DELETED"
        return None

    def _rewind_stopped(self, topic: Topic, channel: Channel, tlog: TopicLog) -> str | None:
        if self._exiting():
            return "EXITING"
        if topic.exiting:
            return "TOPIC_DELETED"
        if channel.exiting or topic.channels.get(channel.name) is not channel:
            return "CHANNEL_DELETED"
        if topic.log is not tlog:
            return "TOPIC_NOT_RETAINED"
        return None

    def resume_rewinds(self, topics: dict[str, Topic]) -> None:
        """At start: rewinds a crash interrupted go on where their progress says."""
        for name, tlog in self.logs.items():
            for entry in sorted(os.listdir(tlog.directory)):
                m = _REWIND_FILE.match(entry)
                if m is None:
                    continue
                path = os.path.join(tlog.directory, entry)
                stop, channel_name = int(m.group(1)), m.group(2)
                topic = topics.get(name)
                channel = topic.channels.get(channel_name) if topic is not None else None
                try:
                    pf = PositionFile(path)
                    try:
                        offset = pf.load()
                    finally:
                        pf.close()
                except (OSError, ValueError) as err:
                    log.error("TOPIC(%s): unreadable %s (%s); removed", name, path, err)
                    offset = None
                if offset is not None:
                    offset = max(offset, tlog.earliest)  # retention may have moved past it
                if topic is None or channel is None or offset is None or offset >= stop:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    continue
                # The resumed rewind goes on in this same file and removes it when it ends.
                log.warning(
                    "CHANNEL(%s:%s): resuming the rewind a crash interrupted, offsets %d-%d",
                    name,
                    channel_name,
                    offset,
                    stop - 1,
                )
                task = asyncio.ensure_future(self.rewind(topic, channel, offset, stop))
                self._resumed.add(task)
                task.add_done_callback(self._resumed.discard)

    def sync(self, topics: dict[str, Topic]) -> None:
        """The ``--sync-timeout`` tick (after the channels' queues were synced): each log's
        hand-off position, its records, and retention."""
        for name, topic_log in list(self.logs.items()):
            topic = topics.get(name)
            try:
                if topic is not None:
                    topic.save_handed()
                topic_log.sync_if_due()
                topic_log.prune()
            except OSError as err:
                log.error("TOPIC(%s): failed to sync its log - %s", name, err)
                self._on_error(err)
            bg_err = topic_log.take_sync_error()  # a background sync failed (already logged)
            if bg_err is not None:
                self._on_error(bg_err)
        for key, replica in list(self.replicas.items()):
            try:
                replica.save_handed(replica.latest)
                replica.sync_if_due()
                replica.prune()
            except OSError as err:
                log.error("TOPIC(%s): failed to sync its replica log - %s", key, err)
                self._on_error(err)
            bg_err = replica.take_sync_error()  # a follower's fsync failed (already logged)
            if bg_err is not None:
                self._on_error(bg_err)

    def close_replicas(self) -> None:
        for key, replica in self.replicas.items():
            try:
                replica.close()
            except OSError as err:
                log.error("TOPIC(%s): failed to close its replica log - %s", key, err)
        self.replicas.clear()

    def found(self, known: set[str], usable: Callable[[str], bool]) -> list[str]:
        """Topics not in ``known`` whose log is in the data path and who retain: served even
        if a crash came before nsqd.dat listed them."""
        names = []
        for entry in sorted(os.listdir(self.data_path)):
            name = entry[:-4]
            if (
                entry.endswith(".log")
                and name not in known
                and usable(name)
                and os.path.isdir(os.path.join(self.data_path, entry))
                and any(self.setting(name))
            ):
                names.append(name)
        return names


def _reopen(topic: Topic, channel: Channel, start: int, stop: int) -> None:
    """A replicated channel is responsible again for what is put back (``core/offsets.py``)."""
    if channel.windows is not None and topic.origin is not None:
        w = channel.windows.get(topic.origin)
        if w is not None and start < stop:
            w.reopen(start, stop)


class UnavailableLog:
    """The log of a retained topic that could not be opened: publishing fails, says why."""

    earliest = latest = visible = size = segment_count = handed = 0
    committed = None

    def __init__(self, err: OSError) -> None:
        self.err = err

    def set_dedup(self, records: int, window_ns: int) -> None:
        pass

    def identities(self) -> Dedup:
        raise OSError(self.err.errno, f"the topic's log is unavailable - {self.err.strerror}")

    def hand_to(self, offset: int) -> None:
        pass

    def save_handed(self, position: int | None = None) -> None:
        pass

    def read_messages(self, offset: int, max_count: int) -> tuple[list[Message], int]:
        return [], 0

    def bodies_at(self, offsets: list[int]) -> list[bytes | None]:
        return [None] * len(offsets)

    def append(self, msgs: list[Message], identity: tuple[bytes, int] | None = None) -> int:
        raise OSError(self.err.errno, f"the topic's log is unavailable - {self.err.strerror}")

    def close(self) -> None:
        pass

    def delete(self) -> None:
        pass
