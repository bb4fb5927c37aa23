"""nsqd's metadata file ``<data-path>/nsqd.dat`` and the data directory lock.

The file is nsqd 1.3.0's JSON, byte for byte in layout::

    {"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":false}]}],"version":"1.3.0"}

``channels`` is ``null`` for a topic without channels. It is written to ``nsqd.dat.<rand>.tmp``,
fsynced and renamed over ``nsqd.dat`` (then the directory is fsynced, which nsqd leaves as a TODO).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..internal import jsonbound
from .atomic import write_atomic

__all__ = [
    "METADATA_FILE",
    "ChannelMeta",
    "DirLock",
    "DirLockError",
    "MetadataWriter",
    "TopicMeta",
    "check_writable",
    "encode_metadata",
    "read_metadata",
    "write_metadata",
]

METADATA_FILE = "nsqd.dat"
VERSION = "1.3.0"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass
class ChannelMeta:
    name: str
    paused: bool = False


@dataclass
class TopicMeta:
    name: str
    paused: bool = False
    channels: list[ChannelMeta] = field(default_factory=list)


def encode_metadata(topics: list[TopicMeta]) -> bytes:
    doc = {
        "topics": [
            {
                "name": t.name,
                "paused": t.paused,
                "channels": [{"name": c.name, "paused": c.paused} for c in t.channels]
                if t.channels
                else None,
            }
            for t in topics
        ],
        "version": VERSION,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def read_metadata(data_path: str) -> list[TopicMeta] | None:
    """The topics of ``nsqd.dat``; None when there is no file. Raises ValueError if unreadable.

    Entries of the wrong shape are left out here; names are checked by the caller.
    """
    fn = os.path.join(data_path, METADATA_FILE)
    try:
        with open(fn, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"failed to read {fn} - {exc}") from exc
    try:
        doc = jsonbound.loads(data)
    except ValueError as exc:
        raise ValueError(f"failed to parse metadata in {fn} - {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"failed to parse metadata in {fn} - not a JSON object")
    topics: list[TopicMeta] = []
    for t in doc.get("topics") or []:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            continue
        channels = [
            ChannelMeta(c["name"], bool(c.get("paused")))
            for c in t.get("channels") or []
            if isinstance(c, dict) and isinstance(c.get("name"), str)
        ]
        topics.append(TopicMeta(t["name"], bool(t.get("paused")), channels))
    return topics


_QUEUE_META = re.compile(r"^(?P<name>[^/]+)\.diskqueue\.meta\.dat$")


def recover_metadata(data_path: str) -> list[TopicMeta]:
    """The topics and channels whose disk queues are in ``data_path`` (paused flags unknown).

    For an unreadable ``nsqd.dat``: nsqd refuses to start; we rebuild the list from
    ``<topic>.diskqueue.meta.dat`` and ``<topic>:<channel>.diskqueue.meta.dat`` so that every
    message on disk is served again.
    """
    topics: dict[str, TopicMeta] = {}
    for entry in sorted(os.listdir(data_path)):
        m = _QUEUE_META.match(entry)
        if m is None:
            continue
        topic, _, channel = m.group("name").partition(":")
        meta = topics.setdefault(topic, TopicMeta(topic, False, []))
        if channel:
            meta.channels.append(ChannelMeta(channel, False))
    return list(topics.values())


def write_metadata(data_path: str, topics: list[TopicMeta]) -> None:
    """Write ``nsqd.dat`` atomically: tmp file, fsync, rename, fsync of the directory."""
    write_atomic(os.path.join(data_path, METADATA_FILE), encode_metadata(topics))
    _fsync_dir(data_path)


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class DirLockError(Exception):
    pass


def check_writable(path: str) -> None:
    """nsqd cannot keep anything in a data path it cannot write: refuse to start, naming it."""
    probe = os.path.join(path, f".pynsqd-write-check.{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise DirLockError(f"data path {path} is not writable - {exc.strerror or exc}") from exc


class DirLock:
    """An exclusive ``flock`` on the data directory, as nsqd's ``internal/dirlock``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def lock(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | _O_CLOEXEC)
        except OSError as exc:
            raise DirLockError(f"cannot open directory {self.path} - {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise DirLockError(
                f"cannot flock directory {self.path} (possibly in use by another instance of nsqd)"
            ) from exc
        self._fd = fd

    def unlock(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> DirLock:
        self.lock()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unlock()


class MetadataWriter:
    """Writes ``nsqd.dat`` for nsqd: now (pause, delete, exit) or soon (create), off the loop.

    Creating a thousand topics must not write the file a thousand times with an fsync each:
    ``write_soon`` waits ``delay`` seconds for more changes, then writes one snapshot on a
    thread of its own, so the event loop never waits for the disk. nsqd, too, persists new
    topics and channels asynchronously. Snapshots are numbered; an older one never overwrites a
    newer one, whichever thread gets to the file first.
    """

    def __init__(self, data_path: str, log: logging.Logger) -> None:
        self.data_path = data_path
        self._log = log
        self._lock = threading.Lock()  # one writer of the file at a time
        self._seq = 0  # the newest snapshot taken
        self._written = 0  # the newest snapshot on disk (guarded by _lock)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: concurrent.futures.Future[None] | None = None

    def write_now(self, topics: list[TopicMeta]) -> None:
        """Write this snapshot before returning; an ``OSError`` is logged."""
        self._seq += 1
        self._write(self._seq, topics)

    def write_soon(
        self,
        snapshot: Callable[[], list[TopicMeta] | None],
        call_later: Callable[[float, Callable[[], None]], object],
        delay: float,
    ) -> None:
        """Call ``snapshot`` (on the caller's thread) ``delay`` seconds from now and write it in
        the background; calls until then share that write. A None snapshot writes nothing."""
        if self._pending is not None:
            return
        self._pending = concurrent.futures.Future()

        def take() -> None:
            self._pending = None
            topics = snapshot()
            if topics is None:
                return
            self._seq += 1
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="nsqd-metadata"
                )
            self._executor.submit(self._write, self._seq, topics)

        call_later(delay, take)

    def close(self) -> None:
        """Wait for a background write under way (a pending one is dropped: write_now follows)."""
        self._pending = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _write(self, seq: int, topics: list[TopicMeta]) -> None:
        with self._lock:
            if seq < self._written:
                return  # a newer snapshot is already on disk
            try:
                write_metadata(self.data_path, topics)
            except OSError as err:
                self._log.error("NSQ: failed to persist metadata - %s", err)
                return
            self._written = seq
            self._log.debug("NSQ: persisted metadata of %d topic(s)", len(topics))
