"""Which storage a data directory is: a random id kept in the directory itself.

A node is known by it rather than by how it is reached (an address changes, several names reach
one node) or by ``--node-id`` (whose default, a hash of the hostname, is the same for every node
on one host): the Spark connector keys a query's log offsets by it, and the cluster tells a node
back with an empty disk (a new id) from one that kept its data (the same id). Copying a data
directory copies its id: two processes answering with one id are refused where it matters.

Theory of operation. The id is written twice, ``cluster.id`` and ``cluster.id.copy``, each as
two lines: the id and its CRC-32 (a file written before had the id alone, read as it is and
written again with its CRC). A damaged file (a flipped bit, a torn write, bytes that are not an
id: they would end in HTTP headers) is repaired from the other copy, with one line saying so.
When neither copy holds an id the directory gets a new one, and the line names what that means
(its replicated copies are fetched again; Spark queries read its log as a new node's) and how
to keep the old one. The damaged file is kept beside, renamed ``<name>.damaged``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import zlib

from ..log import LOGGER_NAME
from .atomic import write_atomic

__all__ = ["STORAGE_ID_FILE", "storage_id"]

log = logging.getLogger(LOGGER_NAME)

#: The file naming this data directory's storage (its name predates its use outside clusters).
STORAGE_ID_FILE = "cluster.id"
#: Its second copy.
COPY_SUFFIX = ".copy"
#: What an id may be: ours are 16 hex digits; any short token of these characters is kept.
_ID = re.compile(r"[0-9A-Za-z_.-]{1,64}")


def _crc(value: str) -> str:
    return f"{zlib.crc32(value.encode()):08x}"


def _encode(value: str) -> bytes:
    return f"{value}\n{_crc(value)}\n".encode()


def parse(raw: bytes) -> tuple[str | None, str, bool]:
    """The id a file holds (or None and why not), and whether its checksum vouches for it (an
    old file, the id alone, does not)."""
    try:
        lines = raw.decode("ascii").split("\n")
    except UnicodeDecodeError:
        return None, "not text", False
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.strip() for line in lines]
    if not lines or not _ID.fullmatch(lines[0]):
        return None, "not an id", False
    if len(lines) == 1:
        return lines[0], "", False
    if len(lines) != 2 or lines[1] != _crc(lines[0]):
        return None, "its checksum does not match", False
    return lines[0], "", True


class _File:
    def __init__(self, path: str) -> None:
        self.path = path
        self.raw: bytes | None = None
        try:
            with open(path, "rb") as f:
                self.raw = f.read(4096)
        except FileNotFoundError:
            pass
        self.value, self.why, self.verified = (
            parse(self.raw) if self.raw is not None else (None, "missing", False)
        )

    def holds(self, value: str) -> bool:
        return self.raw == _encode(value)

    def set_aside(self) -> None:
        """Kept beside, for whoever looks into it."""
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path + ".damaged")


def storage_id(data_path: str) -> str:
    """The directory's storage id, made (crash-safely) the first time it is asked for, and
    repaired from its second copy when one file is damaged. Raises OSError when it cannot be
    written."""
    main = _File(os.path.join(data_path, STORAGE_ID_FILE))
    copy = _File(main.path + COPY_SUFFIX)
    # A copy its checksum vouches for first, then an old file's id as it is.
    ranked = sorted((f for f in (main, copy) if f.value is not None), key=lambda f: not f.verified)
    if ranked:
        value = ranked[0].value
        assert value is not None
        for f, other in ((main, copy), (copy, main)):
            if f.holds(value):
                continue
            if f.raw is not None and f.value != value:
                log.warning(
                    "%s was damaged (%s); written again from %s",
                    f.path,
                    f.why or "another id",
                    other.path,
                )
                f.set_aside()
            write_atomic(f.path, _encode(value))
        return value
    value = secrets.token_hex(8)
    damaged = [f for f in (main, copy) if f.raw is not None]
    if damaged:
        log.error(
            "%s is damaged (%s) and has no good copy: this data directory is now storage %s "
            "(its replicated copies are fetched again from their leaders; Spark queries read "
            "its log as a new node's). To keep the old id, stop nsqd, write it into %s (it is "
            "in etcd's nodes/<node-id> record, and in /info of the node before) and remove %s",
            damaged[0].path,
            damaged[0].why,
            value,
            main.path,
            copy.path,
        )
        for f in damaged:
            f.set_aside()
    write_atomic(main.path, _encode(value))
    write_atomic(copy.path, _encode(value))
    return value
