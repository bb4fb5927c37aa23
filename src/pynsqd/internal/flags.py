"""The flag and config engine behind ``nsqd`` and ``nsqlookupd``: Go ``flag`` syntax, the
``--config`` TOML file, precedence, per-option checks and the ``-h`` text, all generated from an
options table declared with ``internal.optiontable.opt``.

Resolution follows go-options: a flag given on the command line beats the config file, which
beats the default. Flag syntax is exactly Go's ``flag`` package, because NSQ tooling and client
test harnesses start nsqd with it: ``-flag value``, ``-flag=value``, ``--flag value``,
``--flag=value``; a boolean flag never takes the next argument (``-snappy``, ``-snappy=false``).
Where nsqd is silent about bad input (an unknown config key, a trailing argument Go would quietly
ignore together with every flag after it) we say so: every error is one line, never a traceback.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, field
from typing import Any

from .checks import parse_go_bool, quote
from .gotext import format_duration, parse_duration
from .optiontable import config_key, deprecated_flag_name, flag_name, option_fields, option_kind


class UsageError(Exception):
    """Bad input. ``message`` is the one line to print; ``exit_code`` is 2 for the command line
    (as Go's ``flag`` package), 1 for the config file and validation (as nsqd's fatal errors)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class HelpRequested(UsageError):
    """``-h``/``-help``: ``message`` is the usage text; exit 0."""

    def __init__(self, text: str) -> None:
        super().__init__(text, exit_code=0)


def answer(program: str, e: UsageError) -> int:
    """Answer bad input as Go's programs do and return the exit code: the usage text on stdout
    for ``-h``, else one line on stderr that names the program."""
    if isinstance(e, HelpRequested):
        sys.stdout.write(e.message)
    else:
        print(f"{program}: {e.message}", file=sys.stderr)
    return e.exit_code


# -- Go's strconv, as the flag package uses it ------------------------------------------------

_OCTAL = re.compile(r"([+-]?)0([0-7_]*[0-7])")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_go_int(text: str) -> int:
    """``strconv.ParseInt(s, 0, 64)``: decimal, ``0x``/``0o``/``0b``, leading-0 octal, ``_``."""
    if text != text.strip():
        raise ValueError("not an integer")
    octal = _OCTAL.fullmatch(text)
    try:
        value = int(f"{octal.group(1)}0o{octal.group(2)}", 0) if octal else int(text, 0)
    except ValueError:
        raise ValueError("not an integer") from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("value out of range")
    return value


def parsego_float_text(text: str) -> float:
    """``strconv.ParseFloat(s, 64)`` (near enough: no surrounding spaces)."""
    if not text or text != text.strip():
        raise ValueError("not a number")
    try:
        return float(text)
    except ValueError:
        raise ValueError("not a number") from None


def check_value(f: Field[Any], value: Any) -> Any:
    """Check one option's value as its declaration says; return it normalised, or raise
    ``ValueError(reason)``."""
    meta = f.metadata
    check = meta.get("check")
    if check is not None:
        return check(value)
    if meta.get("checked_later"):  # nsqd checks it after resolution, in its own words
        return value
    kind = option_kind(f)
    if kind in ("int", "duration"):
        if meta.get("positive") and value <= 0:
            raise ValueError("must be > 0")
        if value < 0:
            raise ValueError("must not be negative")
    return value


# -- the flag set ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Flag:
    name: str
    field: Field[Any] | None  # None: -version
    deprecated_alias: bool = False

    @property
    def kind(self) -> str:
        return "version" if self.field is None else option_kind(self.field)

    @property
    def implicit(self) -> str | None:
        """The value when given without ``=value``; None if the flag takes an argument."""
        if self.kind in ("bool", "deprecated_bool", "version"):
            return "true"
        if self.field is not None:
            implicit: str | None = self.field.metadata.get("implicit")
            return implicit
        return None


def _flags(options: type[Any]) -> dict[str, _Flag]:
    flags: dict[str, _Flag] = {"version": _Flag("version", None)}
    for f in option_fields(options):
        flags[flag_name(f)] = _Flag(flag_name(f), f)
        alias = deprecated_flag_name(f)
        if alias:
            flags[alias] = _Flag(alias, f, deprecated_alias=True)
    return flags


@dataclass
class CommandLine:
    """What the command line said: only the options actually given, by field name."""

    values: dict[str, Any] = field(default_factory=dict)
    #: field name → value given through a deprecated alias (``--max-message-size``).
    alias_values: dict[str, tuple[str, Any]] = field(default_factory=dict)
    version: bool = False
    warnings: list[str] = field(default_factory=list)


def _convert_flag(flag: _Flag, text: str) -> Any:
    """One flag's text → its value (before ``check_value``); ``ValueError(reason)`` if bad."""
    kind = flag.kind
    if kind in ("bool", "version"):
        return parse_go_bool(text)
    if kind == "int":
        return parse_go_int(text)
    if kind == "float":
        return parsego_float_text(text)
    if kind == "duration":
        return parse_duration(text)
    if kind == "floatlist":
        return [parsego_float_text(part) for part in text.split(",")]
    if kind == "list":
        return [text]
    return text  # str, deprecated_bool


def parse_command_line(argv: Sequence[str], options: type[Any], program: str) -> CommandLine:
    """Go's ``flag.FlagSet.Parse`` over an options table (nsqd's or nsqlookupd's). Raises
    ``UsageError`` (exit 2), or ``HelpRequested`` for ``-h``/``-help``."""
    flags = _flags(options)
    result = CommandLine()
    args = list(argv)
    i = 0
    last_bool = ""  # a boolean flag just given without =value
    while i < len(args):
        arg = args[i]
        i += 1
        if len(arg) < 2 or arg[0] != "-":
            hint = f"a boolean flag takes -{last_bool}={arg}" if last_bool else "see -h"
            raise UsageError(f"unexpected argument {quote(arg)} ({hint})")
        last_bool = ""
        minuses = 2 if arg[1] == "-" else 1
        if minuses == 2 and len(arg) == 2:  # "--" ends the flags
            if i < len(args):
                raise UsageError(f"unexpected argument {quote(args[i])} after --")
            break
        name, has_value, text = arg[minuses:].partition("=")
        if not name or name[0] == "-" or arg[minuses] == "=":
            raise UsageError(f"bad flag syntax: {arg}")
        if name in ("h", "help"):
            raise HelpRequested(usage(options, program))
        flag = flags.get(name)
        if flag is None:
            raise UsageError(f"flag provided but not defined: -{name}")
        implicit = flag.implicit
        if not has_value:
            if implicit is not None:
                text = implicit
                last_bool = name
                # The old integer --worker-id N: N is not a flag; take it rather than stop there.
                old_int = i < len(args) and re.fullmatch(r"[+-]?[0-9]+", args[i])
                if flag.kind == "deprecated_bool" and old_int:
                    i += 1
            elif i < len(args):
                text = args[i]
                i += 1
            else:
                raise UsageError(f"flag needs an argument: -{name}")
        try:
            value = _convert_flag(flag, text)
            if flag.field is not None and flag.kind not in ("list", "floatlist"):
                value = check_value(flag.field, value)
        except ValueError as e:
            what = "boolean value" if flag.kind in ("bool", "version") else "value"
            raise UsageError(f"invalid {what} {quote(text)} for flag -{name}: {e}") from None
        if flag.field is None:
            result.version = value
            continue
        f = flag.field
        if flag.deprecated_alias:
            result.alias_values[f.name] = (name, value)
            continue
        if flag.kind in ("list", "floatlist"):
            value = result.values.get(f.name, []) + value
            try:
                value = check_value(f, value)
            except ValueError as e:
                raise UsageError(f"invalid value {quote(text)} for flag -{name}: {e}") from None
        if f.metadata.get("deprecated"):
            note = f.metadata["deprecated"]
            result.warnings.append(f"--{name} is deprecated and has no effect ({note})")
        result.values[f.name] = value
    for field_name, (alias, value) in result.alias_values.items():
        real = flag_name(next(f for f in option_fields(options) if f.name == field_name))
        if field_name not in result.values:
            result.values[field_name] = value
            result.warnings.append(
                f"use of the --{alias} command line flag is deprecated (use --{real})"
            )
        else:
            result.warnings.append(f"--{alias} is deprecated and overridden by --{real}")
    return result


# -- the config file ---------------------------------------------------------------------------


def _config_keys(options: type[Any]) -> dict[str, Field[Any]]:
    """Every key that names an option: nsqd's key (the cfg alias, else the field name), the
    field name, and the flag name with ``_``."""
    keys: dict[str, Field[Any]] = {}
    for f in option_fields(options):
        if f.name == "config":
            continue
        for key in (config_key(f), f.name, flag_name(f).replace("-", "_")):
            keys[key] = f
    return keys


def _line_of(text: str, key: str) -> int | None:
    quoted = re.escape(key)
    pattern = rf"^[ \t]*(?:{quoted}|\"{quoted}\"|'{quoted}')[ \t]*="
    match = re.search(pattern, text, re.MULTILINE)
    return None if match is None else text.count("\n", 0, match.start()) + 1


def _coerce_config(f: Field[Any], raw: Any) -> Any:
    """A TOML value → the option's value, as go-options coerces it (``ValueError`` if bad)."""
    kind = option_kind(f)
    if kind == "deprecated_bool":
        return raw
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            return parse_go_bool(raw)
        raise ValueError("not a boolean (true or false)")
    if kind == "int":
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            return parse_go_int(raw)
        raise ValueError("not an integer")
    if kind == "duration":
        if isinstance(raw, str):
            return parse_duration(raw)
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw / 1000  # go-options reads a bare integer duration as milliseconds
        raise ValueError('not a duration (a string such as "60s", or milliseconds)')
    if kind == "list":
        if isinstance(raw, str):
            return raw.split(",")
        if isinstance(raw, list) and all(isinstance(v, str) for v in raw):
            return list(raw)
        raise ValueError("not a list of strings")
    if kind == "float":
        if isinstance(raw, str):
            return parsego_float_text(raw)
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        raise ValueError("not a number")
    if kind == "floatlist":
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, list):
            items = [items]
        out: list[float] = []
        for v in items:
            if isinstance(v, str):
                out.append(parsego_float_text(v))
            elif isinstance(v, int | float) and not isinstance(v, bool):
                out.append(float(v))
            else:
                raise ValueError("not a list of numbers")
        return out
    # str
    if isinstance(raw, str):
        return raw
    if f.metadata.get("implicit") is not None and isinstance(raw, bool):
        return "true" if raw else "false"  # tls_required = true
    raise ValueError("not a string")


def load_config(path: str, options: type[Any]) -> tuple[dict[str, Any], list[str]]:
    """Read a TOML config file: (option values by field name, warnings). Raises ``UsageError``
    (exit 1) naming the file, and the line where there is one."""
    try:
        with open(path, "rb") as fp:
            data = fp.read()
    except OSError as e:
        raise UsageError(f"failed to load config file {path} - {e.strerror or e}", 1) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UsageError(f"failed to load config file {path} - line {line}: not UTF-8", 1) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
        if at:
            message = f"line {at.group(1)}, column {at.group(2)}: {message[: at.start()]}"
        elif "end of document" in message:
            message = f"line {text.count(chr(10)) + 1}: {message}"
        raise UsageError(f"failed to load config file {path} - {message}", 1) from None

    keys = _config_keys(options)
    values: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    unknown: list[str] = []
    warnings: list[str] = []
    for key, raw in doc.items():
        f = keys.get(key)
        if f is None:
            unknown.append(key)
            continue
        key_line = _line_of(text, key)
        where = f"config file {path}" + (f" line {key_line}" if key_line else "")
        if f.name in set_by:
            raise UsageError(f"{where}: {key} repeats {set_by[f.name]}", 1)
        set_by[f.name] = key
        try:
            value = check_value(f, _coerce_config(f, raw))
        except ValueError as e:
            raise UsageError(f"{where}: invalid value {quote(raw)} for {key}: {e}", 1) from None
        if f.metadata.get("deprecated"):
            warnings.append(f"{where}: {key} is deprecated and has no effect")
        values[f.name] = value
    if unknown:
        warnings.append(f"config file {path}: ignoring unknown keys: {', '.join(sorted(unknown))}")
    return values, warnings


def resolve(
    command_line: CommandLine,
    options: type[Any],
    validate: Callable[[Any, list[str]], None],
) -> tuple[Any, list[str]]:
    """Flags > config file > defaults, then the program's own cross-option ``validate``.
    Returns the options and the warnings to log once logging is set up. Raises
    ``UsageError``."""
    warnings = list(command_line.warnings)
    config_path = command_line.values.get("config", "")
    config: dict[str, Any] = {}
    if config_path:
        config, config_warnings = load_config(config_path, options)
        warnings.extend(config_warnings)
    opts = options()
    for name, value in {**config, **command_line.values}.items():
        setattr(opts, name, value)
    given = getattr(opts, "options_given", None)
    if given is not None:  # the program learns which options were set, not defaulted
        given(set(config) | set(command_line.values))
    if not opts.broadcast_address:
        opts.broadcast_address = options().broadcast_address
    validate(opts, warnings)
    return opts, warnings


# -- -h ----------------------------------------------------------------------------------------

_TYPE_NAMES = {
    "str": "string",
    "int": "int",
    "float": "float",
    "duration": "duration",
    "list": "value",
}


def usage(options: type[Any], program: str) -> str:
    """Go's ``FlagSet.PrintDefaults`` for ``program``, generated from its options table."""
    defaults = options()
    entries: list[tuple[str, str, str, str | None]] = [
        ("version", "", "print version string", None)
    ]
    for f in option_fields(options):
        kind = option_kind(f)
        value = getattr(defaults, f.name)
        default: str | None
        if kind == "duration":
            default = format_duration(value) if value else None
        elif kind in ("bool", "deprecated_bool"):
            default = "true" if value else None
        elif kind == "int":
            default = str(value) if value else None
        elif kind == "float":
            default = f"{value:g}" if value else None
        elif kind in ("list", "floatlist"):
            default = None
        elif f.metadata.get("implicit") is not None:
            default = None if value == "false" else value
        else:
            default = json.dumps(value, ensure_ascii=False) if value else None
        implicit = f.metadata.get("implicit") is not None
        type_name = "" if implicit else _TYPE_NAMES.get(kind, "value")
        if kind in ("bool", "deprecated_bool"):
            type_name = ""
        entries.append((flag_name(f), type_name, f.metadata["help"], default))
        alias = deprecated_flag_name(f)
        if alias:
            entries.append((alias, type_name, f"[deprecated] use --{flag_name(f)}", None))
    lines = [f"Usage of {program}:"]
    for name, type_name, help_text, default in sorted(entries):
        head = f"  -{name}" + (f" {type_name}" if type_name else "")
        head += "\t" if len(head) <= 4 else "\n    \t"
        line = head + help_text.replace("\n", "\n    \t")
        if default is not None:
            line += f" (default {default})"
        lines.append(line)
    return "\n".join(lines) + "\n"
