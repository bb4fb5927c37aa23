"""``/debug/*``: Python equivalents of Go's pprof endpoints; they answer 200.

README, "Differences from nsqd": nsqd's answer 500 after working.

``profile`` runs cProfile on the event loop thread for ``seconds`` (default 30, as Go's);
``heap`` is a GC and allocation summary; ``goroutine`` lists the asyncio tasks and threads with
their stacks; ``threadcreate`` lists threads; ``block`` reports the rate set with
``/debug/setblockrate`` (Python has no block profiler); ``freememory`` runs a full collection
and returns freed heap to the OS where glibc allows it.
"""

from __future__ import annotations

import asyncio
import cProfile
import ctypes
import gc
import io
import pstats
import sys
import threading
import traceback
from collections import Counter

from .httpapi import HTTPError, Params
from .memstats import mem_stats

_PROFILES = ("block", "goroutine", "heap", "threadcreate")
_profile_lock = asyncio.Lock()
_block_rate = 0


def index() -> str:
    lines = ["/debug/pprof/", "", "profiles:"]
    lines += [f"  {name}" for name in _PROFILES]
    lines += ["", "full goroutine stack dump: /debug/pprof/goroutine?debug=2"]
    lines += ["cpu profile: /debug/pprof/profile?seconds=N", ""]
    return "\n".join(lines)


def cmdline() -> str:
    # Go's pprof.Cmdline: the arguments separated by NUL bytes.
    return "\x00".join(sys.argv)


def symbol(method: str) -> str:
    # Go answers how many symbols it can resolve; Python has no program counters to look up.
    return "num_symbols: 0\n"


def heap(limit: int = 50) -> str:
    out = io.StringIO()
    out.write("heap profile (Python)\n\n")
    for key, value in mem_stats().items():
        out.write(f"# {key} = {value}\n")
    for i, gen in enumerate(gc.get_stats()):
        out.write(f"# gc generation {i}: {gen}\n")
    out.write(f"# gc thresholds {gc.get_threshold()} counts {gc.get_count()}\n\n")
    counts = Counter(type(o).__name__ for o in gc.get_objects())
    out.write(f"{'count':>12}  type (GC-tracked objects)\n")
    for name, n in counts.most_common(limit):
        out.write(f"{n:>12}  {name}\n")
    return out.getvalue()


def goroutine() -> str:
    out = io.StringIO()
    try:
        tasks = list(asyncio.all_tasks())
    except RuntimeError:
        tasks = []
    out.write(f"asyncio tasks: {len(tasks)}\n\n")
    for task in tasks:
        out.write(f"{task!r}\n")
        for frame in task.get_stack():
            out.write("".join(traceback.format_stack(frame, limit=1)))
        out.write("\n")
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    out.write(f"threads: {len(frames)}\n\n")
    for ident, frame in frames.items():
        out.write(f"thread {ident} ({names.get(ident, '?')}):\n")
        out.write("".join(traceback.format_stack(frame)))
        out.write("\n")
    return out.getvalue()


def threadcreate() -> str:
    threads = threading.enumerate()
    lines = [f"threadcreate profile: total {len(threads)}"]
    lines += [f"{t.ident} {t.name} daemon={t.daemon}" for t in threads]
    return "\n".join(lines) + "\n"


def block() -> str:
    return (
        f"block profile: rate {_block_rate}\n"
        "Python has no blocking profiler; use /debug/pprof/profile to see where the event "
        "loop spends its time.\n"
    )


async def profile(params: Params) -> str:
    text = params.get("seconds") or "30"
    try:
        seconds = max(0, int(text))
    except ValueError:
        seconds = 30
    if _profile_lock.locked():
        raise HTTPError(500, "profile already in progress")
    async with _profile_lock:
        prof = cProfile.Profile()
        try:
            prof.enable()
        except ValueError as err:  # another profiler is active in this thread
            raise HTTPError(500, str(err)) from err
        try:
            await asyncio.sleep(seconds)
        finally:
            prof.disable()
    out = io.StringIO()
    out.write(f"cpu profile of the event loop thread for {seconds}s\n")
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(60)
    return out.getvalue()


def setblockrate(params: Params) -> str:
    """``PUT /debug/setblockrate?rate=N`` (text errors as nsqd's)."""
    global _block_rate
    text = params.get("rate") or ""
    try:
        rate = int(text)
    except ValueError:
        raise HTTPError(
            400, f'invalid block rate : strconv.Atoi: parsing "{text}": invalid syntax'
        ) from None
    _block_rate = rate
    return ""


def freememory() -> str:
    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return ""
