"""fsync, and the power-loss tests' record of what each fsync made durable.

Every fsync of a retained log's files goes through ``fsync`` here. With the environment variable
``PYNSQD_FSYNC_LEDGER`` set (tests only), each one also appends ``<path>\\t<size>`` to that file:
the file's size when the fsync started (the end of its records, for a file with zeros
written ahead: ``note_end``), which is what a power loss cannot take back. The
power-loss harness kills every node, truncates each segment to its last recorded size (what
losing the page cache does to an append-only file; LazyFS's model), and starts them again.
Without the variable the hook costs one ``is None`` check per fsync.
"""

from __future__ import annotations

import os

__all__ = ["LEDGER", "LEDGER_ENV", "fsync", "fsync_close", "note_end"]

LEDGER_ENV = "PYNSQD_FSYNC_LEDGER"
_path = os.environ.get(LEDGER_ENV)
_ledger: int | None = (
    os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644) if _path else None
)


#: Whether the ledger is kept (``note_end`` is then worth calling).
LEDGER = _ledger is not None
#: (device, inode) -> the end of the records in a file whose zeros run ahead of them
#: (``TopicLog.preallocate``): what the ledger records for it instead of the file's size.
_ends: dict[tuple[int, int], int] = {}


def note_end(fd: int, end: int) -> None:
    """Tell the ledger where the records of ``fd``'s file end (tests only; else a no-op)."""
    if _ledger is not None:
        st = os.fstat(fd)
        _ends[(st.st_dev, st.st_ino)] = end


def fsync(fd: int) -> None:
    """``os.fdatasync(fd)``: the data and what reading it back needs (the file's size), not
    its times; raises OSError."""
    if _ledger is None:
        os.fdatasync(fd)
        return
    st = os.fstat(fd)
    size = _ends.get((st.st_dev, st.st_ino), st.st_size)
    os.fdatasync(fd)
    path = os.readlink(f"/proc/self/fd/{fd}")
    os.write(_ledger, f"{path}\t{size}\n".encode())


def fsync_close(fd: int) -> None:
    """fsync a duplicated descriptor off the event loop, then close it."""
    try:
        fsync(fd)
    finally:
        os.close(fd)
