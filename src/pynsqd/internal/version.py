"""The one version line of nsqd and nsqlookupd, in the form NSQ tooling parses."""

from __future__ import annotations

import re

import pynsqd


def version_string(program: str = "nsqd") -> str:
    """``nsqd v1.3.0 (built w/pynsqd-0.1.0)``."""
    token = re.sub(r"[^a-z0-9.-]+", "-", pynsqd.__version__.lower()).strip("-")
    return f"{program} v{pynsqd.NSQD_VERSION} (built w/pynsqd-{token})"
