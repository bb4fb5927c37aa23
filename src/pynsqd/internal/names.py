"""Topic and channel name rules (nsqd internal/protocol/names.go)."""

from __future__ import annotations

import hashlib
import re

# fullmatch, not "^...$": Python's "$" also matches before a trailing newline, Go's does not.
_valid = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?").fullmatch
EPHEMERAL_SUFFIX = "#ephemeral"


def is_valid_name(name: bytes | str) -> bool:
    """True for 1..64 characters of ``[.a-zA-Z0-9_-]`` with an optional ``#ephemeral`` suffix."""
    raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name
    # The length limit includes the suffix, as in nsqd.
    return 0 < len(raw) <= 64 and _valid(raw) is not None


_producer = re.compile(rb"[A-Za-z0-9._:-]{1,128}").fullmatch


def is_valid_producer(producer: bytes) -> bool:
    """An idempotent publisher's id (``core/dedup.py``): 1-128 of A-Z a-z 0-9 . _ : -"""
    return _producer(producer) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)


def default_dead_letter(topic: str) -> str:
    """``<topic>.dead``, always a valid, durable topic name: without ``#ephemeral`` (a
    dead-letter topic that vanishes with its last channel would lose what it keeps), and if
    that passes 64 characters, the first 50 of the topic, ``-``, 8 hex digits of its SHA-1
    (distinct topics keep distinct dead-letter topics) and ``.dead``."""
    base = topic.removesuffix(EPHEMERAL_SUFFIX)
    if len(base) + 5 <= 64:
        return base + ".dead"
    digest = hashlib.sha1(topic.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{base[:50]}-{digest}.dead"


#: The characters Go's ``%q`` writes as a backslash escape.
_GO_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def go_quote(raw: bytes) -> str:
    """Quote bytes the way Go's ``%q`` does for a byte slice converted to string.

    Error texts such as ``E_BAD_TOPIC PUB topic name "a b" is not valid`` must match nsqd byte
    for byte, including its escapes for control characters and invalid UTF-8.
    """
    out = ['"']
    text = raw.decode("utf-8", "surrogateescape")
    for ch in text:
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:  # an undecodable byte, carried by surrogateescape
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif cp < 0x80:
            out.append(f"\\x{cp:02x}")
        elif cp <= 0xFFFF:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)
