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
import logging
import typing
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..core.channel import Channel
from ..core.errors import (
    AlreadyDeferred,
    ChannelError,
    Exiting,
    NotInFlight,
    NotOwner,
    TooManyConsumers,
)
from ..core.message import Message
from ..protocol import commands
from ..protocol.errors import ClientError, FatalClientError, ProtocolError
from ..protocol.frames import (
    CLOSE_WAIT_FRAME,
    HEARTBEAT_FRAME,
    OK_FRAME,
    append_message_frames,
    append_message_frames_with_headers,
    encode_error,
    encode_response,
)
from ..protocol.parser import Event, V2Parser
from .auth_session import AuthSession
from .client_v2 import ClientV2State, Pause
from .publishing import Publishing
from .transforms import Pipeline, TransformError
from .upgrade import Upgrade

if TYPE_CHECKING:
    from ..protocol.identify import ProtocolConfig
    from .context import ConnectionContext

log = logging.getLogger("pynsqd")

#: Transport buffer limits: past ``_HIGH`` unsent bytes a consumer gets no more messages.
_HIGH_WATER = 4 * 1024 * 1024
#: The longest a buffered message frame waits for more (when output_buffer_timeout is longer):
#: long enough for a burst to share one write, short enough that a lone message is not late.
FLUSH_DELAY = 0.0002
_LOW_WATER = 1024 * 1024


#: The commands a connection runs, each by the handler named after it on the wire.
COMMANDS = typing.get_args(commands.Command)


class Heartbeat:
    """nsqd's heartbeat for one connection: a heartbeat frame every ``heartbeat_interval``,
    and its read deadline: no command for two intervals closes the connection."""

    def __init__(self, conn: ClientV2) -> None:
        self.conn = conn
        self.timer: asyncio.TimerHandle | None = None
        #: When the last command came (the parser's ``receive`` found one).
        self.last_read = 0.0

    def arm(self) -> None:
        """Start over (a connection made, an IDENTIFY that set the interval)."""
        conn = self.conn
        self.last_read = conn.loop.time()
        self.cancel()
        if conn.heartbeat_interval > 0:
            self.timer = conn.loop.call_later(conn.heartbeat_interval, self._beat)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _beat(self) -> None:
        conn = self.conn
        self.timer = None
        interval = conn.heartbeat_interval
        now = conn.loop.time()
        if now - self.last_read >= 2 * interval:
            log.error(
                "PROTOCOL(V2): [%s] failed to read command - i/o timeout", conn.remote_address
            )
            conn.close_for_exit()
            return
        conn.out.append(HEARTBEAT_FRAME)
        conn.flush()
        wake = min(interval, self.last_read + 2 * interval - now)
        self.timer = conn.loop.call_later(max(wake, 0.001), self._beat)


class ClientV2(ClientV2State, asyncio.Protocol):
    """A V2 client connection: the I/O shell over its state (``client_v2.py``) and the command
    handlers; the upgrade (``upgrade.py``) and the AUTH session (``auth_session.py``) are its
    helpers."""

    #: Another worker of this node (``--workers``): ``server/workers/link.WorkerLink``.
    is_link = False
    #: The peer's name when the socket has no address (a unix socket).
    unnamed_peer = ""

    def __init__(self, nsqd: ConnectionContext, config: ProtocolConfig | None = None) -> None:
        opts = nsqd.opts
        if config is None:
            config = nsqd.protocol_config
        super().__init__(
            nsqd.next_client_id(), config, opts.msg_timeout, opts.output_buffer_timeout
        )
        self.nsqd = nsqd
        self.loop = nsqd.loop
        self.parser = V2Parser(config)
        self._poke = nsqd.busy_poll.poke
        self.transport: asyncio.Transport | None = None
        # -- for the channel --------------------------------------------------------------
        self.channel: Channel | None = None
        self.write_paused = False
        #: The connection is closing or closed: nothing more is read or run.
        self.closed = False
        # -- input: pipeline, event queue, pause --------------------------------------------
        self.pipeline: Pipeline | None = None  # None: a plain connection (the fast path)
        self.queue: deque[Event] = deque()
        self.paused: Pause | None = None
        #: Raw bytes delivered while paused for AUTH or INFLATE; fed on when it resumes.
        self._held = bytearray()
        self._upgrade: Upgrade | None = None  # made by the first IDENTIFY that negotiates
        self._auth: AuthSession | None = None  # made by AUTH or the first checked command
        #: nsqd's heartbeat ticker and read deadline (``Heartbeat``).
        self.heartbeat = Heartbeat(self)
        # -- output ------------------------------------------------------------------------
        self.out: list[bytes] = []
        self._out_bytes = 0
        #: A response or error is queued: written when the current input has been run.
        self._respond = False
        self._flush_pending = False
        self.publishing = Publishing(self)
        self._buffer_timer: asyncio.TimerHandle | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            command: getattr(self, command.__name__.upper()) for command in COMMANDS
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
            self.remote_address = str(peer or "") or self.unnamed_peer
        self.heartbeat.arm()
        self.nsqd.add_client(self)
        log.info("TCP: new client(%s)", self.remote_address)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.heartbeat.cancel()
        if self._buffer_timer is not None:
            self._buffer_timer.cancel()
        if self._upgrade is not None:
            self._upgrade.cancel()
        if self._auth is not None:
            self._auth.cancel()
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
        self.flush()
        if self.transport is not None:
            self.transport.close()

    # -- input ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        paused = self.paused
        if paused is None:
            if self.pipeline is None:  # the hot path: a plain connection
                self.parse(data)
                self._drain()
            else:
                self.input(data)
        elif paused is Pause.UPGRADE:
            assert self._upgrade is not None
            self._upgrade.handshake(data)
        else:
            self._held += data  # reading is paused: these few bytes wait for the resume
            return
        if self._respond:
            # Responses to this read go out now, in one write, rather than a loop turn later.
            self.flush()
        self._poke()

    def input(self, data: bytes) -> None:
        """Bytes from the socket through the pipeline into the queue, which is then drained."""
        pipeline = self.pipeline
        if pipeline is not None:
            try:
                data = pipeline.feed(data)
            except TransformError as err:
                self.stream_failed(err)
                return
            out = pipeline.outgoing()
            if out and self.transport is not None:
                self.transport.write(out)
            if pipeline.eof:  # TLS close_notify: run what came with it, then close
                self.parse(data)
                self._drain()
                self._close()
                return
        self.parse(data)
        self._drain()
        if pipeline is not None and pipeline.more and self.paused is None and not self.closed:
            # A small deflate input can hold a lot: one bounded piece per loop turn.
            self.pause(Pause.INFLATE)
            self.loop.call_soon(self.resume)

    def parse(self, data: bytes) -> None:
        events = self.parser.receive(data)
        if events:
            # nsqd's read deadline restarts with each command: bytes trickling into a
            # half-sent command do not keep a connection alive.
            self.heartbeat.last_read = self.loop.time()
            self.queue.extend(events)

    def _drain(self) -> None:
        """The one loop: run queued commands in order until none is left or the connection
        pauses. The parser stops after each IDENTIFY; unless that IDENTIFY paused the
        connection for an upgrade, parsing goes on here, so any number of pipelined IDENTIFYs
        never recurse."""
        queue = self.queue
        parser = self.parser
        handlers = self._handlers
        debug = log.isEnabledFor(logging.DEBUG)  # once per input: free when not debugging
        while self.paused is None and not self.closed:
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
                self.send_frame(encode_error(err.wire))
            except ProtocolError as err:  # FatalClientError and the parser's own
                self.fatal(err)
            except Exception:  # a bug: log it here, never send a traceback to the client
                log.exception("PROTOCOL(V2): [%s] internal error", self.remote_address)
                self.fatal(FatalClientError("E_INVALID", "internal error"))

    def pause(self, why: Pause) -> None:
        self.paused = why
        # The handshake needs the client's bytes; the other pauses stop reading.
        if why is not Pause.UPGRADE and self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        """A pause ended: run what is queued, then feed on what was held back."""
        paused, self.paused = self.paused, None
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        if paused is not Pause.UPGRADE:
            self.transport.resume_reading()
        held, self._held = self._held, bytearray()
        self._drain()
        if self.paused is not None:  # paused again: what was held stays in front
            self._held[:0] = held
        elif not self.closed and (held or (self.pipeline is not None and self.pipeline.more)):
            self.input(bytes(held))
        if self._respond:
            self.flush()

    def fatal(self, err: ProtocolError) -> None:
        log.error("PROTOCOL(V2): [%s] - %s", self.remote_address, err)
        self.out.append(encode_error(err.wire))
        self._close()

    def stream_failed(self, err: TransformError) -> None:
        # nsqd: "failed to read command - <err>", logged; the connection closes with no reply.
        log.error("PROTOCOL(V2): [%s] failed to read command - %s", self.remote_address, err)
        self.out.clear()  # a broken TLS stream cannot encode them
        self._out_bytes = 0
        if err.alert and self.transport is not None:
            self.transport.write(err.alert)
        self._close()

    # -- output ---------------------------------------------------------------------------

    def send_frame(self, frame: bytes) -> None:
        """A response or error: written once the current input has been run."""
        self.out.append(frame)
        self._respond = True

    def send_messages(self, msgs: list[Message]) -> None:
        """Buffer message frames; nsqd's pump rules decide when they are written."""
        if self.headers is None:
            self._out_bytes += append_message_frames(msgs, self.out.extend)
        else:
            self._out_bytes += append_message_frames_with_headers(msgs, self.out.extend)
        self.sending(len(msgs))
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
                min(self.output_buffer_timeout, FLUSH_DELAY), self.flush
            )

    def _flush_soon(self) -> None:
        if self.out and not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self.flush)

    def output_room(self) -> int:
        """For the channel: body bytes this client may still be handed. What is buffered here
        and in the transport counts, so a client that does not read pins at most about
        ``_HIGH_WATER`` (plus one message), whatever its RDY."""
        transport = self.transport
        if transport is None or self.closed:
            return 0
        return _HIGH_WATER - self._out_bytes - transport.get_write_buffer_size()

    def flush(self) -> None:
        self._flush_pending = False
        self._respond = False
        if self._buffer_timer is not None:
            self._buffer_timer.cancel()
            self._buffer_timer = None
        if self.paused is Pause.UPGRADE:
            return  # output waits for the handshake: OK over TLS goes first
        out = self.out
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

    # -- commands, named as on the wire ---------------------------------------------------

    def IDENTIFY(self, cmd: commands.Identify) -> None:
        d = cmd.data
        self.identified(d)
        self.parser.idempotent = d.idempotent_publish
        self.parser.headers = self.headers is not None
        if log.isEnabledFor(logging.DEBUG):
            log.debug("PROTOCOL(V2): [%s] IDENTIFY %s", self.remote_address, dict(d._asdict()))
        self.heartbeat.arm()
        if not d.feature_negotiation:
            self.send_frame(OK_FRAME)
            return
        if self._upgrade is None:
            self._upgrade = Upgrade(self)
        reply, tls_v1, codec = self._upgrade.negotiate(d)
        self.send_frame(encode_response(reply))
        if tls_v1 or codec is not None:
            self._upgrade.start(tls_v1, codec)

    def SUB(self, cmd: commands.Sub) -> None:
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
        made = self.nsqd.workers.subscribed(channel)
        if made is not None and not made.done():
            # --workers: OK once every worker has the channel, so that a message published
            # through any worker after the OK is the channel's (nsqd's promise for a SUB),
            # and what the others hold is here in order (``workers/relay.py``).
            self.pause(Pause.COMMIT)
            made.add_done_callback(lambda _f: self.answer_ok())
            return
        self.send_frame(OK_FRAME)

    def answer_ok(self, frame: bytes = OK_FRAME) -> None:
        """A paused command's OK (``frame``: a publish's may count duplicates); then the
        commands behind it go on."""
        if self.closed:
            return
        self.send_frame(frame)
        self.resume()

    def RDY(self, cmd: commands.Rdy) -> None:
        self.rdy = cmd.ready_count
        if self.channel is not None:
            if self.in_flight_count >= self.rdy:
                self._flush_soon()
            else:
                self.channel.schedule_pump()

    def FIN(self, cmd: commands.Fin) -> None:
        assert self.channel is not None
        try:
            self.channel.finish_many(self, cmd.ids)
        except ChannelError as err:
            raise channel_error("FIN", err, b"") from None

    def REQ(self, cmd: commands.Req) -> None:
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

    def TOUCH(self, cmd: commands.Touch) -> None:
        assert self.channel is not None
        try:
            self.channel.touch(self, cmd.id)
        except ChannelError as err:
            raise channel_error("TOUCH", err, cmd.id) from None

    def CLS(self, cmd: commands.Cls) -> None:
        self.rdy = 0
        self.send_frame(CLOSE_WAIT_FRAME)

    def NOP(self, cmd: commands.Nop) -> None:
        pass

    def PUB(self, cmd: commands.Pub) -> None:
        if self.nsqd.auth is not None and not self._authorized("PUB", cmd.topic, "", cmd):
            return
        self.publishing.publish("PUB", cmd.topic, [cmd.body], 0, cmd.identity)

    def MPUB(self, cmd: commands.Mpub) -> None:
        if self.nsqd.auth is not None and not self._authorized("MPUB", cmd.topic, "", cmd):
            return
        self.publishing.publish("MPUB", cmd.topic, cmd.bodies, 0, cmd.identity)

    def DPUB(self, cmd: commands.Dpub) -> None:
        if self.nsqd.auth is not None and not self._authorized("DPUB", cmd.topic, "", cmd):
            return
        self.publishing.publish("DPUB", cmd.topic, [cmd.body], cmd.defer_ms, cmd.identity)

    # -- AUTH (auth_session.py) --------------------------------------------------------

    def AUTH(self, cmd: commands.Auth) -> None:
        if self.authed:
            raise FatalClientError("E_INVALID", "AUTH already set")
        if self.nsqd.auth is None:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        self._auth_session().start(cmd.secret)

    def _authorized(self, name: str, topic: str, channel: str, cmd: Event) -> bool:
        return self._auth_session().authorized(name, topic, channel, cmd)

    def _auth_session(self) -> AuthSession:
        if self._auth is None:
            self._auth = AuthSession(self)
        return self._auth

    # -- for /stats ----------------------------------------------------------------------

    @property
    def state(self) -> commands.ClientState:
        return self.parser.state


def _describe(ev: object) -> str:
    """A command as nsqd's debug line shows it: its name and parameters, never a body."""
    if isinstance(ev, ProtocolError):
        return str(ev)
    name = type(ev).__name__.upper()
    if not isinstance(ev, tuple):
        return name
    fields: dict[str, object] = cast(Any, ev)._asdict()  # every command is a NamedTuple
    shown = [
        f"{v.producer.decode()} {v.sequence}" if isinstance(v, commands.Identity) else str(v)
        for k, v in fields.items()
        if k not in ("body", "bodies", "data", "secret")
        and v is not None
        and not isinstance(v, bytes | list)
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
