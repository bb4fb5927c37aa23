"""TLS for nsqd: the server context from the --tls-* flags, and TLS over memory BIOs.

The TCP upgrade runs TLS on ``ssl.MemoryBIO`` pairs inside the client's own protocol object
rather than ``loop.start_tls``: bytes the client sent right after IDENTIFY (already in the
parser's buffer) belong to the handshake and can be fed to it, no command is processed until
the handshake is done, and the same code runs on asyncio and uvloop.
"""

from __future__ import annotations

import ssl
import warnings
from typing import Any

from ..internal.checks import first_unreadable
from ..options import Options

_MIN_VERSIONS = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}
_GO_VERSION_NAMES = {
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
    "TLSv1.3": "TLS1.3",
}
_READ_SIZE = 256 * 1024


class TLSConfigError(Exception):
    """The --tls-* flags do not make a usable TLS configuration."""


def server_context(opts: Options) -> ssl.SSLContext | None:
    """nsqd's ``buildTLSConfig``: None without --tls-cert/--tls-key.

    ``require`` (Go's RequireAnyClientCert) cannot be had from Python's ssl module, which
    verifies every client certificate it asks for: here it requires a certificate that verifies
    against --tls-root-ca-file (or the system's CAs), like ``require-verify``.
    """
    if not opts.tls_cert and not opts.tls_key:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # A file that cannot be read is named with its flag (ssl's errors name neither).
    bad = first_unreadable(
        (
            ("--tls-cert", opts.tls_cert),
            ("--tls-key", opts.tls_key),
            ("--tls-root-ca-file", opts.tls_root_ca_file),
        )
    )
    if bad is not None:
        raise TLSConfigError("failed to load TLS config - {}={}: {}".format(*bad))
    try:
        ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
        with warnings.catch_warnings():
            # TLS 1.0 and 1.1 are deprecated in Python, but --tls-min-version=tls1.0 is
            # nsqd's default. (OpenSSL's own security level may still refuse them.)
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = _MIN_VERSIONS.get(opts.tls_min_version, ssl.TLSVersion.TLSv1)
        policy = opts.tls_client_auth_policy
        if policy in ("require", "require-verify"):
            ctx.verify_mode = ssl.CERT_REQUIRED
            if opts.tls_root_ca_file:
                ctx.load_verify_locations(cafile=opts.tls_root_ca_file)
            else:
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except (OSError, ValueError) as err:
        raise TLSConfigError(f"failed to load TLS config - {err}") from err
    return ctx


def client_context(opts: Options) -> ssl.SSLContext:
    """nsqd's client TLS config (for https auth servers): --tls-root-ca-file if given."""
    ctx = ssl.create_default_context(cafile=opts.tls_root_ca_file or None)
    return ctx


def first_record_is_tls(data: bytes) -> bool:
    """Go's check: a TLS connection starts with a handshake record (type 22)."""
    return not data or data[0] == 0x16


class TLSLayer:
    """One server-side TLS connection over memory BIOs: feed ciphertext, take plaintext."""

    __slots__ = ("_in", "_obj", "_out", "eof", "handshake_done")

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=True)
        self.handshake_done = False
        self.eof = False

    def handshake(self, data: bytes) -> bool:
        """Feed handshake bytes; True once the handshake is done. Raises ``ssl.SSLError``."""
        if data:
            self._in.write(data)
        try:
            self._obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        self.handshake_done = True
        return True

    def take_outgoing(self) -> bytes:
        """Records to send: handshake messages, alerts, session tickets."""
        return self._out.read() if self._out.pending else b""

    def decode(self, data: bytes) -> bytes:
        """Ciphertext in, plaintext out. Raises ``ssl.SSLError`` on a corrupt stream."""
        if data:
            self._in.write(data)
        obj = self._obj
        chunks: list[bytes] = []
        while True:
            try:
                chunk = obj.read(_READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.eof = True  # close_notify: the client is done
                break
            if not chunk:
                # CPython's SSLObject returns b"" (rather than raising) once close_notify has
                # been received; no data at all raises SSLWantReadError.
                self.eof = True
                break
            chunks.append(chunk)
        if len(chunks) == 1:
            return chunks[0]
        return b"".join(chunks)

    def encode(self, data: bytes) -> bytes:
        obj = self._obj
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            offset += obj.write(view[offset:])
        return self._out.read()

    @property
    def version(self) -> str:
        """As nsqd's /stats spells it: ``TLS1.2``, ``TLS1.3``."""
        v = self._obj.version() or ""
        return _GO_VERSION_NAMES.get(v, v)

    @property
    def cipher_suite(self) -> str:
        c = self._obj.cipher()
        return c[0] if c else ""

    @property
    def common_name(self) -> str:
        """The CN of the client certificate, "" without one."""
        cert = self._obj.getpeercert()
        if not cert:
            return ""
        subject: Any = cert.get("subject", ())
        for rdn in subject:
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return ""
