"""How an options table is declared: each dataclass field is one option, and its metadata is
everything the rest of the program needs to know about it (flag name, kind, config key, help,
value check). ``internal.flags`` builds the command line, the TOML loader and ``-h`` from it;
nsqd's ``/config`` reads it. nsqd (``pynsqd.options``) and nsqlookupd
(``pynsqd.lookupd.options``) each declare their own table with ``opt``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, field, fields
from typing import Any, Literal

from .checks import check_log_level, listen_address

Kind = Literal["str", "int", "float", "bool", "duration", "list", "floatlist", "deprecated_bool"]


def opt(
    default: Any,
    help: str,
    *,
    kind: Kind | None = None,
    flag: str | None = None,
    cfg: str | None = None,
    deprecated: str | None = None,
    deprecated_flag: str | None = None,
    implicit: str | None = None,
    check: Callable[[Any], Any] | None = None,
    positive: bool = False,
    checked_later: bool = False,
) -> Any:
    """One option. ``flag``: the flag name where it is not the field name with ``_`` → ``-``
    (nsqd's repeatable flags are singular: ``--lookupd-tcp-address``). ``cfg``: the config-file
    key where it is not the field name. ``deprecated``: the flag itself is deprecated (the note
    says what to use). ``deprecated_flag``: an old flag name still accepted for this option, with
    a warning (go-options' ``deprecated`` tag). ``implicit``: the value a flag given without
    ``=value`` takes, for string options that Go declares as boolean flags (``-tls-required``).
    ``check``: the value check of an option narrower than its type (``internal/checks.py``);
    ``positive``: a number or duration that makes no sense at zero; otherwise numbers must not
    be negative. ``checked_later``: the program checks it after resolution, in its own words."""
    meta = {
        "help": help,
        "kind": kind,
        "flag": flag,
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


def many(help: str, flag: str | None = None, **more: Any) -> Any:
    """A repeatable option, a list: each ``--flag=value`` adds one (nsqd's
    ``--lookupd-tcp-address``); ``more`` as for ``opt``."""
    return opt([], f"{help} (may be given multiple times)", kind="list", flag=flag, **more)


# -- the options every NSQ program has, declared once ----------------------------------------


def config_file() -> Any:
    return opt("", "path to config file", kind="str")


def log_level() -> Any:
    return opt(
        "info", "set log verbosity: debug, info, warn, error, or fatal", check=check_log_level
    )


def verbose() -> Any:
    return opt(False, "[deprecated] has no effect, use --log-level", deprecated="use --log-level")


def listen(default: str, clients: str, *, may_disable: bool, note: str = "") -> Any:
    """``--tcp-address``, ``--http-address``, ...: where ``clients`` connect."""
    return opt(
        default,
        f"<addr>:<port> to listen on for {clients} clients{note}",
        check=listen_address(may_disable=may_disable),
    )


def option_fields(options: type[Any]) -> tuple[Field[Any], ...]:
    """The options of a table, in declaration order."""
    return fields(options)


def flag_name(f: Field[Any]) -> str:
    flag: str | None = f.metadata.get("flag")
    return flag if flag else f.name.replace("_", "-")


def config_key(f: Field[Any]) -> str:
    cfg: str | None = f.metadata.get("cfg")
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
    if isinstance(default, float):
        return "float"
    return "str"


def deprecated_flag_name(f: Field[Any]) -> str | None:
    """An old flag name still accepted for this option (``--max-message-size``)."""
    name: str | None = f.metadata.get("deprecated_flag")
    return name
