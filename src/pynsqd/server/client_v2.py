"""A V2 client's state: what IDENTIFY negotiated, what the channel counts, what ``/stats`` shows.

nsqd's ``client_v2.go`` beside ``protocol_v2.go``: this is the client as data (nsqd's clientV2
struct and ClientV2Stats); the connection (``protocol_v2.py``) is the I/O shell and the command
handlers, the TLS/compression upgrade is ``upgrade.py``, the AUTH session ``auth_session.py``.
``http/host.py:StatsClient`` is the read side of these fields, ``core/channel.py:ConsumerLike``
the part a channel uses.
"""

from __future__ import annotations

import enum
import time

from ..core.message import ConsumerCounts
from ..protocol.commands import IdentifyData
from ..protocol.headers import HeaderLimits
from ..protocol.identify import ProtocolConfig
from .auth import AuthState


class Pause(enum.Enum):
    """Why a connection's drain loop is stopped (``protocol_v2.py``'s docstring)."""

    UPGRADE = "upgrade"
    AUTH = "auth"
    INFLATE = "inflate"
    COMMIT = "commit"  # a publish to a replicated topic waits for its records to commit
    WRITABLE = "writable"  # ... or for its partition, which this node is taking back
    FORWARD = "forward"  # ... or for the worker that keeps its topic's log (--workers)


class ClientV2State(ConsumerCounts):
    """The fields of one client: its identity, negotiated settings and counters."""

    def __init__(self, client_id: int, config: ProtocolConfig, msg_timeout: float, obt: float):
        self.id = client_id
        # -- identity (IDENTIFY; the peer address until then) ------------------------------
        self.remote_address = ""
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.topology_zone = ""
        self.topology_region = ""
        self.connect_ts = int(time.time())
        # -- negotiated settings -----------------------------------------------------------
        self.config = config
        self.heartbeat_interval = config.heartbeat_interval_ms / 1000
        self.msg_timeout = msg_timeout
        self.output_buffer_size = config.output_buffer_size
        self.output_buffer_timeout = obt
        self.sample_rate = 0
        # -- RDY and counters (ConsumerCounts' are moved by the channel's calls) ------------
        ConsumerCounts.__init__(self)
        self.rdy = 0
        self.pub_counts: dict[str, int] = {}
        # -- the byte stream (set by the upgrade) ------------------------------------------
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
        #: pynsqd: IDENTIFY negotiated message headers (``protocol/headers.py``): its bodies
        #: and messages carry header blocks; None: not negotiated.
        self.headers: HeaderLimits | None = None
        # -- AUTH (set by the AUTH session) ------------------------------------------------
        self.auth_state: AuthState | None = None

    def identified(self, d: IdentifyData) -> None:
        """What an IDENTIFY sets (already checked by the parser)."""
        self.client_id = d.client_id
        self.hostname = d.hostname
        self.user_agent = d.user_agent
        self.topology_zone = d.topology_zone
        self.topology_region = d.topology_region
        self.heartbeat_interval = d.heartbeat_interval_ms / 1000
        self.output_buffer_size = d.output_buffer_size
        self.output_buffer_timeout = d.output_buffer_timeout_ms / 1000
        self.sample_rate = d.sample_rate
        self.msg_timeout = d.msg_timeout_ms / 1000
        # Headers only where the client can learn it has them (the negotiation's answer).
        if d.headers and d.feature_negotiation and self.config.max_headers > 0:
            self.headers = HeaderLimits(self.config.max_headers, self.config.max_header_bytes)

    # -- counters, moved by what happened (nsqd's SendingMessage, FinishedMessage, ...) ------

    def published(self, topic: str, n: int) -> None:
        """``n`` messages of a PUB, MPUB or DPUB were taken (``pub_counts``)."""
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + n

    @property
    def authed(self) -> bool:
        return self.auth_state is not None and bool(self.auth_state.authorizations)

    @property
    def auth_identity(self) -> str:
        return self.auth_state.identity if self.auth_state is not None else ""

    @property
    def auth_identity_url(self) -> str:
        return self.auth_state.identity_url if self.auth_state is not None else ""
