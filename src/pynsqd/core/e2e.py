"""End-to-end processing latency percentiles (``--e2e-processing-latency-percentile``).

nsqd keeps two rotating quantile streams per channel, each covering half the window, and
merges them when asked; a topic's value is the merge of its channels'. We do the same with
DDSketch (relative-error quantile sketches that merge exactly) instead of perks' targeted
streams. A sample is ``now - publish time`` in ns, taken at FIN only (``Channel.e2e_sink``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ddsketch import DDSketch

#: A 1% relative error: a reported 10 ms is between 9.9 and 10.1 ms.
RELATIVE_ACCURACY = 0.01


def _new_sketch() -> Any:
    return DDSketch(relative_accuracy=RELATIVE_ACCURACY)


class E2ELatency:
    """A channel's sink: called with a latency in ns for every FIN."""

    __slots__ = ("_half_window_ns", "_last_move_ns", "_streams", "percentiles")

    def __init__(self, percentiles: list[float], window_time: float) -> None:
        self.percentiles = list(percentiles)
        self._half_window_ns = max(1, int(window_time * 1e9) // 2)
        self._streams: list[Any] = [_new_sketch(), _new_sketch()]  # [current, previous]
        self._last_move_ns = time.monotonic_ns()

    def __call__(self, latency_ns: int) -> None:
        now = time.monotonic_ns()
        if now - self._last_move_ns > self._half_window_ns:
            self._move_window(now)
        self._streams[0].add(max(0, latency_ns))

    def _move_window(self, now: int) -> None:
        moves = (now - self._last_move_ns) // self._half_window_ns
        if moves >= 2:
            self._streams = [_new_sketch(), _new_sketch()]
        else:
            self._streams = [_new_sketch(), self._streams[0]]
        self._last_move_ns += moves * self._half_window_ns

    def sketches(self) -> list[Any]:
        now = time.monotonic_ns()
        if now - self._last_move_ns > self._half_window_ns:
            self._move_window(now)
        return self._streams


def merged_result(streams: Iterable[E2ELatency], percentiles: list[float] | None) -> dict[str, Any]:
    """nsqd's ``quantile.Result``: ``{"count", "percentiles": [{"quantile", "value"}]}``.

    ``percentiles`` None (latency not tracked) gives ``{"count": 0, "percentiles": null}``.
    """
    if percentiles is None:
        return {"count": 0, "percentiles": None}
    merged = _new_sketch()
    for stream in streams:
        for sketch in stream.sketches():
            if sketch.count:
                merged.merge(sketch)
    count = int(merged.count)
    out = []
    for q in percentiles:
        value = merged.get_quantile_value(q) if count else 0.0
        out.append({"quantile": go_float(q), "value": round(value or 0.0)})
    return {"count": count, "percentiles": out}


def go_float(value: float) -> float | int:
    """Go's JSON writes a whole float64 without a fraction (1 not 1.0)."""
    return int(value) if float(value).is_integer() else value


def nanoseconds_to_human(v: float) -> str:
    """nsqd's ``NanoSecondToHuman``, used in the text /stats."""
    if v > 1e9:
        return f"{v / 1e9:.1f}s"
    if v > 1e6:
        return f"{v / 1e6:.1f}ms"
    if v > 1e3:
        return f"{v / 1e3:.1f}us"
    return f"{v:.1f}ns"
