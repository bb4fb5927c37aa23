"""nsqlookupd's TCP protocol V1, sans-IO: bytes in, commands out; and the client side nsqd uses.

Theory of operation. A connection starts with the 4-byte magic ``"  V1"``; anything else is
answered ``E_BAD_PROTOCOL``. Then commands are lines read up to ``\\n``, trimmed as Go's
``strings.TrimSpace`` trims them and split on single spaces (``lookup_protocol_v1.go``).
``IDENTIFY`` is followed by ``[int32 size][JSON]``. Every response is ``[int32 size][data]``
with no frame type, and **every error is fatal**: the server sends ``"<CODE> <desc>"`` and
closes. ``V1Parser`` checks everything nsqlookupd checks (the command, the arguments, the names,
the IDENTIFY body, that IDENTIFY came first) and hands out only valid commands, so the asyncio
shell is left with the registration DB. The parser never touches a socket and raises only
``FatalClientError``.

Where nsqlookupd has no limit we set one: a command line longer than ``max_line_length`` and
an IDENTIFY body larger than ``max_body_size`` (or with a negative size, which makes Go's
nsqlookupd panic) are refused with the same error codes instead of buffering without bound.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..internal.gotext import go_json
from ..internal.names import is_valid_name
from .errors import FatalClientError
from .identify import GoObject, go_json_loads, go_key, go_string

MAGIC_V1 = b"  V1"
_SIZE = struct.Struct(">l")
#: nsqd's lookup peers and nsqd's V2 reader use 16 KiB; a REGISTER line is far shorter.
MAX_LINE_LENGTH = 16 * 1024
#: nsqlookupd reads any IDENTIFY size; a real one is a few hundred bytes.
MAX_IDENTIFY_BODY = 1024 * 1024

#: Go's ``unicode.IsSpace``, which ``strings.TrimSpace`` strips from both ends.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)


# -- commands -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Identify:
    """The producer's IDENTIFY body, decoded as Go decodes it into nsqlookupd's ``PeerInfo``."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str = ""
    topology_zone: str = ""
    topology_region: str = ""


@dataclass(frozen=True, slots=True)
class Register:
    topic: str
    channel: str  # "" for a topic registration


@dataclass(frozen=True, slots=True)
class Unregister:
    topic: str
    channel: str  # "": the topic and all of its channels


Command = Ping | Identify | Register | Unregister


def _error(code: str, desc: str) -> FatalClientError:
    return FatalClientError(code, desc)


def go_trim_space(line: bytes) -> str:
    """``strings.TrimSpace`` on raw bytes; undecodable bytes survive (surrogateescape)."""
    return line.decode("utf-8", "surrogateescape").strip(_GO_SPACE)


# -- IDENTIFY body --------------------------------------------------------------------------------

# PeerInfo's JSON fields (Go matches keys case-insensitively; ``remote_address`` is decoded and
# then overwritten with the connection's address).
_PEER_FIELDS: dict[str, str] = {
    "remote_address": "str",
    "hostname": "str",
    "broadcast_address": "str",
    "tcp_port": "int",
    "http_port": "int",
    "version": "str",
    "topology_zone": "str",
    "topology_region": "str",
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _decode_failed() -> FatalClientError:
    return _error("E_BAD_BODY", "IDENTIFY failed to decode JSON body")


def parse_identify_body(body: bytes) -> Identify:
    """``json.Unmarshal`` into ``PeerInfo`` plus nsqlookupd's required-field check."""
    try:
        doc = go_json_loads(body)
    except ValueError:
        raise _decode_failed() from None
    fields: dict[str, Any] = {}
    if doc is not None:
        if not isinstance(doc, GoObject):
            raise _decode_failed()
        for key, value in doc:
            name = go_key(key)
            kind = _PEER_FIELDS.get(name)
            if kind is None or value is None:
                continue
            if kind == "str":
                if not isinstance(value, str):
                    raise _decode_failed()
                value = go_string(value)
            elif not (
                isinstance(value, int)
                and not isinstance(value, bool)
                and _INT64_MIN <= value <= _INT64_MAX
            ):
                raise _decode_failed()
            fields[name] = value
    ident = Identify(
        broadcast_address=fields.get("broadcast_address", ""),
        tcp_port=fields.get("tcp_port", 0),
        http_port=fields.get("http_port", 0),
        version=fields.get("version", ""),
        hostname=fields.get("hostname", ""),
        topology_zone=fields.get("topology_zone", ""),
        topology_region=fields.get("topology_region", ""),
    )
    if not ident.broadcast_address or not ident.tcp_port or not ident.http_port:
        raise _error("E_BAD_BODY", "IDENTIFY missing fields")
    if not ident.version:
        raise _error("E_BAD_BODY", "IDENTIFY missing fields")
    return ident


def _topic_channel(command: str, params: list[str]) -> tuple[str, str]:
    """nsqlookupd's ``getTopicChan``: note the single quotes, unlike nsqd's ``%q``."""
    if not params:
        raise _error("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_name(topic):
        raise _error("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel and not is_valid_name(channel):
        raise _error("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
    return topic, channel


# -- the server-side parser -----------------------------------------------------------------------


class V1Parser:
    """Feed bytes with ``feed``; take commands with ``next_command`` until it returns None.

    ``next_command`` raises ``FatalClientError`` (the error to send before closing). After
    ``feed_eof`` a half-read IDENTIFY body raises the error nsqlookupd sends on a short read; a
    half-read line is dropped, as Go's ``ReadString`` drops it.
    """

    def __init__(
        self, *, max_line_length: int = MAX_LINE_LENGTH, max_body_size: int = MAX_IDENTIFY_BODY
    ) -> None:
        self.max_line_length = max_line_length
        self.max_body_size = max_body_size
        self._buf = bytearray()
        self._search = 0  # where to resume looking for "\n"
        self._magic_ok = False
        self._in_identify = False  # the IDENTIFY line was read; its body comes next
        self._body_size = -1
        self._identified = False
        self._eof = False
        self._failed: FatalClientError | None = None

    @property
    def identified(self) -> bool:
        return self._identified

    def feed(self, data: bytes) -> None:
        if not self._eof:
            self._buf += data

    def feed_eof(self) -> None:
        self._eof = True

    def next_command(self) -> Command | None:
        if self._failed is not None:
            raise self._failed
        try:
            return self._next()
        except FatalClientError as err:
            self._failed = err
            self._buf.clear()
            raise

    def _next(self) -> Command | None:
        buf = self._buf
        if not self._magic_ok:
            if len(buf) < 4:
                return None
            if bytes(buf[:4]) != MAGIC_V1:
                raise _error("E_BAD_PROTOCOL", "")
            del buf[:4]
            self._magic_ok = True
        if self._in_identify:
            return self._identify_body()
        end = buf.find(b"\n", self._search)
        if end < 0:
            if len(buf) > self.max_line_length:
                raise _error("E_INVALID", f"command line longer than {self.max_line_length} bytes")
            self._search = len(buf)
            return None
        line = bytes(buf[:end])
        del buf[: end + 1]
        self._search = 0
        if len(line) > self.max_line_length:
            raise _error("E_INVALID", f"command line longer than {self.max_line_length} bytes")
        params = go_trim_space(line).split(" ")
        name = params[0]
        if name == "PING":
            return Ping()
        if name == "IDENTIFY":
            if self._identified:
                raise _error("E_INVALID", "cannot IDENTIFY again")
            self._in_identify = True
            return self._identify_body()
        if name in ("REGISTER", "UNREGISTER"):
            if not self._identified:
                raise _error("E_INVALID", "client must IDENTIFY")
            topic, channel = _topic_channel(name, params[1:])
            return Register(topic, channel) if name == "REGISTER" else Unregister(topic, channel)
        raise _error("E_INVALID", f"invalid command {name}")

    def _identify_body(self) -> Identify | None:
        buf = self._buf
        if self._body_size < 0:
            if len(buf) < 4:
                if self._eof:
                    raise _error("E_BAD_BODY", "IDENTIFY failed to read body size")
                return None
            (size,) = _SIZE.unpack_from(buf)
            if size < 0 or size > self.max_body_size:
                raise _error("E_BAD_BODY", "IDENTIFY failed to read body")
            del buf[:4]
            self._body_size = size
        if len(buf) < self._body_size:
            if self._eof:
                raise _error("E_BAD_BODY", "IDENTIFY failed to read body")
            return None
        body = bytes(buf[: self._body_size])
        del buf[: self._body_size]
        self._body_size = -1
        self._in_identify = False
        ident = parse_identify_body(body)
        self._identified = True
        return ident


def encode_response(data: bytes) -> bytes:
    """``protocol.SendResponse``: ``[int32 size][data]``, no frame type."""
    return _SIZE.pack(len(data)) + data


# -- the client side (nsqd registering) -----------------------------------------------------------


def encode_identify(data: dict[str, Any]) -> bytes:
    """go-nsq's ``Identify(js)``: ``IDENTIFY\\n[int32 size][JSON]``."""
    body = go_json(data, sort_keys=True)  # a Go map
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def encode_register(topic: str, channel: str = "") -> bytes:
    """go-nsq's ``Register``: the channel is left out when empty."""
    return f"REGISTER {topic} {channel}\n".encode() if channel else f"REGISTER {topic}\n".encode()


def encode_unregister(topic: str, channel: str = "") -> bytes:
    if channel:
        return f"UNREGISTER {topic} {channel}\n".encode()
    return f"UNREGISTER {topic}\n".encode()


PING = b"PING\n"


class ResponseReader:
    """Reads ``[int32 size][data]`` responses, as nsqd's ``readResponseBounded``: a size above
    ``max_size`` (or negative) raises ``ValueError``."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def responses(self) -> list[bytes]:
        out: list[bytes] = []
        buf = self._buf
        while len(buf) >= 4:
            (size,) = _SIZE.unpack_from(buf)
            if size < 0 or size > self.max_size:
                raise ValueError(f"response body size ({size}) is greater than limit")
            if len(buf) < 4 + size:
                break
            out.append(bytes(buf[4 : 4 + size]))
            del buf[: 4 + size]
        return out


__all__ = [
    "MAGIC_V1",
    "PING",
    "Command",
    "Identify",
    "Ping",
    "Register",
    "ResponseReader",
    "Unregister",
    "V1Parser",
    "encode_identify",
    "encode_register",
    "encode_response",
    "encode_unregister",
    "go_trim_space",
    "parse_identify_body",
]
