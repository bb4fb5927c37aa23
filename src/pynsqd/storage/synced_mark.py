"""How far a retained log was fsynced, kept beside it: a log that opens shorter lost data.

Theory of operation. A record below the end of a completed fsync is on disk; nothing a crash or
a power loss does takes it back. A log that opens with fewer records than that end was damaged
(a file cut short, a segment gone): those offsets are **lost**, and a replicated copy that lost
them must not be trusted with the commit point (``cluster/plan.py``: it does not campaign; its
leader takes it out of the in-sync set) until it has fetched them again. Without this mark, a
log cut at a record boundary looks like any log after a crash.

The mark lives in ``synced`` (``storage/position.py``'s two-slot file, a CRC on each slot) in
the log's directory. It moves up after each completed fsync (``advance``: written in place, not
fsynced, so it costs one ``pwrite`` per fsync and never runs ahead of the records: after a
power loss it is at worst older, which only hides a loss, never invents one), and down, fsynced
first, before the log itself is cut (``lower``: a replica's truncation).

An unreadable mark (both slots damaged) is logged and taken as **unknown**: the log may have
lost a tail, and nothing can tell. It never stops a node; a replicated copy counts as having
lost its tail (``cluster/partition.py``: it does not campaign) until it has caught up with a
leader, which vouches for it (``vouch``). Until then the file is left as it is (nothing is
written), so a restart in between finds it unknown again. A log with nothing to catch up with
(no cluster) is vouched for at open: there is no copy it could be compared with.
"""

from __future__ import annotations

import logging
import os

from .position import PositionFile

__all__ = ["SYNCED_FILE", "SyncedMark"]

SYNCED_FILE = "synced"


class SyncedMark:
    """The end of the last completed fsync of one log, as its file says."""

    def __init__(self, directory: str, name: str, logger: logging.Logger) -> None:
        self.path = os.path.join(directory, SYNCED_FILE)
        self.name = name
        self.log = logger
        self.value = 0
        self._file: PositionFile | None = None
        self._failing = False
        #: The file could not be read: what the last fsync covered is not known (``vouch``).
        self.unknown = False
        try:
            self._file = PositionFile(self.path)
            self.value = self._file.load() or 0
        except (OSError, ValueError) as err:
            self.unknown = True
            self.log.error(
                "TOPICLOG(%s): unreadable %s (%s); what its last fsync covered is unknown: a "
                "replicated copy counts as having lost its tail until it has caught up with "
                "its leader",
                name,
                self.path,
                err,
            )

    def opened(self, latest: int) -> None:
        """The log opened ending at ``latest``: say what it lost, if anything; the mark then
        covers what the open fsynced (never lowered here: the loss stays known until the log
        holds those offsets again)."""
        if (lost := self.lost(latest)) is not None:
            self.log.error(
                "TOPICLOG(%s): lost offsets %d-%d: the log ends before its last fsync did (a "
                "file damaged or cut short); a replicated copy fetches them again",
                self.name,
                *lost,
            )
        self.advance(latest)

    def lost(self, latest: int) -> tuple[int, int] | None:
        """The offsets (first, last) a log ending at ``latest`` lost, or None."""
        return (latest, self.value - 1) if self.value > latest else None

    def advance(self, end: int) -> None:
        """An fsync covering everything below ``end`` completed."""
        if end <= self.value:
            return
        self.value = end
        if not self.unknown:
            self._save(end, sync=False)

    def vouch(self, end: int) -> None:
        """The log holds everything below ``end`` that it should (a leader's whole log, or no
        copy to compare with): an unknown mark is known again, and written."""
        if not self.unknown:
            return
        self.unknown = False
        self.value = max(self.value, end)
        self._save(self.value, sync=False)
        self.log.info("TOPICLOG(%s): %s written again at offset %d", self.name, self.path, end)

    def hold(self, end: int) -> None:
        """The log is about to be cut below ``end`` to fetch its records again (damage): the
        mark covers at least ``end``, on disk first, so the loss stays known. Raises OSError."""
        if end <= self.value:
            return
        self.value = end
        if self._file is not None and not self.unknown:
            self._file.save(end, sync=True)

    def lower(self, end: int) -> None:
        """The log is about to be cut to ``end``: the mark first, on disk. Raises OSError."""
        if end >= self.value:
            return
        self.value = end
        if self._file is not None and not self.unknown:
            self._file.save(end, sync=True)

    def _save(self, end: int, *, sync: bool) -> None:
        if self._file is None:
            return
        try:
            self._file.save(end, sync=sync)
            self._failing = False
        except OSError as err:  # a full disk: the log goes on; the mark is a safety net
            if not self._failing:
                self._failing = True
                self.log.warning("TOPICLOG(%s): failed to write %s - %s", self.name, self.path, err)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
