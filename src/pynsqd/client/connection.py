"""The blocking NSQ client on ``pynsqd.protocol``: one home for the Spark connector, the
command-line tools (``pynsqd.tools``) and the tests.

Two ways to use a :class:`Connection`:

* **request/response** (producers): ``pub``/``mpub``/``dpub``/``request`` send a command and read
  frames until its response, answering heartbeats with ``NOP`` on the way. An error frame raises
  :class:`NsqError` carrying nsqd's code (``E_BAD_TOPIC``, ...). ``pipeline`` sends several
  commands at once and then reads their responses in order.
* **subscriber**: :meth:`Connection.subscribe` sends ``SUB`` and starts reading: a reader thread
  of its own, or a :class:`Reactor` (one selector thread for many connections) hands messages
  to a callback in columns (timestamps, attempts, ids, bodies) and answers heartbeats.
  ``rdy``/``fin``/``touch``/``req`` may then be called from any thread: writes are serialised by a
  lock, and only the reading thread reads.

TLS (``tls_v1``) and AUTH are supported; snappy and deflate are never requested. It imports
only the standard library and pynsqd's sans-IO protocol.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from .. import __version__
from ..internal import jsonbound
from ..protocol import encode
from ..protocol import headers as header_codec
from ..protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
    Frame,
    FrameReader,
    duplicates_in,
)
from ..protocol.headers import HeaderError, join_body
from ..protocol.headers import decode as decode_headers
from .errors import (
    IDEMPOTENT,
    NsqConnectionError,
    NsqError,
    check_identity,
    check_names,
    parse_address,
)
from .options import ClientOptions

__all__ = [
    "ClientOptions",
    "Connection",
    "Reactor",
]

log = logging.getLogger("pynsqd.client")

VERSION = __version__

_FRAME_HEAD = struct.Struct(">ll")
_MSG_HEAD = struct.Struct(">llqH")  # size, frame type, timestamp, attempts
_RECV_SIZE = 256 * 1024

#: on_messages(conn, timestamps_ns, attempts, ids, bodies)
MessagesCallback = Callable[["Connection", list[int], list[int], list[bytes], list[bytes]], None]
#: With ``ClientOptions.headers``: on_messages(conn, timestamps_ns, attempts, ids, bodies,
#: headers), each message's headers as a list of (name, value).
HeadersCallback = Callable[
    ["Connection", list[int], list[int], list[bytes], list[bytes], list[list[tuple[str, bytes]]]],
    None,
]
#: What a message's headers are given as to ``pub``, ``mpub`` and ``dpub``.
Headers = Sequence[tuple[str, bytes | str]] | Mapping[str, bytes | str]


def header_blocks(given: Headers | Sequence[Headers | None] | None, count: int) -> list[bytes]:
    """Each of ``count`` messages' header block: ``given`` is every message's headers (a
    mapping or a list of pairs), a list with each message's (None: none), or None; values are
    bytes or text (UTF-8). Raises ``NsqError`` (E_BAD_MESSAGE) for headers that break a rule."""

    def block(h: Headers | None) -> bytes:
        if not h:
            return b""
        items = h.items() if isinstance(h, Mapping) else h
        pairs = [(k, v.encode() if isinstance(v, str) else bytes(v)) for k, v in items]
        try:
            return header_codec.encode(pairs)
        except HeaderError as err:
            raise NsqError("E_BAD_MESSAGE", str(err)) from None

    if isinstance(given, Sequence) and given and not isinstance(given[0], tuple):
        each = list(cast(Sequence[Headers | None], given))
        if len(each) != count:
            raise NsqError("E_BAD_MESSAGE", f"{len(each)} headers for {count} messages")
        return [block(h) for h in each]
    one = block(cast(Headers | None, given))
    return [one] * count


class Connection:
    """One V2 connection to one nsqd. See the module docstring for the two ways to use it."""

    def __init__(self, address: str, options: ClientOptions | None = None) -> None:
        self.host, self.port = parse_address(address)
        self.address = f"{self.host}:{self.port}"
        self.options = options or ClientOptions()
        self.identify_response: dict[str, Any] = {}
        self.closed = False
        #: set by the reader thread when the connection ends (None: closed by us)
        self.close_reason: BaseException | None = None
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._frames = FrameReader()
        self._pending: list[Frame] = []
        self._reader: threading.Thread | None = None
        #: subscribed on a Reactor: its parser, and set once the reactor has closed it
        self._reactor: Reactor | None = None
        self._deliver: _Deliver | None = None
        self._ended = threading.Event()

    # -- set-up ---------------------------------------------------------------------------

    def connect(self) -> Connection:
        """TCP connect, magic, IDENTIFY, optional TLS upgrade and AUTH. Returns self."""
        opts = self.options
        try:
            sock = socket.create_connection((self.host, self.port), timeout=opts.connect_timeout)
        except OSError as e:
            raise NsqConnectionError(
                f"cannot connect to nsqd {self.address}: {e}", self.address
            ) from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        try:
            self._send(MAGIC_V2)
            ident: dict[str, Any] = {
                "feature_negotiation": True,
                "client_id": opts.client_id or socket.gethostname().split(".")[0],
                "hostname": socket.gethostname(),
                "user_agent": opts.user_agent,
                IDEMPOTENT: True,
            }
            if opts.heartbeat_interval_ms:
                ident["heartbeat_interval"] = opts.heartbeat_interval_ms
            if opts.msg_timeout_ms:
                ident["msg_timeout"] = opts.msg_timeout_ms
            if opts.tls:
                ident["tls_v1"] = True
            if opts.headers:
                ident["headers"] = True
            resp = self.request(encode.identify(ident))
            if resp.startswith(b"{"):
                self.identify_response = jsonbound.loads(resp)
            if opts.headers and self.identify_response.get("headers") is not True:
                raise NsqConnectionError(
                    f"nsqd {self.address} does not offer message headers (an nsqd, or a "
                    "pynsqd of several workers or --max-headers=0)",
                    self.address,
                )
            if opts.tls:
                if not self.identify_response.get("tls_v1"):
                    raise NsqConnectionError(
                        f"nsqd {self.address} does not offer TLS (tls_v1 not negotiated)",
                        self.address,
                    )
                self._sock = opts.ssl_context().wrap_socket(sock, server_hostname=self.host)
                if self._read_response() != OK:
                    raise NsqConnectionError(f"nsqd {self.address}: no OK after TLS", self.address)
            if self.identify_response.get("auth_required"):
                if opts.auth_secret is None:
                    raise NsqConnectionError(
                        f"nsqd {self.address} requires AUTH but no auth secret was given",
                        self.address,
                    )
                self.request(encode.auth(opts.auth_secret.encode()))
            self._sock.settimeout(opts.timeout)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def max_rdy_count(self) -> int:
        return int(self.identify_response.get("max_rdy_count", 2500))

    @property
    def msg_timeout_ms(self) -> int:
        return int(self.identify_response.get("msg_timeout", 60000))

    def close(self) -> None:
        self.closed = True
        sock = self._sock
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        reader = self._reader
        if reader is not None and reader.is_alive() and threading.current_thread() is not reader:
            # The shutdown wakes the reader thread, which closes the socket itself. Closing the
            # fd here, under its pending recv, could let that recv read from a new socket that
            # reuses the fd number (seen: a TLS reader ate the next connection's first 5 bytes).
            return
        if self._reactor is not None:
            # Likewise the reactor: it sees the shutdown as readable, unregisters, then closes.
            self._reactor.wake()
            return
        self._sock = None
        sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<nsq Connection {self.address}{' closed' if self.closed else ''}>"

    # -- low level ------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None or self.closed:
            raise NsqConnectionError(f"connection to nsqd {self.address} is closed", self.address)
        try:
            with self._send_lock:
                sock.sendall(data)
        except OSError as e:
            self.close()
            raise NsqConnectionError(
                f"send to nsqd {self.address} failed: {e}", self.address
            ) from e

    def send(self, data: bytes) -> None:
        """Send raw command bytes (thread-safe)."""
        self._send(data)

    def _read_frame(self) -> Frame:
        """The next frame other than a heartbeat (which is answered with NOP)."""
        while True:
            while not self._pending:
                sock = self._sock
                if sock is None:
                    raise NsqConnectionError(f"connection to nsqd {self.address} is closed")
                try:
                    data = sock.recv(_RECV_SIZE)
                except OSError as e:
                    self.close()
                    raise NsqConnectionError(
                        f"read from nsqd {self.address} failed: {e}", self.address
                    ) from e
                if not data:
                    self.close()
                    raise NsqConnectionError(
                        f"nsqd {self.address} closed the connection", self.address
                    )
                self._frames.feed(data)
                self._pending.extend(self._frames.frames())
            frame = self._pending.pop(0)
            if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == HEARTBEAT:
                self._send(encode.nop())
                continue
            return frame

    def _read_response(self) -> bytes:
        frame = self._read_frame()
        if frame.frame_type == FRAME_TYPE_RESPONSE:
            return frame.data
        if frame.frame_type == FRAME_TYPE_ERROR:
            err = NsqError.from_frame(frame.data, self.address)
            if err.fatal:
                self.close()
            raise err
        self.close()
        raise NsqConnectionError(
            f"nsqd {self.address}: unexpected frame type {frame.frame_type}", self.address
        )

    # -- request/response -----------------------------------------------------------------

    def read_response(self) -> bytes:
        """The next response frame's data (heartbeats answered); NsqError on an error frame."""
        return self._read_response()

    def request(self, command: bytes) -> bytes:
        """Send one command and return its response frame's data; NsqError on an error frame."""
        if self._reader is not None:
            raise RuntimeError("request() cannot be used on a subscribed connection")
        self._send(command)
        return self._read_response()

    def pipeline(self, commands: Sequence[bytes]) -> list[bytes]:
        """Send several commands in one write, then read one response each (in order).

        The first error frame raises NsqError; the later responses are then unknown.
        """
        if self._reader is not None:
            raise RuntimeError("pipeline() cannot be used on a subscribed connection")
        self._send(b"".join(commands))
        return [self._read_response() for _ in commands]

    def pub(
        self,
        topic: str,
        body: bytes,
        *,
        identity: tuple[str, int] | None = None,
        headers: Headers | None = None,
    ) -> int:
        """PUB; ``identity``: (producer id, sequence number) of an idempotent publish to a
        retained topic (pynsqd): a retry with the same identity is written once. ``headers``:
        the message's headers (with ``ClientOptions.headers``). Returns how many of the
        records the topic already had (acknowledged, not written again): 0 or 1."""
        check_names(topic, framing_only=True)
        check_identity(identity, self.identify_response, self.address)
        (body,) = self._with_headers([body], headers)
        return self._expect_ok(self.request(encode.pub(topic, body, identity)))

    def mpub(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        identity: tuple[str, int] | None = None,
        headers: Headers | Sequence[Headers | None] | None = None,
    ) -> int:
        """MPUB; ``identity``: the producer and the first message's sequence number (the
        others follow it); ``headers``: every message's, or a list with each message's (None:
        none). Returns how many of the records the topic already had."""
        check_names(topic, framing_only=True)
        check_identity(identity, self.identify_response, self.address)
        bodies = self._with_headers(bodies, headers)
        return self._expect_ok(self.request(encode.mpub(topic, bodies, identity)))

    def dpub(
        self,
        topic: str,
        defer_ms: int,
        body: bytes,
        *,
        identity: tuple[str, int] | None = None,
        headers: Headers | None = None,
    ) -> int:
        check_names(topic, framing_only=True)
        check_identity(identity, self.identify_response, self.address)
        (body,) = self._with_headers([body], headers)
        return self._expect_ok(self.request(encode.dpub(topic, defer_ms, body, identity)))

    def _with_headers(
        self, bodies: Sequence[bytes], given: Headers | Sequence[Headers | None] | None
    ) -> list[bytes]:
        """The bodies as sent: with headers negotiated, each with its header block before it
        (``protocol/headers.py``); raises NsqError for headers not negotiated or invalid."""
        if not self.options.headers:
            if given:
                raise NsqError(
                    "E_INVALID", "headers need ClientOptions(headers=True)", self.address
                )
            return list(bodies)
        blocks = header_blocks(given, len(bodies))
        return [join_body(block, body) for block, body in zip(blocks, bodies, strict=True)]

    def _expect_ok(self, resp: bytes) -> int:
        """An OK: how many records it says were already there (``frames.ok_answer``)."""
        duplicates = duplicates_in(resp)
        if duplicates is None:
            raise NsqConnectionError(f"nsqd {self.address}: expected OK, got {resp!r}")
        return duplicates

    # -- subscriber -----------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        channel: str,
        on_messages: MessagesCallback | HeadersCallback,
        on_close: Callable[[Connection], None] | None = None,
        on_error: Callable[[Connection, NsqError], None] | None = None,
        rdy: int | None = None,
        reactor: Reactor | None = None,
    ) -> None:
        """SUB, then start reading (and send RDY if given): on a reader thread of its own, or,
        given a :class:`Reactor`, on the reactor's thread shared with other connections.

        ``on_messages`` runs on the reading thread once per received chunk of messages (with
        ``ClientOptions.headers``, given each message's headers too: ``HeadersCallback``).
        ``on_error`` gets error frames (non-fatal ones, like E_FIN_FAILED, and the fatal one
        before the close); ``on_close`` runs when the connection ends, with ``close_reason`` set.
        """
        check_names(topic, channel, framing_only=True)
        self._expect_ok(self.request(encode.sub(topic, channel)))
        sock = self._sock
        assert sock is not None
        deliver = _Deliver(self, on_messages, on_close, on_error)
        if reactor is not None:
            self._deliver = deliver
            self._reactor = reactor
            reactor.add(self)
        else:
            # The reader blocks in recv; a timeout only lets it notice close() promptly.
            sock.settimeout(1.0)
            self._reader = threading.Thread(
                target=self._read_loop,
                args=(deliver,),
                name=f"nsq-reader-{self.address}",
                daemon=True,
            )
            self._reader.start()
        if rdy is not None:
            self.rdy(rdy)

    def rdy(self, count: int) -> None:
        self._send(encode.rdy(count))

    def fin(self, msg_id: bytes) -> None:
        self._send(encode.fin(msg_id))

    def fin_many(self, ids: Iterable[bytes]) -> None:
        """FIN every id in one write (FIN has no response unless it fails)."""
        self._send_each(b"FIN ", ids)

    def touch(self, msg_id: bytes) -> None:
        self._send(encode.touch(msg_id))

    def touch_many(self, ids: Iterable[bytes]) -> None:
        self._send_each(b"TOUCH ", ids)

    def _send_each(self, command: bytes, ids: Iterable[bytes]) -> None:
        """``command`` for every id, in one write."""
        data = b"".join([command + i + b"\n" for i in ids])
        if data:
            self._send(data)

    def req(self, msg_id: bytes, timeout_ms: int = 0) -> None:
        self._send(encode.req(msg_id, timeout_ms))

    def req_many(self, ids: Iterable[bytes], timeout_ms: int = 0) -> None:
        data = b"".join([encode.req(i, timeout_ms) for i in ids])
        if data:
            self._send(data)

    def cls(self) -> None:
        self._send(encode.cls())

    def join(self, timeout: float | None = None) -> None:
        """Wait for the reader thread (or the reactor) to be done with this connection."""
        if self._reader is not None:
            self._reader.join(timeout)
        elif self._reactor is not None:
            self._ended.wait(timeout)

    def _read_loop(self, deliver: _Deliver) -> None:
        try:
            while not self.closed:
                sock = self._sock
                if sock is None:
                    break
                try:
                    data = sock.recv(_RECV_SIZE)
                except TimeoutError:
                    continue
                if not data:
                    raise NsqConnectionError(f"nsqd {self.address} closed the connection")
                deliver.feed(data)
        except (OSError, NsqConnectionError) as e:
            if not self.closed:
                self.close_reason = e
        except BaseException as e:  # a callback failed: end the connection, report why
            log.exception("nsq reader for %s failed", self.address)
            self.close_reason = e
        finally:
            self.close()
            deliver.closed()

    # -- on a Reactor (one thread for many connections) -----------------------------------

    def _on_readable(self) -> bool:
        """Read what the socket has and deliver it; False once the connection has ended."""
        sock, deliver = self._sock, self._deliver
        if sock is None or deliver is None or self.closed:
            return False
        try:
            data = sock.recv(_RECV_SIZE)
            if not data:
                raise NsqConnectionError(f"nsqd {self.address} closed the connection")
            # TLS: a record already decrypted is not seen by select(); take it now.
            while isinstance(sock, ssl.SSLSocket) and (more := sock.pending()):
                data += sock.recv(more)
            deliver.feed(data)
        except (TimeoutError, ssl.SSLWantReadError):
            return True
        except (OSError, NsqConnectionError) as e:
            if not self.closed:
                self.close_reason = e
            return False
        except BaseException as e:  # a callback failed: end the connection, report why
            log.exception("nsq reader for %s failed", self.address)
            self.close_reason = e
            return False
        return not self.closed

    def _end(self) -> None:
        """The reactor has unregistered the socket: close it and report the close."""
        self.closed = True
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        deliver, self._deliver = self._deliver, None
        if deliver is not None:
            deliver.closed()
        self._ended.set()


class _Deliver:
    """Incremental parser of a subscribed connection's frames into message columns.

    Frames are parsed here directly (not through FrameReader) to build the columns without a
    Frame and a Message object per message: this is the consumer's hot path.
    """

    __slots__ = ("buf", "conn", "on_close", "on_error", "on_messages")

    def __init__(
        self,
        conn: Connection,
        on_messages: MessagesCallback | HeadersCallback,
        on_close: Callable[[Connection], None] | None,
        on_error: Callable[[Connection, NsqError], None] | None,
    ) -> None:
        self.conn = conn
        self.on_messages = on_messages
        self.on_close = on_close
        self.on_error = on_error
        self.buf = b""

    def feed(self, data: bytes) -> None:
        conn = self.conn
        unpack_head = _FRAME_HEAD.unpack_from
        unpack_msg = _MSG_HEAD.unpack_from
        buf = self.buf + data if self.buf else data
        end = len(buf)
        pos = 0
        ts_col: list[int] = []
        att_col: list[int] = []
        id_col: list[bytes] = []
        body_col: list[bytes] = []
        hdr_col: list[list[tuple[str, bytes]]] | None = [] if conn.options.headers else None
        while end - pos >= 8:
            size, ftype = unpack_head(buf, pos)
            if size < 4:
                raise NsqConnectionError(f"nsqd {conn.address}: bad frame size {size}")
            stop = pos + 4 + size
            if stop > end:
                break
            if ftype == FRAME_TYPE_MESSAGE:
                if size < 30:
                    raise NsqConnectionError(f"nsqd {conn.address}: short message frame")
                _, _, ts, attempts = unpack_msg(buf, pos)
                ts_col.append(ts)
                att_col.append(attempts)
                id_col.append(buf[pos + 18 : pos + 34])
                if hdr_col is None:
                    body_col.append(buf[pos + 34 : stop])
                else:  # [uint16 block length][block][body]
                    block_end = pos + 36 + int.from_bytes(buf[pos + 34 : pos + 36], "big")
                    try:
                        hdr_col.append(decode_headers(buf[pos + 36 : block_end]))
                    except HeaderError as bad:
                        raise NsqConnectionError(f"nsqd {conn.address}: {bad}") from None
                    body_col.append(buf[block_end:stop])
            elif ftype == FRAME_TYPE_RESPONSE:
                if buf[pos + 8 : stop] == HEARTBEAT:
                    conn._send(encode.nop())
                # other responses (CLOSE_WAIT) need no action
            elif ftype == FRAME_TYPE_ERROR:
                err = NsqError.from_frame(buf[pos + 8 : stop], conn.address)
                if self.on_error is not None:
                    self.on_error(conn, err)
                else:
                    log.warning("%s", err)
            pos = stop
        self.buf = buf[pos:] if pos < end else b""
        if id_col:
            if hdr_col is None:
                cast(MessagesCallback, self.on_messages)(conn, ts_col, att_col, id_col, body_col)
            else:
                cast(HeadersCallback, self.on_messages)(
                    conn, ts_col, att_col, id_col, body_col, hdr_col
                )

    def closed(self) -> None:
        if self.on_close is not None:
            self.on_close(self.conn)


class Reactor:
    """One thread that reads many subscribed connections (``selectors``), instead of a reader
    thread each: a consumer with 80 connections runs on one thread.

    Writes (RDY, FIN, TOUCH, REQ) still go straight out from the caller's thread. Callbacks run
    on the reactor's thread and must be quick.
    """

    def __init__(self, name: str = "nsq-reactor") -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._add: list[Connection] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, conn: Connection) -> None:
        with self._lock:
            if self._stopping:
                raise NsqConnectionError("the reactor is stopped", conn.address)
            self._add.append(conn)
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def stop(self, timeout: float | None = 5.0) -> None:
        """End every connection still registered and the thread."""
        with self._lock:
            self._stopping = True
        self.wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        sel = self._sel
        try:
            while True:
                with self._lock:
                    adds, self._add = self._add, []
                    stopping = self._stopping
                for conn in adds:
                    if conn._sock is None or conn.closed:
                        conn._end()
                    else:
                        sel.register(conn._sock, selectors.EVENT_READ, conn)
                if stopping:
                    break
                for key, _ in sel.select(1.0):
                    conn = key.data
                    if conn is None:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                        continue
                    if not conn._on_readable():
                        sel.unregister(key.fileobj)
                        conn._end()
        finally:
            for key in list(sel.get_map().values()):
                if key.data is not None:
                    sel.unregister(key.fileobj)
                    key.data._end()
            with self._lock:
                leftover, self._add = self._add, []
            for conn in leftover:
                conn._end()
            sel.close()
            self._wake_r.close()
            self._wake_w.close()
