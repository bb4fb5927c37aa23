"""Fixtures for the Spark connector tests: nsqd subprocesses and ONE shared SparkSession."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.client import ClientOptions, LogRecord, read_log
from pynsqd.client.connection import Connection

from ..conftest import SPARK_WORKER_TIMEOUT

BIN = Path(sys.executable).parent

#: Every Spark JVM the tests start (the local-mode session, the drivers of
#: ``cluster_query.py``, which inherit this environment, and the standalone executors) compiles
#: with C1 only and collects with one thread: a third less CPU for the same tests, which on a
#: busy 2-core machine is what keeps Python workers inside Spark's fixed 10 s to connect back.
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", JVM_OPTS)
#: The Python Spark starts: as root, ``spark_python`` (the processes Spark gives a fixed 10 s
#: to connect back start at a higher priority); otherwise this interpreter.
SPARK_PYTHON = (
    str(Path(__file__).with_name("spark_python")) if os.geteuid() == 0 else sys.executable
)
os.environ["PYNSQD_TEST_PYTHON"] = sys.executable
os.environ["PYSPARK_PYTHON"] = SPARK_PYTHON
#: Set in the environment the test's Spark starts with (its executors inherit it), for
#: ``authSecretEnv``: the secret the tests' auth server grants.
TEST_SECRET_ENV = "PYNSQD_SPARK_TEST_SECRET"


class NsqdProcess:
    """``nsqd`` (our console script) on 127.0.0.1 with OS-chosen ports."""

    def __init__(self, data_path: Path, *args: str) -> None:
        data_path.mkdir(parents=True, exist_ok=True)
        self.log_path = data_path / "nsqd.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                str(BIN / "nsqd"),
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                "--https-address=127.0.0.1:0",  # only used with TLS; never the fixed 4152
                f"--data-path={data_path}",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        deadline = time.monotonic() + 20
        while True:
            text = self.log_path.read_text(errors="replace")
            tcp = re.search(r"TCP: listening on (\S+)", text)
            http = re.search(r"HTTP: listening on (\S+)", text)
            if tcp and http:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nsqd did not start:\n{text}")
            time.sleep(0.05)
        self.tcp_address = tcp.group(1)
        self.http_address = http.group(1)

    def stats(self, topic: str) -> dict[str, Any]:
        url = f"http://{self.http_address}/stats?format=json&topic={topic}&include_mem=false"
        with urllib.request.urlopen(url, timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        for t in self.stats(topic).get("topics") or []:
            if t["topic_name"] == topic:
                return dict(t)
        return None

    def channel_stats(self, topic: str, channel: str) -> dict[str, Any] | None:
        t = self.topic_stats(topic)
        for c in (t or {}).get("channels") or []:
            if c["channel_name"] == channel:
                return dict(c)
        return None

    def wait_drained(self, topic: str, channel: str, timeout: float = 20) -> dict[str, Any]:
        """Poll /stats until the channel has depth 0 and nothing in flight; return its stats."""
        deadline = time.monotonic() + timeout
        while True:
            c = self.channel_stats(topic, channel)
            if c is not None and c["depth"] == 0 and c["in_flight_count"] == 0:
                return c
            if time.monotonic() > deadline:
                raise AssertionError(f"channel {topic}/{channel} not drained: {c}")
            time.sleep(0.1)

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        with Connection(self.tcp_address).connect() as c:
            for i in range(0, len(bodies), 1000):
                c.mpub(topic, bodies[i : i + 1000])

    def log_records(self, topic: str) -> list[LogRecord]:
        """Every record of a retained topic's log (``GET /topic/log``)."""
        out: list[LogRecord] = []
        offset = 0
        while True:
            chunk = read_log(self.http_address, topic, offset, ClientOptions())
            if not chunk.records:
                return out
            out += chunk.records
            offset = chunk.next

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class LookupdProcess:
    """``nsqlookupd`` (our console script) on 127.0.0.1 with OS-chosen ports."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                str(BIN / "nsqlookupd"),
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                "--broadcast-address=127.0.0.1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        deadline = time.monotonic() + 20
        while True:
            text = log_path.read_text(errors="replace")
            tcp = re.search(r"TCP: listening on (\S+)", text)
            http = re.search(r"HTTP: listening on (\S+)", text)
            if tcp and http:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nsqlookupd did not start:\n{text}")
            time.sleep(0.05)
        self.tcp_address = tcp.group(1)
        self.http_address = http.group(1)

    def nodes(self) -> list[str]:
        """Every registered nsqd's TCP address, in the order ``/nodes`` lists them."""
        url = f"http://{self.http_address}/nodes"
        with urllib.request.urlopen(url, timeout=5) as resp:
            data = json.loads(resp.read())
        return [f"{p['broadcast_address']}:{p['tcp_port']}" for p in data["producers"]]

    def producers(self, topic: str) -> list[str]:
        url = f"http://{self.http_address}/lookup?topic={topic}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError:
            return []
        return sorted(f"{p['broadcast_address']}:{p['tcp_port']}" for p in data["producers"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


HAVE_LOOKUPD = (BIN / "nsqlookupd").exists()


@pytest.fixture
def lookupd(tmp_path: Path) -> Iterator[LookupdProcess]:
    p = LookupdProcess(tmp_path / "nsqlookupd.log")
    yield p
    p.stop()


@pytest.fixture
def start_nsqd(tmp_path: Path) -> Iterator[Callable[..., NsqdProcess]]:
    procs: list[NsqdProcess] = []

    def start(*args: str) -> NsqdProcess:
        p = NsqdProcess(tmp_path / f"nsqd{len(procs)}", *args)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def nsqd_proc(start_nsqd: Callable[..., NsqdProcess]) -> NsqdProcess:
    return start_nsqd()


def java_missing() -> str | None:
    """Why Spark cannot start here, or None: it needs a Java runtime (17 or newer)."""
    home = os.environ.get("JAVA_HOME")
    if (home and os.path.exists(os.path.join(home, "bin", "java"))) or shutil.which("java"):
        return None
    return (
        "Spark needs Java 17+: no JAVA_HOME and no java on PATH"
        " (apt-get install openjdk-17-jre-headless)"
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession for the whole run: local[2], no UI, 2 shuffle partitions."""
    reason = java_missing()
    if reason is not None:
        pytest.skip(reason)  # one clear reason for every Spark test, not an error each
    os.environ["PYSPARK_PYTHON"] = SPARK_PYTHON
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ[TEST_SECRET_ENV] = "s3cret"
    from pyspark.sql import SparkSession

    from pynsqd_spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pynsqd-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


#: When a test started (its setup, where pytest-timeout's clock starts too).
STARTED = pytest.StashKey[float]()
#: The watchdog acts this long before pytest-timeout would.
WATCHDOG_MARGIN = 20.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[STARTED] = time.monotonic()
    yield


#: What Spark's JVM logs when a Python process it started did not connect back in its fixed
#: 10 s (the cause of ``SPARK_WORKER_TIMEOUT``, tests/conftest.py).
SPARK_LOGGED_TIMEOUT = "Timed out while waiting for the Python worker to connect back"


class SparkPythonStartTimedOut(Exception):
    """A test failed while Spark logged that a Python process it started timed out."""


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that failed in another way (a wait that timed out: the query it waited on had
    died) while Spark logged its Python start timeout has that named as the cause, so that the
    rerun rule (tests/conftest.py) sees it; the test's own failure stays in the report."""
    if call.when == "call" and call.excinfo is not None:
        logged = "".join(text for when, _, text in item._report_sections if when == "call")
        if SPARK_LOGGED_TIMEOUT in logged and SPARK_WORKER_TIMEOUT not in str(call.excinfo.value):
            try:
                raise SparkPythonStartTimedOut(
                    f"{SPARK_WORKER_TIMEOUT}: Spark logged '{SPARK_LOGGED_TIMEOUT}' during it"
                ) from call.excinfo.value
            except SparkPythonStartTimedOut as err:
                call.excinfo = pytest.ExceptionInfo.from_exception(err)
    yield


def _cancel_everything(spark: Any, test: str) -> None:
    print(f"watchdog: {test} near its timeout: cancelling its Spark work", file=sys.stderr)
    spark.sparkContext.cancelAllJobs()
    for query in spark.streams.active:
        query.stop()


@pytest.fixture(autouse=True)
def spark_watchdog(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the shared session that runs long has its Spark jobs cancelled (and its
    streaming queries stopped) shortly before pytest-timeout would interrupt it: the test then
    fails with Spark's own error. Interrupted inside a py4j call instead, the session's
    connection to the JVM falls out of step (each later call reads the answer to the one
    before) and every later Spark test of the worker fails with it."""
    if "spark" not in request.fixturenames:
        yield
        return
    spark = request.getfixturevalue("spark")
    marker = request.node.get_closest_marker("timeout")
    limit = float(marker.args[0] if marker and marker.args else request.config.getini("timeout"))
    started = request.node.stash.get(STARTED, time.monotonic())
    left = started + limit - WATCHDOG_MARGIN - time.monotonic()
    timer = threading.Timer(max(left, 1.0), _cancel_everything, (spark, request.node.nodeid))
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()
