"""A node's first workers, forked from the supervisor with the server already imported.

Theory of operation. Started as ``python -m pynsqd``, each worker imports the whole server
before it can serve (about 0.4 s of one core here): four workers on two cores took well over a
second to be ready. So at a node's start the supervisor imports the server's modules once
(``preload``), before its own event loop exists, and forks the workers (``fork_worker``): each
child keeps only the descriptors its ``WorkerSpec`` names, and runs the same ``cli.main`` an
exec'd worker runs, on a loop of its own. A worker started again later (after it exited) is
exec'd as before: the supervisor's loop is running by then, and a fork of it would carry it.

The supervisor waits for a forked worker through a pidfd (``ForkedWorker.wait``): it is the
worker's parent, so its exit status is read with ``waitpid`` as for any child.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import signal
import sys
from collections.abc import Callable

from .spec import WorkerSpec


def can_fork() -> bool:
    """Forking needs a pidfd to wait on (Linux 5.3 and later)."""
    return hasattr(os, "pidfd_open") and hasattr(os, "fork")


def preload() -> None:
    """Import what a worker runs, once, here: every fork shares it (copy on write)."""
    import pynsqd.server.nsqd  # noqa: F401

    gc.freeze()  # kept out of the collector's sight: its pages stay shared


class ForkedWorker:
    """A worker forked by ``fork_worker``, as the supervisor handles a started one."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    async def wait(self) -> int:
        """Its exit code (negative: the signal that ended it), as ``Process.wait``."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        fd = os.pidfd_open(self.pid)

        def readable() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await ended
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def fork_worker(
    argv: list[str], spec: WorkerSpec, main: Callable[[list[str]], int]
) -> ForkedWorker:
    """Fork worker ``spec.index``; in the child, run ``main`` (the console script's, which
    finds the spec in the environment) and exit (never returns there)."""
    pid = os.fork()
    if pid:
        return ForkedWorker(pid)
    code = 1
    try:
        keep = {0, 1, 2, *spec.fds.values()}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        os.environ[WorkerSpec.ENV] = spec.to_env()
        random.seed()
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)
