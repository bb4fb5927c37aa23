"""What a client connection needs of nsqd: the seam that lets it be built, and tested, alone.

``ClientV2`` is constructed from a ``ConnectionContext`` (nsqd itself in production; in the unit
tests a small stand-in with a fake loop and real core topics), never from nsqd's privates.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..core.channel import Channel
from ..core.topic import Topic
from ..options import Options
from ..protocol.identify import ProtocolConfig
from .auth import AuthClient
from .busypoll import BusyPoll

if TYPE_CHECKING:
    from ..cluster.replicator import Replicator
    from .protocol_v2 import ClientV2


class ChannelsEverywhere(Protocol):
    """``--workers``: a channel just made here is being made on every other worker; a
    publish to a topic another worker keeps the log of is made there."""

    def subscribed(self, channel: Channel) -> asyncio.Future[Any] | None:
        """Done once a SUB to ``channel`` may be answered: every worker has the channel, and
        what the others hold of it is here (None: nothing to wait for)."""

    def forward(self, peer: int, command: bytes, done: Callable[[bytes, bool], None]) -> None:
        """Send a publish command to worker ``peer``; ``done(answer, error)``: its OK (which
        may count duplicates), or an error line (``server/workers/forward.py``)."""

    @property
    def placement(self) -> Homes: ...


class Homes(Protocol):
    def home(self, producer: bytes) -> int | None:
        """The worker that makes ``producer``'s identified publishes, when another."""


class ConnectionContext(Protocol):
    loop: asyncio.AbstractEventLoop
    opts: Options
    protocol_config: ProtocolConfig
    auth: AuthClient | None
    tls_context: ssl.SSLContext | None
    busy_poll: BusyPoll
    replication: Replicator | None

    @property
    def workers(self) -> ChannelsEverywhere: ...

    def next_client_id(self) -> int: ...
    def add_client(self, client: ClientV2) -> None: ...
    def remove_client(self, client: ClientV2) -> None: ...
    def get_topic(self, name: str) -> Topic: ...
    def set_health_error(self, err: BaseException | None) -> None: ...
