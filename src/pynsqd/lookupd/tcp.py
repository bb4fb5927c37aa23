"""The asyncio shell of nsqlookupd's TCP protocol V1: one ``LookupProtocolV1`` per connection.

``data_received`` feeds the sans-IO ``V1Parser`` and runs each command against the
registration DB (``nsqlookupd/lookup_protocol_v1.go``); the responses of one read go out in one
write. An error is sent and the connection closed. When the connection goes, the node is removed
from every registration it had; the registration keys stay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol, cast

from ..internal.gotext import go_json
from ..internal.names import is_ephemeral
from ..protocol.errors import FatalClientError
from ..protocol.lookup import (
    Command,
    Identify,
    Ping,
    Register,
    Unregister,
    V1Parser,
    encode_response,
)
from .registration_db import PeerInfo, Producer, Registration

if TYPE_CHECKING:
    from .options import LookupdOptions
    from .registration_db import RegistrationDB


class TCPHost(Protocol):
    """What a V1 connection needs of nsqlookupd (``NSQLookupd``)."""

    db: RegistrationDB
    clients: set[LookupProtocolV1]
    opts: LookupdOptions

    @property
    def real_tcp_port(self) -> int: ...
    @property
    def real_http_port(self) -> int: ...

    version: str
    hostname: str


log = logging.getLogger("pynsqd.lookupd")

_OK = b"OK"
_CLIENT = Registration("client", "", "")


def _remote_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer or "")


class LookupProtocolV1(asyncio.Protocol):
    def __init__(self, lookupd: TCPHost) -> None:
        self.lookupd = lookupd
        self.parser = V1Parser()
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.peer_info: PeerInfo | None = None
        self._magic_logged = False

    def __repr__(self) -> str:
        return self.remote

    # -- asyncio ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.remote = _remote_address(transport)
        self.lookupd.clients.add(self)
        log.info("TCP: new client(%s)", self.remote)

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        self._run()

    def eof_received(self) -> bool | None:
        self.parser.feed_eof()
        self._run()
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lookupd.clients.discard(self)
        self.transport = None
        log.info("CLIENT(%s): closing", self.remote)
        peer = self.peer_info
        if peer is None:
            return
        db = self.lookupd.db
        for r in db.lookup_registrations(peer.id):
            removed, _left = db.remove_producer(r, peer.id)
            if removed:
                self._log_db("UNREGISTER", r)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- commands ---------------------------------------------------------------------------

    def _run(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out: list[bytes] = []
        while True:
            try:
                cmd = self.parser.next_command()
            except FatalClientError as err:
                if err.code == "E_BAD_PROTOCOL":
                    log.error("client(%s) bad protocol magic", self.remote)
                else:
                    log.error("[%s] - %s", self.remote, err)
                out.append(encode_response(err.wire))
                transport.write(b"".join(out))
                transport.close()
                return
            if cmd is None:
                break
            out.append(encode_response(self.execute(cmd)))
        if out:
            transport.write(b"".join(out))

    def execute(self, cmd: Command) -> bytes:
        """Run one valid command against the registration DB; the response data."""
        if isinstance(cmd, Ping):
            return self.ping()
        if isinstance(cmd, Identify):
            return self.identify(cmd)
        if isinstance(cmd, Register):
            return self.register(cmd)
        return self.unregister(cmd)

    def ping(self) -> bytes:
        peer = self.peer_info
        if peer is not None:
            # a PING may come before IDENTIFY on the same connection
            log.debug("CLIENT(%s): pinged", peer.id)
            peer.last_update_ns = time.time_ns()
        return _OK

    def identify(self, cmd: Identify) -> bytes:
        lookupd = self.lookupd
        peer = PeerInfo(id=self.remote, remote_address=self.remote, node=cmd)
        log.info(
            "CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s",
            self.remote,
            cmd.broadcast_address,
            cmd.tcp_port,
            cmd.http_port,
            cmd.version,
        )
        self.peer_info = peer
        if lookupd.db.add_producer(_CLIENT, Producer(peer)):
            log.info("DB: client(%s) REGISTER category:client key: subkey:", self.remote)
        return go_json(  # a Go map: sorted keys
            sort_keys=True,
            data={
                "tcp_port": lookupd.real_tcp_port,
                "http_port": lookupd.real_http_port,
                "version": lookupd.version,
                "broadcast_address": lookupd.opts.broadcast_address,
                "hostname": lookupd.hostname,
            },
        )

    def register(self, cmd: Register) -> bytes:
        peer = self.peer_info
        assert peer is not None  # the parser refuses REGISTER before IDENTIFY
        db = self.lookupd.db
        if cmd.channel:
            key = Registration("channel", cmd.topic, cmd.channel)
            if db.add_producer(key, Producer(peer)):
                self._log_db("REGISTER", key)
        key = Registration("topic", cmd.topic, "")
        if db.add_producer(key, Producer(peer)):
            self._log_db("REGISTER", key)
        return _OK

    def unregister(self, cmd: Unregister) -> bytes:
        peer = self.peer_info
        assert peer is not None
        db = self.lookupd.db
        if cmd.channel:
            self._unregister(Registration("channel", cmd.topic, cmd.channel), peer.id)
            return _OK
        # A topic unregistration: normally its channels are gone already, hence the warning.
        for r in db.find_registrations("channel", cmd.topic, "*"):
            removed, _ = db.remove_producer(r, peer.id)
            if removed:
                log.warning(
                    "client(%s) unexpected UNREGISTER category:channel key:%s subkey:%s",
                    self.remote,
                    cmd.topic,
                    r.subkey,
                )
        self._unregister(Registration("topic", cmd.topic, ""), peer.id)
        return _OK

    def _unregister(self, key: Registration, peer_id: str) -> None:
        """One producer off ``key``; an #ephemeral topic or channel goes with its last one."""
        db = self.lookupd.db
        removed, left = db.remove_producer(key, peer_id)
        if removed:
            self._log_db("UNREGISTER", key)
        if left == 0 and is_ephemeral(key.subkey or key.key):
            db.remove_registration(key)

    def _log_db(self, what: str, key: Registration) -> None:
        log.info(
            "DB: client(%s) %s category:%s key:%s subkey:%s",
            self.remote,
            what,
            key.category,
            key.key,
            key.subkey,
        )
