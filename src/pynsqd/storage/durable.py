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
#: (the process that opened it, its descriptor): opened by each process at its first fsync,
#: not at import, since ``--workers`` forks its workers from a supervisor that imported this
#: module and each child closes the descriptors that are not its own (a descriptor opened
#: at import was closed there, its number reused: the ledger's writes failed, EINVAL).
_ledger: tuple[int, int] | None = None


def _ledger_fd(path: str) -> int:
    global _ledger
    pid = os.getpid()
    if _ledger is None or _ledger[0] != pid:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        _ledger = (pid, os.open(path, flags, 0o644))
    return _ledger[1]


def fsync(fd: int) -> None:
    """``os.fsync(fd)``; raises OSError."""
    if _path is None:
        os.fsync(fd)
        return
    size = os.fstat(fd).st_size
    os.fsync(fd)
    path = os.readlink(f"/proc/self/fd/{fd}")
    os.write(_ledger_fd(_path), f"{path}\t{size}\n".encode())


def fsync_close(fd: int) -> None:
    """fsync a duplicated descriptor off the event loop, then close it."""
    try:
        fsync(fd)
    finally:
        os.close(fd)
