"""fsync, and the power-loss tests' record of what each fsync made durable.

Every fsync of a retained log's files goes through ``fsync`` here. With the environment variable
``PYNSQD_FSYNC_LEDGER`` set (tests only), each one also appends ``<path>\\t<size>`` to that file:
the file's size when the fsync started, which is what a power loss cannot take back. The
power-loss harness kills every node, truncates each segment to its last recorded size (what
losing the page cache does to an append-only file; LazyFS's model), and starts them again.
Without the variable the hook costs one ``is None`` check per fsync.
"""

from __future__ import annotations

import os

__all__ = ["LEDGER_ENV", "fsync", "fsync_close"]

LEDGER_ENV = "PYNSQD_FSYNC_LEDGER"
_path = os.environ.get(LEDGER_ENV)
_ledger: int | None = (
    os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644) if _path else None
)


def fsync(fd: int) -> None:
    """``os.fsync(fd)``; raises OSError."""
    if _ledger is None:
        os.fsync(fd)
        return
    size = os.fstat(fd).st_size
    os.fsync(fd)
    path = os.readlink(f"/proc/self/fd/{fd}")
    os.write(_ledger, f"{path}\t{size}\n".encode())


def fsync_close(fd: int) -> None:
    """fsync a duplicated descriptor off the event loop, then close it."""
    try:
        fsync(fd)
    finally:
        os.close(fd)
