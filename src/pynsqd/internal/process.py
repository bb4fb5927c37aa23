"""The process shared by nsqd, nsqlookupd and nsqadmin: start, run until SIGTERM/SIGINT, stop."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import signal
import sys
from collections.abc import Callable
from typing import Protocol

#: objects allocated (minus freed) between collections of the youngest generation (Python: 700)
GC_THRESHOLD = 20_000
#: How long a thread waits for the GIL before the running one is asked to drop it (Python: 5 ms).
#: The event loop holds it almost always; the threads that want it finished an fsync or a read
#: off the loop and only hand back a result, which a replicated publish's OK waits for.
SWITCH_INTERVAL = 0.0005


#: glibc's ``mallopt`` parameters (malloc.h) and what this process sets them to. Freed memory
#: up to ``KEEP_FREED`` stays in the process, and blocks up to ``HEAP_BLOCK`` (an MPUB of
#: 200 x 1 KB, a socket read) come from the heap, not each from its own ``mmap``. glibc's own
#: defaults hand memory back to the kernel as soon as 128 KiB sit free at the heap's top, and
#: the next messages take those pages afresh: 2 to 94 page faults a 1,000 messages delivered
#: (``bench/headers.py`` counts them), 0.4 with this. A fresh page is dear on a VM whose free
#: pages go back to its host (4-36 us here); in alternating runs on this one the throughput
#: moved less than the VM's own drift. What is kept is bounded: the process's size stays near
#: its high-water mark plus ``KEEP_FREED``, as Go's runtime keeps its heap.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
KEEP_FREED = 64 << 20
HEAP_BLOCK = 4 << 20


def keep_freed_memory() -> bool:
    """Set the allocator as ``KEEP_FREED`` says; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # pragma: no cover - musl, macOS
        return False
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, HEAP_BLOCK),
            (M_TRIM_THRESHOLD, KEEP_FREED),
            (M_TOP_PAD, 1 << 20),
        )
    )


class Service(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def run(
    make: Callable[[asyncio.AbstractEventLoop], Service], name: str, log: logging.Logger
) -> int:
    """Run the service made by ``make`` on uvloop (when installed) until a signal; exit code."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        runner = asyncio.run
    else:
        runner = uvloop.run
    return runner(_serve(make, name, log))


async def _serve(
    make: Callable[[asyncio.AbstractEventLoop], Service], name: str, log: logging.Logger
) -> int:
    loop = asyncio.get_running_loop()
    service = make(loop)
    try:
        await service.start()
    except Exception as err:  # bind errors, the data-dir lock, TLS files: one line, no traceback
        log.critical("failed to start %s - %s", name, err)
        log.debug("startup failure", exc_info=True)
        return 1
    # Everything made so far (modules, options, the loaded queues) lives as long as the process:
    # out of the collector's sight, so the full collections that message traffic triggers do not
    # walk it again and again. And a server makes and drops many short-lived acyclic objects
    # (messages, frames, commands), so the youngest generation is collected less often.
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    sys.setswitchinterval(SWITCH_INTERVAL)
    keep_freed_memory()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await service.stop()
    return 0
