"""The two kinds of client error nsqd distinguishes.

A ``FatalClientError`` is sent as an error frame and then the connection is closed; a
``ClientError`` (only E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED) is sent and the connection
goes on. On the wire both are ``"<code> <desc>"``.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every error the protocol layer raises; nothing else may escape the parser."""

    fatal = True

    def __init__(self, code: str, desc: str = "") -> None:
        super().__init__(f"{code} {desc}" if desc else code)
        self.code = code
        self.desc = desc

    @property
    def wire(self) -> bytes:
        """The error frame's data, exactly as nsqd writes it."""
        # surrogateescape: nsqd echoes raw command bytes (%s of a []byte) that may not be UTF-8.
        return str(self).encode("utf-8", "surrogateescape")


class FatalClientError(ProtocolError):
    fatal = True


class ClientError(ProtocolError):
    fatal = False
