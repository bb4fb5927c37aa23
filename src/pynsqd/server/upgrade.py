"""TLS and compression after an IDENTIFY that negotiated them: nsqd's UpgradeTLS, UpgradeDeflate
and UpgradeSnappy, for one connection.

The IDENTIFY reply goes out in plain text first. Bytes the client sent after IDENTIFY belong to
the new layer (a ClientHello, or compressed commands): the parser stopped there and hands them
back. For TLS the connection pauses (``UPGRADE``): its input feeds the handshake and its output
waits, until the handshake is done (then ``OK`` goes out over TLS, and compression negotiated
with TLS follows), fails, or passes ``HANDSHAKE_TIMEOUT`` (then ``E_IDENTIFY_FAILED`` goes out
on the raw connection, which closes, as nsqd does).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Protocol

from .. import NSQD_VERSION
from ..protocol.commands import IdentifyData
from ..protocol.errors import FatalClientError, ProtocolError
from ..protocol.frames import OK_FRAME
from ..protocol.headers import HeaderLimits
from ..protocol.parser import V2Parser
from .client_v2 import Pause
from .context import ConnectionContext
from .transforms import (
    DeflateTransform,
    Pipeline,
    SnappyTransform,
    TLSTransform,
    Transform,
    TransformError,
)

log = logging.getLogger("pynsqd")

#: nsqd's TLS handshake deadline.
HANDSHAKE_TIMEOUT = 5.0


class Upgradable(Protocol):
    """What the upgrade needs of its connection (``protocol_v2.ClientV2``)."""

    nsqd: ConnectionContext
    loop: asyncio.AbstractEventLoop
    parser: V2Parser
    pipeline: Pipeline | None
    transport: asyncio.Transport | None
    paused: Pause | None
    out: list[bytes]
    remote_address: str
    tls: bool
    tls_version: str
    tls_cipher_suite: str
    tls_common_name: str
    snappy: bool
    deflate: bool
    deflate_level: int
    headers: HeaderLimits | None

    def flush(self) -> None: ...
    def pause(self, why: Pause) -> None: ...
    def parse(self, data: bytes) -> None: ...
    def input(self, data: bytes) -> None: ...
    def fatal(self, err: ProtocolError) -> None: ...
    def stream_failed(self, err: TransformError) -> None: ...


class Upgrade:
    """One connection's upgrade after IDENTIFY."""

    __slots__ = ("_after_tls", "_conn", "_stage", "_timer")

    def __init__(self, conn: Upgradable) -> None:
        self._conn = conn
        self._stage: TLSTransform | None = None
        self._after_tls: Transform | None = None  # compression negotiated with TLS
        self._timer: asyncio.TimerHandle | None = None

    def negotiate(self, d: IdentifyData) -> tuple[bytes, bool, Transform | None]:
        """An IDENTIFY with feature negotiation: nsqd's JSON reply, whether TLS follows, and
        the compression that does (each is turned on once: what the server offers and the
        client asks). Raises FatalClientError for both compressions at once."""
        conn = self._conn
        opts = conn.nsqd.opts
        cfg = conn.nsqd.protocol_config
        compressed = conn.snappy or conn.deflate
        tls_v1 = d.tls_v1 and conn.nsqd.tls_context is not None and not conn.tls
        tls_v1 = tls_v1 and not compressed
        snappy = d.snappy and opts.snappy and not compressed
        deflate = d.deflate and opts.deflate and not compressed
        if deflate and snappy:
            raise FatalClientError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        # nsqd's effective level: the client's if it negotiates deflate, else 6; capped.
        deflate_level = d.deflate_level if deflate and d.deflate_level > 0 else 6
        deflate_level = min(deflate_level, opts.max_deflate_level)
        reply = {
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
            "auth_required": conn.nsqd.auth is not None,
            "output_buffer_size": d.output_buffer_size,
            "output_buffer_timeout": d.output_buffer_timeout_ms,
        }
        if d.idempotent_publish:  # pynsqd (core/dedup.py); absent unless asked for
            reply["idempotent_publish"] = True
        if d.headers:  # pynsqd (protocol/headers.py): whether it has them; absent unless asked
            reply["headers"] = conn.headers is not None
            if conn.headers is not None:
                reply["max_headers"] = conn.headers.max_count
                reply["max_header_bytes"] = conn.headers.max_bytes
        codec: Transform | None = None
        if deflate:
            codec = DeflateTransform(deflate_level)
        elif snappy:
            codec = SnappyTransform()
        return json.dumps(reply, separators=(",", ":")).encode(), tls_v1, codec

    def start(self, tls_v1: bool, codec: Transform | None) -> None:
        """IDENTIFY negotiated TLS and/or compression; its reply is queued."""
        conn = self._conn
        conn.flush()  # the IDENTIFY reply goes out as it is, before any upgrade
        leftover = conn.parser.take_buffered()
        if conn.pipeline is None:
            conn.pipeline = Pipeline()
        if tls_v1:
            ctx = conn.nsqd.tls_context
            assert ctx is not None
            stage = TLSTransform(ctx)
            conn.pipeline.push(stage)
            self._stage = stage
            self._after_tls = codec
            conn.pause(Pause.UPGRADE)
            self._timer = conn.loop.call_later(HANDSHAKE_TIMEOUT, self._timed_out)
            # (The handshake cannot complete on these alone: the server has not answered yet.)
            self.handshake(leftover)
        elif codec is not None:
            self._compress(codec)
            try:
                conn.parse(codec.feed(leftover))
            except TransformError as err:
                conn.stream_failed(err)

    def handshake(self, data: bytes) -> None:
        """Bytes from the socket while the TLS handshake runs."""
        conn = self._conn
        stage = self._stage
        assert stage is not None
        try:
            stage.feed(data)
        except TransformError as err:
            self._failed(err.reason, err.alert)
            return
        out = stage.outgoing()
        if out and conn.transport is not None:
            conn.transport.write(out)
        if stage.ready:
            self._done(stage)

    def cancel(self) -> None:
        """The connection is gone."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        self._failed("tls: handshake timeout")

    def _failed(self, reason: str, alert: bytes = b"") -> None:
        conn = self._conn
        self.cancel()
        if alert and conn.transport is not None:
            conn.transport.write(alert)
        # As nsqd: the error goes out on the raw connection, which then closes.
        conn.pipeline = None
        self._stage = None
        conn.paused = None
        conn.fatal(FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {reason}"))

    def _done(self, stage: TLSTransform) -> None:
        conn = self._conn
        self.cancel()
        self._stage = None
        layer = stage.layer
        conn.parser.tls = True
        conn.tls = True
        conn.tls_version = layer.version
        conn.tls_cipher_suite = layer.cipher_suite
        conn.tls_common_name = layer.common_name
        log.info(
            "PROTOCOL(V2): [%s] upgraded to %s (%s)",
            conn.remote_address,
            conn.tls_version,
            conn.tls_cipher_suite,
        )
        conn.paused = None
        # OK over TLS first; what waited during the handshake (heartbeats) after it.
        conn.out.insert(0, OK_FRAME)
        conn.flush()
        if self._after_tls is not None:
            self._compress(self._after_tls)
            self._after_tls = None
        conn.input(b"")  # application data that came with the client's Finished

    def _compress(self, codec: Transform) -> None:
        conn = self._conn
        assert conn.pipeline is not None
        conn.flush()  # what is queued goes out as it was
        conn.pipeline.push(codec)
        if isinstance(codec, DeflateTransform):
            conn.deflate = True
            conn.deflate_level = codec.level
        else:
            conn.snappy = True
        conn.out.append(OK_FRAME)  # the first compressed frame
        conn.flush()
