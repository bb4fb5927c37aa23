"""IDENTIFY body decoding and validation, as nsqd's ``clientV2.Identify`` does it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .commands import IdentifyData
from .errors import FatalClientError


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """The server limits and client defaults the V2 protocol checks against (ms, bytes)."""

    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    max_rdy_count: int = 2500
    max_req_timeout_ms: int = 3_600_000
    msg_timeout_ms: int = 60_000
    max_msg_timeout_ms: int = 900_000
    #: nsqd's ClientTimeout/2; ClientTimeout (60 s) is not a flag.
    heartbeat_interval_ms: int = 30_000
    max_heartbeat_interval_ms: int = 60_000
    output_buffer_size: int = 16 * 1024
    output_buffer_timeout_ms: int = 250
    max_output_buffer_size: int = 65536
    min_output_buffer_timeout_ms: int = 25
    max_output_buffer_timeout_ms: int = 30_000
    tls_required: bool = False
    #: nsqd reads commands with a 16 KiB bufio.Reader: a longer line cannot be read.
    max_line_length: int = 16 * 1024
    #: pynsqd: message headers (``protocol/headers.py``): most per message (0: a client that
    #: asks is answered ``"headers": false``) and most bytes of a message's block.
    max_headers: int = 0
    max_header_bytes: int = 4096


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Go's encoding/json matches keys case-insensitively; the value is the field kind.
_FIELDS: dict[str, str] = {
    "client_id": "str",
    "hostname": "str",
    "user_agent": "str",
    "heartbeat_interval": "int",
    "output_buffer_size": "int",
    "output_buffer_timeout": "int",
    "feature_negotiation": "bool",
    "tls_v1": "bool",
    "deflate": "bool",
    "deflate_level": "int",
    "snappy": "bool",
    "sample_rate": "int32",
    "msg_timeout": "int",
    "topology_region": "str",
    "topology_zone": "str",
    # pynsqd (core/dedup.py): a JSON boolean, nothing else, not even null (a client asking in
    # another form would otherwise be left without it and its retries written twice)
    "idempotent_publish": "flag",
    # pynsqd (protocol/headers.py): messages with headers, both ways
    "headers": "flag",
}


def _decode_failed() -> FatalClientError:
    return FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")


class GoObject(list[tuple[str, Any]]):
    """A JSON object as its pairs in document order, so that a repeated key's last value wins
    even when it is spelled in another case (Go assigns the fields in document order)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python accepts NaN and Infinity; Go does not


def _parse_int(text: str) -> int:
    # Python refuses ints of more than 4300 digits; Go skips unknown fields of any size. A number
    # this long is out of range for every known field, so any out-of-range stand-in will do.
    return int(text) if len(text) <= 20 else 1 << 64


_surrogates = re.compile("[\ud800-\udfff]").sub


def go_string(value: str) -> str:
    """A decoded JSON string as Go sees it: each invalid UTF-8 byte becomes U+FFFD."""
    return _surrogates("\ufffd", value)


def go_key(key: str) -> str:
    """Go's case-insensitive key match: simple case folding, where U+017F is "s" and U+212A "k"."""
    key = key.lower()
    return key if key.isascii() else key.replace("\u017f", "s")


def go_json_loads(body: bytes) -> Any:
    """``json.Unmarshal``'s view of ``body``: objects as ordered pairs; ValueError if Go refuses.

    The bytes are decoded here: json.loads(bytes) also accepts a BOM, UTF-16 and UTF-32, which Go
    rejects. Invalid UTF-8 survives as lone surrogates: a syntax error outside strings, and
    U+FFFD inside them (``go_string``), as in Go.
    """
    try:
        return json.loads(
            body.decode("utf-8", "surrogateescape"),
            object_pairs_hook=GoObject,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
        )
    except RecursionError as err:
        raise ValueError("nesting too deep") from err


def _decode(body: bytes) -> dict[str, Any]:
    """Decode like ``json.Unmarshal`` into nsqd's identifyDataV2 struct."""
    try:
        doc = go_json_loads(body)
    except ValueError:
        raise _decode_failed() from None
    if doc is None:  # Go leaves the struct at its zero value
        return {}
    if not isinstance(doc, GoObject):
        raise _decode_failed()
    fields: dict[str, Any] = {}
    for key, value in doc:
        name = go_key(key)
        kind = _FIELDS.get(name)
        if kind == "flag":
            ok = isinstance(value, bool)
        elif kind is None or value is None:
            continue
        elif kind == "str":
            ok = isinstance(value, str)
            if ok:
                # Go turns invalid UTF-8 and lone \u surrogates into U+FFFD; a lone surrogate
                # would also break any later .encode() of the string (logs, /stats).
                value = go_string(value)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            lo, hi = (_INT32_MIN, _INT32_MAX) if kind == "int32" else (_INT64_MIN, _INT64_MAX)
            ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
        if not ok:
            raise _decode_failed()
        fields[name] = value
    return fields


def _invalid(reason: str) -> FatalClientError:
    return FatalClientError("E_BAD_BODY", f"IDENTIFY {reason}")


def _setting(
    f: dict[str, Any], key: str, default: int, low: int, high: int, off: int | None = 0
) -> int:
    """A client's setting ``key`` as nsqd checks it: 0 (or none) keeps ``default``, -1 turns
    it off (``off``; where it cannot be, -1 is out of range), else it must be within
    ``[low, high]``."""
    value = f.get(key, 0)
    if value == -1 and off is not None:
        return off
    if value == 0:
        return default
    if low <= value <= high:
        return value  # type: ignore[no-any-return]
    raise _invalid(f"{key.replace('_', ' ')} ({value}) is invalid")


def parse_identify(body: bytes, config: ProtocolConfig) -> IdentifyData:
    """Decode and validate an IDENTIFY body; raises ``E_BAD_BODY`` as nsqd would."""
    f = _decode(body)

    heartbeat = _setting(
        f,
        "heartbeat_interval",
        config.heartbeat_interval_ms,
        1000,
        config.max_heartbeat_interval_ms,
    )
    # Timeout is checked before size, as in nsqd's SetOutputBuffer.
    buf_timeout = _setting(
        f,
        "output_buffer_timeout",
        config.output_buffer_timeout_ms,
        config.min_output_buffer_timeout_ms,
        config.max_output_buffer_timeout_ms,
    )
    buf_size = _setting(
        f, "output_buffer_size", config.output_buffer_size, 64, config.max_output_buffer_size, 1
    )
    if f.get("output_buffer_size") == -1:  # no buffering: every frame written at once
        buf_timeout = 0

    sample_rate = f.get("sample_rate", 0)
    if sample_rate < 0 or sample_rate > 99:
        raise _invalid(f"sample rate ({sample_rate}) is invalid")

    msg_timeout = _setting(
        f, "msg_timeout", config.msg_timeout_ms, 1000, config.max_msg_timeout_ms, off=None
    )

    return IdentifyData(
        client_id=f.get("client_id", ""),
        hostname=f.get("hostname", ""),
        user_agent=f.get("user_agent", ""),
        heartbeat_interval_ms=heartbeat,
        output_buffer_size=buf_size,
        output_buffer_timeout_ms=buf_timeout,
        sample_rate=sample_rate,
        msg_timeout_ms=msg_timeout,
        feature_negotiation=f.get("feature_negotiation", False),
        tls_v1=f.get("tls_v1", False),
        snappy=f.get("snappy", False),
        deflate=f.get("deflate", False),
        deflate_level=f.get("deflate_level", 0),
        topology_region=f.get("topology_region", ""),
        topology_zone=f.get("topology_zone", ""),
        idempotent_publish=f.get("idempotent_publish", False),
        headers=f.get("headers", False),
    )
