"""The nsqlookupd root object: options, the registration DB, the TCP and HTTP listeners."""

from __future__ import annotations

import asyncio
import logging
import socket

from .. import NSQD_VERSION
from ..internal import process
from ..internal.listener import format_address, listen, split_host_port
from .http import LookupdHTTP
from .options import LookupdOptions
from .registration_db import RegistrationDB
from .tcp import LookupProtocolV1

log = logging.getLogger("pynsqd.lookupd")


def _port(address: str) -> int:
    try:
        return split_host_port(address)[1]
    except ValueError:
        return 0


class NSQLookupd:
    version = NSQD_VERSION

    def __init__(self, opts: LookupdOptions, loop: asyncio.AbstractEventLoop | None = None):
        self.opts = opts
        self.loop = loop or asyncio.get_running_loop()
        self.db = RegistrationDB()
        self.hostname = socket.gethostname()
        self.clients: set[LookupProtocolV1] = set()
        self.tcp_server: asyncio.Server | None = None
        self.tcp_address = ""
        self.http = LookupdHTTP(self)
        self.http_address = ""

    @property
    def real_tcp_port(self) -> int:
        return _port(self.tcp_address)

    @property
    def real_http_port(self) -> int:
        return _port(self.http_address)

    async def start(self) -> None:
        self.tcp_server = await listen(
            self.loop, lambda: LookupProtocolV1(self), self.opts.tcp_address
        )
        self.tcp_address = format_address(self.tcp_server.sockets[0])
        log.info("TCP: listening on %s", self.tcp_address)
        try:
            await self.http.start(self.opts.http_address)
        except BaseException:
            self.tcp_server.close()
            raise
        self.http_address = self.http.address

    async def stop(self) -> None:
        if self.tcp_server is not None:
            log.info("TCP: closing %s", self.tcp_address)
            self.tcp_server.close()
        for client in list(self.clients):
            client.close()
        await self.http.stop()
        if self.tcp_server is not None:
            await self.tcp_server.wait_closed()
            self.tcp_server = None


def run(opts: LookupdOptions) -> int:
    """Run nsqlookupd until SIGTERM or SIGINT; the console script's body."""
    return process.run(lambda loop: NSQLookupd(opts, loop), "nsqlookupd", log)
