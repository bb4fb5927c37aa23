"""Rewinds: a retained log's messages put back into a channel, with their IDs.

Theory of operation. A rewind (``POST /channel/rewind``, ``/channel/create?offset=``) puts the
retained messages from an offset up to the latest one at the time of the call back into a
channel, a batch per loop turn. Its progress is kept in ``rewind.<stop>.<channel>`` in the log's
directory (``storage/position.py``: the next offset to put back, saved after each batch), so a
crash mid-way resumes at the next start (``resume``) instead of leaving a partial replay no one
knows of. A rewind ends early, with what it put back so far, if its channel or topic is deleted;
when nsqd stops, it answers so too and goes on at the next start. Turning retention off is
refused while one runs (``running_on``). A channel created at an offset is the same replay,
except when it is the topic's only channel: then the topic's own hand-off simply restarts at
that offset (``HandOff.restart``). A replicated channel taking over a partition's pending
messages is put back the same way (``replay_ranges``, ``cluster/checkpoints.py``), with their
attempts and due times, and no bound refuses them (they were acknowledged).
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
from ..core.replay import Conflict, Replayed
from ..core.topic import Topic
from ..storage.position import PositionFile
from ..storage.topiclog import OffsetOutOfRange, TopicLog

log = logging.getLogger("pynsqd")

#: Messages put back into a channel per loop turn by a rewind (about a millisecond of work).
REWIND_BATCH = 1024
#: Seconds between two progress lines of a long replay.
PROGRESS_EVERY = 5.0
_REWIND_FILE = re.compile(r"^rewind\.(\d{1,19})\.(.+)$")


class Rewinds:
    """The running rewinds of one nsqd's retained logs."""

    def __init__(self, exiting: Callable[[], bool] = lambda: False) -> None:
        self._exiting = exiting
        #: Running rewinds, by (topic, channel).
        self.running: set[tuple[str, str]] = set()
        self._resumed: set[asyncio.Task[Replayed]] = set()

    def running_on(self, topic: str) -> bool:
        """Whether a rewind of one of ``topic``'s channels runs."""
        return any(t == topic for t, _ in self.running)

    async def create_at(self, topic: Topic, channel: Channel, start: int) -> Replayed:
        """A channel just created (nothing awaited since) starts at ``start`` of the log: it
        gets ``[start, latest)`` and then what follows, each message once."""
        tlog = topic.log
        assert isinstance(tlog, TopicLog)
        bounded = channel.bounds.on
        if len(topic.channels) == 1 and not len(topic.queue) and not bounded:
            _reopen(topic, channel, start, tlog.handed)
            topic.hand_off.restart(start)  # the backlog is its alone: no replay needed
            return Replayed(start, tlog.latest, tlog.latest - start)
        topic.hand_off.skip_before(channel, tlog.latest)  # the replay gives it all before that
        return await self.rewind(topic, channel, start)

    async def rewind(
        self, topic: Topic, channel: Channel, start: int, stop: int | None = None
    ) -> Replayed:
        """Put ``[start, stop)`` (``stop``: the latest offset now) back into ``channel``.
        Raises ``Conflict`` while another rewind of the channel runs."""
        tlog = topic.log
        assert isinstance(tlog, TopicLog)
        key = (topic.name, channel.name)
        if key in self.running:
            raise Conflict("REWIND_IN_PROGRESS")
        stop = tlog.latest if stop is None else stop
        marker = os.path.join(tlog.directory, f"rewind.{stop}.{channel.name}")
        progress = PositionFile(marker)  # OSError: nothing started
        _reopen(topic, channel, start, stop)
        self.running.add(key)
        resume = False
        try:
            progress.save(start, sync=tlog.sync_every <= 1)
            result = await self._replay(topic, channel, tlog, start, stop, progress)
            resume = result.stopped == "EXITING"  # nsqd stops: it goes on at the next start
            return result
        finally:
            self.running.discard(key)
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

    def resume(self, logs: Mapping[str, TopicLog], topics: Mapping[str, Topic]) -> None:
        """At start: rewinds a crash interrupted go on where their progress says."""
        for name, tlog in logs.items():
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


def _reopen(topic: Topic, channel: Channel, start: int, stop: int) -> None:
    """A replicated channel is responsible again for what is put back (``core/offsets.py``)."""
    if channel.windows is not None and topic.origin is not None:
        w = channel.windows.get(topic.origin)
        if w is not None and start < stop:
            w.reopen(start, stop)
