"""What the tools share: Go-style flags from an options table, their exit on bad input, and
go-nsq's config keys (``--consumer-opt``, ``--producer-opt``)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from ..client import ClientOptions
from ..internal.checks import parse_go_bool
from ..internal.flags import UsageError, answer, parse_command_line
from ..internal.gotext import parse_duration
from ..internal.version import version_string


def parse(program: str, options: type[Any], argv: list[str] | None) -> Any:
    """The tool's options from Go-style flags (no config file). ``--version``, ``-h`` and a bad
    flag are answered here: ``SystemExit`` with the exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command_line = parse_command_line(args, options, program)
        if command_line.version:
            print(version_string(program))
            raise SystemExit(0)
        opts = options()
        for name, value in command_line.values.items():
            setattr(opts, name, value)
    except UsageError as e:
        raise SystemExit(answer(program, e)) from None
    return opts


# -- the tools' log lines --------------------------------------------------------------------

#: Go's log levels (``--log-level``), lowest first.
LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")


class ToolLog:
    """A tool's lines on stderr: ``prefix`` first (``<program>: `` unless ``--log-prefix``),
    those below ``--log-level`` left out."""

    def __init__(self, program: str, prefix: str | None = None, level: str = "info") -> None:
        level = level.lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"--log-level={level}: must be one of {', '.join(LOG_LEVELS)}")
        self.prefix = f"{program}: " if prefix is None else prefix
        self.threshold = LOG_LEVELS.index(level)

    def say(self, line: str, level: str = "info") -> None:
        if LOG_LEVELS.index(level) >= self.threshold:
            print(f"{self.prefix}{line}", file=sys.stderr, flush=True)


# -- go-nsq's config keys (--consumer-opt / --producer-opt) ----------------------------------


def _ms(value: str) -> int:
    return round(parse_duration(value) * 1000)


#: go-nsq Config keys the tools honour: how each sets ClientOptions (or the tool's own
#: ``max_in_flight``). Others are refused by name (snappy and deflate are not built into the
#: tools' client; go-nsq's backoff, sampling and buffering keys have no effect here).
_GO_KEYS: dict[str, Callable[[str], dict[str, Any]]] = {
    "tls_v1": lambda v: {"tls": parse_go_bool(v)},
    "tls_root_ca_file": lambda v: {"tls": True, "tls_ca_file": v},
    "tls_insecure_skip_verify": lambda v: {"tls_verify": not parse_go_bool(v)},
    "tls_cert": lambda v: {"tls_cert_file": v},
    "tls_key": lambda v: {"tls_key_file": v},
    "auth_secret": lambda v: {"auth_secret": v},
    "client_id": lambda v: {"client_id": v},
    "user_agent": lambda v: {"user_agent": v},
    "heartbeat_interval": lambda v: {"heartbeat_interval_ms": _ms(v)},
    "msg_timeout": lambda v: {"msg_timeout_ms": _ms(v)},
    "dial_timeout": lambda v: {"connect_timeout": parse_duration(v)},
    "read_timeout": lambda v: {"timeout": parse_duration(v)},
    "write_timeout": lambda v: {"timeout": parse_duration(v)},
    "max_in_flight": lambda v: {"max_in_flight": int(v)},
}


def go_client(program: str, flag: str, values: list[str]) -> tuple[ClientOptions, int]:
    """The tool's client options with ``--consumer-opt``/``--producer-opt`` applied, and the
    ``max_in_flight`` given (0: none); a bad one is the tool's one line and exit 1."""
    try:
        return go_config(flag, values, ClientOptions(user_agent=f"{program}/pynsqd"))
    except ValueError as err:
        print(f"{program}: {err}", file=sys.stderr)
        raise SystemExit(1) from None


def go_config(flag: str, values: list[str], client: ClientOptions) -> tuple[ClientOptions, int]:
    """``--consumer-opt``/``--producer-opt`` values (go-nsq's ``key,value``) applied to
    ``client``; also the ``max_in_flight`` given (0: none). Raises ValueError naming the flag
    and the key (the tool's one line)."""
    changes: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition(",")
        key = key.strip().lower()
        if not sep:
            raise ValueError(f"--{flag}={item}: expected key,value (go-nsq's config)")
        setter = _GO_KEYS.get(key)
        if setter is None:
            raise ValueError(f"--{flag}: go-nsq config {key!r} is not supported by this tool")
        try:
            changes.update(setter(value.strip()))
        except ValueError as err:
            raise ValueError(f"--{flag}={item}: {err}") from None
    max_in_flight = int(changes.pop("max_in_flight", 0))
    return dataclasses.replace(client, **changes), max_in_flight


def header_line(pairs: list[tuple[str, bytes]]) -> bytes:
    """A message's headers as one line of JSON, for the tools that print them
    (``--message-headers``): name to value (text; bytes that are not UTF-8 as ``\\xNN``), a
    name given more than once to the list of its values."""
    out: dict[str, list[str]] = {}
    for name, value in pairs:
        out.setdefault(name, []).append(value.decode("utf-8", "backslashreplace"))
    doc = {k: v[0] if len(v) == 1 else v for k, v in out.items()}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
