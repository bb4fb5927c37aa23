"""E2E latency windows: two rotating DDSketches, each half the window, merged when read."""

from __future__ import annotations

import pytest

from pynsqd.core import e2e
from pynsqd.core.e2e import E2ELatency, merged_result, nanoseconds_to_human


def test_window_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0]
    monkeypatch.setattr(e2e.time, "monotonic_ns", lambda: now[0])
    stream = E2ELatency([0.5, 1.0], window_time=10.0)  # halves of 5 s
    for v in (1_000, 2_000, 3_000):
        stream(v)
    assert merged_result([stream], stream.percentiles)["count"] == 3
    now[0] = 6 * 10**9  # one half later: the old samples are still in the window
    stream(100_000)
    result = merged_result([stream], stream.percentiles)
    assert result["count"] == 4
    assert abs(result["percentiles"][1]["value"] - 100_000) <= 1_000  # 1% accuracy
    now[0] = 12 * 10**9  # the first half has left the window
    assert merged_result([stream], stream.percentiles)["count"] == 1
    now[0] = 40 * 10**9  # idle for longer than the window: empty
    result = merged_result([stream], stream.percentiles)
    assert result == {
        "count": 0,
        "percentiles": [{"quantile": 0.5, "value": 0}, {"quantile": 1, "value": 0}],
    }


def test_topic_merge_and_untracked() -> None:
    a, b = E2ELatency([0.99], 600.0), E2ELatency([0.99], 600.0)
    a(1_000_000)
    b(2_000_000)
    b(3_000_000)
    assert merged_result([a, b], [0.99])["count"] == 3
    assert merged_result([], None) == {"count": 0, "percentiles": None}


def test_human_durations() -> None:
    assert nanoseconds_to_human(500) == "500.0ns"
    assert nanoseconds_to_human(1500) == "1.5us"
    assert nanoseconds_to_human(2_500_000) == "2.5ms"
    assert nanoseconds_to_human(3_000_000_001) == "3.0s"
