"""How far a retained log has been handed to its topic's channels, kept beside it.

Theory of operation. A published message is appended to the log, then handed to the channels
(``core/handoff.py``). ``handed`` is the first offset not yet handed: it moves on the publish
path (an assignment, ``TopicLog.hand_to``), and is saved (``save``: ``storage/position.py``'s
two-slot file ``handed``, in place) once every channel has stored what it was handed. With
``--sync-every=1`` the save is fdatasync'd at once; otherwise it rides the log's next fsync,
after the records (``dup_unsynced``), so the position never runs ahead of them. After a
restart the messages from the saved position on are handed again (at least once); an
unreadable file is logged and the whole retained log is handed again. Retention never removes
a segment at or after the saved position (``saved``).
"""

from __future__ import annotations

import logging
import os

from .position import PositionFile

__all__ = ["HANDED_FILE", "HandedPosition"]

#: The first offset not yet handed to the topic's channels.
HANDED_FILE = "handed"


class HandedPosition:
    """``handed`` and its file for one log (``name`` in its lines)."""

    def __init__(self, directory: str, name: str, logger: logging.Logger, sync: bool) -> None:
        self.path = os.path.join(directory, HANDED_FILE)
        self.name = name
        self.log = logger
        #: Saves are fdatasync'd at once (``--sync-every=1``).
        self.sync_now = sync
        self.handed = 0
        #: The position as saved: retention never removes a segment at or after it.
        self.saved = -1
        self.file: PositionFile | None = None

    def load(self, earliest: int, latest: int) -> None:
        """Read the saved position (a new log: ``latest``, nothing waits), kept inside
        ``[earliest, latest]``, and save it back."""
        try:
            self.file = PositionFile(self.path)
            saved = self.file.load()
            self.handed = latest if saved is None else saved
        except (OSError, ValueError) as err:
            # Unknown: hand over everything still retained again (at least once).
            self.log.error(
                "TOPICLOG(%s): unreadable %s (%s); replaying the log", self.name, self.path, err
            )
            self.handed = earliest
        self.handed = min(max(self.handed, earliest), latest)
        self.saved = -1
        self.save()
        if self.handed < latest:
            self.log.info(
                "TOPICLOG(%s): %d messages waiting for channels (offsets %d-%d)",
                self.name,
                latest - self.handed,
                self.handed,
                latest - 1,
            )

    def save(self, position: int | None = None) -> None:
        """Persist ``handed`` (or an earlier ``position`` that every channel has stored) if it
        moved. Raises OSError."""
        position = self.handed if position is None else position
        if position != self.saved:
            if self.file is None:
                self.file = PositionFile(self.path)
            self.file.save(position, sync=self.sync_now)
            self.saved = position

    @property
    def unsynced(self) -> bool:
        return self.file is not None and self.file.unsynced

    def dup_unsynced(self) -> int | None:
        """A descriptor to fsync off the loop when a save waits for one (the caller closes)."""
        return self.file.dup_unsynced() if self.file is not None else None

    def sync(self) -> None:
        if self.file is not None:
            self.file.sync()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
