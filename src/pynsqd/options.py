"""The one options table: every nsqd flag, its config-file key, default and help.

Each dataclass field of ``Options`` is one option. Its metadata names the flag kind and help
text; the flag is the field name with ``_`` → ``-`` and the config key is the field name (or the
``cfg`` alias nsqd uses). ``cli.py`` builds the flag parser and the TOML loader from this table,
and the HTTP API's ``/config/:opt`` reads it, so an option is written down exactly once.

Durations are held as float seconds; on the wire they are converted to nsqd's units (ms in
IDENTIFY, ns in /info). ``parse_duration`` and ``format_duration`` speak Go's ``time.Duration``
text (``1m0s``, ``250ms``), which is what flags, the config file and ``/config`` use.
"""

from __future__ import annotations

import hashlib
import re
import socket
import zlib
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from fractions import Fraction
from typing import Any, Literal

from .internal import checks

Kind = Literal["str", "int", "bool", "duration", "list", "floatlist", "deprecated_bool"]


def opt(
    default: Any,
    help: str,
    *,
    kind: Kind | None = None,
    cfg: str | None = None,
    deprecated: str | None = None,
    deprecated_flag: str | None = None,
    implicit: str | None = None,
    check: Callable[[Any], Any] | None = None,
    positive: bool = False,
    checked_later: bool = False,
) -> Any:
    """One option. ``deprecated``: the flag itself is deprecated (the note says what to use).
    ``deprecated_flag``: an old flag name still accepted for this option, with a warning
    (go-options' ``deprecated`` tag). ``implicit``: the value a flag given without ``=value``
    takes, for string options that Go declares as boolean flags (``-tls-required``).
    ``check``: the value check of an option narrower than its type (``internal/checks.py``);
    ``positive``: a number or duration that makes no sense at zero; otherwise numbers must not
    be negative. ``checked_later``: nsqd checks it after resolution, in its own words."""
    meta = {
        "help": help,
        "kind": kind,
        "cfg": cfg,
        "deprecated": deprecated,
        "deprecated_flag": deprecated_flag,
        "implicit": implicit,
        "check": check,
        "positive": positive,
        "checked_later": checked_later,
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def default_node_id() -> int:
    """nsqd's default: crc32(md5(hostname)) % 1024."""
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


def _hostname() -> str:
    return socket.gethostname()


@dataclass
class Options:
    # -- basic
    config: str = opt("", "path to config file", kind="str")
    log_level: str = opt(
        "info",
        "set log verbosity: debug, info, warn, error, or fatal",
        check=checks.check_log_level,
    )
    log_prefix: str = opt("[nsqd] ", "log message prefix")
    verbose: bool = opt(
        False, "[deprecated] has no effect, use --log-level", deprecated="use --log-level"
    )
    node_id: int = opt(
        -1,
        "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
        cfg="id",
        checked_later=True,
    )
    worker_id: bool = opt(
        False, "[deprecated] use --node-id", kind="deprecated_bool", deprecated="use --node-id"
    )
    https_address: str = opt(
        "0.0.0.0:4152",
        "<addr>:<port> to listen on for HTTPS clients",
        check=checks.listen_address(may_disable=True),
    )
    http_address: str = opt(
        "0.0.0.0:4151",
        '<addr>:<port> to listen on for HTTP clients ("" disables it)',
        check=checks.listen_address(may_disable=True),
    )
    tcp_address: str = opt(
        "0.0.0.0:4150",
        "<addr>:<port> to listen on for TCP clients",
        check=checks.listen_address(may_disable=False),
    )
    broadcast_address: str = opt(
        "", "address that will be registered with lookupd (defaults to the OS hostname)"
    )
    broadcast_tcp_port: int = opt(
        0,
        "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)",
        check=checks.check_port,
    )
    broadcast_http_port: int = opt(
        0,
        "HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)",
        check=checks.check_port,
    )
    lookupd_tcp_addresses: list[str] = opt(
        [],
        "lookupd TCP address (may be given multiple times)",
        kind="list",
        cfg="nsqlookupd_tcp_addresses",
        check=checks.check_lookupd_addresses,
    )
    auth_http_addresses: list[str] = opt(
        [],
        "<addr>:<port> or a full url to query auth server (may be given multiple times)",
        kind="list",
        cfg="auth_http_addresses",
        check=checks.check_auth_addresses,
    )
    auth_http_request_method: str = opt(
        "get",
        "HTTP method to use for auth server requests (get or post)",
        check=checks.check_auth_http_request_method,
    )
    http_client_connect_timeout: float = opt(2.0, "timeout for HTTP connect", kind="duration")
    http_client_request_timeout: float = opt(5.0, "timeout for HTTP request", kind="duration")
    topology_region: str = opt(
        "", "region represents a larger domain, typically a geographic region"
    )
    topology_zone: str = opt("", "zone represents a smaller domain within a region")
    enable_experiment: list[str] = opt(
        [],
        "enable experimental feature (may be given multiple times)",
        kind="list",
        cfg="enable_experiment",
    )
    # -- disk queue
    data_path: str = opt("", "path to store disk-backed messages (default: the current directory)")
    mem_queue_size: int = opt(10000, "number of messages to keep in memory (per topic/channel)")
    max_bytes_per_file: int = opt(
        104857600, "number of bytes per diskqueue file before rolling", positive=True
    )
    sync_every: int = opt(2500, "number of messages per diskqueue fsync", positive=True)
    sync_timeout: float = opt(
        2.0, "duration of time per diskqueue fsync", kind="duration", positive=True
    )
    queue_scan_worker_pool_max: int = opt(
        4,
        "max concurrency for checking in-flight and deferred message timeouts (pynsqd: accepted, unused: timeouts fire from one timed queue per channel)",
    )
    queue_scan_selection_count: int = opt(
        20,
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts (pynsqd: accepted, unused)",
    )
    # -- msg and command
    msg_timeout: float = opt(
        60.0, "default duration to wait before auto-requeing a message", kind="duration"
    )
    max_msg_timeout: float = opt(
        900.0, "maximum duration before a message will timeout", kind="duration"
    )
    max_msg_size: int = opt(
        1048576,
        "maximum size of a single message in bytes",
        deprecated_flag="max-message-size",
        positive=True,
    )
    max_req_timeout: float = opt(3600.0, "maximum requeuing timeout for a message", kind="duration")
    max_body_size: int = opt(5242880, "maximum size of a single command body", positive=True)
    # -- client overridable
    max_heartbeat_interval: float = opt(
        60.0,
        "maximum client configurable duration of time between client heartbeats",
        kind="duration",
    )
    max_rdy_count: int = opt(2500, "maximum RDY count for a client")
    max_output_buffer_size: int = opt(
        65536, "maximum client configurable size (in bytes) for a client output buffer"
    )
    max_output_buffer_timeout: float = opt(
        30.0,
        "maximum client configurable duration of time between flushing to a client",
        kind="duration",
    )
    min_output_buffer_timeout: float = opt(
        0.025,
        "minimum client configurable duration of time between flushing to a client",
        kind="duration",
    )
    output_buffer_timeout: float = opt(
        0.25, "default duration of time between flushing data to clients", kind="duration"
    )
    max_channel_consumers: int = opt(
        0,
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
    )
    # -- statsd
    statsd_address: str = opt(
        "",
        "UDP <addr>:<port> of a statsd daemon for pushing stats",
        check=checks.check_statsd_address,
    )
    statsd_interval: float = opt(
        60.0, "duration between pushing to statsd", kind="duration", positive=True
    )
    statsd_mem_stats: bool = opt(True, "toggle sending memory and GC stats to statsd")
    statsd_prefix: str = opt(
        "nsq.%s", "prefix used for keys sent to statsd (%s for host replacement)"
    )
    statsd_udp_packet_size: int = opt(508, "the size in bytes of statsd UDP packets", positive=True)
    statsd_exclude_ephemeral: bool = opt(
        False, "Skip ephemeral topics and channels when sending stats to statsd"
    )
    # -- e2e latency
    e2e_processing_latency_percentiles: list[float] = opt(
        [],
        "message processing time percentiles (as float (0, 1.0]) to track (can be specified multiple times or comma separated '1.0,0.99,0.95', default none)",
        kind="floatlist",
        cfg="e2e_processing_latency_percentiles",
        check=checks.check_percentiles,
    )
    e2e_processing_latency_window_time: float = opt(
        600.0,
        "calculate end to end latency quantiles for this duration of time (ie: 60s would only show quantile calculations from the past 60 seconds)",
        kind="duration",
    )
    # -- TLS
    tls_cert: str = opt("", "path to certificate file")
    tls_key: str = opt("", "path to key file")
    tls_client_auth_policy: str = opt(
        "",
        "client certificate auth policy ('require' or 'require-verify')",
        check=checks.check_tls_client_auth_policy,
    )
    tls_root_ca_file: str = opt("", "path to certificate authority file")
    tls_required: str = opt(
        "false",
        "require TLS for client connections (true, false, tcp-https)",
        implicit="true",
        check=checks.check_tls_required,
    )
    tls_min_version: str = opt(
        "tls1.0",
        "minimum SSL/TLS version acceptable (tls1.0, tls1.1, tls1.2 or tls1.3)",
        check=checks.check_tls_min_version,
    )
    # -- compression
    deflate: bool = opt(True, "enable deflate feature negotiation (client compression)")
    max_deflate_level: int = opt(
        6,
        "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
        checked_later=True,
    )
    snappy: bool = opt(True, "enable snappy feature negotiation (client compression)")

    def __post_init__(self) -> None:
        if self.node_id == -1:
            self.node_id = default_node_id()
        if not self.broadcast_address:
            self.broadcast_address = _hostname()


#: nsqd's flag names where they are not simply the field name with ``_`` → ``-``.
FLAG_NAMES: dict[str, str] = {
    "lookupd_tcp_addresses": "lookupd-tcp-address",
    "auth_http_addresses": "auth-http-address",
    "e2e_processing_latency_percentiles": "e2e-processing-latency-percentile",
}


def option_fields(options: type[Any] = Options) -> tuple[Field[Any], ...]:
    """The fields of an options table (nsqd's ``Options`` unless another is given)."""
    return fields(options)


def flag_name(f: Field[Any]) -> str:
    return FLAG_NAMES.get(f.name, f.name.replace("_", "-"))


def config_key(f: Field[Any]) -> str:
    cfg = f.metadata.get("cfg")
    return cfg if cfg else f.name


def option_kind(f: Field[Any]) -> Kind:
    kind: Kind | None = f.metadata.get("kind")
    if kind is not None:
        return kind
    default = f.default if f.default is not MISSING else None
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    return "str"


def deprecated_flag_name(f: Field[Any]) -> str | None:
    """An old flag name still accepted for this option (``--max-message-size``)."""
    name: str | None = f.metadata.get("deprecated_flag")
    return name


# -- Go's time.Duration text ------------------------------------------------------------------

_NS_PER_UNIT: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_NUMBER = re.compile(r"([0-9]*)(?:\.([0-9]*))?")
_UNIT = re.compile(r"[^0-9.]*")
_MAX_NS = (1 << 63) - 1


def parse_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration``: ``60s``, ``1h0m0s``, ``1.5h``, ``300µs``; ``0`` alone is 0.

    Raises ``ValueError`` with Go's message (``time: missing unit in duration "60"``).
    """
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f'time: invalid duration "{text}"')
    total = Fraction(0)
    while s:
        number = _NUMBER.match(s)
        assert number is not None  # the pattern matches the empty string
        whole, frac = number.group(1), number.group(2)
        if not whole and not frac:
            raise ValueError(f'time: invalid duration "{text}"')
        s = s[number.end() :]
        unit_match = _UNIT.match(s)
        assert unit_match is not None
        unit = unit_match.group(0)
        s = s[unit_match.end() :]
        if not unit:
            raise ValueError(f'time: missing unit in duration "{text}"')
        if unit not in _NS_PER_UNIT:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{text}"')
        value = Fraction(int(whole or "0"))
        if frac:
            value += Fraction(int(frac), 10 ** len(frac))
        total += value * _NS_PER_UNIT[unit]
        if total > _MAX_NS + (1 if negative else 0):
            raise ValueError(f'time: invalid duration "{text}"')
    ns = int(total)
    return -ns if negative else ns


def parse_duration(text: str) -> float:
    """Go duration text → float seconds (the unit ``Options`` keeps durations in)."""
    return parse_duration_ns(text) / 1e9


def _with_fraction(value: int, unit: int, digits: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def format_duration(seconds: float) -> str:
    """Go's ``Duration.String``: 60.0 → ``1m0s``, 0.25 → ``250ms``, 3600.0 → ``1h0m0s``."""
    ns = round(seconds * 1e9)
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u == 0:
        return "0s"
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_with_fraction(u, 1_000, 3)}\u00b5s"
    if u < 1_000_000_000:
        return f"{sign}{_with_fraction(u, 1_000_000, 6)}ms"
    whole_seconds, frac_ns = divmod(u, 1_000_000_000)
    hours, rest = divmod(whole_seconds, 3600)
    minutes, secs = divmod(rest, 60)
    sec_text = _with_fraction(secs * 1_000_000_000 + frac_ns, 1_000_000_000, 9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{sec_text}"
    if minutes:
        return f"{sign}{minutes}m{sec_text}"
    return f"{sign}{sec_text}"
