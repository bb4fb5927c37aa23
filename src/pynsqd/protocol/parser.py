"""The server side of NSQ V2: bytes from a client in, validated commands out.

Theory of operation. ``receive(data)`` appends to one bytearray and parses every complete command
in it, in order. A command is a text line, split on single spaces, possibly followed by a
length-prefixed body. Each command is checked the way nsqd's ``protocol_v2.go`` checks it, in the
same order, so that a malformed command gets the very error nsqd would send. The parser keeps the
client state machine itself (init → subscribed → closing): a SUB moves it to subscribed as soon as
it is parsed, because if the server then fails the SUB the error is fatal and nothing after it is
read anyway.

The first error ends the stream: ``receive`` returns the commands parsed before it followed by the
error, and nothing more is parsed. Parsing also pauses after an IDENTIFY, because what follows may
be a TLS handshake or a compressed stream; the server calls ``receive(b"")`` to go on.

Bodies are parsed only once they have arrived whole, and the parser remembers how many bytes it
waits for, so a 5 MiB MPUB trickling in costs one length check per read, not a re-parse.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import NamedTuple

from ..internal.names import go_quote, is_valid_name, is_valid_producer
from .commands import (
    Auth,
    ClientState,
    Cls,
    Command,
    Dpub,
    Fin,
    Identify,
    Identity,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    Strided,
    Sub,
    Touch,
)
from .errors import FatalClientError, ProtocolError
from .frames import MAGIC_V2
from .identify import ProtocolConfig, parse_identify

_EMPTY = b""
_INT32 = struct.Struct(">l")
_unpack_int32 = _INT32.unpack_from
_DIGITS = frozenset(b"0123456789")
_UINT64_MASK = (1 << 64) - 1
# A run of well-formed "FIN <16-byte id>\n": no space or newline inside the id, and no "\r"
# at its end (nsqd strips a trailing "\r", which would leave a 15-byte id).
_fin_run = re.compile(rb"(?:FIN [^ \n]{15}[^ \n\r]\n)++").match
_FIN_LINE = 21  # len(b"FIN ") + 16 + len(b"\n")
_FIN_COLUMNS = ((0, b"F"), (1, b"I"), (2, b"N"), (3, b" "), (20, b"\n"))


def fin_ids(buf: bytes | bytearray, pos: int) -> tuple[list[bytes], int] | None:
    """The ids of the run of well-formed FINs at ``pos`` and the run's length, or None.

    A consumer FINs a whole batch at once: thousands of 21-byte lines. They are found with a
    few strided slices (every line's byte 0, 1, 2, 3 and 20) and cut with one replace and one
    split, all in C, rather than a regex step and a slice per line. The same rules as
    ``_fin_run``: no space or newline in an id, no "\r" at its end; short runs and anything
    unusual go through ``_fin_run``.
    """
    lines = (len(buf) - pos) // _FIN_LINE
    if lines >= 8:
        region = bytes(buf[pos : pos + lines * _FIN_LINE])
        k = lines
        for off, ch in _FIN_COLUMNS:
            col = region[off::_FIN_LINE]
            k = min(k, len(col) - len(col.lstrip(ch)))
        if k >= 8:
            if k < lines:
                region = region[: k * _FIN_LINE]
            # Only the k separators: no space or newline inside an id, so no "FIN " either.
            if region.count(b" ") == k and region.count(b"\n") == k and b"\r\n" not in region:
                ids = region.replace(b"FIN ", b"").split(b"\n")
                ids.pop()  # after the last newline
                return ids, len(region)
    m = _fin_run(buf, pos)
    if m is None:
        return None
    run = m[0]
    return [run[i + 4 : i + 20] for i in range(0, len(run), _FIN_LINE)], len(run)


#: A parsed command, or the error that ended the stream.
Event = Command | ProtocolError

# handler(params, after_line) -> (command or None, position after the command); -1 = need more
_Result = tuple[Command | None, int]


def _parse_base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: digits only, an empty string is 0, and it wraps like a uint64."""
    if not raw:
        return 0
    if not _DIGITS.issuperset(raw):
        return None
    if len(raw) <= 19:  # below 2**64, and far below Python's int-from-str digit limit
        return int(raw)
    n = 0
    for i in range(0, len(raw), 19):
        chunk = raw[i : i + 19]
        n = (n * 10 ** len(chunk) + int(chunk)) & _UINT64_MASK
    return n


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class StateRule(NamedTuple):
    runs_in: frozenset[ClientState]
    ignored_in: frozenset[ClientState]  # dropped without a reply (elsewhere: E_INVALID)
    moves_to: ClientState | None


_INIT, _SUBSCRIBED, _CLOSING = ClientState.INIT, ClientState.SUBSCRIBED, ClientState.CLOSING
_NONE: frozenset[ClientState] = frozenset()
_FIN_STATES = frozenset({_SUBSCRIBED, _CLOSING})

#: Which command runs in which client state, and the state it moves the client to: nsqd's rules,
#: checked in one place, before the command's own checks (as nsqd's handlers do first). A command
#: not listed (PUB, MPUB, DPUB, NOP) runs in every state. Anything else in a state not listed is
#: ``E_INVALID cannot <CMD> in current state``.
STATE_TABLE: dict[bytes, StateRule] = {
    b"IDENTIFY": StateRule(frozenset({_INIT}), _NONE, None),  # again and again, as nsqd
    b"AUTH": StateRule(frozenset({_INIT}), _NONE, None),
    b"SUB": StateRule(frozenset({_INIT}), _NONE, _SUBSCRIBED),
    b"RDY": StateRule(frozenset({_SUBSCRIBED}), frozenset({_CLOSING}), None),
    b"FIN": StateRule(_FIN_STATES, _NONE, None),
    b"REQ": StateRule(_FIN_STATES, _NONE, None),
    b"TOUCH": StateRule(_FIN_STATES, _NONE, None),
    b"CLS": StateRule(frozenset({_SUBSCRIBED}), _NONE, _CLOSING),
}


class V2Parser:
    __slots__ = (
        "_buf",
        "_dead",
        "_handlers",
        "_magic",
        "_need",
        "_paused",
        "_scan",
        "_src",
        "config",
        "headers",
        "heartbeats_disabled",
        "idempotent",
        "state",
        "tls",
    )

    def __init__(self, config: ProtocolConfig, *, expect_magic: bool = True) -> None:
        self.config = config
        self.state = ClientState.INIT
        #: Set by the server once the connection is upgraded to TLS (for --tls-required).
        self.tls = False
        self.heartbeats_disabled = False
        #: pynsqd: IDENTIFY negotiated idempotent publishing (``Identity`` after PUB's params).
        self.idempotent = False
        #: pynsqd: IDENTIFY negotiated headers: each body starts with a block's length
        #: (``protocol/headers.py``); MPUB cuts bodies of empty blocks past it at once.
        self.headers = False
        self._buf = bytearray()
        #: What ``_parse`` reads: the new bytes themselves, or the buffer when a tail was waiting.
        self._src: bytes | bytearray = _EMPTY
        self._magic = not expect_magic
        self._dead = False
        self._paused = False
        self._scan = 0  # how far the current line was already searched for "\n"
        self._need = 0  # bytes the buffer must hold before parsing can make progress
        self._handlers: dict[bytes, Callable[[list[bytes], int], _Result]] = {
            b"FIN": self._fin,
            b"RDY": self._rdy,
            b"REQ": self._req,
            b"PUB": self._pub,
            b"MPUB": self._mpub,
            b"DPUB": self._dpub,
            b"NOP": self._nop,
            b"TOUCH": self._touch,
            b"SUB": self._sub,
            b"CLS": self._cls,
            b"AUTH": self._auth,
        }

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def paused(self) -> bool:
        """It stopped after IDENTIFY (h11's PAUSED): an upgrade may change what the buffered
        bytes mean. ``receive(b"")`` goes on; ``take_buffered()`` hands them to the upgrade."""
        return self._paused

    def take_buffered(self) -> bytes:
        """Remove and return unparsed bytes (what follows IDENTIFY before a TLS upgrade)."""
        data = bytes(self._buf)
        self._buf.clear()
        self._scan = self._need = 0
        return data

    def receive(self, data: bytes) -> list[Event]:
        """Feed bytes; return every command now complete, and the error that ended it, if any."""
        if self._dead:
            return []
        buf = self._buf
        if buf or len(data) < self._need:
            # A partial command is waiting: parse from the buffer.
            buf += data
            if len(buf) < self._need:
                return []
            src: bytes | bytearray = buf
        else:
            # The common case: nothing buffered, so parse the new bytes in place and copy only
            # an incomplete tail.
            src = data
        self._src = src
        self._paused = False
        out: list[Event] = []
        pos = 0
        try:
            pos = self._parse(out)
        except ProtocolError as err:
            out.append(err)
            self._dead = True
        self._src = _EMPTY
        if self._dead:
            buf.clear()
            return out
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < len(src):
            buf += memoryview(src)[pos:]
        if pos:
            self._scan = max(0, self._scan - pos)
            # _need is an offset into the buffer, which now starts pos bytes later.
            if self._need:
                self._need -= pos
        return out

    def _parse(self, out: list[Event]) -> int:
        buf = self._src
        n = len(buf)
        pos = 0
        if not self._magic:
            if n < 4:
                self._need = 4
                return 0
            if buf[:4] != MAGIC_V2:
                raise FatalClientError("E_BAD_PROTOCOL")
            self._magic = True
            pos = 4
        max_line = self.config.max_line_length
        handlers = self._handlers
        self._need = 0
        while pos < n:
            # Fast path for the commonest command: a run of "FIN <16-byte id>\n".
            if buf[pos] == 70 and self.state in _FIN_STATES:  # 70: "F"
                found = fin_ids(buf, pos)
                if found is not None:
                    out.append(Fin(found[0]))
                    pos += found[1]
                    continue
            nl = buf.find(b"\n", max(pos, self._scan), pos + max_line)
            if nl < 0:
                if n - pos >= max_line:
                    raise FatalClientError(
                        "E_INVALID", f"command line too long (more than {max_line} bytes)"
                    )
                self._scan = n
                break
            end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
            params = bytes(buf[pos:end]).split(b" ")
            name = params[0]
            if self.config.tls_required and not self.tls and name != b"IDENTIFY":
                raise FatalClientError(
                    "E_INVALID", f"cannot {_text(name)} in current state (TLS required)"
                )
            handler = self._identify if name == b"IDENTIFY" else handlers.get(name)
            if handler is None:
                raise FatalClientError("E_INVALID", f"invalid command {_text(name)}")
            rule = STATE_TABLE.get(name)
            if rule is not None and self.state not in rule.runs_in:
                if self.state not in rule.ignored_in:
                    raise FatalClientError("E_INVALID", f"cannot {_text(name)} in current state")
                cmd, after = None, nl + 1  # nsqd drops it without a reply
            else:
                cmd, after = handler(params, nl + 1)
                if rule is not None and rule.moves_to is not None and after >= 0:
                    self.state = rule.moves_to
            if after < 0:
                self._scan = pos  # the line is known; resume at it when the body is here
                break
            self._scan = 0
            pos = after
            if cmd is not None:
                out.append(cmd)
                if type(cmd) is Identify:
                    self._paused = True
                    break
        return pos

    # -- bodies -----------------------------------------------------------------------------

    def _body_len(self, start: int) -> int | None:
        if len(self._src) - start < 4:
            self._need = start + 4
            return None
        size: int = _unpack_int32(self._src, start)[0]
        return size

    def _body(self, start: int, size: int) -> bytes | None:
        src = self._src
        if len(src) - start < size:
            self._need = start + size
            return None
        if type(src) is bytes:
            return src[start : start + size]
        return memoryview(src)[start : start + size].tobytes()

    def _message_body(self, cmd: str, start: int) -> tuple[bytes | None, int]:
        """The body of PUB or DPUB: nsqd's checks and texts, with the command's name in them."""
        size = self._body_len(start)
        if size is None:
            return None, -1
        if size <= 0:
            raise FatalClientError("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
        limit = self.config.max_msg_size
        if size > limit:
            raise FatalClientError("E_BAD_MESSAGE", f"{cmd} message too big {size} > {limit}")
        body = self._body(start + 4, size)
        if body is None:
            return None, -1
        return body, start + 4 + size

    def _body_size(self, cmd: str, start: int) -> int | None:
        """The size of the body of IDENTIFY, AUTH or MPUB at ``start``, bounded by
        --max-body-size (None: not all here yet)."""
        size = self._body_len(start)
        if size is None:
            return None
        limit = self.config.max_body_size
        if size > limit:
            raise FatalClientError("E_BAD_BODY", f"{cmd} body too big {size} > {limit}")
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"{cmd} invalid body size {size}")
        return size

    def _sized_body(self, cmd: str, start: int) -> tuple[bytes | None, int]:
        """The body of IDENTIFY or AUTH."""
        size = self._body_size(cmd, start)
        if size is None:
            return None, -1
        body = self._body(start + 4, size)
        if body is None:
            return None, -1
        return body, start + 4 + size

    # -- commands, each in nsqd's check order --------------------------------------------------

    def _identify(self, params: list[bytes], start: int) -> _Result:
        body, after = self._sized_body("IDENTIFY", start)
        if body is None:
            return None, -1
        data = parse_identify(body, self.config)
        self.heartbeats_disabled = data.heartbeat_interval_ms == 0
        return Identify(data), after

    def _auth(self, params: list[bytes], start: int) -> _Result:
        if len(params) != 1:
            raise FatalClientError("E_INVALID", "AUTH invalid number of parameters")
        body, after = self._sized_body("AUTH", start)
        if body is None:
            return None, -1
        return Auth(body), after

    def _sub(self, params: list[bytes], start: int) -> _Result:
        if self.heartbeats_disabled:
            raise FatalClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "SUB insufficient number of parameters")
        if not is_valid_name(params[1]):
            raise FatalClientError(
                "E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid"
            )
        if not is_valid_name(params[2]):
            raise FatalClientError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid"
            )
        return Sub(params[1].decode(), params[2].decode()), start

    def _rdy(self, params: list[bytes], start: int) -> _Result:
        count = 1
        if len(params) > 1:
            parsed = _parse_base10(params[1])
            if parsed is None:
                raise FatalClientError("E_INVALID", f"RDY could not parse count {_text(params[1])}")
            count = parsed
        limit = self.config.max_rdy_count
        if count > limit:
            if count >= 1 << 63:  # nsqd converts the uint64 to an int64
                count -= 1 << 64
            raise FatalClientError("E_INVALID", f"RDY count {count} out of range 0-{limit}")
        return Rdy(count), start

    def _message_id(self, cmd: str, params: list[bytes], min_params: int) -> bytes:
        if len(params) < min_params:
            raise FatalClientError("E_INVALID", f"{cmd} insufficient number of params")
        if len(params[1]) != 16:
            raise FatalClientError("E_INVALID", "invalid message ID")
        return params[1]

    def _fin(self, params: list[bytes], start: int) -> _Result:
        return Fin([self._message_id("FIN", params, 2)]), start

    def _touch(self, params: list[bytes], start: int) -> _Result:
        return Touch(self._message_id("TOUCH", params, 2)), start

    def _req(self, params: list[bytes], start: int) -> _Result:
        msg_id = self._message_id("REQ", params, 3)
        timeout = _parse_base10(params[2])
        if timeout is None:
            raise FatalClientError("E_INVALID", f"REQ could not parse timeout {_text(params[2])}")
        return Req(msg_id, min(timeout, self.config.max_req_timeout_ms), timeout), start

    def _cls(self, params: list[bytes], start: int) -> _Result:
        return Cls(), start

    def _nop(self, params: list[bytes], start: int) -> _Result:
        return Nop(), start

    def _topic(self, cmd: str, params: list[bytes], min_params: int, code_in_desc: str) -> str:
        if len(params) < min_params:
            raise FatalClientError("E_INVALID", f"{cmd} insufficient number of parameters")
        if not is_valid_name(params[1]):
            raise FatalClientError(
                "E_BAD_TOPIC",
                f"{code_in_desc}{cmd} topic name {go_quote(params[1])} is not valid",
            )
        return params[1].decode()

    def _pub(self, params: list[bytes], start: int) -> _Result:
        # The commonest command after FIN, inlined; any anomaly takes the general path.
        src = self._src
        if (
            (len(params) != 2 and (len(params) < 2 or self.idempotent))
            or not is_valid_name(params[1])
            or len(src) - start < 4
        ):
            return self._pub_general(params, start)
        size: int = _unpack_int32(src, start)[0]
        end = start + 4 + size
        if size <= 0 or size > self.config.max_msg_size or len(src) < end:
            return self._pub_general(params, start)
        if type(src) is bytes:
            return Pub(params[1].decode(), src[start + 4 : end]), end
        return Pub(params[1].decode(), memoryview(src)[start + 4 : end].tobytes()), end

    def _pub_general(self, params: list[bytes], start: int) -> _Result:
        topic = self._topic("PUB", params, 2, "")
        identity = self._identity("PUB", params, 2)
        body, after = self._message_body("PUB", start)
        if body is None:
            return None, -1
        return Pub(topic, body, identity), after

    def _identity(self, cmd: str, params: list[bytes], at: int) -> Identity | None:
        """pynsqd: an idempotent publish's producer id and sequence number, after the
        command's own parameters, once IDENTIFY negotiated ``idempotent_publish`` (before,
        extra parameters are ignored, as nsqd ignores them)."""
        if not self.idempotent or len(params) <= at:
            return None
        if len(params) < at + 2:
            raise FatalClientError(
                "E_INVALID", f"{cmd} insufficient number of parameters (producer and sequence)"
            )
        producer, seq = params[at], params[at + 1]
        if not is_valid_producer(producer):
            raise FatalClientError(
                "E_INVALID",
                f"{cmd} producer {go_quote(producer)} is not valid (1-128 of A-Z a-z 0-9 . _ : -)",
            )
        if not seq or len(seq) > 19 or not _DIGITS.issuperset(seq) or int(seq) >= 1 << 63:
            raise FatalClientError("E_INVALID", f"{cmd} could not parse sequence {_text(seq)}")
        return Identity(producer, int(seq))

    def _dpub(self, params: list[bytes], start: int) -> _Result:
        topic = self._topic("DPUB", params, 3, "")
        identity = self._identity("DPUB", params, 3)
        defer_ms = _parse_base10(params[2])
        if defer_ms is None:
            raise FatalClientError("E_INVALID", f"DPUB could not parse timeout {_text(params[2])}")
        limit = self.config.max_req_timeout_ms
        if defer_ms > limit:
            raise FatalClientError("E_INVALID", f"DPUB timeout {defer_ms} out of range 0-{limit}")
        body, after = self._message_body("DPUB", start)
        if body is None:
            return None, -1
        return Dpub(topic, defer_ms, body, identity), after

    def _mpub(self, params: list[bytes], start: int) -> _Result:
        # nsqd repeats the code inside the description here; clients may match on it.
        topic = self._topic("MPUB", params, 2, "E_BAD_TOPIC ")
        identity = self._identity("MPUB", params, 2)
        size = self._body_size("MPUB", start)
        if size is None:
            return None, -1
        after = start + 4 + size
        if len(self._src) < after:
            self._need = after
            return None, -1
        # The messages are cut straight from the input when it is the bytes read (one copy
        # each, not the whole body first); from the buffer, through one copy of the body.
        src = self._src
        try:
            if type(src) is bytes:
                bodies = parse_mpub_body(src, self.config, start + 4, after, self.headers)
                return Mpub(topic, bodies, identity), after
            view = memoryview(src)[start + 4 : after]
            try:
                bodies = parse_mpub_body(view, self.config, headers=self.headers)
                return Mpub(topic, bodies, identity), after
            finally:
                view.release()  # before the buffer under it may be resized
        except FatalClientError:
            # One walk for the right declared size; a second only when it did not frame them.
            if not self._mpub_declared_size_is_wrong(start + 4, size):
                raise
        return self._mpub_framed(topic, start + 4, identity)

    def _mpub_declared_size_is_wrong(self, p: int, size: int) -> bool:
        """nsqd only range-checks MPUB's body size: it reads the messages by their count and
        sizes. Some clients (nsq.js, squeaky) declare only the messages' bytes. The declared
        size is used as the frame when it is right (one length check per read while the body
        trickles in); it is known wrong once its bytes are here and do not frame the messages."""
        if size <= 0 or size > self.config.max_body_size:
            return False  # _sized_body gives nsqd's error
        src = self._src
        if len(src) - p < size:
            return False  # wait for the declared bytes first
        end = p + size
        if end - p < 4:
            return False  # not even a count: parse_mpub_body's error, as for a short body
        count: int = _unpack_int32(src, p)[0]
        if count <= 0 or count > (self.config.max_body_size - 4) // 5:
            return False
        q = p + 4
        for _ in range(count):
            if end - q < 4:
                return True
            n: int = _unpack_int32(src, q)[0]
            if n <= 0 or n > self.config.max_msg_size:
                return False  # parse_mpub_body gives nsqd's error
            q += 4 + n
            if q > end:
                return True
        return q != end

    def _mpub_framed(self, topic: str, p: int, identity: Identity | None = None) -> _Result:
        """MPUB framed as nsqd reads it: ``[count]([size][data])*``, whatever the declared size
        (bounded by --max-body-size all the same)."""
        src = self._src
        limit = self.config.max_body_size
        q = p + 4
        if len(src) < q:
            self._need = q
            return None, -1
        count: int = _unpack_int32(src, p)[0]
        if count <= 0 or count > (limit - 4) // 5:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        for _ in range(count):
            if len(src) < q + 4:
                self._need = q + 4
                return None, -1
            n: int = _unpack_int32(src, q)[0]
            if n <= 0 or n > self.config.max_msg_size:
                break  # parse_mpub_body below gives nsqd's error for it
            q += 4 + n
            if q - p > limit:
                raise FatalClientError("E_BAD_BODY", f"MPUB body too big {q - p} > {limit}")
            if len(src) < q:
                self._need = q
                return None, -1
        else:
            body = self._body(p, q - p)
            assert body is not None
            bodies = parse_mpub_body(body, self.config, headers=self.headers)
            return Mpub(topic, bodies, identity), q
        body = self._body(p, q + 4 - p)
        assert body is not None
        parse_mpub_body(body, self.config)  # raises the error for the bad message size
        raise AssertionError("unreachable")


def parse_mpub_body(
    body: bytes | memoryview,
    config: ProtocolConfig,
    start: int = 0,
    end: int = -1,
    headers: bool = False,
) -> list[bytes]:
    """Split ``[count]([size][data])*`` into message bodies, with nsqd's checks and texts.

    ``body[start:end]`` (``end`` -1: to its end) is exactly the messages: the TCP parser frames
    them by their count and sizes (as nsqd) and HTTP's binary ``/mpub`` gives the whole request
    body, which must hold nothing more.

    The well-formed case takes one tight loop over bytes (the input itself, or a copy of a
    view: a slice of bytes is one step, a slice of a view two); anything it does not accept
    goes through the checking loop, which gives nsqd's error. Bodies all of one size come back
    as a ``Strided`` list (``headers``: the client negotiated them, so each body starts with a
    block length; when every one is 0, the bodies are cut past it: ``Strided.unblocked``).
    """
    if end < 0:
        end = len(body)
    if end - start >= 4:
        count: int = _unpack_int32(body, start)[0]
        if 0 < count <= (config.max_body_size - 4) // 5:
            if type(body) is bytes:
                data = body
            else:
                data = bytes(body[start:end])
                start, end = 0, end - start
            max_msg = config.max_msg_size
            same = _same_sized(data, start, end, count, max_msg, headers)
            if same is not None:
                return same
            bodies: list[bytes] = []
            append = bodies.append
            p = start + 4
            for _ in range(count):
                if end - p < 4:
                    break
                q = p + 4 + _unpack_int32(data, p)[0]
                if not p + 4 < q <= end or q - p - 4 > max_msg:
                    break
                append(data[p + 4 : q])
                p = q
            else:
                if p == end:
                    return bodies
    whole = start == 0 and end == len(body)  # (a view's slice would outlive its release)
    return _parse_mpub_body_checked(body if whole else body[start:end], config)


def _same_sized(
    data: bytes, start: int, end: int, count: int, max_msg: int, headers: bool = False
) -> Strided | None:
    """The bodies of the MPUB ``data[start:end]`` when its messages all have the first one's
    size, or None.

    Producers often batch records of one size. Then the size fields sit at a fixed stride,
    and four strided slices (each size's byte 0, 1, 2 and 3 across all messages) check them
    all in C; the bodies are cut at that stride without reading a size per message.
    """
    if end - start < 8:
        return None
    size: int = _unpack_int32(data, start + 4)[0]
    stride = size + 4
    if not 0 < size <= max_msg or end - start != 4 + count * stride:
        return None
    for i in range(start + 4, start + 8):
        if data[i:end:stride] != data[i : i + 1] * count:
            return None
    first = start + 8
    cut = 0
    if headers and size >= 2 and not data[first] and not data[first + 1]:
        zeros = b"\0" * count
        if data[first:end:stride] == zeros and data[first + 1 : end : stride] == zeros:
            cut = 2  # every block empty: the bodies are what follows its length
    out = Strided([data[p + cut : p + size] for p in range(first, end, stride)])
    out.data = data
    out.start = first + cut
    out.stride = stride
    out.unblocked = cut > 0
    return out


def _parse_mpub_body_checked(body: bytes | memoryview, config: ProtocolConfig) -> list[bytes]:
    end = len(body)
    if end < 4:
        raise FatalClientError("E_BAD_BODY", "MPUB failed to read message count")
    count: int = _unpack_int32(body, 0)[0]
    max_count = (config.max_body_size - 4) // 5
    if count <= 0 or count > max_count:
        raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
    max_msg = config.max_msg_size
    bodies: list[bytes] = []
    append = bodies.append
    p = 4
    for i in range(count):
        if end - p < 4:
            raise FatalClientError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        size: int = _unpack_int32(body, p)[0]
        if size <= 0:
            raise FatalClientError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if size > max_msg:
            raise FatalClientError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg}")
        p += 4
        if end - p < size:
            raise FatalClientError("E_BAD_MESSAGE", "MPUB failed to read message body")
        append(bytes(body[p : p + size]))  # a copy of a view; the slice itself if bytes
        p += size
    if p != end:
        raise FatalClientError(
            "E_BAD_BODY", f"MPUB body size {end} does not match its {count} messages ({p} bytes)"
        )
    return bodies
