"""The operations files do what docs/operations.md says: the cluster walkthrough runs as
written, and the systemd units pass systemd-analyze."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _free_base() -> int:
    """A base port with the next 22 free (the walkthrough uses base .. base+21)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        if base + 22 > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + 22):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no free port range")


@pytest.mark.skipif(not (BIN / "nsqd").exists(), reason="needs the installed nsqd console script")
def test_the_cluster_walkthrough_runs_as_written() -> None:
    base = _free_base()
    res = subprocess.run(
        [str(ROOT / "contrib" / "cluster-walkthrough.sh"), str(BIN)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "BASE": str(base)},
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"nodes: [{base + 10}, {base + 20}]" in res.stdout
    assert res.stdout.rstrip().endswith("cluster ok")


@pytest.mark.parametrize("unit", ["nsqd.service", "nsqlookupd.service"])
def test_the_systemd_units_verify(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text = (ROOT / "contrib" / unit).read_text().replace("/opt/pynsqd/bin", str(BIN))
    path = tmp_path / unit
    path.write_text(text)
    res = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr
