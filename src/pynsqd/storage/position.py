"""A position kept across crashes, rewritten in place: a retained log's hand-off point.

Theory of operation. The value is saved often (once per loop turn that moved it), so it is not
written to a new file and renamed, which costs a file creation and leaves a temporary file
behind when the process dies mid-way. The file holds two slots, 512 bytes apart (two disk
sectors), each ``magic, sequence, value, crc32``; a save writes the slot the next sequence
number picks, so the slot holding the last good value is never the one being overwritten. A
load takes the valid slot with the higher sequence: a torn write (power loss mid-sector) costs
the newest value, never both. Overwriting blocks already allocated needs no free space, so a
full disk does not stop the position from moving.

A file holding decimal text is read as the value too (the format before this one); the next
save rewrites it in slots.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import zlib

__all__ = ["PositionFile"]

_SLOT = struct.Struct(">4sQqI")  # magic, sequence, value, crc32 of the bytes before it
_MAGIC = b"POS1"
_SLOT_SPACING = 512
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class PositionFile:
    """One int64 in ``path``: ``load`` it, ``save`` it in place, ``sync`` it to disk."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
        self._seq = 0
        self._unsynced = False

    def load(self) -> int | None:
        """The last saved value; None for a new (empty) file. Raises ValueError when the file
        holds no readable value, OSError when it cannot be read."""
        data = os.pread(self._fd, _SLOT_SPACING + _SLOT.size, 0)
        if not data:
            return None
        text = data.strip()
        if text.isdigit() and len(text) <= 19:
            return int(text)  # the decimal text of the earlier format
        best: tuple[int, int] | None = None
        for pos in (0, _SLOT_SPACING):
            raw = data[pos : pos + _SLOT.size]
            if len(raw) < _SLOT.size:
                continue
            magic, seq, value, crc = _SLOT.unpack(raw)
            if magic != _MAGIC or zlib.crc32(raw[:-4]) != crc:
                continue
            if best is None or seq > best[0]:
                best = (seq, value)
        if best is None:
            raise ValueError(f"{self.path} holds no readable position")
        self._seq = best[0]
        return best[1]

    def save(self, value: int, *, sync: bool) -> None:
        """Write ``value`` into the slot not holding the newest one; with ``sync``, fdatasync
        before returning. Raises OSError."""
        seq = self._seq + 1
        head = _SLOT.pack(_MAGIC, seq, value, 0)[:-4]
        record = head + struct.pack(">I", zlib.crc32(head))
        written = os.pwrite(self._fd, record, (seq % 2) * _SLOT_SPACING)
        if written != len(record):
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (short write to {self.path})")
        self._seq = seq
        self._unsynced = True
        if sync:
            self.sync()

    def sync(self) -> None:
        if self._unsynced:
            os.fdatasync(self._fd)
            self._unsynced = False

    @property
    def unsynced(self) -> bool:
        return self._unsynced

    def dup_unsynced(self) -> int | None:
        """A duplicate descriptor for another thread to fsync (and close), if a save has not
        been synced yet; the save then counts as synced here."""
        if not self._unsynced:
            return None
        self._unsynced = False
        return os.dup(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                self.sync()
            os.close(self._fd)
            self._fd = -1
