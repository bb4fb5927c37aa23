"""Value checks for options whose values are narrower than their type: one function per kind of
value, named in the options tables (``pynsqd.options``, ``pynsqd.lookupd.options``) where each
option is declared. Each returns the value normalised or raises ``ValueError`` with the reason
that the flag parser, the config loader and ``/config`` put after the option's name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from ..log import parse_log_level
from .listener import is_unix_address, split_host_port

#: sockaddr_un's sun_path: 108 bytes with the terminating NUL.
MAX_UNIX_PATH = 107
TLS_VERSIONS = ("tls1.0", "tls1.1", "tls1.2", "tls1.3")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(text: str) -> bool:
    """``strconv.ParseBool``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("not a boolean (true or false)")


def unreadable(path: str) -> str | None:
    """Why ``path`` cannot be read (``No such file or directory``...), or None: for errors that
    name the file (ssl's certificate loaders name none)."""
    try:
        with open(path, "rb"):
            return None
    except OSError as err:
        return err.strerror or str(err)


def first_unreadable(named: Iterable[tuple[str, str | None]]) -> tuple[str, str, str] | None:
    """Of ``(name, path)`` pairs (a flag, an option; empty paths skipped), the first file that
    cannot be read, as ``(name, path, why)``: TLS files are named before ssl fails unnamed."""
    for name, path in named:
        why = unreadable(path) if path else None
        if why is not None:
            assert path is not None
            return name, path, why
    return None


def go_float_text(value: float) -> str:
    """A float as Go's ``%v`` prints it: 1.0 → ``1``, 0.99 → ``0.99``."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def quote(value: Any) -> str:
    """A value as the user wrote it, for error messages: strings in Go's ``%q`` style."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(quote(v) for v in value) + "]"
    return str(value)


# -- value checks: one per option that takes less than its type allows ------------------------


def check_log_level(value: str) -> str:
    parse_log_level(value)
    return value.lower()


def check_tls_required(value: str) -> str:
    lowered = value.lower()
    if lowered == "tcp-https":
        return lowered
    try:
        return "true" if parse_go_bool(lowered) else "false"
    except ValueError:
        raise ValueError("must be true, false or tcp-https") from None


def check_tls_min_version(value: str) -> str:
    lowered = value.lower()
    if lowered == "":
        return "tls1.0"
    if lowered in TLS_VERSIONS:
        return lowered
    if lowered == "ssl3.0":
        raise ValueError("SSL 3.0 is not supported; must be tls1.0, tls1.1, tls1.2 or tls1.3")
    raise ValueError("must be tls1.0, tls1.1, tls1.2 or tls1.3")


def check_tls_client_auth_policy(value: str) -> str:
    if value in ("", "require", "require-verify"):
        return value
    raise ValueError("must be require or require-verify")


def check_auth_http_request_method(value: str) -> str:
    lowered = value.lower()
    if lowered in ("get", "post"):
        return lowered
    raise ValueError("--auth-http-request-method must be post or get")


def within(low: int, high: int, words: str) -> Callable[[int], int]:
    """The check of a number that must be within ``[low, high]``; ``words`` say so."""

    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(words)
        return value

    return check


check_port = within(0, 65535, "must be a port number [0,65535]")


def check_host_port(value: str, *, port_zero: bool) -> str:
    if is_unix_address(value):
        raise ValueError("must be <addr>:<port>")
    host, port = split_host_port(value)
    if ":" in host and not value.startswith("["):
        raise ValueError("an IPv6 address needs brackets, as in [::1]:4150")
    if port > 65535 or (port == 0 and not port_zero):
        raise ValueError(f"port {port} out of range")
    return value


def listen_address(*, may_disable: bool) -> Callable[[str], str]:
    """``host:port`` (port 0 picks a free port), ``[v6]:port``, or a unix socket path."""

    def check(value: str) -> str:
        if value == "":
            if may_disable:
                return value
            raise ValueError("must not be empty")
        if not is_unix_address(value):
            return check_host_port(value, port_zero=True)
        if value.startswith("["):
            raise ValueError("an IPv6 address needs a port, as in [::1]:4150")
        if len(os.fsencode(value)) > MAX_UNIX_PATH:
            raise ValueError(f"a unix socket path is at most {MAX_UNIX_PATH} bytes")
        return value

    return check


def check_lookupd_addresses(values: list[str]) -> list[str]:
    for value in values:
        try:
            check_host_port(value, port_zero=False)
        except ValueError as e:
            raise ValueError(f"{quote(value)}: {e}") from None
    return values


def check_auth_addresses(values: list[str]) -> list[str]:
    for value in values:
        if value.startswith(("http://", "https://")):
            if value.partition("://")[2].strip("/") == "":
                raise ValueError(f"{quote(value)}: a URL needs a host")
            continue
        try:
            check_host_port(value, port_zero=False)
        except ValueError:
            raise ValueError(f"{quote(value)}: must be <addr>:<port> or a full URL") from None
    return values


def check_statsd_address(value: str) -> str:
    return value if value == "" else check_host_port(value, port_zero=False)


BOUND_POLICIES = ("reject", "drop-oldest")


def check_bound_policy(value: str) -> str:
    if value not in BOUND_POLICIES:
        raise ValueError("must be reject or drop-oldest")
    return value


check_max_attempts = within(0, 65535, "must be [0,65535]")


def check_percentiles(values: list[float]) -> list[float]:
    for v in values:
        if not 0 < v <= 1:
            raise ValueError(f"invalid E2E processing latency percentile: {go_float_text(v)}")
    # nsqd's FloatArray keeps them sorted, largest first; a repeat would only repeat a column.
    return sorted(set(values), reverse=True)


#: ``--workers``: at most this many worker processes.
MAX_WORKERS = 256


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, within its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def check_workers(value: str) -> str:
    """``auto`` or a count of worker processes, 1 to 256."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise ValueError("must be a number of worker processes or 'auto'") from None
    if not 1 <= n <= MAX_WORKERS:
        raise ValueError(f"must be 1 to {MAX_WORKERS} or 'auto'")
    return str(n)


def workers_count(value: str) -> int:
    return usable_cores() if value == "auto" else int(value)


def check_cluster_name(value: str) -> str:
    if not value or len(value) > 64 or not all(c.isalnum() or c in "._-" for c in value):
        raise ValueError("must be 1-64 letters, digits, '.', '_' or '-'")
    return value


def check_lease_ttl(value: float) -> float:
    if value < 2 or value != int(value):
        raise ValueError("must be whole seconds, at least 2s (etcd's shortest lease)")
    return value


check_replicas = within(1, 7, "must be 1-7")


def choice(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value

    return check
