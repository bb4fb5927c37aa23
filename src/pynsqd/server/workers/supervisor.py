"""``nsqd --workers N``: the supervisor, a small process that owns the node's sockets and keeps
N workers running.

Theory of operation. The supervisor binds ``--tcp-address``, ``--http-address`` and
``--https-address`` itself (a port in use is its one FATAL line) and, in a private directory
(mode 0700), each worker's two unix sockets: ``link`` (the V2 protocol between workers) and
``admin`` (HTTP between workers). It imports the server once, before its first worker, and
makes each worker by forking itself (``fork_worker``): the child keeps only its descriptors,
forgets the supervisor's event loop and signal handlers, and runs the server with its
``WorkerSpec`` (``spec.py``), so a worker starts without importing anything again (the node's
start-up: ``bench/startup.py``). The workers are the supervisor's own children, whose exits it
sees through a pidfd each (``Forked.wait``). Where the kernel has no pidfd (Linux before 5.3),
a worker is started as ``python -m pynsqd`` with the same arguments, the descriptors, and the
spec in ``PYNSQD_WORKER``.
Because the supervisor holds every listening socket, the node's ports never close while a worker
restarts; a connection that arrives meanwhile waits in the kernel's queue for a live worker.

- Ready means ready: each worker reports ``<i> serving`` on a pipe; once every worker has, the
  supervisor tells them (``s``, on each worker's own ``go`` pipe), worker 0 registers the node
  with nsqlookupd and reports ``0 registered``, and the supervisor tells every worker ``R``:
  only from then on does ``GET /ping`` answer OK (before: ``NOK - starting (...)``), and the
  supervisor logs "ready". A worker started again is told at once what the others were.
- A worker that exits is started again at once (then after 0.1 s, doubling to 5 s, while it
  keeps exiting within 10 s of each start). A worker that fails its first start stops the node:
  its FATAL line has been printed, and the supervisor exits 1.
- A replicated node (``--etcd-endpoints``): every worker joins the cluster as a member of its
  own (node id ``--node-id`` + its index) and serves once it has joined.
- SIGTERM or SIGINT: every worker is sent SIGTERM and flushes as nsqd does; the supervisor exits
  when they have (after 60 s it kills what is left).
- The supervisor killed with kill -9: each worker holds the read end of a pipe whose write end
  only the supervisor has; its end of file makes the worker stop cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from typing import NoReturn, Protocol

from ...internal.listener import (
    is_unix_address,
    listen_backlog,
    listen_failed,
    split_host_port,
)
from ...internal.waits import wait_set
from ...options import Options
from ...storage.identity import storage_id
from .spec import ConnectionCounts, WorkerSpec

log = logging.getLogger("pynsqd")

RESTART_BACKOFF_MIN = 0.1
RESTART_BACKOFF_MAX = 5.0
#: A worker that ran this long before exiting is restarted at once.
STABLE_AFTER = 10.0
STOP_GRACE = 60.0


def restart_pause(tries: int) -> float:
    """How long a worker's keeper waits before its next start, after ``tries`` quick
    failures in a row (a start that failed, or an exit soon after one): none before the
    first, then 0.1 s doubling to 5 s, so that a worker that cannot run is no hot loop."""
    if tries < 1:
        return 0.0
    return min(RESTART_BACKOFF_MIN * float(1 << (tries - 1)), RESTART_BACKOFF_MAX)


def bind(address: str) -> socket.socket:
    """A listening socket on ``address`` as nsqd binds it (``host:port`` or a unix path)."""
    try:
        if is_unix_address(address):
            if os.path.exists(address):
                os.unlink(address)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(address)
        else:
            host, port = split_host_port(address)
            family, kind, proto, _, addr = socket.getaddrinfo(
                host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
        sock.listen(listen_backlog())
    except OSError as err:
        raise listen_failed(address, err) from None
    return sock


class Worker(Protocol):
    """A running worker as the supervisor uses it (``asyncio.subprocess.Process`` has it)."""

    @property
    def pid(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...
    async def wait(self) -> int: ...


class Forked:
    """A worker forked by the supervisor, watched through its pidfd: readable once it exited.
    ``wait`` reaps it and gives its exit code as ``asyncio``'s does (negative: the signal)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        if self.returncode is None:
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[None] = loop.create_future()

            def on_exit() -> None:
                if not exited.done():
                    exited.set_result(None)

            loop.add_reader(self._pidfd, on_exit)
            try:
                await exited
            finally:
                loop.remove_reader(self._pidfd)
            _, status = os.waitpid(self.pid, 0)
            os.close(self._pidfd)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def preload() -> bool:
    """Import the server here, once, before the first worker is forked (each worker then
    starts with it imported); False where workers cannot be forked and watched (no pidfd),
    and are started as new programs instead."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    import pynsqd.server.nsqd  # noqa: F401  (what every worker runs)

    return True


def fork_worker(opts: Options, fds: dict[str, int], spec: WorkerSpec) -> Forked:
    """Worker ``spec.index``, forked from this process (``preload`` returned True)."""
    pid = os.fork()
    if pid == 0:
        _run_forked(opts, fds, spec)
    try:
        return Forked(pid, os.pidfd_open(pid))
    except OSError:  # no descriptor to watch it with: it must not serve unwatched
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


def _run_forked(opts: Options, fds: dict[str, int], spec: WorkerSpec) -> NoReturn:
    """The forked child: only its own descriptors (the others' pipes and sockets closed: the
    supervisor's death must reach it as the end of its ``alive`` pipe), none of the
    supervisor's signal handling or event loop, then the server as ``cli.main`` runs it for
    a worker. It never returns into the supervisor's code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        keep = sorted({0, 1, 2, *fds.values()})
        for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
            os.closerange(low + 1, high)
        asyncio.events._set_running_loop(None)
        asyncio.set_event_loop_policy(None)
        import copy

        from ...log import configure_logging
        from ..nsqd import run
        from .spec import worker_options

        mine = copy.deepcopy(opts)
        worker_options(mine, spec)
        configure_logging(mine.log_level, mine.log_prefix)
        code = run(mine, spec)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class Supervisor:
    def __init__(self, opts: Options, argv: list[str], count: int) -> None:
        self.opts = opts
        self.argv = argv
        self.count = count
        self.shared: dict[str, socket.socket] = {}
        self.private: list[dict[str, socket.socket]] = []
        self.links: list[str] = []
        self.admins: list[str] = []
        self.private_dir = ""
        self.procs: dict[int, Worker] = {}
        #: Workers are forked from this process (``preload``), else started as programs.
        self.forks = False
        self.ever_ready: set[int] = set()
        self.failure = 0
        self.stop = asyncio.Event()
        #: What the node told its workers so far (each worker's ``go`` pipe): ``s`` every
        #: worker served (worker 0 registers with nsqlookupd), ``R`` the node is ready.
        self.told = b""
        self._go: dict[int, int] = {}
        #: The node's start: every worker reports it (``WorkerSpec.started``).
        self.started = int(time.time())
        self.storage = ""

    def bind_all(self) -> None:
        opts = self.opts
        self.shared["tcp"] = bind(opts.tcp_address)
        if opts.http_address:
            self.shared["http"] = bind(opts.http_address)
        if opts.https_address and opts.tls_cert:
            self.shared["https"] = bind(opts.https_address)
        # Short paths (sun_path holds 107 bytes), private to this user.
        self.private_dir = tempfile.mkdtemp(prefix="pynsqd-workers-")
        self.counts_path = os.path.join(self.private_dir, "connections")
        self.counts = ConnectionCounts.create(self.counts_path, self.count)
        for i in range(self.count):
            link = os.path.join(self.private_dir, f"{i}.link")
            admin = os.path.join(self.private_dir, f"{i}.admin")
            self.private.append({"link": bind(link), "admin": bind(admin)})
            self.links.append(link)
            self.admins.append(admin)
        base = opts.data_path or os.getcwd()
        for i in range(self.count):
            os.makedirs(os.path.join(base, f"worker-{i}"), mode=0o700, exist_ok=True)
        self.storage = storage_id(base)  # the node's, in /info (a worker's log has its own)
        self._alive_r, self._alive_w = os.pipe()
        self._ready_r, self._ready_w = os.pipe()

    @contextlib.contextmanager
    def _starting(self, i: int) -> Iterator[tuple[dict[str, int], WorkerSpec]]:
        """Worker ``i``'s descriptors and spec while it is started. Its ``go`` pipe's read
        end is closed after (the worker has its own copy); the write end is kept once it
        started."""
        fds, go_w, spec = self._spec(i)
        try:
            yield fds, spec
        except BaseException:
            os.close(go_w)
            raise
        finally:
            os.close(fds["go"])
        self._go[i] = go_w

    def _spec(self, i: int) -> tuple[dict[str, int], int, WorkerSpec]:
        """Worker ``i``'s descriptors, the write end of its ``go`` pipe, and its spec."""
        fds = {name: s.fileno() for name, s in self.shared.items()}
        fds.update({name: s.fileno() for name, s in self.private[i].items()})
        fds["alive"] = self._alive_r
        fds["ready"] = self._ready_w
        go_r, go_w = os.pipe()
        fds["go"] = go_r
        if self.told:  # a worker started again: what the node told the others
            os.write(go_w, self.told)
        spec = WorkerSpec(
            i,
            self.count,
            fds,
            self.links,
            self.admins,
            self.counts_path,
            self.started,
            self.storage,
        )
        return fds, go_w, spec

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        os.set_blocking(self._ready_r, False)
        loop.add_reader(self._ready_r, self._on_ready)
        log.info(
            "WORKERS: %d worker processes on %s (data in %s/worker-<i>; their own sockets in %s)",
            self.count,
            ", ".join(s for s in (self.opts.tcp_address, self.opts.http_address) if s),
            self.opts.data_path or os.getcwd(),
            self.private_dir,
        )
        # (A replicated node's workers join the cluster each as its own member, at once.)
        tasks = [loop.create_task(self._keep(i)) for i in range(self.count)]
        for task in tasks:
            task.add_done_callback(self._kept)
        await self.stop.wait()
        for proc in list(self.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        _done, pending = await asyncio.wait(tasks, timeout=STOP_GRACE)
        if pending:
            for proc in list(self.procs.values()):
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await asyncio.wait(pending)
        loop.remove_reader(self._ready_r)
        self.close()
        log.info("WORKERS: every worker has stopped")
        return self.failure

    def _on_ready(self) -> None:
        """A worker's report: ``<i> serving``, or worker 0's ``0 registered`` (with every
        nsqlookupd, after every worker served): then the node is ready, and every worker's
        ``/ping`` says OK from then on."""
        try:
            data = os.read(self._ready_r, 4096)
        except BlockingIOError:
            return
        for line in data.decode().splitlines():
            index, _, what = line.partition(" ")
            i = int(index)
            if what == "serving":
                proc = self.procs.get(i)
                log.info("WORKERS: worker %d (pid %s) serving", i, proc.pid if proc else "?")
                self.ever_ready.add(i)
                if len(self.ever_ready) == self.count and not self.told:
                    self._tell(b"s")
            elif what == "registered" and self.told == b"s":
                log.info(
                    "WORKERS: ready: %d workers serve on %s",
                    self.count,
                    ", ".join(s for s in (self.opts.tcp_address, self.opts.http_address) if s),
                )
                self._tell(b"R")

    def _tell(self, word: bytes) -> None:
        self.told += word
        for fd in self._go.values():
            with contextlib.suppress(OSError):
                os.write(fd, word)

    async def _keep(self, i: int) -> None:
        loop = asyncio.get_running_loop()
        quick_exits = 0  # in a row, each within STABLE_AFTER of its start
        while not self.stop.is_set():
            try:
                proc = await self._start(i)
            except OSError as err:  # out of descriptors or processes, say: said, tried again
                if i not in self.ever_ready:
                    log.error("WORKERS: worker %d could not be started - %s; stopping", i, err)
                    self.failure = 1
                    self.stop.set()
                    return
                quick_exits += 1
                backoff = restart_pause(quick_exits)
                log.error(
                    "WORKERS: worker %d could not be started again - %s; trying again in %gs",
                    i,
                    err,
                    backoff,
                )
                await wait_set(self.stop, backoff)
                continue
            self.procs[i] = proc
            started = loop.time()
            code = await proc.wait()
            del self.procs[i]
            os.close(self._go.pop(i))
            self.counts.set(i, ConnectionCounts.DOWN)  # no longer takes connections
            if self.stop.is_set():
                return
            if i not in self.ever_ready:
                # An ERROR: the worker's own FATAL line said why (nsqd's one FATAL line).
                log.error("WORKERS: worker %d failed to start (exit %d); stopping", i, code)
                self.failure = 1
                self.stop.set()
                return
            how = f"signal {-code}" if code < 0 else f"exit {code}"
            quick_exits = 0 if loop.time() - started > STABLE_AFTER else quick_exits + 1
            backoff = restart_pause(quick_exits - 1)  # the first quick exit: at once
            log.error(
                "WORKERS: worker %d (pid %d) ended (%s); starting it again%s",
                i,
                proc.pid,
                how,
                f" in {backoff:g}s" if backoff else "",
            )
            if backoff:
                await wait_set(self.stop, backoff)

    def _kept(self, task: asyncio.Task[None]) -> None:
        """A worker's keeper ended: on a stop, or (a defect) by an exception, which stops the
        node with one line rather than leave that worker unkept without a word."""
        if task.cancelled() or task.exception() is None:
            return
        log.critical("WORKERS: keeping a worker failed - %r; stopping", task.exception())
        self.failure = 1
        self.stop.set()

    async def _start(self, i: int) -> Worker:
        """Worker ``i`` forked (or started as a new program); raises OSError."""
        with self._starting(i) as (fds, spec):
            if self.forks:
                return fork_worker(self.opts, fds, spec)
            env = dict(os.environ, **{WorkerSpec.ENV: spec.to_env()})
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pynsqd",
                *self.argv,
                pass_fds=list(fds.values()),
                env=env,
            )

    def close(self) -> None:
        for fd in (self._alive_w, self._alive_r, self._ready_r, self._ready_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        for sock in list(self.shared.values()) + [s for p in self.private for s in p.values()]:
            sock.close()
        if getattr(self, "counts", None) is not None:
            self.counts.close()
        if self.private_dir:
            shutil.rmtree(self.private_dir, ignore_errors=True)


def run_supervisor(opts: Options, argv: list[str], count: int) -> int:
    """The console script's body for ``--workers N`` (N > 1)."""
    sup = Supervisor(opts, argv, count)
    try:
        sup.bind_all()
    except OSError as err:
        log.critical("failed to start nsqd - %s", err)
        if sup.private_dir:
            shutil.rmtree(sup.private_dir, ignore_errors=True)
        return 1
    sup.forks = preload()
    return asyncio.run(sup.run())
