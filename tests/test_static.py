"""ruff and mypy --strict run as part of the test suite, so CI enforces them; and the README's
benchmark figures are the ones of the run docs/performance.md reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


# A fresh clone has no cache: mypy then checks every module, minutes on a loaded 2-core machine
# (past 120 s in a fresh-clone run beside other work).
@pytest.mark.timeout(900)
def test_mypy_strict() -> None:
    res = _run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_readme_benchmarks_come_from_the_run_in_docs_performance() -> None:
    """One set of figures: the README's table is what bench/curves.py writes from the run
    docs/performance.md and docs/performance.json hold (scripts/bench-curves writes all three)."""
    import json

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import curves
    finally:
        sys.path.remove(str(ROOT / "bench"))
    results = json.loads((ROOT / "docs" / "performance.json").read_text())
    readme = (ROOT / "README.md").read_text()
    start = readme.index(curves.README_START) + len(curves.README_START)
    table = readme[start : readme.index(curves.README_END)].strip()
    assert table == "\n".join(curves.readme_table(results))
    assert results["meta"]["date"] in (ROOT / "docs" / "performance.md").read_text()


def test_the_docs_and_benchmarks_name_no_path_outside_the_repository() -> None:
    """Issue 54: the performance docs told a new user to run a file of this machine's
    (``/tmp/nsq-go-1.3.0/bin/nsqd``, ``../shared/tools/nsq-go``), which a clone does not have."""
    outside = ("../shared", "/tmp/nsq-go", "/work/")
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("bench/*.py")]
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if any(o in line for o in outside)
    ]
    assert found == [], "\n".join(found)
