"""Go's text forms that NSQ tools and clients parse: ``encoding/json`` output and
``time.Duration`` text. Shared by nsqd's TCP and HTTP sides, the auth client and nsqlookupd, so
there is one copy of each rule."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def go_json(data: Any, *, sort_keys: bool = False) -> bytes:
    """Go's ``json.Marshal``: compact, with ``<``, ``>``, ``&``, U+2028 and U+2029 escaped.
    ``sort_keys`` for a Go map (a struct keeps its field order). A string that is not valid
    Unicode (a lone surrogate from a ``\\ud800`` escape) is written as U+FFFD, as Go does,
    rather than failing the response."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)
    for ch, esc in _GO_ESCAPES:
        if ch in text:
            text = text.replace(ch, esc)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()


# -- Go's time.Duration text -------------------------------------------------------------------

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
