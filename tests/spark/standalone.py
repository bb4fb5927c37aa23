"""A Spark standalone cluster on 127.0.0.1 for the tests: one Master and two Workers started
with pyspark's own ``spark-class``, free ports, every directory under the test's tmp dir.

Readiness is observed, not slept for: the master's ``/json/`` is polled until the workers are
ALIVE. ``kill_worker`` is ``kill -9`` of a worker JVM, its executor JVMs and their Python
workers (found in ``/proc`` first: ``pyspark.daemon`` makes its own process group, so a group
kill would miss it). The driver of a job runs in a process of its own
(``cluster_query.py``): the test process keeps its local-mode Spark.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyspark

from ..processes import free_port
from ..waiting import wait_for
from .conftest import SPARK_PYTHON

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) of every live (not zombie) process."""
    out: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            out[int(d.name)] = (int(ppid), cmd)
    return out


def _descendants(pid: int, procs: dict[int, tuple[int, str]]) -> list[int]:
    kids = [p for p, (pp, _) in procs.items() if pp == pid]
    return kids + [d for k in kids for d in _descendants(k, procs)]


class StandaloneCluster:
    """One Master and ``workers`` Workers of one core each under ``tmp``."""

    def __init__(self, tmp: Path, workers: int = 2, worker_memory: str = "1g") -> None:
        self.tmp = tmp
        self.worker_memory = worker_memory
        self.port, self.webui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * workers
        self.worker_ports = [0] * workers
        self.killed: set[int] = set()
        self.env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(tmp / "logs"),
            "SPARK_PID_DIR": str(tmp),
            "SPARK_CONF_DIR": str(tmp),
            "SPARK_DAEMON_MEMORY": "256m",
            # A silent worker is dropped after 10 s (not 60); the daemons start faster on C1.
            "SPARK_DAEMON_JAVA_OPTS": "-Dspark.worker.timeout=10 -XX:TieredStopAtLevel=1 "
            "-XX:+UseSerialGC",
            # The executors' Python workers import this tree's packages, as the tests do.
            "PYTHONPATH": os.pathsep.join(sys.path),
            "PYSPARK_PYTHON": SPARK_PYTHON,
        }
        for k in ("SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "PYSPARK_SUBMIT_ARGS"):
            self.env.pop(k, None)

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        (self.tmp / "logs").mkdir(parents=True, exist_ok=True)
        with open(self.tmp / "logs" / f"{name}.log", "ab") as log:
            # spark-class ends in ``exec java``: the Popen's pid is the JVM's.
            return subprocess.Popen(
                [str(SPARK_CLASS), *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> StandaloneCluster:
        try:
            self.master = self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--webui-port", str(self.webui_port)),
            )
            self._master_ports()
            for i in range(len(self.workers)):
                self.start_worker(i, wait=False)
            self.wait_alive(len(self.workers))
        except BaseException:
            self.stop()
            raise
        return self

    def _master_ports(self) -> None:
        """The ports the master bound, from its log: a port found free may be taken by another
        test before the master binds it, and Spark then binds the next one."""
        log = self.tmp / "logs" / "master.log"
        rpc = re.compile(r"Starting Spark master at (spark://\S+:(\d+))")
        web = re.compile(r"MasterWebUI: Bound MasterWebUI to \S+, and started at http://\S+:(\d+)")

        def bound() -> bool:
            assert self.master is not None and self.master.poll() is None, log.read_text()
            text = log.read_text(errors="replace")
            return bool(rpc.search(text) and web.search(text))

        wait_for(bound, "the Spark master to listen", 120)
        text = log.read_text(errors="replace")
        found, webui = rpc.search(text), web.search(text)
        assert found is not None and webui is not None
        self.master_url, self.port = found.group(1), int(found.group(2))
        self.webui_port = int(webui.group(1))

    def start_worker(self, i: int, wait: bool = True) -> None:
        """Worker ``i`` (again, after a kill), on a fresh port."""
        self.worker_ports[i] = free_port()
        work = self.tmp / f"work{i}"
        work.mkdir(parents=True, exist_ok=True)
        self.workers[i] = self._spawn(
            f"worker{i}",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--port", str(self.worker_ports[i])),
            *("--webui-port", str(free_port()), "--cores", "1"),
            *("--memory", self.worker_memory, "--work-dir", str(work)),
            self.master_url,
        )
        if wait:
            self.wait_alive(sum(w is not None for w in self.workers))

    def alive_workers(self) -> int:
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                state: dict[str, Any] = json.load(r)
        except (OSError, ValueError):
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def wait_alive(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_workers() != n:
            if self.master is None or self.master.poll() is not None:
                raise RuntimeError(f"the Spark master exited; see {self.tmp / 'logs'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not {n} Spark workers ALIVE; see {self.tmp / 'logs'}")
            time.sleep(0.2)

    def executor_pids(self, i: int) -> list[int]:
        """The executor JVMs worker ``i`` launched."""
        procs, w = _procs(), self.workers[i]
        tree = set(_descendants(w.pid, procs)) if w is not None else set()
        tag = f"Worker@127.0.0.1:{self.worker_ports[i]}"
        return [
            p
            for p, (_, cmd) in procs.items()
            if "CoarseGrainedExecutorBackend" in cmd and (p in tree or tag in cmd)
        ]

    def executor_logs(self) -> str:
        """Every executor's stderr so far (the Python workers' log lines land there)."""
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.tmp.glob("work*/app-*/*/stderr"))
        )

    def kill_worker(self, i: int) -> None:
        """kill -9 of worker ``i``, its executors and their Python workers."""
        w, procs = self.workers[i], _procs()
        pids = ([w.pid] if w is not None else []) + self.executor_pids(i)
        pids += [d for p in list(pids) for d in _descendants(p, procs)]
        for p in dict.fromkeys(pids):
            self.killed.add(p)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if w is not None:
            w.wait()
        self.workers[i] = None

    def leftovers(self) -> list[str]:
        ports = [f"127.0.0.1:{p}" for p in (self.port, *self.worker_ports) if p]
        return [
            f"{p} {cmd[:120]}"
            for p, (_, cmd) in _procs().items()
            if p != os.getpid()
            and (p in self.killed or str(self.tmp) in cmd or any(x in cmd for x in ports))
        ]

    def stop(self) -> list[str]:
        """Everything down; what is still running after 10 s (nothing, normally)."""
        for i in range(len(self.workers)):
            self.kill_worker(i)
        if self.master is not None:
            self.master.kill()
            self.master.wait()
            self.master = None
        deadline = time.monotonic() + 10
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left
