"""A replica's epoch history: which leader epoch wrote which offsets (Kafka's KIP-101).

Theory of operation. Each entry is ``(epoch, start offset)``: from ``start`` on, the records came
from the leader of ``epoch``, until the next entry's start. A leader adds an entry when it is
elected; a follower copies the leader's entries that cover what it has fetched. When a follower
starts to follow a new leader it sends its last epoch; the leader answers where that epoch ended
in its own history (``end_for``), and the follower truncates what lies beyond: records a former
leader appended that were never committed, and that the current leader does not have (or holds
different ones at those offsets). The file ``epochs`` is JSON with a CRC-32 of its entries
(``{"entries": [...], "crc": n}``; a file written before, the bare list, is read as it is),
replaced atomically on change (leadership changes only: rare).

A damaged file (it does not parse, or its CRC does not match) is set aside as
``epochs.damaged``, with one line: the history starts empty and ``damaged`` says why. A copy
without its history cannot tell which of its records a leader would keep, so it counts as
having lost its log (``cluster/plan.py`` never lets it campaign): following a leader it asks
from epoch 0, is told to truncate, and fetches everything again; the leader's history it then
copies is its own again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import zlib
from typing import Any

from ..log import LOGGER_NAME
from .atomic import write_atomic

__all__ = ["EPOCHS_FILE", "EpochHistory"]

log = logging.getLogger(LOGGER_NAME)

EPOCHS_FILE = "epochs"


def _crc(entries: list[tuple[int, int]]) -> int:
    return zlib.crc32(json.dumps(entries).encode())


def decode(raw: bytes) -> list[tuple[int, int]]:
    """The entries of an ``epochs`` file. Raises ValueError (or TypeError) when it is damaged."""
    doc: Any = json.loads(raw)
    if isinstance(doc, list):  # written before the CRC
        return [(int(e), int(s)) for e, s in doc]
    entries = [(int(e), int(s)) for e, s in doc["entries"]]
    if doc["crc"] != _crc(entries):
        raise ValueError("its CRC does not match")
    return entries


class EpochHistory:
    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, EPOCHS_FILE)
        self.entries: list[tuple[int, int]] = []
        #: Why the file was set aside as damaged ("": it was not).
        self.damaged = ""
        try:
            with open(self.path, "rb") as f:
                self.entries = decode(f.read())
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError) as err:
            self.damaged = str(err) or type(err).__name__
            log.error(
                "%s is damaged (%s); set aside as %s.damaged: this copy does not lead, and "
                "fetches its log again from the leader",
                self.path,
                self.damaged,
                self.path,
            )
            with contextlib.suppress(OSError):
                os.replace(self.path, self.path + ".damaged")

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def _save(self) -> None:
        doc = {"entries": self.entries, "crc": _crc(self.entries)}
        write_atomic(self.path, json.dumps(doc).encode())

    def begin(self, epoch: int, start: int) -> None:
        """This node leads from ``start`` at ``epoch``. Raises OSError."""
        if self.entries and self.entries[-1][0] >= epoch:
            return
        self.entries.append((epoch, start))
        self._save()

    def copy_from(self, leader: list[tuple[int, int]], end: int) -> None:
        """A follower holding offsets below ``end`` takes the leader's entries that cover them."""
        mine = [(e, s) for e, s in leader if s < end]
        if mine and (mine != self.entries or self.damaged):
            self.entries = mine
            self._save()
            self.damaged = ""  # the leader's history, for what this copy fetched from it

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
