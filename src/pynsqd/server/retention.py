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

Rewinds are ``server/rewind.py``'s (``Retention.rewinds``); turning retention off is refused
while one runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from ..core.dedup import Dedup
from ..core.message import Message
from ..core.replay import Conflict
from ..core.topic import Topic
from ..options import Options
from ..storage.group_sync import GroupSync
from ..storage.topiclog import (
    RETENTION_FILE,
    TopicLog,
    read_retention,
    write_retention,
)
from .rewind import Rewinds
from .workers.placement import Placement

log = logging.getLogger("pynsqd")

#: Messages moved from a log's backlog to the topic's queue per write.
MOVE_BATCH = 1024


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
        placement: Placement | None = None,
    ) -> None:
        self.opts = opts
        self.data_path = data_path
        self._on_write = on_write  # every append's outcome (nsqd's /ping health)
        self._on_error = on_error
        self._exiting = exiting
        self.logs: dict[str, TopicLog] = {}
        #: ``--workers``: which worker keeps a topic (``workers/placement.py``); one process
        #: keeps every topic.
        self.placement = placement or Placement()
        #: Copies of other nodes' partitions (replicated topics), by "topic/origin".
        self.replicas: dict[str, TopicLog] = {}
        #: The rewinds of these logs' channels (``server/rewind.py``).
        self.rewinds = Rewinds(exiting)
        #: ``--sync-every=1``: the topics' logs fsync as a group commit, off the loop
        #: (``storage/group_sync.py``); a replica's copy keeps the replication's own fsyncs.
        self.group = GroupSync() if opts.sync_every <= 1 else None

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
            tlog = self._open(key, path)  # its lines name the partition: "orders/2"
            tlog.retention_time = self.opts.retention_time
            tlog.retention_bytes = self.opts.retention_bytes
            tlog.hand_to(tlog.latest)  # a replica's channels are not fed from it
            self.replicas[key] = tlog
        return tlog

    def _open(self, name: str, directory: str | None = None) -> TopicLog:
        """The one place a ``TopicLog`` is built. Raises OSError."""
        tlog = TopicLog(
            directory or self.directory(name),
            segment_bytes=self.opts.max_bytes_per_file,
            sync_every=self.opts.sync_every,
            logger=log,
            name=name,
        )
        if not self.opts.etcd_endpoints:
            tlog.mark.vouch(tlog.latest)  # no copy to catch up with: nothing to wait for
        return tlog

    def attach(self, topic: Topic) -> None:
        """A topic was created: give it its log if it retains; if it does not but its log
        still holds a backlog, move that to its queue."""
        seconds, size = self.setting(topic.name)
        if self.placement.count > 1:  # a bound set later may move it to its keeper
            topic.on_bounds = self.bounds_changed
        self.placement.place(topic, retained=bool(seconds or size))
        if not (seconds or size) or topic.kept_by is not None:
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
        topic_log.group = self.group
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

    def bounds_changed(self, topic: Topic) -> None:
        """``--workers``: a topic's bounds changed (``Topic.on_bounds``): one that keeps no
        log is kept where its bound says (``Placement.place``)."""
        if topic.kept_by is None and not topic.bounded:
            return  # the common case, without reading the topic's retention from disk
        seconds, size = self.setting(topic.name)
        if not (seconds or size):
            self.placement.place(topic, retained=False)

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
            self.placement.place(topic, retained=False)
            return
        if self.rewinds.running_on(name):
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

    def sync(self, topics: dict[str, Topic]) -> None:
        """The ``--sync-timeout`` tick (after the channels' queues were synced): each log's
        hand-off position, its records, and retention."""
        for name, topic_log in list(self.logs.items()):
            topic = topics.get(name)
            try:
                if topic is not None:
                    topic.hand_off.save()
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


class UnavailableLog:
    """The log of a retained topic that could not be opened: publishing fails, says why."""

    earliest = latest = visible = size = segment_count = handed = 0
    committed = None

    def __init__(self, err: OSError) -> None:
        self.err = err

    def set_dedup(self, records: int, window_ns: int) -> None:
        pass

    def sync_wait(self, end: int) -> None:
        return None

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
