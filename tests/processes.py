"""The suite's one process wrapper: a console script of this package (``nsqd``,
``nsqlookupd``, ...) as a real child process, its stderr in a log file, its bound addresses
read from its own "listening on" lines, and the signals a fault test sends it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pynsqd.internal.listener import port_free

from .waiting import wait_for
from .wire import Conn

BIN = Path(sys.executable).parent
NSQD = str(BIN / "nsqd")
#: "TCP: listening on 127.0.0.1:4150", "HTTP: listening on /tmp/x.sock", "HTTPS: ..."
LISTENING = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")

#: How long a server process that is alive may take to say it listens (seconds).
START_GUARD = 120.0
#: Every process started and not yet reaped: ``reap_all`` kills what a failing test left.
_LIVE: list[subprocess.Popen[bytes]] = []


class ServerProcess:
    """``script`` started with ``args``; ``addresses`` maps "TCP", "HTTP" (and "HTTPS") to
    the address it logged, once each of ``want`` is there."""

    def __init__(
        self,
        script: str,
        *args: str,
        log: Path,
        want: Iterable[str] = ("TCP", "HTTP"),
        cwd: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.log_file = log.open("ab")
        self._start = log.stat().st_size
        self.p = subprocess.Popen(
            [str(BIN / script), *args],
            stdout=subprocess.DEVNULL,
            stderr=self.log_file,
            cwd=cwd,
            preexec_fn=preexec_fn,
        )
        _LIVE.append(self.p)
        self.addresses: dict[str, str] = {}
        wanted = set(want)

        def listening() -> bool:
            text = self.output()
            assert self.p.poll() is None, f"{script} exited early:\n{text}"
            self.addresses.update(LISTENING.findall(text))
            return wanted <= self.addresses.keys()

        # A hang guard, not a wait on time: an exit fails at once, and a start under the whole
        # suite's load (4 workers importing, a replicated node joining its cluster) took 25 s.
        wait_for(listening, f"{script} to listen", START_GUARD)

    def output(self) -> str:
        """What this run logged (the file may hold earlier runs' lines too)."""
        return self.log.read_bytes()[self._start :].decode(errors="replace")

    def port_of(self, what: str = "TCP") -> int:
        return int(self.addresses[what].rsplit(":", 1)[1])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig``, wait for the exit; the exit code."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        code = self.p.wait(timeout=timeout)
        self.log_file.close()
        if self.p in _LIVE:
            _LIVE.remove(self.p)
        return code


class NsqdProcess(ServerProcess):
    """The real nsqd process with TCP and HTTP on port 0, its data in ``data``."""

    def __init__(
        self,
        data: Path,
        log: Path,
        *flags: str,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data}",
            *flags,
            log=log,
            preexec_fn=preexec_fn,
        )
        self.port, self.http_port = self.port_of("TCP"), self.port_of("HTTP")

    def connect(self) -> Conn:
        return Conn(("127.0.0.1", self.port))

    def http(self, method: str, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        try:
            conn.request(method, path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        status, body = self.http("GET", "/stats?format=json")
        assert status == 200
        result: dict[str, Any] = json.loads(body)
        return result


def run_script(script: str, cwd: Path, timeout: float) -> tuple[int | None, str]:
    """``script`` under ``bash -euo pipefail`` in a session of its own (as a user pastes it);
    whatever it leaves running (a command that fails skips its last ``kill``) is killed after
    it. Its exit status (None: it did not end within ``timeout``) and its output."""
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        status = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if status is None:
        out, _ = proc.communicate()
    return status, out


def track(p: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """A process a test started itself: killed by ``reap_all`` if the test leaves it."""
    _LIVE.append(p)
    return p


def free_port() -> int:
    """A port nobody listens on now (bound, then closed): for a server told its port up front."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_offset(ports: Iterable[int], low: int = 10_000) -> int:
    """An offset at or above ``low`` that moves every one of ``ports`` to a port free now.

    The ports land below the kernel's ephemeral range, where the suite's own client connections
    take their ports (a port chosen above it is taken again a moment later by some connect()),
    and each is probed as servers bind it (``port_free``). A CI run under the whole suite found
    no 22 ports in a row free to a bind without SO_REUSEADDR in 50 tries."""
    ports = sorted(set(ports))
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(50):
        offset = rng.randrange(low, max(low + 1, ephemeral - ports[-1]), 10)
        if all(port_free(port + offset) for port in ports):
            return offset
    raise AssertionError(f"no free ports for {ports} in 50 tries")


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return {p for p in found if alive(p)}


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie not yet reaped is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def reap_all() -> None:
    """Kill every process a test started and did not stop."""
    while _LIVE:
        p = _LIVE.pop()
        if p.poll() is None:
            p.kill()
            p.wait()
