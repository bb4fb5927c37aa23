"""The ``memory`` block of /stats and statsd's ``mem.*`` keys, from what Python has.

nsqd reports Go's runtime.MemStats. We keep its keys and fill them with the nearest Python
facts: ``heap_objects`` = blocks held by Python's allocator, ``heap_in_use_bytes`` = the
process RSS, GC pause percentiles from the last 256 collections (timed with ``gc.callbacks``,
as Go keeps its last 256 pauses), ``gc_total_runs`` = collections of every generation.
Python's collector is triggered by allocation counts, not heap bytes, and frees memory at once,
so ``heap_idle_bytes``, ``heap_released_bytes`` and ``next_gc_bytes`` are 0.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from collections import deque
from typing import Any

_pauses_ns: deque[int] = deque(maxlen=256)
_gc_started_ns = 0
_installed = False


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    global _gc_started_ns
    if phase == "start":
        _gc_started_ns = time.perf_counter_ns()
    elif _gc_started_ns:
        _pauses_ns.append(time.perf_counter_ns() - _gc_started_ns)
        _gc_started_ns = 0


def install_gc_timer() -> None:
    """Start timing collections (once per process)."""
    global _installed
    if not _installed:
        gc.callbacks.append(_on_gc)
        _installed = True


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        # ru_maxrss is the peak, in KiB on Linux and bytes on macOS: better than nothing.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _percentile(perc: float, values: list[int]) -> int:
    """nsqd's ``percentile`` over sorted pauses (nearest rank)."""
    if not values:
        return 0
    index = max(0, min(len(values) - 1, round(perc / 100.0 * len(values)) - 1))
    return values[index]


def gc_total_runs() -> int:
    return sum(int(s["collections"]) for s in gc.get_stats())


def mem_stats() -> dict[str, int]:
    """nsqd's ``memStats`` keys, in its order."""
    pauses = sorted(_pauses_ns)
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": rss_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": 0,
        "gc_total_runs": gc_total_runs(),
    }
