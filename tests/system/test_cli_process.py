"""The installed ``nsqd`` console script, as a process: exit codes, stdout and stderr."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pynsqd

ROOT = Path(__file__).resolve().parents[2]
NSQD = Path(sys.executable).with_name("nsqd")


def run_nsqd(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(NSQD)] if NSQD.exists() else [sys.executable, "-m", "pynsqd.cli"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )


def test_version() -> None:
    res = run_nsqd("--version")
    assert res.returncode == 0
    assert res.stdout == f"nsqd v1.3.0 (built w/pynsqd-{pynsqd.__version__})\n"
    assert res.stderr == ""


def test_single_dash_version() -> None:
    res = run_nsqd("-version")
    assert res.returncode == 0
    assert res.stdout.startswith("nsqd v1.3.0 (built w/")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--no-such-flag"], 2, "nsqd: flag provided but not defined: -no-such-flag"),
        (
            ["-msg-timeout", "60"],
            2,
            'nsqd: invalid value "60" for flag -msg-timeout: time: missing unit in duration "60"',
        ),
        (["--node-id=1024"], 1, "nsqd: --node-id must be [0,1024) (got 1024)"),
        (["--max-deflate-level=0"], 1, "nsqd: --max-deflate-level must be [1,9] (got 0)"),
        (
            ["--config=/nonexistent/nsqd.cfg"],
            1,
            "nsqd: failed to load config file /nonexistent/nsqd.cfg - No such file or directory",
        ),
    ],
)
def test_bad_input_is_one_line_without_a_traceback(
    args: list[str], code: int, message: str
) -> None:
    res = run_nsqd(*args)
    assert res.returncode == code
    assert res.stdout == ""
    assert res.stderr == message + "\n"
    assert "Traceback" not in res.stderr


def test_invalid_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('tcp_address = "0.0.0.0:4150"\nmsg_timeout = \n')
    res = run_nsqd(f"--config={cfg}")
    assert res.returncode == 1
    assert res.stderr.startswith(f"nsqd: failed to load config file {cfg} - line 2, column ")
    assert len(res.stderr.splitlines()) == 1


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(flag: str) -> None:
    res = run_nsqd(flag)
    assert res.returncode == 0
    assert res.stdout.startswith("Usage of nsqd:\n")
    assert "\n  -tcp-address string\n" in res.stdout
    assert "\n  -msg-timeout duration\n" in res.stdout
    assert res.stderr == ""


def test_python_dash_m_pynsqd_is_nsqd() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pynsqd", "--version"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0
    assert res.stdout == f"nsqd v1.3.0 (built w/pynsqd-{pynsqd.__version__})\n"


def test_a_port_in_use_is_one_line_in_nsqds_words(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = run_nsqd(
            f"--tcp-address=127.0.0.1:{port}",
            "--http-address=127.0.0.1:0",
            f"--data-path={tmp_path}",
        )
    assert res.returncode == 1
    assert (
        f"FATAL: failed to start nsqd - listen (127.0.0.1:{port}) failed - address already in use"
        in res.stderr
    )
    assert "Traceback" not in res.stderr and "('127.0.0.1'" not in res.stderr


def _fake_python(path: Path, version: str, ok: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!/bin/sh\n[ \"$1\" = -V ] && echo 'Python {version}' && exit 0\nexit {0 if ok else 1}\n"
    )
    path.chmod(0o755)
    return path


def test_bootstrap_rebuilds_a_venv_of_an_old_python_and_names_what_to_set(
    tmp_path: Path,
) -> None:
    # A copy of the repo's scripts with a .venv made by Python 3.10 and no usable python3.
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bootstrap").write_bytes((ROOT / "scripts" / "bootstrap").read_bytes())
    (tmp_path / "scripts" / "bootstrap").chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("")
    _fake_python(tmp_path / ".venv" / "bin" / "python", "3.10.12", ok=False)
    old = _fake_python(tmp_path / "py310" / "python3", "3.10.12", ok=False)
    res = subprocess.run(
        [str(tmp_path / "scripts" / "bootstrap")],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(old)},
    )
    assert res.returncode == 1
    assert (
        "bootstrap: .venv was made by Python 3.10.12; pynsqd needs Python 3.11 or newer"
        in res.stderr
    )
    assert "set PYTHON=/path/to/python3.11" in res.stderr
    assert not (tmp_path / ".venv").exists()


def _scratch_bootstrap(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """A copy of ``scripts/bootstrap`` with a ``.venv`` whose python logs each ``pip install``
    (after a moment, as pip takes one) instead of installing (and compiles nothing), and a PATH
    without apt."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "bootstrap"
    script.write_bytes((ROOT / "scripts" / "bootstrap").read_bytes())
    script.chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    log = tmp_path / ".venv" / "pip.log"
    python.write_text(
        "#!/bin/sh\n"
        '[ "$1" = -c ] && exit 0\n'
        'case "$*" in *"--upgrade pip"* | *compileall*) exit 0 ;; esac\n'
        "sleep 0.3\n"
        f'echo "$*" >> {log}\n'
    )
    python.chmod(0o755)
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("bash", "sh", "dirname", "sha256sum", "cut", "flock", "sleep", "cat"):
        found = shutil.which(name)
        assert found is not None, name
        (tools / name).symlink_to(found)
    return script, {"PATH": str(tools)}, log


def test_bootstrap_modes_share_one_install_and_wait_for_each_other(tmp_path: Path) -> None:
    """Issue 54: each script's mode wanted its own install (a switch reinstalled: 46.5 s), and
    the replication walk-through's four scripts at once fought over one .venv (one never
    started). Now a larger install serves a smaller mode, an install never shrinks one, and
    bootstraps started together wait for the one that installs."""
    script, env, log = _scratch_bootstrap(tmp_path)

    def start(mode: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(script), mode], env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path
        )

    def run(mode: str) -> int:
        proc = start(mode)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        return len(installs())

    def installs() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    together = [start(mode) for mode in ("server", "cluster", "server", "cluster")]
    errs = [p.communicate(timeout=60)[1] for p in together]
    assert [p.returncode for p in together] == [0, 0, 0, 0], errs
    assert installs() == ["-m pip install -q -e ."], errs
    assert run("server") == run("cluster") == 1
    assert run("spark") == 2  # larger: installed once
    assert run("server") == 2
    assert installs()[1] == "-m pip install -q --progress-bar on -e .[spark]"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'changed'\n")
    assert run("server") == 3  # changed: the larger install again
    assert installs()[2] == "-m pip install -q --progress-bar on -e .[spark]"
