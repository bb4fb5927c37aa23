"""``docs/exactly-once.md``'s "Try it", every command as written: only its ports and its
directory are moved, so that it runs beside the rest of the suite."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ..processes import free_port, run_script

ROOT = Path(__file__).resolve().parents[2]


def try_it(directory: Path, tcp: int, http: int) -> str:
    doc = (ROOT / "docs" / "exactly-once.md").read_text()
    part = doc.split("<!-- try it -->", 1)[1].split("<!-- end of try it -->", 1)[0]
    script = "\n".join(re.findall(r"```\n(.*?)```", part, re.S))
    script = re.sub(r"\b4150\b", str(tcp), re.sub(r"\b4151\b", str(http), script))
    assert not re.search(r"127\.0\.0\.1:415\d\b", script), script
    return script.replace("/tmp/pynsqd-exactly-once", str(directory))


def test_the_exactly_once_example_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("the example uses curl: install it (Debian: apt install curl)")
    script = try_it(tmp_path / "eo", free_port(), free_port())
    status, out = run_script(script, ROOT, 120)
    log = (tmp_path / "eo" / "nsqd.log").read_text(errors="replace")
    assert status == 0, f"{out}\n--- nsqd.log\n{log[-2000:]}"
    lines = out.splitlines()
    assert lines[:2] == ["OK", "X-Nsq-Duplicates: 1"], out
    assert "BAD_SEQUENCE" in lines[2] and "expected 1" in lines[2], out
    assert lines[3:6] == ["OK", "order 1", "order 2"], out
    acked = [ln for ln in lines if ln.startswith("to_nsq: 1000 records acknowledged")]
    assert len(acked) == 2, out
    assert '"latest":1002' in lines[-1], out
    assert "Traceback" not in log, log
