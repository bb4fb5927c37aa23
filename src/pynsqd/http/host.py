"""What the HTTP API, ``/stats``, ``/metrics`` and statsd need of nsqd: a narrow, typed seam.

The server package builds the HTTP service and hands it the nsqd object; this package never
imports the server (core sees its owners the same way, through ``TopicOwner``/``ChannelOwner``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp.web import StreamResponse
from aiohttp.web_request import BaseRequest

from ..core.channel import Channel
from ..core.replay import Replayed
from ..core.topic import Topic
from ..internal.listener import SharedListener
from ..options import Options
from ..protocol.commands import ClientState
from ..protocol.identify import ProtocolConfig
from ..storage.topiclog import TopicLog

if TYPE_CHECKING:
    from ..cluster.replicator import Replicator

Json = dict[str, Any]
Handler = Callable[[BaseRequest, Any], Awaitable[Any]]


class StatsClient(Protocol):
    """The fields of a client connection that ``/stats`` reports (nsqd's ClientV2Stats)."""

    client_id: str
    hostname: str
    remote_address: str
    rdy: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    user_agent: str
    topology_zone: str
    topology_region: str
    pub_counts: dict[str, int]
    deflate: bool
    snappy: bool
    tls: bool
    tls_version: str
    tls_cipher_suite: str
    tls_negotiated_protocol: str
    tls_negotiated_protocol_is_mutual: bool

    @property
    def state(self) -> ClientState: ...
    @property
    def authed(self) -> bool: ...
    @property
    def auth_identity(self) -> str: ...
    @property
    def auth_identity_url(self) -> str: ...


class LogOwner(Protocol):
    """The retained logs' one owner (``server/retention.py``): what the HTTP API asks of it."""

    def get(self, name: str) -> TopicLog | None:
        """A replayable topic's retained log (None: the topic keeps no log)."""

    def change(self, topic: Topic, seconds: float, size: int) -> None:
        """``POST /topic/retention``; raises OSError, or ``Conflict`` while a rewind runs."""

    @property
    def rewinds(self) -> Rewinder: ...


class Rewinder(Protocol):
    """The rewinds of the retained logs' channels (``server/rewind.py``)."""

    async def rewind(
        self, topic: Topic, channel: Channel, start: int, stop: int | None = None
    ) -> Replayed:
        """``POST /channel/rewind``; raises ``Conflict`` while the channel rewinds already."""

    async def create_at(self, topic: Topic, channel: Channel, start: int) -> Replayed:
        """A channel just created starts at ``start`` of its topic's log."""


class WorkersHost(Protocol):
    """``--workers``: this worker's part in a node of several (``server/workers/peers.py``);
    in a single process, none (``server/workers/lone.py``)."""

    async def listen(
        self,
        name: str,
        factory: Callable[[], asyncio.BaseProtocol],
        address: str,
        ssl_context: ssl.SSLContext | None = None,
        *,
        serve: bool,
    ) -> asyncio.Server | SharedListener | None:
        """The node's socket ``name`` (http, https; shared by its workers) or this worker's
        (admin); None where there is none (``--http-address=""``)."""

    @property
    def admin(self) -> AdminCalls: ...
    @property
    def placement(self) -> Homes: ...


class Homes(Protocol):
    """Where a topic or a producer's publishes are kept (``server/workers/placement.py``)."""

    #: The node's workers.
    count: int

    def home(self, producer: bytes) -> int | None:
        """The worker that makes ``producer``'s identified publishes, when another."""


class AdminCalls(Protocol):
    """HTTP between the workers (``server/workers/admin.py``)."""

    async def peer_answers(self, request: BaseRequest, path_qs: str) -> list[bytes] | None:
        """Every other worker's answer to ``GET path_qs`` (None: ``request`` came from a
        worker, answer for this one alone)."""

    def fanned(self, handler: Handler) -> Handler:
        """``handler`` made on every worker, answered once."""

    def routed(self, handler: Handler) -> Handler:
        """``handler`` made by the worker that keeps the topic's log."""

    def on_member(self, handler: Handler) -> Handler:
        """``handler`` made by the member it is about on a replicated node (each worker is
        one: ``server/workers/members.py``)."""

    def on_admin_socket(self, request: BaseRequest) -> bool:
        """A request over this worker's private socket (from another worker)."""

    async def proxy(self, peer: int, request: BaseRequest, body: bytes | None) -> StreamResponse:
        """The request made of worker ``peer``, its answer passed on."""

    async def unhealthy_peers(self, request: BaseRequest) -> list[tuple[int, str]]:
        """Every other worker that answers ``/ping`` unhealthy: (its index, its line)."""

    async def combine_stats(
        self, request: BaseRequest, topics: list[Json] | None, producers: list[Json] | None
    ) -> tuple[list[Json] | None, list[Json] | None]:
        """This worker's /stats with the others': the node's."""


class LifecycleSettings(Protocol):
    """Topics' and channels' lifecycle settings (``server/lifecycle.py``)."""

    def topic_config(self, name: str) -> dict[str, Any]:
        """A topic's lifecycle settings (effective values, and ``own``: those set for it)."""

    def channel_config(self, topic: str, channel: str) -> dict[str, Any]: ...
    def set_topic_config(self, name: str, values: dict[str, Any]) -> None:
        """Raises OSError."""

    def set_channel_config(self, topic: str, channel: str, values: dict[str, Any]) -> None:
        """Raises OSError."""


class NSQDHost(Protocol):
    """The nsqd the HTTP side serves."""

    @property
    def opts(self) -> Options: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def topics(self) -> Mapping[str, Topic]: ...
    @property
    def clients(self) -> Mapping[int, StatsClient]: ...
    @property
    def start_time(self) -> int: ...
    @property
    def storage_id(self) -> str: ...
    @property
    def node_storage_id(self) -> str:
        """The node's storage id (``--workers``: the supervisor's directory's), for /info."""

    @property
    def instance(self) -> str: ...
    @property
    def health_error(self) -> str | None: ...
    @property
    def starting(self) -> str | None:
        """Why the node is not ready yet; None once it is (``GET /ping``)."""

    @property
    def exiting(self) -> bool: ...
    @property
    def tcp_address(self) -> str: ...
    @property
    def http_address(self) -> str: ...
    @property
    def protocol_config(self) -> ProtocolConfig: ...
    @property
    def replication(self) -> Replicator | None: ...
    @property
    def retention(self) -> LogOwner: ...

    def get_topic(self, name: str) -> Topic: ...
    def get_existing_topic(self, name: str) -> Topic | None: ...
    def delete_existing_topic(self, name: str) -> bool: ...
    def set_health_error(self, err: BaseException | None) -> None: ...
    async def authorize_log_read(
        self, topic: str, secret: str, remote_ip: str, tls: bool
    ) -> str | None:
        """None if this reader may read the topic's log, else nsqd-style error token."""

    @property
    def lifecycle(self) -> LifecycleSettings: ...

    def lookupd_addresses_changed(self) -> None:
        """``opts.lookupd_tcp_addresses`` was set through ``/config``."""

    @property
    def workers(self) -> WorkersHost: ...
