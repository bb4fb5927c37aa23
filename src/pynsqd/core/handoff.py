"""A retained topic's hand-off: its log's backlog going to its channels, and where that stands.

Theory of operation. A replayable topic's log is its queue: ``TopicLog.handed`` is the offset
below which every channel has stored the messages (moved only by ``TopicLog.hand_to``). The
topic's drain reads the backlog a batch at a time and hands it over (``hand_over``); the position
moves after (``handed_to``) and is saved once at the end of the loop turn for every batch handed
in it (``save``), so a crash repeats a batch, never skips one. A channel that could keep a batch
only in memory (its disk write failed) holds the saved position back (``_hold``) until what it
kept was delivered. A channel created at a later offset (a replay gave it what came before) is
skipped until the hand-off passes that offset (``skip_before``); the topic's only channel created
at an offset restarts the hand-off there (``restart``). The hand-off waits while the topic's
partition is served by another node or this node is still joining its cluster (``hold``,
``release``; ``held``).
"""

from __future__ import annotations

import logging
from typing import Protocol

from .backend import MessageLog
from .channel import Channel
from .message import Message
from .timed_queue import Scheduler

log = logging.getLogger("pynsqd")


class Handing(Protocol):
    """What the hand-off needs of its topic (``core/topic.Topic``)."""

    name: str
    loop: Scheduler
    log: MessageLog | None
    channels: dict[str, Channel]

    def schedule_drain(self) -> None: ...
    def fan_out(self, msgs: list[Message], *, mixed: bool = False) -> OSError | None: ...


class HandOff:
    """One topic's hand-off (``Topic.hand_off``)."""

    __slots__ = ("_hold", "_save_pending", "_starts", "held", "topic")

    def __init__(self, topic: Handing) -> None:
        self.topic = topic
        #: The hand-off waits (the partition is served by another node, or this node is still
        #: joining its cluster).
        self.held = False
        self._save_pending = False
        #: The first offset some channel holds only in memory because its disk write failed:
        #: the saved position must not pass it (None: every channel stored all).
        self._hold: int | None = None
        #: Channels created at an offset past the hand-off position (they had the messages
        #: before it by a replay): the drain gives them nothing before it. Usually empty.
        self._starts: dict[str, int] = {}

    def hold(self) -> None:
        """The log's backlog waits in the log."""
        self.held = True

    def release(self) -> None:
        """The backlog goes to the channels again (a no-op when it was not held)."""
        if self.held:
            self.held = False
            self.topic.schedule_drain()

    def handed_to(self, offset: int, failed_from: int | None = None) -> None:
        """Every channel has stored the messages before ``offset`` (those from ``failed_from``
        on only in memory: a disk write failed). The position is saved at the end of the loop
        turn, once for all the batches handed in it: a crash before then hands them again (at
        least once), and the saved position never passes what the channels stored."""
        tlog = self.topic.log
        assert tlog is not None
        tlog.hand_to(offset)
        if failed_from is not None and (self._hold is None or failed_from < self._hold):
            self._hold = failed_from
        if not self._save_pending:
            self._save_pending = True
            self.topic.loop.call_soon(self._save_now)

    def _save_now(self) -> None:
        self._save_pending = False
        try:
            self.save()
        except OSError as err:  # the backlog would be handed over again: no loss
            log.error("TOPIC(%s): failed to save its log position - %s", self.topic.name, err)

    def save(self) -> None:
        """Persist the hand-off position, never past a message some channel holds only in
        memory after a failed write. Raises OSError."""
        tlog = self.topic.log
        if tlog is None:
            return
        hold = self._hold
        if hold is not None and all(
            ch.queue.mem_depth <= ch.queue.mem_size for ch in self.topic.channels.values()
        ):
            hold = self._hold = None  # what was kept in memory has been delivered
        tlog.save_handed(tlog.handed if hold is None else min(hold, tlog.handed))

    def hand_over(self, batch: list[Message], first: int) -> OSError | None:
        """A batch of the log's backlog (offsets from ``first``) to the channels; a channel
        created at a later offset gets only what it asked for."""
        topic = self.topic
        starts = self._starts
        if starts:
            for name, start in list(starts.items()):
                if start <= first or name not in topic.channels:
                    del starts[name]
        if not starts:
            return topic.fan_out(batch, mixed=True)
        err = None
        for i, ch in enumerate(topic.channels.values()):
            skip = starts.get(ch.name, first) - first
            mine = batch[skip:] if skip else batch
            if i:
                mine = [m.copy() for m in mine]
            if mine:
                err = ch.put_many(mine, mixed=True) or err
        return err

    def restart(self, offset: int) -> None:
        """The topic's only channel was created at ``offset`` of the log: the backlog is
        ``[offset, latest)`` from now on, handed over (and saved) as any backlog."""
        tlog = self.topic.log
        assert tlog is not None
        self._starts.clear()
        self._hold = None
        tlog.hand_to(offset)
        self.save()
        self.topic.schedule_drain()

    def skip_before(self, channel: Channel, offset: int) -> None:
        """``channel`` was given the log up to ``offset`` by a replay: the drain skips it
        until the hand-off passes that offset."""
        tlog = self.topic.log
        if tlog is not None and offset > tlog.handed:
            self._starts[channel.name] = offset
