"""The built wheel: it holds the packages, their data and the license, installs, and its console
scripts start (the dependencies come from this environment; the wheel is installed alone)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_and_its_commands_start(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("pynsqd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "pynsqd/py.typed",
        "pynsqd/__main__.py",
        "pynsqd_spark/py.typed",
        "pynsqd/nsqadmin/static/app.js",  # nsqadmin's pages work from an installed wheel
        "pynsqd/nsqadmin/static/index.html",
    ):
        assert expected in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    for script, expected in (
        ("nsqd", "nsqd v1.3.0"),
        ("nsqlookupd", "nsqlookupd v1.3.0"),
        ("nsqadmin", "nsqadmin v1.3.0"),
        ("nsq_tail", "nsq_tail v1.3.0"),
    ):
        res = subprocess.run(
            [str(target / "bin" / script), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
            cwd=tmp_path,
        )
        assert res.returncode == 0 and res.stdout.startswith(expected), res.stderr
    where = subprocess.run(
        [sys.executable, "-c", "import pynsqd; print(pynsqd.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(target))  # the installed copy, not the clone's src/
