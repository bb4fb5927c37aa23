"""How the client connects: one options type for the TCP connection and the HTTP side."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from .. import __version__
from ..internal.checks import first_unreadable

__all__ = ["ClientOptions"]

_CONTEXTS: dict[tuple[object, ...], ssl.SSLContext] = {}


@dataclass(frozen=True)
class ClientOptions:
    """How to connect and IDENTIFY; picklable, so it can travel to Spark executors."""

    connect_timeout: float = 5.0
    #: read/write timeout of request/response calls (seconds)
    timeout: float = 30.0
    #: IDENTIFY heartbeat_interval in ms (0: nsqd's default, 30 s)
    heartbeat_interval_ms: int = 0
    #: IDENTIFY msg_timeout in ms (0: nsqd's --msg-timeout)
    msg_timeout_ms: int = 0
    client_id: str = ""
    user_agent: str = f"pynsqd/{__version__}"
    tls: bool = False
    tls_verify: bool = True
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    auth_secret: str | None = None
    #: pynsqd: ask for message headers (``protocol/headers.py``): ``pub``/``mpub``/``dpub``
    #: take ``headers=``, and a subscriber's callback gets each message's headers.
    headers: bool = False

    def ssl_context(self) -> ssl.SSLContext:
        """Raises OSError naming a file that cannot be read (ssl's own errors do not)."""
        bad = first_unreadable(
            (
                ("TLS CA file", self.tls_ca_file),
                ("TLS certificate file", self.tls_cert_file),
                ("TLS key file", self.tls_key_file),
            )
        )
        if bad is not None:
            raise OSError("{} {}: {}".format(*bad))
        ctx = ssl.create_default_context(cafile=self.tls_ca_file)
        if not self.tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.tls_cert_file:
            ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return ctx

    def shared_ssl_context(self) -> ssl.SSLContext:
        """One context per set of TLS options and process (HTTP requests reuse it)."""
        key = (self.tls_verify, self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = _CONTEXTS[key] = self.ssl_context()
        return ctx
