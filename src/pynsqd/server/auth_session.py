"""One connection's AUTH session: asking the auth server without blocking the loop.

AUTH (and, before PUB/MPUB/DPUB/SUB, an authorization that expired) pauses the connection
(``AUTH``): its parsed commands wait in its queue, in order, and raw bytes that still arrive are
held. When the auth server answers, the session resumes the connection; the command that found
its authorization expired goes back to the front of the queue and runs again with the fresh
answer deciding, as in nsqd. Any failure closes the connection with ``E_AUTH_FAILED``: the
auth server's details are for the log only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from ..internal.gotext import go_json
from ..internal.names import go_quote
from ..protocol.errors import FatalClientError, ProtocolError
from ..protocol.frames import encode_response
from ..protocol.parser import Event
from .auth import AuthError, AuthState
from .client_v2 import Pause
from .context import ConnectionContext

log = logging.getLogger("pynsqd")


class Authenticating(Protocol):
    """What the AUTH session needs of its connection (``protocol_v2.ClientV2``)."""

    nsqd: ConnectionContext
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    queue: deque[Event]
    closed: bool
    remote_address: str
    tls: bool
    tls_common_name: str
    auth_state: AuthState | None

    def pause(self, why: Pause) -> None: ...
    def resume(self) -> None: ...
    def fatal(self, err: ProtocolError) -> None: ...
    def send_frame(self, frame: bytes) -> None: ...


class AuthSession:
    """The secret a connection authenticated with, and the query under way."""

    __slots__ = ("_conn", "_fresh", "_task", "secret")

    def __init__(self, conn: Authenticating) -> None:
        self._conn = conn
        self.secret = b""
        self._task: asyncio.Task[AuthState] | None = None
        self._fresh = False  # the retried command's authorization was just fetched

    def start(self, secret: bytes) -> None:
        """AUTH: ask the auth server; the reply (identity, permission count) follows."""
        self.secret = secret
        self._ask(self._replied)

    def authorized(self, name: str, topic: str, channel: str, cmd: Event) -> bool:
        """nsqd's CheckAuth for PUB, MPUB, DPUB and SUB (only called when auth is enabled).

        False: the authorization expired and the server is asked again; ``cmd`` goes back to
        the front of the queue and runs again when it has answered."""
        conn = self._conn
        state = conn.auth_state
        if self._fresh:
            # The command that waited for a re-query: its answer decides, as in nsqd.
            self._fresh = False
        else:
            if state is None or not state.authorizations:
                raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {name}")
            if state.is_expired(conn.loop.time()):
                conn.queue.appendleft(cmd)
                self._ask(self._refreshed)
                return False
        if state is None or not state.is_allowed(topic, channel):
            where = f"{go_quote(topic.encode())} {go_quote(channel.encode())}"
            raise FatalClientError("E_UNAUTHORIZED", f"AUTH failed for {name} on {where}")
        return True

    def cancel(self) -> None:
        """The connection is gone."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _ask(self, done: Callable[[asyncio.Task[AuthState]], None]) -> None:
        conn = self._conn
        auth = conn.nsqd.auth
        assert auth is not None
        remote_ip = ""
        if conn.transport is not None:
            peer = conn.transport.get_extra_info("peername")
            if isinstance(peer, tuple):
                remote_ip = str(peer[0])
        conn.pause(Pause.AUTH)
        task = conn.loop.create_task(
            auth.query_any(remote_ip, conn.tls, conn.tls_common_name, self.secret)
        )
        self._task = task
        task.add_done_callback(done)

    def _answer(self, task: asyncio.Task[AuthState]) -> AuthState | None:
        conn = self._conn
        self._task = None
        if conn.closed or task.cancelled():
            return None
        err = task.exception()
        if err is None:
            return task.result()
        if isinstance(err, AuthError):
            log.warning("PROTOCOL(V2): [%s] AUTH failed %s", conn.remote_address, err)
        else:
            log.error("PROTOCOL(V2): [%s] AUTH failed", conn.remote_address, exc_info=err)
        # Never the auth server's details: they are for the log.
        conn.fatal(FatalClientError("E_AUTH_FAILED", "AUTH failed"))
        return None

    def _replied(self, task: asyncio.Task[AuthState]) -> None:
        conn = self._conn
        state = self._answer(task)
        if state is None:
            return
        conn.auth_state = state
        if not state.authorizations:
            conn.fatal(FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found"))
            return
        body = go_json(
            {
                "identity": state.identity,
                "identity_url": state.identity_url,
                "permission_count": len(state.authorizations),
            }
        )
        conn.send_frame(encode_response(body))
        conn.resume()

    def _refreshed(self, task: asyncio.Task[AuthState]) -> None:
        state = self._answer(task)
        if state is None:
            return
        self._conn.auth_state = state
        self._fresh = True
        self._conn.resume()
