"""Fixtures: a real nsqd on 127.0.0.1 port 0, run on its own event loop thread; and the tiers.

The suite has four tiers, each a marker given by the folder a test lives in (``tier_of``):
``tests/unit`` (mirroring ``src/``; no server, no process: parsers, rules, the plan,
milliseconds), ``tests/integration`` (real servers over real sockets in this process or a few
child processes), ``tests/system`` and ``tests/spark`` (real NSQ clients, tools, Spark, a
browser, packaging: whole programs), ``tests/fault`` (kill -9, pauses, partitions, power loss
of real processes, a few cycles each; ``scripts/replication-faults`` runs them as soaks).
``scripts/test`` runs every tier in parallel workers (pytest-xdist): the tests that start many
processes in five serial lanes, first (``LANES``), the rest beside them; ``scripts/test -m
unit`` runs one tier."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from pynsqd.options import Options
from pynsqd.server.nsqd import NSQD

from .wire import Conn

T = TypeVar("T")


class LoopThread:
    """An event loop on a background thread: ``call`` and ``call_async`` run work on it."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return fut.result(timeout=10)

    def call_async(self, coro_fn: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(timeout=30)

    def stop_loop(self, service_stop: Callable[[], Any]) -> None:
        """Stop the service with ``service_stop`` (a coroutine function), then the loop."""
        if self.loop.is_running():
            self.call_async(service_stop)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop.close()


class ServerThread(LoopThread):
    """nsqd in a background thread; ``call`` runs a function on its loop and returns the result."""

    def __init__(self, opts: Options) -> None:
        super().__init__()
        self.opts = opts
        self.nsqd: NSQD = self.call_async(self._start)

    async def _start(self) -> NSQD:
        nsqd = NSQD(self.opts, self.loop)
        await nsqd.start()
        return nsqd

    @property
    def tcp_port(self) -> int:
        return int(self.nsqd.tcp_address.rsplit(":", 1)[1])

    @property
    def tcp_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.tcp_port)

    @property
    def http_port(self) -> int:
        return int(self.nsqd.http_address.rsplit(":", 1)[1])

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def connect(self, **identify: Any) -> Conn:
        conn = Conn(self.tcp_address)
        if identify:
            conn.identify(identify)
        return conn

    def stop(self) -> None:
        self.stop_loop(self.nsqd.stop)


def http_request(
    server: ServerThread, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, bytes]:
    """One request to nsqd's HTTP port: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def make_options(tmp_path: Path, **overrides: Any) -> Options:
    opts = Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=str(tmp_path))
    for key, value in overrides.items():
        if not hasattr(opts, key):
            raise AttributeError(key)
        setattr(opts, key, value)
    return opts


@pytest.fixture
def make_nsqd(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    servers: list[ServerThread] = []

    def make(**overrides: Any) -> ServerThread:
        server = ServerThread(make_options(tmp_path, **overrides))
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def nsqd(make_nsqd: Callable[..., ServerThread]) -> ServerThread:
    return make_nsqd()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test's captured output may hold what hostile clients sent (lone surrogates, as the
    server logs undecodable bytes): escaped, so a parallel worker can send its report."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]


TIERS = ("fault", "system", "integration", "unit")


def tier_of(path: Path) -> str:
    """A test's tier is its folder's: ``tests/fault``, ``tests/system`` (and ``tests/spark``),
    ``tests/integration``; ``tests/unit`` (mirroring ``src/``) and the top-level checks are
    ``unit``."""
    parts = path.parts
    for tier, folders in (("fault", ("fault",)), ("system", ("system", "spark"))):
        if any(f in parts for f in folders):
            return tier
    return "integration" if "integration" in parts else "unit"


#: Tests that start many processes (Spark's JVMs, three nodes and etcd under faults) run in
#: five serial lanes: at most five at once on 2 cores (more lanes, more workers: slower, as
#: every lane waits on the two cores), while the other workers take the rest
#: (``pytest_xdist_make_scheduler``). Each lane takes a few minutes.
LANES = {
    # Spark standalone clusters (a master, two workers, their executors and a driver: six JVMs
    # each): one at a time. Side by side on the two cores a driver took 160 s to start its query
    # and its first batch missed a 300-s guard (CI, 2026-11-30).
    "test_standalone.py": "spark-cluster",
    "test_standalone_sink.py": "spark-cluster",
    "test_replication.py": "fault-1",
    "test_replicated_channels.py": "fault-2",
    "test_retained_faults.py": "fault-2",
    "test_crash_safety.py": "fault-2",
    "test_persistence_process.py": "fault-2",
    # Many processes each (a replicated cluster and its etcd; a supervisor and its workers):
    # run in order with the other fault files, not beside them on the two cores, where their
    # load makes etcd leases lapse in the replication tests.
    "test_cluster_script.py": "fault-2",
    "test_workers.py": "fault-1",
    "test_damaged_copies.py": "fault-1",
    "test_failover.py": "fault-2",
}


#: Spark's local-mode tests that run streaming queries across kills: a lane of their own.
SPARK_STREAMS = {"test_log_mode.py", "test_log_replicated.py", "test_log_nodes.py"}


def lane_of(path: Path) -> str | None:
    if path.name in LANES:
        return LANES[path.name]
    if "spark" in path.parts:
        return "spark-streams" if path.name in SPARK_STREAMS else "spark-local"
    return None


#: A Spark test's timeout unless it names its own: the first test of a worker also starts the
#: session's JVM, which takes a minute on a busy 2-core machine. A guard against a hang: a
#: 62-s test took 223 s beside two busy loops and met the watchdog at 240 (2026-11-30).
SPARK_TIMEOUT = 360
#: Spark gives each Python process it starts for a data source's planning or a streaming
#: source a fixed 10 s to connect back (``PythonWorkerFactory.createSimpleWorker``, no
#: setting); on a saturated 2-core machine that start can take longer. A Spark test that fails
#: with exactly this error runs again from scratch (pytest-rerunfailures), at most twice; any
#: other failure fails it.
SPARK_WORKER_TIMEOUT = "Python worker failed to connect back"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        item.add_marker(tier_of(path))
        if "spark" in path.parts:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))
            item.add_marker(pytest.mark.flaky(reruns=2, only_rerun=[SPARK_WORKER_TIMEOUT]))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with the lanes as scopes: each lane is one unit of work (one
    worker runs it, in order); every other test is a unit of its own. Units with the most
    tests go first (xdist's default order), so the lanes start at once."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(Path(nodeid.split("::", 1)[0])) or nodeid

    return Lanes(config, log)
