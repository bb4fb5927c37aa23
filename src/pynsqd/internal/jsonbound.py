"""JSON from untrusted sources with its nesting bounded.

``json.loads`` recurses once per level of nesting, so 100,000 ``[`` raise ``RecursionError``,
which callers that catch ``ValueError`` for bad JSON let through (a traceback, a 500, a server
that does not start). Everything pynsqd reads as JSON (IDENTIFY bodies, auth and lookupd
replies, ``/config`` bodies, ``nsqd.dat``) goes through ``loads``: too deep a document is then
just another ``ValueError``.
"""

from __future__ import annotations

import json
from typing import Any


def loads(data: str | bytes, **kwargs: Any) -> Any:
    """``json.loads``; raises ``ValueError`` for invalid JSON, including too deep a nesting."""
    try:
        return json.loads(data, **kwargs)
    except RecursionError as err:
        raise ValueError("JSON nested too deeply") from err
