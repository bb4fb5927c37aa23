"""pynsqd: message headers (name/value pairs beside the body), negotiated in IDENTIFY.

Theory of operation. NSQ's message is a body and nothing else; Kafka has record headers
(KIP-82), NATS and Pulsar have them too, and tracing (W3C ``traceparent``) rides on them. Here a
message may carry a few headers; a client sees them only if it asked (IDENTIFY
``"headers": true``, answered ``"headers": true`` where the node has them), and every other
client sees nsqd's messages exactly: the same frames, the same bodies.

The encoding, one **block** per message, on the wire and on disk alike::

    [uint8 name length][name][uint16 value length][value]   repeated, nothing else

A name is 1-255 bytes of lowercase ASCII letters, digits and ``-_.`` (HTTP's field names,
folded: ``/pub`` takes them from request headers); a value is any bytes. A message's block is
at most ``max_bytes`` (``--max-header-bytes``, at most 65,535) and holds at most ``max_count``
pairs (``--max-headers``); a block that breaks a rule is refused whole, with the rule named.

A negotiated client sends each body of PUB, MPUB and DPUB as ``[uint16 block length][block]
[body]`` (length 0: no headers) and receives each message frame's data as ``[timestamp]
[attempts][id][uint16 block length][block][body]``. Stored messages keep the block beside the
body (``core/message.py``: the disk queues; ``protocol/log_record.py``: the retained log).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from operator import itemgetter

from .commands import Strided

__all__ = [
    "Blocks",
    "HeaderError",
    "HeaderLimits",
    "WireForm",
    "body_bytes",
    "cut",
    "decode",
    "encode",
    "split_bodies",
    "split_body",
]

_LEN = struct.Struct(">H")
_NAME = re.compile(rb"[a-z0-9][a-z0-9_.\-]*")
#: The most a block can hold: its length is a uint16.
MAX_BLOCK = 0xFFFF


class HeaderError(ValueError):
    """A header block that breaks a rule (the message says which)."""


@dataclass(frozen=True, slots=True)
class HeaderLimits:
    """``--max-headers`` and ``--max-header-bytes``."""

    max_count: int = 16
    max_bytes: int = 4096


def encode(pairs: list[tuple[str, bytes]], limits: HeaderLimits | None = None) -> bytes:
    """The block of ``pairs`` (names folded to lowercase); raises HeaderError."""
    out = bytearray()
    for name, value in pairs:
        raw = name.lower().encode("ascii", "replace")
        if not 0 < len(raw) <= 255 or not _NAME.fullmatch(raw):
            raise HeaderError(f"header name {name!r} is invalid (1-255 of a-z 0-9 - _ .)")
        if len(value) > MAX_BLOCK:
            raise HeaderError(f"header {name!r} value is {len(value)} bytes (most {MAX_BLOCK})")
        out += bytes((len(raw),)) + raw + _LEN.pack(len(value)) + value
    block = bytes(out)
    check(block, limits or HeaderLimits(max_bytes=MAX_BLOCK, max_count=MAX_BLOCK))
    return block


def decode(block: bytes | memoryview) -> list[tuple[str, bytes]]:
    """The pairs of ``block``, in order; raises HeaderError when it is not a block."""
    pairs = []
    pos, end = 0, len(block)
    while pos < end:
        n = block[pos]
        name = bytes(block[pos + 1 : pos + 1 + n])
        pos += 1 + n
        if n == 0 or len(name) < n or pos + 2 > end or not _NAME.fullmatch(name):
            raise HeaderError("a header name is invalid or cut short")
        (size,) = _LEN.unpack_from(block, pos)
        pos += 2
        if pos + size > end:
            raise HeaderError("a header value is cut short")
        pairs.append((name.decode(), bytes(block[pos : pos + size])))
        pos += size
    return pairs


#: The bytes a header name may hold (``bytes.translate`` deletes them: what is left is not).
_NAME_BYTES = b"abcdefghijklmnopqrstuvwxyz0123456789_.-"
_NOT_FIRST = frozenset(b"_.-")
#: Blocks already found valid, by their bytes (a publisher often repeats its headers): a
#: bounded set, emptied when full.
_VALID: dict[bytes, int] = {}
_VALID_KEPT = 4096


def check(block: bytes, limits: HeaderLimits) -> None:
    """Raise HeaderError unless ``block`` is a block within ``limits``: one walk over its
    length fields and names, no pairs built (this runs for every message a negotiated client
    publishes with headers)."""
    end = len(block)
    if end > limits.max_bytes:
        raise HeaderError(f"headers are {end} bytes (--max-header-bytes={limits.max_bytes})")
    count = _VALID.get(block)
    if count is None:
        pos = count = 0
        while pos < end:
            n = block[pos]
            stop = pos + 1 + n
            if n == 0 or stop + 2 > end:
                raise HeaderError("a header name is invalid or cut short")
            name = block[pos + 1 : stop]
            if name.translate(None, _NAME_BYTES) or name[0] in _NOT_FIRST:
                raise HeaderError(f"header name {name!r} is invalid (a-z 0-9 - _ .)")
            pos = stop + 2 + (block[stop] << 8 | block[stop + 1])
            count += 1
        if pos != end:
            raise HeaderError("a header value is cut short")
        if len(_VALID) >= _VALID_KEPT:
            _VALID.clear()
        _VALID[bytes(block)] = count
    if count > limits.max_count:
        raise HeaderError(f"{count} headers (--max-headers={limits.max_count})")


def split_body(data: bytes, limits: HeaderLimits) -> tuple[bytes, bytes]:
    """A negotiated client's body ``[uint16 length][block][body]`` as (block, body); raises
    HeaderError."""
    if len(data) < 2:
        raise HeaderError("a body too short for its header length")
    size = data[0] << 8 | data[1]
    if not size:
        return b"", data[2:]
    if 2 + size > len(data):
        raise HeaderError(f"a header block of {size} bytes in a body of {len(data)}")
    block = data[2 : 2 + size]
    check(block, limits)
    return block, data[2 + size :]


@dataclass(frozen=True, slots=True)
class WireForm:
    """The blocks of a publish whose bodies were kept as the client sent them: each
    ``[uint16 size][block][body]``, every block ``size`` bytes (not 0) and valid
    (``core/message.WireMessage`` keeps them so)."""

    size: int

    def split(self, wires: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """(bodies, blocks) of ``wires``."""
        n = 2 + self.size
        return [w[n:] for w in wires], [w[2:n] for w in wires]


#: A publish's header blocks: one per body, the bodies in their wire form, or None (no
#: message has headers).
Blocks = list[bytes] | WireForm | None


def cut(bodies: list[bytes], blocks: Blocks) -> tuple[list[bytes], list[bytes] | None]:
    """(bodies, blocks) of a publish, its bodies cut from their blocks where they are as
    sent (``WireForm``)."""
    if isinstance(blocks, WireForm):
        return blocks.split(bodies)
    return bodies, blocks


def body_bytes(bodies: list[bytes], blocks: Blocks) -> int:
    """The bytes of a publish's bodies, without their blocks where they are as sent
    (nsqd's ``message_bytes`` counts bodies)."""
    if isinstance(blocks, WireForm):
        return sum(map(len, bodies)) - len(bodies) * (2 + blocks.size)
    return sum(map(len, bodies))


def split_bodies(datas: list[bytes], limits: HeaderLimits) -> tuple[list[bytes], Blocks]:
    """A negotiated client's bodies of one publish (each ``[uint16 length][block][body]``) as
    (bodies, blocks); blocks None when no message has headers, a ``WireForm`` when the bodies
    are returned as they came (below). Raises HeaderError.

    The cost is the point here: a publisher that tags its messages sends one MPUB of many
    bodies whose blocks have the same names and value lengths (a ``traceparent`` of its own
    per message, say). Such blocks share their **skeleton** (the block length, and each pair's
    name length, name and value length, at the same offsets), and a block's validity depends
    on its skeleton alone (values are any bytes). So the first block is checked, and every
    body compared with its skeleton at once in C (``_shared_block_size``); when all share it,
    the bodies are not cut from their blocks at all (``WireForm``: the messages keep them as
    sent). Otherwise each distinct block is checked (``check``).
    """
    if type(datas) is Strided and datas.unblocked:  # the parser cut them past empty blocks
        return datas, None
    if len(datas) > 1 and len(datas[0]) >= 2:
        same = _shared_block_size(datas, limits)
        if same is not None:
            if not same:
                return [d[2:] for d in datas], None
            return datas, WireForm(same)
    if any(len(d) < 2 for d in datas):
        raise HeaderError("a body too short for its header length")
    sizes = [d[0] << 8 | d[1] for d in datas]
    if not any(sizes):
        return [d[2:] for d in datas], None
    for d, n in zip(datas, sizes, strict=True):
        if 2 + n > len(d):
            raise HeaderError(f"a header block of {n} bytes in a body of {len(d)}")
    blocks = [d[2 : 2 + n] for d, n in zip(datas, sizes, strict=True)]
    for block in set(blocks):
        if block:
            check(block, limits)
    return [d[2 + n :] for d, n in zip(datas, sizes, strict=True)], blocks


def _shared_block_size(datas: list[bytes], limits: HeaderLimits) -> int | None:
    """The size of the first body's block when every body has its skeleton, else None; the
    first block is checked here (HeaderError).

    The skeleton is a few **runs** of bytes at fixed offsets (``_skeleton_runs``). Bodies the
    parser cut at a stride from the MPUB as read (``Strided``: all one size) are compared a
    skeleton byte at a time across all of them, a strided slice of the input each, the
    slices joined and compared once with each skeleton byte repeated (``_repeated``); any other
    list a run at a time, each body's slice of it gathered into a set (``itemgetter``), and
    each body at least as long as the block."""
    first = datas[0]
    size = first[0] << 8 | first[1]
    if 2 + size > len(first):
        raise HeaderError(f"a header block of {size} bytes in a body of {len(first)}")
    if size:
        check(first[2 : 2 + size], limits)
    runs = _skeleton_runs(first, size)
    count = len(datas)
    if type(datas) is Strided:
        data, start, stride = datas.data, datas.start, datas.stride
        stop = start + count * stride
        want = _repeated(b"".join([run for _, run in runs]), count)
        got = b"".join(
            [data[i:stop:stride] for o, run in runs for i in range(start + o, start + o + len(run))]
        )
        return size if got == want else None
    if min(map(len, datas)) < 2 + size:
        return None
    for offset, run in runs:
        if set(map(itemgetter(slice(offset, offset + len(run))), datas)) != {run}:
            return None
    return size


#: ``_repeated``'s answers by (skeleton, count): a publisher sends one skeleton in batches of
#: one count, most often. Bounded: at most 64 answers of at most 64 KiB each (4 MiB; an MPUB's
#: answer can be as long as the MPUB), emptied when full.
_REPEATED: dict[tuple[bytes, int], bytes] = {}
_REPEATED_KEPT = 64
_REPEATED_MAX_BYTES = 64 * 1024


def _repeated(skeleton: bytes, count: int) -> bytes:
    """Each byte of ``skeleton`` repeated ``count`` times, in order: what the strided slices
    of ``count`` bodies that share it give, joined."""
    key = (skeleton, count)
    want = _REPEATED.get(key)
    if want is None:
        want = b"".join([bytes((b,)) * count for b in skeleton])
        if len(want) <= _REPEATED_MAX_BYTES:
            if len(_REPEATED) >= _REPEATED_KEPT:
                _REPEATED.clear()
            _REPEATED[key] = want
    return want


def _skeleton_runs(first: bytes, size: int) -> list[tuple[int, bytes]]:
    """The skeleton of ``first``'s block (found valid, ``size`` bytes) as (offset, bytes)
    runs: its length field with the first pair's name length, name and value length, then
    each later pair's name length, name and value length."""
    runs = []
    start, pos, end = 0, 2, 2 + size
    while pos < end:
        name_end = pos + 1 + first[pos]
        runs.append((start, first[start : name_end + 2]))
        pos = start = name_end + 2 + (first[name_end] << 8 | first[name_end + 1])
    return runs or [(0, first[:2])]


def join_body(block: bytes, body: bytes) -> bytes:
    """``[uint16 length][block][body]``: how a negotiated client sends and receives a body."""
    return _LEN.pack(len(block)) + block + body
