"""The process's allocator setting (``internal/process.keep_freed_memory``): memory a burst of
messages freed is taken again without the kernel handing out fresh pages."""

from __future__ import annotations

import subprocess
import sys

import pytest

_BURSTS = """
import resource, sys
sys.path.insert(0, "src")
from pynsqd.internal import process
if sys.argv[1] == "keep":
    assert process.keep_freed_memory()
def burst():
    # 100 blocks of 200 KB held at once (a queue's worth of MPUBs), touched, then all freed.
    blocks = [bytearray(200_000) for _ in range(100)]
    for b in blocks:
        b[::4096] = b"x" * len(b[::4096])
    del blocks
burst()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    burst()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _BURSTS, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_memory_freed_by_a_burst_is_reused_without_fresh_pages() -> None:
    # glibc's defaults give much of the 20 MB back to the kernel after each burst and fault
    # it in again (6,124 pages over the five here); kept, the next bursts reuse it (0 here).
    default, kept = _faults("default"), _faults("keep")
    assert default > 1_000
    assert kept * 10 < default
