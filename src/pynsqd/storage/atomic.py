"""Atomic file replacement, as nsqd and go-diskqueue do it: ``<file>.<rand>.tmp``, fsync, rename."""

from __future__ import annotations

import contextlib
import os
import random
import re

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: What ``write_atomic`` names its temporary file: ``<file>.<random>.tmp``.
_TMP = re.compile(r"^.+\.\d{1,19}\.tmp$")


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never a mix.

    Raises OSError (and leaves no tmp file behind) if the data could not be written.
    """
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def remove_leftovers(directory: str) -> list[str]:
    """Remove the temporary files a crash in the middle of ``write_atomic`` left in
    ``directory`` (the file they were to replace is whole: old or new). Returns their paths."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(directory):
            if _TMP.match(entry):
                path = os.path.join(directory, entry)
                with contextlib.suppress(OSError):
                    os.remove(path)
                    removed.append(path)
    return removed
