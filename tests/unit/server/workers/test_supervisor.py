"""The supervisor's restart decision (``workers/supervisor.restart_pause``), without a clock."""

from __future__ import annotations

import itertools

from pynsqd.server.workers.supervisor import (
    RESTART_BACKOFF_MAX,
    RESTART_BACKOFF_MIN,
    restart_pause,
)


def test_a_worker_that_keeps_failing_waits_longer_each_time_up_to_a_bound() -> None:
    pauses = [restart_pause(n) for n in range(12)]
    assert pauses[0] == 0.0  # a worker that ran a while is started again at once
    assert pauses[1] == RESTART_BACKOFF_MIN
    assert all(b == min(2 * a, RESTART_BACKOFF_MAX) for a, b in itertools.pairwise(pauses[1:]))
    assert pauses[-1] == RESTART_BACKOFF_MAX
