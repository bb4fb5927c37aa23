"""One client connection speaking NSQ V2: a thin asyncio.Protocol over the sans-IO parts.

Theory of operation. Bytes from the socket go through the connection's ``Pipeline`` of byte
transforms (none on a plain connection; TLS, then snappy or deflate, after an IDENTIFY that
negotiates them; see transforms.py), then the parser, whose commands join one event queue. One
drain loop, ``_drain``, runs the queued commands in order, each by the handler named after the
wire command (``PUB``, ``SUB``, ...), until the queue is empty or the connection pauses:

- ``UPGRADE``: after an IDENTIFY that negotiated TLS, until the handshake is done. The parser
  stopped after IDENTIFY (h11's PAUSED); what it buffered is taken back and fed to the
  handshake. No command runs and no output is written until the handshake is done.
- ``AUTH``: while the auth server is asked (AUTH, or an expired authorization before PUB/SUB).
  Reading is paused; raw bytes still delivered are held and fed on when the reply comes.
- ``INFLATE``: deflate had more output than one bounded piece; the rest comes a loop turn
  later, so that other clients are served in between.

Each pause ends in ``_resume``, which drains the queue again: there is no recursion and no
control-flow exception. Everything sent is appended to one output list and written, through the
pipeline, with a single ``transport.write``: responses and errors at the end of each input,
message frames when the client stops being ready, when ``output_buffer_size`` bytes are buffered,
or ``FLUSH_DELAY`` (0.2 ms, or ``output_buffer_timeout`` if shorter) after the first of them:
a lone message is not held for the whole ``output_buffer_timeout``, and a burst is still one
write. uvloop's timers count whole milliseconds and run a shorter delay at the next turn of the
event loop, after the input already waiting has been read. A
fatal error is written and the connection closed; non-fatal ones (E_FIN_FAILED, E_REQ_FAILED,
E_TOUCH_FAILED) are written and the connection goes on.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .. import NSQD_VERSION
from ..core.channel import Channel
from ..core.errors import (
    AlreadyDeferred,
    ChannelError,
    Exiting,
    NotInFlight,
    NotOwner,
    QueueFull,
    TooManyConsumers,
)
from ..core.message import Message
from ..internal.gotext import go_json
from ..internal.names import go_quote
from ..protocol.commands import (
    Auth,
    ClientState,
    Cls,
    Dpub,
    Fin,
    Identify,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
)
from ..protocol.errors import ClientError, FatalClientError, ProtocolError
from ..protocol.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_MESSAGE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    encode_error,
    encode_response,
)
from ..protocol.parser import Event, V2Parser
from .auth import AuthError, AuthState
from .transforms import (
    DeflateTransform,
    Pipeline,
    SnappyTransform,
    TLSTransform,
    Transform,
    TransformError,
)

if TYPE_CHECKING:
    from .context import ConnectionContext

log = logging.getLogger("pynsqd")

_MSG_HEADER = struct.Struct(">llqH")
#: Transport buffer limits: past ``_HIGH`` unsent bytes a consumer gets no more messages.
_HIGH_WATER = 4 * 1024 * 1024
#: The longest a buffered message frame waits for more (when output_buffer_timeout is longer):
#: long enough for a burst to share one write, short enough that a lone message is not late.
FLUSH_DELAY = 0.0002
_LOW_WATER = 1024 * 1024
#: nsqd's TLS handshake deadline.
HANDSHAKE_TIMEOUT = 5.0


class Pause(enum.Enum):
    """Why the drain loop is stopped (see the module docstring)."""

    UPGRADE = "upgrade"
    AUTH = "auth"
    INFLATE = "inflate"


class ClientV2(asyncio.Protocol):
    """A V2 client: its negotiated settings, RDY and in-flight counts, and its command handlers."""

    def __init__(self, nsqd: ConnectionContext) -> None:
        self.nsqd = nsqd
        self.loop = nsqd.loop
        opts = nsqd.opts
        self.id = nsqd.next_client_id()
        self.parser = V2Parser(nsqd.protocol_config)
        self._poke = nsqd.busy_poll.poke
        self.transport: asyncio.Transport | None = None
        # -- what /stats reports ----------------------------------------------------------
        self.remote_address = ""
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.topology_zone = ""
        self.topology_region = ""
        self.connect_ts = int(time.time())
        self.heartbeat_interval = nsqd.protocol_config.heartbeat_interval_ms / 1000
        self.msg_timeout: float = opts.msg_timeout
        self.output_buffer_size = nsqd.protocol_config.output_buffer_size
        self.output_buffer_timeout: float = opts.output_buffer_timeout
        self.sample_rate = 0
        self.rdy = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
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
        # -- for the channel --------------------------------------------------------------
        self.channel: Channel | None = None
        self.write_paused = False
        #: The connection is closing or closed: nothing more is read or run.
        self.closed = False
        # -- input: pipeline, event queue, pause --------------------------------------------
        self.pipeline: Pipeline | None = None  # None: a plain connection (the fast path)
        self._queue: deque[Event] = deque()
        self._paused: Pause | None = None
        #: Raw bytes delivered while paused for AUTH or INFLATE; fed on when it resumes.
        self._held = bytearray()
        self._upgrading: TLSTransform | None = None
        self._after_tls: Transform | None = None  # compression negotiated with TLS
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._auth_task: asyncio.Task[AuthState] | None = None
        self._auth_fresh = False  # the retried command's authorization was just fetched
        self._last_read = 0.0
        # -- output ------------------------------------------------------------------------
        self._out: list[bytes] = []
        self._out_bytes = 0
        #: A response or error is queued: written when the current input has been run.
        self._respond = False
        self._flush_pending = False
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._buffer_timer: asyncio.TimerHandle | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            Fin: self.FIN,
            Pub: self.PUB,
            Mpub: self.MPUB,
            Dpub: self.DPUB,
            Rdy: self.RDY,
            Req: self.REQ,
            Touch: self.TOUCH,
            Sub: self.SUB,
            Cls: self.CLS,
            Nop: self.NOP,
            Identify: self.IDENTIFY,
            Auth: self.AUTH,
        }

    # -- connection lifecycle -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=_HIGH_WATER, low=_LOW_WATER)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host = peer[0]
            self.remote_address = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
            self.client_id = self.hostname = host
        else:
            self.remote_address = str(peer or "")
        self._last_read = self.loop.time()
        self._arm_heartbeat()
        self.nsqd.add_client(self)
        log.info("TCP: new client(%s)", self.remote_address)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in (self._heartbeat_timer, self._buffer_timer, self._handshake_timer):
            if timer is not None:
                timer.cancel()
        if self._auth_task is not None:
            self._auth_task.cancel()
            self._auth_task = None
        if self.channel is not None:
            self.channel.remove_client(self)
        self.nsqd.remove_client(self)
        log.info("PROTOCOL(V2): [%s] exiting ioloop", self.remote_address)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.channel is not None:
            self.channel.schedule_pump()

    def abort(self) -> None:
        """Close now, dropping unsent output (shutdown, for a client that does not read)."""
        if self.transport is not None:
            self.transport.abort()

    def close_for_exit(self) -> None:
        """The channel or nsqd is going away: flush and close."""
        self._close()

    def _close(self) -> None:
        self.closed = True
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    # -- input ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        paused = self._paused
        if paused is None:
            if self.pipeline is None:  # the hot path: a plain connection
                self._parse(data)
                self._drain()
            else:
                self._input(data)
        elif paused is Pause.UPGRADE:
            self._handshake(data)
        else:
            self._held += data  # reading is paused: these few bytes wait for the resume
            return
        if self._respond:
            # Responses to this read go out now, in one write, rather than a loop turn later.
            self._flush()
        self._poke()

    def _input(self, data: bytes) -> None:
        """Bytes from the socket through the pipeline into the queue, which is then drained."""
        pipeline = self.pipeline
        if pipeline is not None:
            try:
                data = pipeline.feed(data)
            except TransformError as err:
                self._stream_failed(err)
                return
            out = pipeline.outgoing()
            if out and self.transport is not None:
                self.transport.write(out)
            if pipeline.eof:  # TLS close_notify: run what came with it, then close
                self._parse(data)
                self._drain()
                self._close()
                return
        self._parse(data)
        self._drain()
        if pipeline is not None and pipeline.more and self._paused is None and not self.closed:
            # A small deflate input can hold a lot: one bounded piece per loop turn.
            self._pause(Pause.INFLATE)
            self.loop.call_soon(self._resume)

    def _parse(self, data: bytes) -> None:
        events = self.parser.receive(data)
        if events:
            # nsqd's read deadline restarts with each command: bytes trickling into a
            # half-sent command do not keep a connection alive.
            self._last_read = self.loop.time()
            self._queue.extend(events)

    def _drain(self) -> None:
        """The one loop: run queued commands in order until none is left or the connection
        pauses. The parser stops after each IDENTIFY; unless that IDENTIFY paused the
        connection for an upgrade, parsing goes on here, so any number of pipelined IDENTIFYs
        never recurse."""
        queue = self._queue
        parser = self.parser
        handlers = self._handlers
        debug = log.isEnabledFor(logging.DEBUG)  # once per input: free when not debugging
        while self._paused is None and not self.closed:
            if not queue:
                if not parser.paused:
                    return
                events = parser.receive(b"")
                if not events:
                    return
                queue.extend(events)
            ev = queue.popleft()
            if debug:
                log.debug("PROTOCOL(V2): [%s] %s", self.remote_address, _describe(ev))
            try:
                if isinstance(ev, ProtocolError):
                    raise ev
                handlers[type(ev)](ev)
            except ClientError as err:
                log.info("PROTOCOL(V2): [%s] %s", self.remote_address, err)
                self._send_frame(encode_error(err.wire))
            except ProtocolError as err:  # FatalClientError and the parser's own
                self._fatal(err)
            except Exception:  # a bug: log it here, never send a traceback to the client
                log.exception("PROTOCOL(V2): [%s] internal error", self.remote_address)
                self._fatal(FatalClientError("E_INVALID", "internal error"))

    def _pause(self, why: Pause) -> None:
        self._paused = why
        # The handshake needs the client's bytes; the other pauses stop reading.
        if why is not Pause.UPGRADE and self.transport is not None:
            self.transport.pause_reading()

    def _resume(self) -> None:
        """A pause ended: run what is queued, then feed on what was held back."""
        paused, self._paused = self._paused, None
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        if paused is not Pause.UPGRADE:
            self.transport.resume_reading()
        held, self._held = self._held, bytearray()
        self._drain()
        if self._paused is not None:  # paused again: what was held stays in front
            self._held[:0] = held
        elif not self.closed and (held or (self.pipeline is not None and self.pipeline.more)):
            self._input(bytes(held))
        if self._respond:
            self._flush()

    def _fatal(self, err: ProtocolError) -> None:
        log.error("PROTOCOL(V2): [%s] - %s", self.remote_address, err)
        self._out.append(encode_error(err.wire))
        self._close()

    def _stream_failed(self, err: TransformError) -> None:
        # nsqd: "failed to read command - <err>", logged; the connection closes with no reply.
        log.error("PROTOCOL(V2): [%s] failed to read command - %s", self.remote_address, err)
        self._out.clear()  # a broken TLS stream cannot encode them
        self._out_bytes = 0
        if err.alert and self.transport is not None:
            self.transport.write(err.alert)
        self._close()

    # -- upgrade after IDENTIFY -----------------------------------------------------------

    def _negotiate(self, tls_v1: bool, snappy: bool, deflate: bool) -> tuple[bool, bool, bool]:
        """What this IDENTIFY turns on: what the server offers and the client asks, once."""
        opts = self.nsqd.opts
        compressed = self.snappy or self.deflate
        tls_v1 = tls_v1 and self.nsqd.tls_context is not None and not self.tls and not compressed
        snappy = snappy and opts.snappy and not compressed
        return tls_v1, snappy, deflate and opts.deflate and not compressed

    def _upgrade(self, tls_v1: bool, codec: Transform | None) -> None:
        """IDENTIFY negotiated TLS and/or compression; its reply is queued."""
        self._flush()  # the IDENTIFY reply goes out as it is, before any upgrade
        # Bytes the client sent after IDENTIFY belong to the new layer (the ClientHello, or
        # compressed commands): the parser stopped there and hands them back.
        leftover = self.parser.take_buffered()
        if self.pipeline is None:
            self.pipeline = Pipeline()
        if tls_v1:
            ctx = self.nsqd.tls_context
            assert ctx is not None
            stage = TLSTransform(ctx)
            self.pipeline.push(stage)
            self._upgrading = stage
            self._after_tls = codec
            self._pause(Pause.UPGRADE)
            self._handshake_timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)
            # (The handshake cannot complete on these alone: the server has not answered yet.)
            self._handshake(leftover)
        elif codec is not None:
            self._compress(codec)
            try:
                self._parse(codec.feed(leftover))
            except TransformError as err:
                self._stream_failed(err)

    def _handshake(self, data: bytes) -> None:
        stage = self._upgrading
        assert stage is not None
        try:
            stage.feed(data)
        except TransformError as err:
            self._upgrade_failed(err.reason, err.alert)
            return
        out = stage.outgoing()
        if out and self.transport is not None:
            self.transport.write(out)
        if stage.ready:
            self._upgraded(stage)

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
        self.pipeline = None
        self._upgrading = None
        self._paused = None
        self._fatal(FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {reason}"))

    def _upgraded(self, stage: TLSTransform) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._upgrading = None
        layer = stage.layer
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
        self._paused = None
        # OK over TLS first; what waited during the handshake (heartbeats) after it.
        self._out.insert(0, OK_FRAME)
        self._flush()
        if self._after_tls is not None:
            self._compress(self._after_tls)
            self._after_tls = None
        self._input(b"")  # application data that came with the client's Finished

    def _compress(self, codec: Transform) -> None:
        assert self.pipeline is not None
        self._flush()  # what is queued goes out as it was
        self.pipeline.push(codec)
        if isinstance(codec, DeflateTransform):
            self.deflate = True
            self.deflate_level = codec.level
        else:
            self.snappy = True
        self._out.append(OK_FRAME)  # the first compressed frame
        self._flush()

    # -- output ---------------------------------------------------------------------------

    def _send_frame(self, frame: bytes) -> None:
        """A response or error: written once the current input has been run."""
        self._out.append(frame)
        self._respond = True

    def send_messages(self, msgs: list[Message]) -> None:
        """Buffer message frames; nsqd's pump rules decide when they are written."""
        out = self._out
        pack = _MSG_HEADER.pack
        size = 0
        for m in msgs:
            body = m.body
            out += (pack(len(body) + 30, FRAME_TYPE_MESSAGE, m.timestamp, m.attempts), m.id, body)
            size += len(body)
        self._out_bytes += size + 34 * len(msgs)
        self.message_count += len(msgs)
        if (
            self._out_bytes >= self.output_buffer_size
            or self.in_flight_count >= self.rdy
            or not self.output_buffer_timeout
        ):
            self._flush_soon()
        elif self._buffer_timer is None:
            # output_buffer_timeout is an upper bound, not a wait (README, "Differences from
            # nsqd"): a lone message goes out within FLUSH_DELAY, while what the channels hand
            # this client meanwhile (a burst, several loop turns under load) is one write.
            self._buffer_timer = self.loop.call_later(
                min(self.output_buffer_timeout, FLUSH_DELAY), self._flush
            )

    def _flush_soon(self) -> None:
        if self._out and not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

    def output_room(self) -> int:
        """For the channel: body bytes this client may still be handed. What is buffered here
        and in the transport counts, so a client that does not read pins at most about
        ``_HIGH_WATER`` (plus one message), whatever its RDY."""
        transport = self.transport
        if transport is None or self.closed:
            return 0
        return _HIGH_WATER - self._out_bytes - transport.get_write_buffer_size()

    def _flush(self) -> None:
        self._flush_pending = False
        self._respond = False
        if self._buffer_timer is not None:
            self._buffer_timer.cancel()
            self._buffer_timer = None
        if self._paused is Pause.UPGRADE:
            return  # output waits for the handshake: OK over TLS goes first
        out = self._out
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            if self.pipeline is None:
                transport.write(b"".join(out))
            else:
                transport.write(self.pipeline.encode(b"".join(out)))
            if (
                self._out_bytes >= _LOW_WATER
                and self.channel is not None
                and self.in_flight_count < self.rdy
            ):
                # It may have been passed over for lack of room: the bytes have left this
                # buffer (pause_writing/resume_writing cover the transport's).
                self.channel.schedule_pump()
        out.clear()
        self._out_bytes = 0

    # -- heartbeats -----------------------------------------------------------------------

    def _arm_heartbeat(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        if self.heartbeat_interval > 0:
            self._heartbeat_timer = self.loop.call_later(self.heartbeat_interval, self._heartbeat)

    def _heartbeat(self) -> None:
        self._heartbeat_timer = None
        interval = self.heartbeat_interval
        now = self.loop.time()
        if now - self._last_read >= 2 * interval:
            # nsqd's read deadline: no command for two intervals closes the connection.
            log.error(
                "PROTOCOL(V2): [%s] failed to read command - i/o timeout", self.remote_address
            )
            self._close()
            return
        self._out.append(HEARTBEAT_FRAME)
        self._flush()
        wake = min(interval, self._last_read + 2 * interval - now)
        self._heartbeat_timer = self.loop.call_later(max(wake, 0.001), self._heartbeat)

    # -- commands, named as on the wire ---------------------------------------------------

    def IDENTIFY(self, cmd: Identify) -> None:
        d = cmd.data
        self.client_id = d.client_id
        self.hostname = d.hostname
        self.user_agent = d.user_agent
        self.topology_zone = d.topology_zone
        self.topology_region = d.topology_region
        if log.isEnabledFor(logging.DEBUG):
            log.debug("PROTOCOL(V2): [%s] IDENTIFY %s", self.remote_address, dict(d._asdict()))
        self.heartbeat_interval = d.heartbeat_interval_ms / 1000
        self.output_buffer_size = d.output_buffer_size
        self.output_buffer_timeout = d.output_buffer_timeout_ms / 1000
        self.sample_rate = d.sample_rate
        self.msg_timeout = d.msg_timeout_ms / 1000
        self._arm_heartbeat()
        if not d.feature_negotiation:
            self._send_frame(OK_FRAME)
        else:
            cfg = self.nsqd.protocol_config
            opts = self.nsqd.opts
            tls_v1, snappy, deflate = self._negotiate(d.tls_v1, d.snappy, d.deflate)
            if deflate and snappy:
                raise FatalClientError(
                    "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
                )
            # nsqd's effective level: the client's if it negotiates deflate, else 6; capped.
            deflate_level = d.deflate_level if deflate and d.deflate_level > 0 else 6
            deflate_level = min(deflate_level, opts.max_deflate_level)
            resp = {
                "max_rdy_count": cfg.max_rdy_count,
                "version": NSQD_VERSION,
                "max_msg_timeout": cfg.max_msg_timeout_ms,
                "msg_timeout": d.msg_timeout_ms,
                "tls_v1": tls_v1,
                "deflate": deflate,
                "deflate_level": deflate_level,
                "max_deflate_level": opts.max_deflate_level,
                "snappy": snappy,
                "sample_rate": d.sample_rate,
                "auth_required": self.nsqd.auth is not None,
                "output_buffer_size": d.output_buffer_size,
                "output_buffer_timeout": d.output_buffer_timeout_ms,
            }
            self._send_frame(encode_response(json.dumps(resp, separators=(",", ":")).encode()))
            codec: Transform | None = None
            if deflate:
                codec = DeflateTransform(deflate_level)
            elif snappy:
                codec = SnappyTransform()
            if tls_v1 or codec is not None:
                self._upgrade(tls_v1, codec)

    def SUB(self, cmd: Sub) -> None:
        if self.nsqd.auth is not None and not self._authorized("SUB", cmd.topic, cmd.channel, cmd):
            return
        topic = self.nsqd.get_topic(cmd.topic)
        channel = topic.get_channel(cmd.channel)
        try:
            channel.add_client(self)
        except ChannelError as err:
            raise channel_error("SUB", err, b"") from None
        self.channel = channel
        log.debug(
            "PROTOCOL(V2): [%s] state change to SUBSCRIBED on %s:%s",
            self.remote_address,
            cmd.topic,
            cmd.channel,
        )
        self._send_frame(OK_FRAME)

    def RDY(self, cmd: Rdy) -> None:
        self.rdy = cmd.ready_count
        if self.channel is not None:
            if self.in_flight_count >= self.rdy:
                self._flush_soon()
            else:
                self.channel.schedule_pump()

    def FIN(self, cmd: Fin) -> None:
        assert self.channel is not None
        err = self.channel.finish_many(self, cmd.ids)
        if err is not None:
            raise channel_error("FIN", err, b"")

    def REQ(self, cmd: Req) -> None:
        assert self.channel is not None
        if cmd.timeout_ms != cmd.requested_ms:
            log.info(
                "PROTOCOL(V2): [%s] REQ timeout %d out of range 0-%d. Setting to %d",
                self.remote_address,
                cmd.requested_ms,
                self.nsqd.protocol_config.max_req_timeout_ms,
                cmd.timeout_ms,
            )
        try:
            self.channel.requeue(self, cmd.id, cmd.timeout_ms / 1000)
        except ChannelError as err:
            raise channel_error("REQ", err, cmd.id) from None

    def TOUCH(self, cmd: Touch) -> None:
        assert self.channel is not None
        try:
            self.channel.touch(self, cmd.id)
        except ChannelError as err:
            raise channel_error("TOUCH", err, cmd.id) from None

    def CLS(self, cmd: Cls) -> None:
        self.rdy = 0
        self._send_frame(CLOSE_WAIT_FRAME)

    def NOP(self, cmd: Nop) -> None:
        pass

    def _publish(self, cmd: str, topic_name: str, bodies: list[bytes], defer_ms: int = 0) -> None:
        topic = self.nsqd.get_topic(topic_name)
        if topic.exiting:
            raise FatalClientError(f"E_{cmd}_FAILED", f"{cmd} failed exiting")
        try:
            topic.put_bodies(bodies, defer_ms)
        except OSError as err:
            self.nsqd.set_health_error(err)
            raise FatalClientError(f"E_{cmd}_FAILED", f"{cmd} failed {err}") from err
        except QueueFull as err:  # pynsqd: a bounded queue pushes back on its producers
            raise FatalClientError(f"E_{cmd}_FAILED", f"{cmd} failed {err}") from err
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)
        self._send_frame(OK_FRAME)

    def PUB(self, cmd: Pub) -> None:
        if self.nsqd.auth is not None and not self._authorized("PUB", cmd.topic, "", cmd):
            return
        self._publish("PUB", cmd.topic, [cmd.body])

    def MPUB(self, cmd: Mpub) -> None:
        if self.nsqd.auth is not None and not self._authorized("MPUB", cmd.topic, "", cmd):
            return
        self._publish("MPUB", cmd.topic, cmd.bodies)

    def DPUB(self, cmd: Dpub) -> None:
        if self.nsqd.auth is not None and not self._authorized("DPUB", cmd.topic, "", cmd):
            return
        self._publish("DPUB", cmd.topic, [cmd.body], cmd.defer_ms)

    # -- AUTH: asking the auth server without blocking the loop ----------------------------

    def AUTH(self, cmd: Auth) -> None:
        if self.authed:
            raise FatalClientError("E_INVALID", "AUTH already set")
        if self.nsqd.auth is None:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        self.auth_secret = cmd.secret
        self._ask_auth(self._auth_replied)

    def _authorized(self, name: str, topic: str, channel: str, cmd: Event) -> bool:
        """nsqd's CheckAuth for PUB, MPUB, DPUB and SUB (only called when auth is enabled).

        False: the authorization expired and the server is asked again; ``cmd`` goes back to
        the front of the queue and runs again when it has answered."""
        state = self.auth_state
        if self._auth_fresh:
            # The command that waited for a re-query: its answer decides, as in nsqd.
            self._auth_fresh = False
        else:
            if state is None or not state.authorizations:
                raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {name}")
            if state.is_expired():
                self._queue.appendleft(cmd)
                self._ask_auth(self._auth_refreshed)
                return False
        if state is None or not state.is_allowed(topic, channel):
            where = f"{go_quote(topic.encode())} {go_quote(channel.encode())}"
            raise FatalClientError("E_UNAUTHORIZED", f"AUTH failed for {name} on {where}")
        return True

    def _ask_auth(self, done: Callable[[asyncio.Task[AuthState]], None]) -> None:
        auth = self.nsqd.auth
        assert auth is not None
        remote_ip = ""
        if self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            if isinstance(peer, tuple):
                remote_ip = str(peer[0])
        self._pause(Pause.AUTH)
        task = self.loop.create_task(
            auth.query_any(remote_ip, self.tls, self.tls_common_name, self.auth_secret)
        )
        self._auth_task = task
        task.add_done_callback(done)

    def _auth_answer(self, task: asyncio.Task[AuthState]) -> AuthState | None:
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

    def _auth_replied(self, task: asyncio.Task[AuthState]) -> None:
        state = self._auth_answer(task)
        if state is None:
            return
        self.auth_state = state
        if not state.authorizations:
            self._fatal(FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found"))
            return
        body = go_json(
            {
                "identity": state.identity,
                "identity_url": state.identity_url,
                "permission_count": len(state.authorizations),
            }
        )
        self._send_frame(encode_response(body))
        self._resume()

    def _auth_refreshed(self, task: asyncio.Task[AuthState]) -> None:
        state = self._auth_answer(task)
        if state is None:
            return
        self.auth_state = state
        self._auth_fresh = True
        self._resume()

    # -- for the channel and /stats -------------------------------------------------------

    def messages_timed_out(self, n: int) -> None:
        # nsqd's TimedOutMessage only lowers the in-flight count, which the channel did.
        pass

    @property
    def state(self) -> ClientState:
        return self.parser.state

    @property
    def authed(self) -> bool:
        return self.auth_state is not None and bool(self.auth_state.authorizations)

    @property
    def auth_identity(self) -> str:
        return self.auth_state.identity if self.auth_state is not None else ""

    @property
    def auth_identity_url(self) -> str:
        return self.auth_state.identity_url if self.auth_state is not None else ""


def _describe(ev: object) -> str:
    """A command as nsqd's debug line shows it: its name and parameters, never a body."""
    if isinstance(ev, ProtocolError):
        return str(ev)
    name = type(ev).__name__.upper()
    if not isinstance(ev, tuple):
        return name
    fields: dict[str, object] = cast(Any, ev)._asdict()  # every command is a NamedTuple
    shown = [
        str(v)
        for k, v in fields.items()
        if k not in ("body", "bodies", "data", "secret") and not isinstance(v, bytes | list)
    ]
    return " ".join([name, *shown])


def channel_error(cmd: str, err: ChannelError, msg_id: bytes) -> ProtocolError:
    """The channel's refusal as nsqd words it: the one place where core errors become ``E_*``.

    FIN, REQ and TOUCH failures are non-fatal (``ClientError``); SUB's close the connection.
    """
    if isinstance(err, NotInFlight | NotOwner | AlreadyDeferred):
        msg_id = err.msg_id
    mid = msg_id.decode("ascii", "replace")
    if isinstance(err, NotInFlight):
        return ClientError(f"E_{cmd}_FAILED", f"{cmd} {mid} failed ID not in flight")
    if isinstance(err, NotOwner):
        return ClientError(f"E_{cmd}_FAILED", f"{cmd} {mid} failed client does not own message")
    if isinstance(err, AlreadyDeferred):
        return ClientError(f"E_{cmd}_FAILED", f"{cmd} {mid} failed ID already deferred")
    if isinstance(err, TooManyConsumers):
        return FatalClientError(
            "E_SUB_FAILED",
            f"SUB failed consumers for {err.topic}:{err.channel} exceeds limit of {err.limit}",
        )
    if isinstance(err, Exiting):
        if cmd == "SUB":
            return FatalClientError("E_SUB_FAILED", "SUB failed exiting")
        return ClientError(f"E_{cmd}_FAILED", f"{cmd} {mid} failed exiting")
    return FatalClientError("E_INVALID", f"{cmd} failed")
