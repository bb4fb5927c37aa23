"""A replica's epoch history: which leader epoch wrote which offsets (Kafka's KIP-101).

Theory of operation. Each entry is ``(epoch, start offset)``: from ``start`` on, the records came
from the leader of ``epoch``, until the next entry's start. A leader adds an entry when it is
elected; a follower copies the leader's entries that cover what it has fetched. When a follower
starts to follow a new leader it sends its last epoch; the leader answers where that epoch ended
in its own history (``end_for``), and the follower truncates what lies beyond: records a former
leader appended that were never committed, and that the current leader does not have (or holds
different ones at those offsets). The file ``epochs`` is JSON, replaced atomically on change
(leadership changes only: rare).
"""

from __future__ import annotations

import json
import os

from .atomic import write_atomic

__all__ = ["EPOCHS_FILE", "EpochHistory"]

EPOCHS_FILE = "epochs"


class EpochHistory:
    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, EPOCHS_FILE)
        self.entries: list[tuple[int, int]] = []
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
            self.entries = [(int(e), int(s)) for e, s in doc]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"unreadable {self.path} - {err}") from err

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def _save(self) -> None:
        write_atomic(self.path, json.dumps(self.entries).encode())

    def begin(self, epoch: int, start: int) -> None:
        """This node leads from ``start`` at ``epoch``. Raises OSError."""
        if self.entries and self.entries[-1][0] >= epoch:
            return
        self.entries.append((epoch, start))
        self._save()

    def copy_from(self, leader: list[tuple[int, int]], end: int) -> None:
        """A follower holding offsets below ``end`` takes the leader's entries that cover them."""
        mine = [(e, s) for e, s in leader if s < end]
        if mine and mine != self.entries:
            self.entries = mine
            self._save()

    def end_for(self, epoch: int, latest: int) -> int:
        """Where records of ``epoch`` (or the last epoch before it this history knows) end: the
        start of the next entry, or ``latest``; 0 when every entry is later."""
        found = -1
        for i, (e, _) in enumerate(self.entries):
            if e <= epoch:
                found = i
        if found < 0:
            return 0 if self.entries else latest
        if found + 1 < len(self.entries):
            return self.entries[found + 1][1]
        return latest

    def truncate(self, end: int) -> None:
        """The log was cut to ``end``: entries that start beyond it go."""
        kept = [(e, s) for e, s in self.entries if s <= end]
        if kept != self.entries:
            self.entries = kept
            self._save()
