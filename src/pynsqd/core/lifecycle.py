"""A channel's message lifecycle (pynsqd; README, "Beyond nsqd"): all off by default.

Theory of operation. Two helpers a channel holds, each with its settings and counters:

- ``Screen`` looks at each batch at delivery when ``max_attempts`` or ``msg_ttl_ns`` is set:
  a message past its TTL is dropped (counted ``expired_count``); one that used up its attempts
  goes to the channel's dead-letter topic (``ChannelOwner.dead_letter``). If that fails (a full
  disk, a full bounded dead-letter topic) the messages are deferred, as a REQ with a delay that
  doubles per failure up to ``DEAD_LETTER_RETRY_MAX``, and delivered once when due (``passing``):
  never lost, never a hot loop; the log line is rate-limited, with a count.
- ``Bounds`` is the channel's bound (``max_depth`` messages, ``max_bytes`` body bytes, queued and
  deferred, as ``/stats``'s depth counts them) and its policy: ``reject`` (the topic refuses a
  publish that would not fit: ``QueueFull``) or ``drop-oldest`` (``trim``). Messages the server
  takes back from consumers (REQ, timeout, disconnect) are kept past it, and counted
  (``over_bound_count``): their publisher was told OK.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from .errors import QueueFull
from .message import Message
from .timed_queue import Scheduler
from .windows import Replicated

#: Dead-lettering failed: the messages wait this long (doubling to the cap) and are tried again.
DEAD_LETTER_RETRY_MIN = 1.0
DEAD_LETTER_RETRY_MAX = 60.0
#: At most one "failed to dead-letter" line per channel this often (with a count).
DEAD_LETTER_LOG_EVERY = 10.0

log = logging.getLogger("pynsqd")


class Named(Protocol):
    name: str


class Held(Replicated, Protocol):
    """What the lifecycle reads and changes of its channel (``core/channel.Channel``): what
    replication does (its queue, timed queue, deferred set and windows), and its names."""

    name: str

    @property
    def topic(self) -> Named: ...

    loop: Scheduler

    @property
    def depth(self) -> int: ...


#: Publishes messages to the channel's dead-letter topic; the error if they could not be stored.
DeadLetter = Callable[[list[Message]], OSError | QueueFull | None]


class Screen:
    """Max attempts, dead-lettering and TTL at delivery (this module's docstring)."""

    __slots__ = (
        "_backoff",
        "_logged_at",
        "_unlogged",
        "channel",
        "dead_letter",
        "dead_letter_count",
        "dead_letter_failed_count",
        "expired_count",
        "max_attempts",
        "msg_ttl_ns",
        "on",
        "passing",
    )

    def __init__(self, channel: Held, dead_letter: DeadLetter) -> None:
        self.channel = channel
        self.dead_letter = dead_letter
        self.max_attempts = 0  # deliveries before a message is dead-lettered; 0: unlimited
        self.msg_ttl_ns = 0  # age from publish after which a message is not delivered
        self.on = False  # either is set: the channel's delivery looks at each message
        self.dead_letter_count = 0
        self.dead_letter_failed_count = 0
        self.expired_count = 0
        self._backoff = 0.0  # the next retry delay after a dead-letter failure; 0: none
        self._logged_at = float("-inf")
        self._unlogged = 0
        #: Deferred after a failure: delivered once when due, as a REQ would be.
        self.passing: set[bytes] = set()

    def set(self, max_attempts: int, msg_ttl_ns: int) -> None:
        self.max_attempts = max_attempts
        self.msg_ttl_ns = msg_ttl_ns
        self.on = bool(max_attempts or msg_ttl_ns)

    def batch(self, batch: list[Message]) -> list[Message]:
        """What of ``batch`` is delivered: expired messages are dropped; those that used up
        their attempts go to the dead-letter topic (if that fails they are deferred)."""
        channel = self.channel
        ttl = self.msg_ttl_ns
        limit = self.max_attempts
        now_ns = time.time_ns() if ttl else 0
        keep: list[Message] = []
        dead: list[Message] = []
        expired = 0
        windows = channel.windows
        for m in batch:
            if ttl and now_ns - m.timestamp >= ttl:
                expired += 1
                if windows is not None:
                    windows.mark_done((m.id,))
            elif limit and m.attempts >= limit:
                if m.id in self.passing:  # back from its delay: delivered, as a REQ would be
                    self.passing.discard(m.id)
                    keep.append(m)
                else:
                    dead.append(m)
            else:
                keep.append(m)
        self.expired_count += expired
        if dead:
            err = self.dead_letter(dead)
            if err is None:
                self.dead_letter_count += len(dead)
                self._backoff = 0.0
                if windows is not None:
                    windows.mark_done([m.id for m in dead])
            else:
                self._failed(dead, err)
        return keep

    def _failed(self, dead: list[Message], err: OSError | QueueFull) -> None:
        """Deferred, as a REQ with a delay (doubling per failure, capped), then tried again."""
        channel = self.channel
        self.dead_letter_failed_count += len(dead)
        delay = self._backoff or DEAD_LETTER_RETRY_MIN
        self._backoff = min(delay * 2, DEAD_LETTER_RETRY_MAX)
        now = channel.loop.time()
        for m in dead:
            channel.deferred[m.id] = m
            self.passing.add(m.id)
        channel.tq.push_many(dead, now + delay)
        self._unlogged += len(dead)
        if now - self._logged_at >= DEAD_LETTER_LOG_EVERY:
            log.error(
                "CHANNEL(%s:%s): failed to dead-letter %d message(s) (%d failures in all), "
                "retrying in %gs - %s",
                channel.topic.name,
                channel.name,
                self._unlogged,
                self.dead_letter_failed_count,
                delay,
                err,
            )
            self._logged_at = now
            self._unlogged = 0


class Bounds:
    """A channel's bound and its policy (this module's docstring)."""

    __slots__ = (
        "channel",
        "dropped_count",
        "max_bytes",
        "max_depth",
        "over_bound_count",
        "policy",
    )

    def __init__(self, channel: Held) -> None:
        self.channel = channel
        self.max_depth = 0  # queued + deferred messages; 0: unbounded
        self.max_bytes = 0  # their body bytes (about: disk counts record headers); 0: unbounded
        self.policy = "reject"  # or "drop-oldest"
        self.dropped_count = 0
        #: Messages the server had to take back (REQ, timeout, disconnect) past the bound.
        self.over_bound_count = 0

    def set(self, max_depth: int, policy: str, max_bytes: int) -> None:
        queue = self.channel.queue
        self.max_depth = max_depth
        self.max_bytes = max_bytes
        self.policy = policy
        if bool(max_bytes) != queue.track_bytes:
            queue.count_bytes(bool(max_bytes))

    @property
    def on(self) -> bool:
        return bool(self.max_depth or self.max_bytes)

    @property
    def depth(self) -> int:
        """What a bound counts: queued (memory and disk) and deferred, as /stats's depth."""
        channel = self.channel
        return channel.depth + len(channel.deferred)

    @property
    def size(self) -> int:
        """Their body bytes (the queue counts while a bytes bound applies)."""
        channel = self.channel
        return channel.queue.byte_size() + sum(m.size for m in channel.deferred.values())

    def over(self, n: int, size: int) -> str | None:
        """Why ``n`` more messages of ``size`` body bytes would not fit, or None."""
        if self.max_depth and self.depth + n > self.max_depth:
            return f"{self.depth} of {self.max_depth} messages"
        if self.max_bytes:
            held = self.size
            if held + size > self.max_bytes:
                return f"{held} of {self.max_bytes} bytes"
        return None

    def fitting(self, msgs: list[Message]) -> int:
        """How many of ``msgs``, from the first, fit under the bounds now."""
        n = len(msgs)
        if self.max_depth:
            n = min(n, max(0, self.max_depth - self.depth))
        if self.max_bytes:
            room = self.max_bytes - self.size
            for i in range(n):
                room -= msgs[i].size
                if room < 0:
                    return i
        return n

    def count_over(self, n: int) -> None:
        """Requeued messages are kept even past the bound (their publisher was told OK)."""
        if self.max_depth:
            over = min(n, self.depth - self.max_depth)
            if over > 0:
                self.over_bound_count += over

    def trim(self) -> int:
        """Policy drop-oldest: drop the messages next in line past the bounds."""
        queue = self.channel.queue
        dropped = 0
        while len(queue) and (
            (self.max_depth and self.depth > self.max_depth)
            or (self.max_bytes and self.size > self.max_bytes)
        ):
            excess = max(1, self.depth - self.max_depth) if self.max_depth else 1
            taken = queue.drop_oldest(excess)
            if not taken:
                break
            dropped += taken
        self.dropped_count += dropped
        return dropped
