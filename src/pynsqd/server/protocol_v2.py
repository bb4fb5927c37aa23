"""One client connection speaking NSQ V2: a thin asyncio.Protocol over the sans-IO parser.

Theory of operation. ``data_received`` feeds the parser and runs each command it returns by
calling the handler named after the wire command (``PUB``, ``SUB``, ...). Everything sent is
appended to one output list and written with a single ``transport.write`` per loop turn:
responses and errors at the end of the turn, message frames when the client stops being ready,
when ``output_buffer_size`` bytes are buffered, or when ``output_buffer_timeout`` expires — the
rules of nsqd's message pump. A fatal error is written and the connection closed; non-fatal
ones (E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED) are written and the connection goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from typing import TYPE_CHECKING, Any, cast

from .. import NSQD_VERSION
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
from ..protocol.parser import V2Parser
from .secure import SecureClient, Suspend

if TYPE_CHECKING:
    from .context import ConnectionContext

log = logging.getLogger("pynsqd")

_MSG_HEADER = struct.Struct(">llqH")
#: Transport buffer limits: past ``_HIGH`` unsent bytes a consumer gets no more messages.
_HIGH_WATER = 4 * 1024 * 1024
_LOW_WATER = 1024 * 1024


class ClientV2(SecureClient, asyncio.Protocol):
    """A V2 client: its negotiated settings, RDY and in-flight counts, and its command handlers."""

    def __init__(self, nsqd: ConnectionContext) -> None:
        self.nsqd = nsqd
        self.loop = nsqd.loop
        opts = nsqd.opts
        self.id = nsqd.next_client_id()
        self.parser = V2Parser(nsqd.protocol_config)
        self.transport: asyncio.Transport | None = None
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
        self.channel: Channel | None = None
        self.write_paused = False
        self.closed = False
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_pending = False
        self._reading = False  # inside data_received: responses are written when it returns
        self._go_on = False  # IDENTIFY done without an upgrade: _run resumes the parser
        self._respond = False
        self._buffer_timer: asyncio.TimerHandle | None = None
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._handlers: dict[type, Any] = {
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
        self._init_secure()  # TLS, snappy, deflate, AUTH: see secure.py

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
        self._close_secure()
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        if self._buffer_timer is not None:
            self._buffer_timer.cancel()
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
        self._flush()
        if self.transport is not None:
            self.transport.close()

    # -- input ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._rx is not None:  # TLS, compression or waiting for the auth server
            self._rx(data)
            return
        self._reading = True
        self._run(self.parser.receive(data))
        self._reading = False
        if self._respond:
            # Responses to this read go out now, in one write, rather than a loop turn later.
            self._respond = False
            self._flush()

    def _process(self, data: bytes) -> None:
        """data_received's body for bytes that came through TLS or decompression."""
        reading = self._reading
        self._reading = True
        self._run(self.parser.receive(data))
        self._reading = reading
        if self._respond and not reading:
            self._respond = False
            self._flush()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def _run(self, events: list[Any]) -> None:
        # The parser pauses after each IDENTIFY (an upgrade could follow); when none does, the
        # handler asks to go on here, in a loop: a thousand pipelined IDENTIFYs never recurse.
        while True:
            self._go_on = False
            self._run_events(events)
            if not self._go_on or self.closed:
                return
            events = self.parser.receive(b"")

    def _run_events(self, events: list[Any]) -> None:
        if events:
            # nsqd's read deadline restarts with each command: bytes trickling into a
            # half-sent command do not keep a connection alive.
            self._last_read = self.loop.time()
        handlers = self._handlers
        debug = log.isEnabledFor(logging.DEBUG)  # once per read: free when not debugging
        it = iter(events)
        for ev in it:
            if debug:
                log.debug("PROTOCOL(V2): [%s] %s", self.remote_address, _describe(ev))
            try:
                if type(ev) is Fin:
                    self.FIN(ev)
                elif isinstance(ev, ProtocolError):
                    raise ev
                else:
                    handlers[type(ev)](ev)
            except ClientError as err:
                log.info("PROTOCOL(V2): [%s] %s", self.remote_address, err)
                self._send_frame(encode_error(err.wire))
            except FatalClientError as err:
                self._fatal(err)
                return
            except ProtocolError as err:
                self._fatal(err)
                return
            except Suspend as s:
                # Waiting for the auth server: the rest runs, in order, once it has answered.
                self._pending = [ev, *it] if s.retry else list(it)
                return
            except Exception:  # a bug: log it here, never send a traceback to the client
                log.exception("PROTOCOL(V2): [%s] internal error", self.remote_address)
                self._fatal(FatalClientError("E_INVALID", "internal error"))
                return

    def _fatal(self, err: ProtocolError) -> None:
        log.error("PROTOCOL(V2): [%s] - %s", self.remote_address, err)
        self._out.append(encode_error(err.wire))
        self._flush()
        if self.transport is not None:
            self.transport.close()

    # -- output ---------------------------------------------------------------------------

    def _send_frame(self, frame: bytes) -> None:
        self._out.append(frame)
        if self._reading:
            self._respond = True
        elif not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

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
            if not self._flush_pending:
                self._flush_pending = True
                self.loop.call_soon(self._flush)
        elif self._buffer_timer is None:
            self._buffer_timer = self.loop.call_later(self.output_buffer_timeout, self._flush)

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
        if self._buffer_timer is not None:
            self._buffer_timer.cancel()
            self._buffer_timer = None
        out = self._out
        if out and self.transport is not None and not self.transport.is_closing():
            if self._stack is None:
                self.transport.write(b"".join(out))
            else:
                self.transport.write(self._stack.encode(b"".join(out)))
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
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        self._send_frame(HEARTBEAT_FRAME)
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
            tls_v1, snappy, deflate = self.negotiate(d.tls_v1, d.snappy, d.deflate)
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
            if tls_v1 or snappy or deflate:
                self.start_upgrade(tls_v1, snappy, deflate, deflate_level)
                return
        # The parser pauses after IDENTIFY (an upgrade could follow); _run carries on.
        self._go_on = True

    def AUTH(self, cmd: Auth) -> None:
        self.start_auth(cmd.secret)

    def SUB(self, cmd: Sub) -> None:
        if self.nsqd.auth is not None:
            self.check_auth("SUB", cmd.topic, cmd.channel)
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

    def _flush_soon(self) -> None:
        if self._out and not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

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
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)
        self._send_frame(OK_FRAME)

    def PUB(self, cmd: Pub) -> None:
        if self.nsqd.auth is not None:
            self.check_auth("PUB", cmd.topic, "")
        self._publish("PUB", cmd.topic, [cmd.body])

    def MPUB(self, cmd: Mpub) -> None:
        if self.nsqd.auth is not None:
            self.check_auth("MPUB", cmd.topic, "")
        self._publish("MPUB", cmd.topic, cmd.bodies)

    def DPUB(self, cmd: Dpub) -> None:
        if self.nsqd.auth is not None:
            self.check_auth("DPUB", cmd.topic, "")
        self._publish("DPUB", cmd.topic, [cmd.body], cmd.defer_ms)

    # -- for the channel and /stats -------------------------------------------------------

    def messages_timed_out(self, n: int) -> None:
        # nsqd's TimedOutMessage only lowers the in-flight count, which the channel did.
        pass

    @property
    def state(self) -> ClientState:
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
