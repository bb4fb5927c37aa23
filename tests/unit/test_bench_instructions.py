"""``bench/instructions.py`` counts the server's instructions per message in-process; its harness
must deliver and FIN every message it publishes, or it measures less than it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "instructions.py"


def test_the_instruction_benchmark_harness_delivers_and_fins_every_message() -> None:
    # Plain, every message crossing workers, every MPUB passed to the worker that keeps the
    # topic, and headers negotiated by the publisher and the consumers.
    for size, batch, extra in (
        (200, 200, ""),
        (10, 7, ""),
        (3000, 1, ""),
        (10, 7, "--cross"),
        (10, 7, "--forward"),
        (200, 200, "--headers two"),
        (10, 7, "--headers negotiated"),
        (10, 7, "--headers small"),
    ):
        done = subprocess.run(
            [
                *(sys.executable, str(BENCH), "--inner", "pubsub", "--cycles", "4"),
                *("--size", str(size), "--batch", str(batch)),
                *extra.split(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
