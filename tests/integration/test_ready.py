"""Ready means ready: the first ``GET /ping`` answered OK finds the node whole.

A client (a readiness probe, a client's test suite) polls ``/ping`` and starts the moment it
answers OK. At that instant every worker of ``--workers N`` serves and the node is listed at
its nsqlookupd; one process is listed there too. A ``/ping`` before then answers 500
``NOK - starting ...`` (the node's HTTP port is bound from the start: with ``--workers`` the
supervisor holds it while the workers start)."""

from __future__ import annotations

import fcntl
import http.client
import os
import re
import subprocess
from pathlib import Path

import pytest

from ..processes import NSQD, free_port, track
from ..waiting import wait_for
from .lookupd_helpers import LookupdThread, get_json

SERVING = re.compile(r"WORKERS: worker (\d+) \(pid \d+\) serving")


def ping(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/ping")
        r = conn.getresponse()
        return r.status, r.read().decode()
    except OSError as err:  # not bound yet (one process binds at its start)
        return 0, str(err)
    finally:
        conn.close()


def start(log_path: Path, *flags: str) -> subprocess.Popen[bytes]:
    """nsqd with ``flags``, its log in ``log_path``, not waited for."""
    with log_path.open("wb") as log_file:
        return track(subprocess.Popen([NSQD, *flags], stdout=subprocess.DEVNULL, stderr=log_file))


@pytest.mark.parametrize("workers", [1, 4])
def test_the_first_ping_ok_finds_every_worker_serving_and_the_node_at_nsqlookupd(
    tmp_path: Path, workers: int
) -> None:
    lookupd = LookupdThread()
    log_path = tmp_path / "nsqd.log"
    tcp, http_port = free_port(), free_port()
    host, lport = lookupd.tcp_address
    try:
        p = start(
            log_path,
            f"--tcp-address=127.0.0.1:{tcp}",
            f"--http-address=127.0.0.1:{http_port}",
            f"--data-path={tmp_path}",
            f"--workers={workers}",
            f"--lookupd-tcp-address={host}:{lport}",
            "--broadcast-address=n1",
        )
        answers: list[tuple[int, str]] = []

        def ping_ok() -> bool:
            assert p.poll() is None, log_path.read_text()
            answers.append(ping(http_port))
            return answers[-1][0] == 200

        wait_for(ping_ok, "/ping to answer OK", 60)
        # The instant it did: the node is at nsqlookupd, and every worker serves.
        nodes = get_json(f"{lookupd.http_url}/nodes")["producers"]
        assert [(n["broadcast_address"], n["tcp_port"]) for n in nodes] == [("n1", tcp)]
        if workers > 1:
            serving = {int(i) for i in SERVING.findall(log_path.read_text())}
            assert serving == set(range(workers))
        for status, text in answers[:-1]:  # what it said before: starting, never a wrong OK
            assert status == 0 or (status == 500 and text.startswith("NOK - starting")), text
        p.terminate()
        assert p.wait(60) == 0
        log = log_path.read_text()
        assert "Traceback" not in log, log
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        lookupd.stop()


def test_no_ping_ok_while_a_worker_cannot_start(tmp_path: Path) -> None:
    """Worker 1 cannot take its data directory (another process holds its lock): /ping never
    claims the node ready; it says starting until the supervisor gives up (exit 1)."""
    data = tmp_path / "data"
    (data / "worker-1").mkdir(parents=True)
    held = os.open(data / "worker-1", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    http_port = free_port()
    log_path = tmp_path / "nsqd.log"
    p = start(
        log_path,
        f"--tcp-address=127.0.0.1:{free_port()}",
        f"--http-address=127.0.0.1:{http_port}",
        f"--data-path={data}",
        "--workers=2",
    )
    answers: list[tuple[int, str]] = []
    try:
        while p.poll() is None:
            answers.append(ping(http_port))
        assert p.wait() == 1
        assert all(status != 200 for status, _ in answers), answers
        log = log_path.read_text()
        assert "worker 1 failed to start" in log, log
    finally:
        os.close(held)
        if p.poll() is None:
            p.kill()
            p.wait()
