"""What the client raises, and how it reads an address: shared by every part of it."""

from __future__ import annotations

from ..internal.names import is_valid_name, is_valid_producer

__all__ = [
    "DEFAULT_LOOKUPD_HTTP_PORT",
    "DEFAULT_TCP_PORT",
    "NON_FATAL_ERRORS",
    "NsqConnectionError",
    "NsqError",
    "NsqLookupError",
    "check_names",
    "parse_address",
]

#: Error codes after which nsqd keeps the connection open; every other error closes it.
NON_FATAL_ERRORS = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})
DEFAULT_TCP_PORT = 4150
DEFAULT_LOOKUPD_HTTP_PORT = 4161


class NsqError(Exception):
    """nsqd answered with an error frame ``"<code> <description>"``."""

    def __init__(self, code: str, desc: str, address: str = "") -> None:
        where = f" (nsqd {address})" if address else ""
        super().__init__(f"{code} {desc}{where}" if desc else f"{code}{where}")
        self.code = code
        self.desc = desc
        self.address = address

    @property
    def fatal(self) -> bool:
        """nsqd closes the connection after a fatal error."""
        return self.code not in NON_FATAL_ERRORS

    @classmethod
    def from_frame(cls, data: bytes, address: str = "") -> NsqError:
        text = data.decode("utf-8", "replace")
        code, _, desc = text.partition(" ")
        return cls(code, desc, address)


class NsqConnectionError(ConnectionError):
    """Connecting failed, the connection broke, or nsqd spoke something we did not expect."""

    def __init__(self, message: str, address: str = "") -> None:
        super().__init__(message)
        self.address = address


class NsqLookupError(ConnectionError):
    """No nsqlookupd answered."""


def check_names(topic: str, channel: str | None = None, *, framing_only: bool = False) -> None:
    """Raise ``ValueError`` naming a topic or channel nsqd would refuse, before anything is
    sent (the tools: they name the flag). With ``framing_only`` (the connections), only a
    name that would break the command line: a space or a line end splits it, and nsqd would
    read a piece of the name as the topic (others are nsqd's to refuse, with its code)."""
    for what, name in (("topic", topic), ("channel", channel)):
        if name is None:
            continue
        bad = any(c in name for c in " \n\r\t") if framing_only else not is_valid_name(name)
        if bad:
            raise ValueError(
                f"invalid {what} name {name!r}: 1-64 of [.a-zA-Z0-9_-], optionally #ephemeral"
            )


#: What a client puts in IDENTIFY to publish with identities (pynsqd; nsqd ignores it).
IDEMPOTENT = "idempotent_publish"


def check_identity(
    identity: tuple[str, int] | None, identify_response: dict[str, object], address: str
) -> None:
    """An idempotent publish's (producer, sequence): ValueError if malformed, NsqError if the
    node did not take ``idempotent_publish`` in IDENTIFY (Go nsqd: it would drop the
    identity and write every retry)."""
    if identity is None:
        return
    producer, seq = identity
    if not is_valid_producer(producer.encode()):
        raise ValueError(f"invalid producer id {producer!r}: 1-128 of A-Z a-z 0-9 . _ : -")
    if not 0 <= seq < 1 << 63:
        raise ValueError(f"invalid sequence number {seq}: 0 to 2**63-1")
    if identify_response.get(IDEMPOTENT) is not True:
        raise NsqError(
            "E_NOT_SUPPORTED",
            f"nsqd {address} does not offer idempotent publishing (pynsqd does, on retained "
            "topics; Go nsqd does not)",
            address,
        )


def parse_address(value: str, default_port: int = DEFAULT_TCP_PORT) -> tuple[str, int]:
    """``host:port``, ``host`` or ``[v6]:port`` → ``(host, port)``; ValueError if malformed."""
    value = value.strip()
    if not value:
        raise ValueError("empty address")
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep:
            raise ValueError(f"bad address {value!r}")
        port_s = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, port_s = value.split(":")
    else:
        host, port_s = value, ""
    if not host:
        raise ValueError(f"bad address {value!r}: no host")
    if not port_s:
        return host, default_port
    if not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise ValueError(f"bad address {value!r}: port must be 1..65535")
    return host, int(port_s)
