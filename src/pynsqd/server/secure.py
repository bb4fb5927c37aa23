"""TLS, snappy, deflate and AUTH for a V2 client: the part of ClientV2 that is not the hot path.

Theory of operation. A plain connection has ``_rx`` and ``_stack`` set to None: data_received
feeds the parser directly and _flush writes directly (one branch each). Everything else hooks in
through those two attributes:

- Upgrade (after IDENTIFY, nsqd's order): the JSON reply is flushed in plaintext; bytes the
  parser buffered after IDENTIFY are taken back. With TLS, ``_rx`` feeds the handshake (those
  bytes first) while output waits in the stack; once it completes, ``OK`` goes out over TLS.
  Snappy or deflate are then stacked on top, and a compressed ``OK`` follows.
- AUTH and an expired authorization ask the auth server without blocking the loop: reading is
  paused, ``_rx`` holds any raw bytes still delivered, and the commands parsed after the one
  that waits are kept. The reply decides; then those commands run, in order, and the held bytes
  are fed on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..protocol.compression import (
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
    StreamError,
)
from ..protocol.errors import FatalClientError, ProtocolError
from ..protocol.frames import OK_FRAME, encode_response
from ..protocol.names import go_quote
from .auth import AuthError, AuthState
from .tls import TLSLayer, first_record_is_tls

if TYPE_CHECKING:
    from ..protocol.parser import V2Parser
    from .context import ConnectionContext

log = logging.getLogger("pynsqd")

#: nsqd's TLS handshake deadline.
HANDSHAKE_TIMEOUT = 5.0

Decoder = SnappyDecoder | DeflateDecoder
Encoder = SnappyEncoder | DeflateEncoder


class Suspend(Exception):
    """Raised by a handler that waits for the auth server; ``retry`` runs the command again."""

    def __init__(self, retry: bool) -> None:
        super().__init__()
        self.retry = retry


class Stack:
    """The layers between the socket and the parser: TLS, then snappy or deflate."""

    __slots__ = ("decoder", "encoder", "holding", "tls")

    def __init__(self) -> None:
        self.tls: TLSLayer | None = None
        self.decoder: Decoder | None = None
        self.encoder: Encoder | None = None
        #: output written while the TLS handshake is under way waits here
        self.holding: list[bytes] | None = None

    def encode(self, data: bytes) -> bytes:
        if self.holding is not None:
            self.holding.append(data)
            return b""
        if self.encoder is not None:
            data = self.encoder.encode(data)
        if self.tls is not None:
            data = self.tls.encode(data)
        return data


class SecureClient:
    """Mixin for ClientV2: upgrade after IDENTIFY, AUTH, and the matching /stats attributes."""

    if TYPE_CHECKING:
        nsqd: ConnectionContext
        loop: asyncio.AbstractEventLoop
        transport: asyncio.Transport | None
        parser: V2Parser
        remote_address: str
        closed: bool
        _out: list[bytes]
        _reading: bool
        _respond: bool

        def _run(self, events: list[Any]) -> None: ...
        def _flush(self) -> None: ...
        def _fatal(self, err: ProtocolError) -> None: ...
        def _process(self, data: bytes) -> None: ...

    def _init_secure(self) -> None:
        # /stats
        self.tls = False
        self.tls_version = ""
        self.tls_cipher_suite = ""
        # nsqd reports ALPN; no NSQ client negotiates it, so these stay empty, as with nsqd
        self.tls_negotiated_protocol = ""
        self.tls_negotiated_protocol_is_mutual = False
        self.tls_common_name = ""
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.auth_state: AuthState | None = None
        self.auth_secret = b""
        # plumbing
        self._rx: Callable[[bytes], None] | None = None
        self._stack: Stack | None = None
        self._tls_layer: TLSLayer | None = None
        self._after_tls: tuple[Decoder, Encoder] | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._first_tls_read = True
        self._held: bytearray | None = None
        self._saved_rx: Callable[[bytes], None] | None = None
        self._pending: list[Any] = []
        self._auth_task: asyncio.Task[AuthState] | None = None
        self._auth_fresh = False

    # -- /stats ---------------------------------------------------------------------------

    @property
    def authed(self) -> bool:
        return self.auth_state is not None and bool(self.auth_state.authorizations)

    @property
    def auth_identity(self) -> str:
        return self.auth_state.identity if self.auth_state is not None else ""

    @property
    def auth_identity_url(self) -> str:
        return self.auth_state.identity_url if self.auth_state is not None else ""

    def _close_secure(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if self._auth_task is not None:
            self._auth_task.cancel()
            self._auth_task = None

    # -- upgrade after IDENTIFY -----------------------------------------------------------

    def negotiate(self, tls_v1: bool, snappy: bool, deflate: bool) -> tuple[bool, bool, bool]:
        """What this IDENTIFY turns on: what the server offers and the client asks, once."""
        opts = self.nsqd.opts
        compressed = self.snappy or self.deflate
        tls_v1 = tls_v1 and self.nsqd.tls_context is not None and not self.tls and not compressed
        snappy = snappy and opts.snappy and not compressed
        return tls_v1, snappy, deflate and opts.deflate and not compressed

    def start_upgrade(self, tls_v1: bool, snappy: bool, deflate: bool, deflate_level: int) -> None:
        """Called by IDENTIFY once its reply is queued and an upgrade was negotiated."""
        self._flush()  # the IDENTIFY reply goes out as it is, before any upgrade
        leftover = self.parser.take_buffered()
        codec: tuple[Decoder, Encoder] | None = None
        if deflate:
            codec = (DeflateDecoder(), DeflateEncoder(deflate_level))
            self.deflate_level = deflate_level
        elif snappy:
            codec = (SnappyDecoder(), SnappyEncoder())
        if tls_v1:
            ctx = self.nsqd.tls_context
            assert ctx is not None
            self._tls_layer = TLSLayer(ctx)
            self._after_tls = codec
            stack = Stack()
            stack.holding = []
            self._stack = stack
            self._rx = self._handshake_received
            self._handshake_timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)
            if leftover:
                self._handshake_received(leftover)
            return
        if codec is not None:
            self._enable_compression(codec)
            self._codec_received(leftover)

    def _handshake_received(self, data: bytes) -> None:
        layer = self._tls_layer
        assert layer is not None
        if data and self._first_tls_read:
            self._first_tls_read = False
            if not first_record_is_tls(data):
                self._upgrade_failed("tls: first record does not look like a TLS handshake")
                return
        try:
            done = layer.handshake(data)
        except ssl.SSLError as err:
            self._upgrade_failed(str(err.reason or err), layer.take_outgoing())
            return
        out = layer.take_outgoing()
        if out and self.transport is not None:
            self.transport.write(out)
        if done:
            self._handshake_done(layer)

    def _handshake_timeout(self) -> None:
        self._handshake_timer = None
        self._upgrade_failed("tls: handshake timeout")

    def _upgrade_failed(self, reason: str, alert: bytes = b"") -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if alert and self.transport is not None:
            self.transport.write(alert)
        # As nsqd: the error goes out on the raw connection, which then closes.
        self._stack = None
        self._rx = self._discard
        self._fatal(FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {reason}"))

    def _discard(self, data: bytes) -> None:
        pass

    def _handshake_done(self, layer: TLSLayer) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        stack = self._stack
        assert stack is not None
        self.parser.tls = True
        self.tls = True
        self.tls_version = layer.version
        self.tls_cipher_suite = layer.cipher_suite
        self.tls_common_name = layer.common_name
        log.info(
            "PROTOCOL(V2): [%s] upgraded to %s (%s)",
            self.remote_address,
            self.tls_version,
            self.tls_cipher_suite,
        )
        held = stack.holding or []
        stack.holding = None
        stack.tls = layer
        # OK over TLS first; what waited during the handshake (heartbeats) after it.
        self._out[:0] = [OK_FRAME, *held]
        self._flush()
        self._rx = self._decode_received
        if self._after_tls is not None:
            self._enable_compression(self._after_tls)
            self._after_tls = None
        self._decode_received(b"")  # application data that came with the client's Finished

    def _enable_compression(self, codec: tuple[Decoder, Encoder]) -> None:
        stack = self._stack
        if stack is None:
            stack = self._stack = Stack()
        self._flush()
        stack.decoder, stack.encoder = codec
        if isinstance(codec[0], SnappyDecoder):
            self.snappy = True
        else:
            self.deflate = True
        self._out.append(OK_FRAME)  # the first compressed frame
        self._flush()
        if self._rx is None:
            self._rx = self._decode_received

    # -- input through the stack ----------------------------------------------------------

    def _decode_received(self, data: bytes) -> None:
        stack = self._stack
        assert stack is not None
        layer = stack.tls
        if layer is not None:
            try:
                data = layer.decode(data)
            except ssl.SSLError as err:
                self._stream_failed(f"tls: {err.reason or err}")
                return
            out = layer.take_outgoing()
            if out and self.transport is not None:
                self.transport.write(out)
            if layer.eof:
                self._codec_received(data)
                if self.transport is not None and not self.closed:
                    self._flush()
                    self.transport.close()
                return
        self._codec_received(data)

    def _codec_received(self, data: bytes) -> None:
        stack = self._stack
        decoder = stack.decoder if stack is not None else None
        if decoder is None:
            if data:
                self._process(data)
            return
        try:
            plain = decoder.decode(data)
        except StreamError as err:
            self._stream_failed(str(err))
            return
        if plain:
            self._process(plain)
        # A small deflate input can hold a lot: one bounded piece per loop turn, with reading
        # paused meanwhile, so that other clients are served in between.
        more = type(decoder) is DeflateDecoder and decoder.more
        if more and not self.closed and self._held is None:
            self._suspend()
            self.loop.call_soon(self._resume)

    def _stream_failed(self, reason: str) -> None:
        # nsqd: "failed to read command - <err>", logged; the connection closes with no reply.
        log.error("PROTOCOL(V2): [%s] failed to read command - %s", self.remote_address, reason)
        self._rx = self._discard
        if self.transport is not None:
            self._flush()
            self.transport.close()

    # -- waiting for the auth server ------------------------------------------------------

    def _hold(self, data: bytes) -> None:
        assert self._held is not None
        self._held += data

    def _suspend(self) -> None:
        if self._held is None:
            self._held = bytearray()
            self._saved_rx = self._rx
            self._rx = self._hold
        if self.transport is not None:
            self.transport.pause_reading()

    def _resume(self) -> None:
        pending, self._pending = self._pending, []
        held, self._held = self._held, None
        self._rx, self._saved_rx = self._saved_rx, None
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        self.transport.resume_reading()
        self._reading = True
        try:
            self._run(pending)
        finally:
            self._reading = False
        self._respond = False
        self._flush()
        if self._held is not None:  # waiting again: what was held stays in front
            if held:
                self._held[:0] = held
            return
        if self.closed:
            return
        if self._rx is not None:
            self._rx(bytes(held or b""))
        elif held:
            self._process(bytes(held))

    def _query_auth(self, done: Callable[[asyncio.Task[AuthState]], None]) -> None:
        auth = self.nsqd.auth
        assert auth is not None
        remote_ip = ""
        if self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            if isinstance(peer, tuple):
                remote_ip = str(peer[0])
        self._suspend()
        task = self.loop.create_task(
            auth.query_any(remote_ip, self.tls, self.tls_common_name, self.auth_secret)
        )
        self._auth_task = task
        task.add_done_callback(done)

    def _auth_result(self, task: asyncio.Task[AuthState]) -> AuthState | None:
        self._auth_task = None
        if self.closed or task.cancelled():
            return None
        err = task.exception()
        if err is None:
            return task.result()
        if isinstance(err, AuthError):
            log.warning("PROTOCOL(V2): [%s] AUTH failed %s", self.remote_address, err)
        else:
            log.error("PROTOCOL(V2): [%s] AUTH failed", self.remote_address, exc_info=err)
        # Never the auth server's details: they are for the log.
        self._fatal(FatalClientError("E_AUTH_FAILED", "AUTH failed"))
        return None

    def start_auth(self, secret: bytes) -> None:
        """The AUTH command, after the parser's checks; raises Suspend while the server is asked."""
        if self.authed:
            raise FatalClientError("E_INVALID", "AUTH already set")
        if self.nsqd.auth is None:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        self.auth_secret = secret
        self._query_auth(self._auth_replied)
        raise Suspend(False)

    def _auth_replied(self, task: asyncio.Task[AuthState]) -> None:
        state = self._auth_result(task)
        if state is None:
            return
        self.auth_state = state
        if not state.authorizations:
            self._fatal(FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found"))
            return
        body = json.dumps(
            {
                "identity": state.identity,
                "identity_url": state.identity_url,
                "permission_count": len(state.authorizations),
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )
        body = body.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        self._out.append(encode_response(body.encode()))
        self._resume()

    def check_auth(self, cmd: str, topic: str, channel: str) -> None:
        """nsqd's CheckAuth for PUB, MPUB, DPUB and SUB (only called when auth is enabled)."""
        state = self.auth_state
        if self._auth_fresh:
            # The command that waited for a re-query: its answer decides, as in nsqd.
            self._auth_fresh = False
        else:
            if state is None or not state.authorizations:
                raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
            if state.is_expired():
                self._query_auth(self._auth_refreshed)
                raise Suspend(True)
        if state is None or not state.is_allowed(topic, channel):
            raise FatalClientError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {cmd} on {go_quote(topic.encode())} {go_quote(channel.encode())}",
            )

    def _auth_refreshed(self, task: asyncio.Task[AuthState]) -> None:
        state = self._auth_result(task)
        if state is None:
            return
        self.auth_state = state
        self._auth_fresh = True
        self._resume()
