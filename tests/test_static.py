"""ruff and mypy --strict run as part of the test suite, so CI enforces them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_check() -> None:
    res = _run("ruff", "check", "src", "tests")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format() -> None:
    res = _run("ruff", "format", "--check", "src", "tests")
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_strict() -> None:
    res = _run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr
