"""A retained log's segment files: which there are, the open descriptor of the newest, and every
change to them (Kafka's ``LocalLog`` beside its ``UnifiedLog``).

Theory of operation. ``TopicLog`` (``storage/topiclog.py``) decides what a log holds: offsets,
the commit point, what was fsynced, the hand-off and the producers. This class only does what
it is told to the files, each change crash-safe on its own: ``open`` finds and checks them
(``storage/segment.py``: a torn tail of the newest is cut, a closed segment's index checked or
rebuilt, an overlapping segment set aside as ``.bad``) and says where records are missing
between segments; ``write`` puts records at the end of the newest with one ``pwrite`` and cuts
a failed or short one back off; ``roll`` closes the newest (its index written beside it) and
starts the next; ``cut`` removes every record from an offset on, newest segments first, so a
crash mid-way leaves a prefix of the old log; ``empty_at`` removes them all and starts again
at an offset; ``remove_oldest`` is retention's. Nothing here fsyncs but ``empty_at`` (the
caller fsyncs ``fd`` when its rules say so).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os

from . import durable
from .atomic import write_atomic
from .segment import Segment, segment_bases

__all__ = ["SegmentFiles"]

_NEW = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC


class SegmentFiles:
    """The segments of the log in ``directory`` (``name`` in its lines), oldest first."""

    def __init__(self, directory: str, name: str, logger: logging.Logger) -> None:
        self.directory = directory
        self.name = name
        self.log = logger
        self.segments: list[Segment] = []
        #: The newest segment's descriptor (-1: closed).
        self.fd = -1

    def open(self) -> list[tuple[int, int]]:
        """Find and check the segments; open the newest for writing (made when there is none).
        Returns the gaps of damaged records between closed segments (first, last offset)."""
        bases = segment_bases(self.directory)
        for n, base in enumerate(bases):
            seg = Segment(self.directory, base)
            last = n == len(bases) - 1
            if last or not seg.load_index():
                seg.scan(truncate=last, log=self.log, name=self.name)
            if not last and seg.next > bases[n + 1]:
                self.log.error(
                    "TOPICLOG(%s): segment %d overlaps segment %d; kept as .bad",
                    self.name,
                    base,
                    bases[n + 1],
                )
                os.replace(seg.path, seg.path + ".bad")
                continue
            self.segments.append(seg)
        if not self.segments:
            self.segments.append(Segment(self.directory, 0))
        self.fd = os.open(self.segments[-1].path, _NEW, 0o644)
        holes = []
        for i, s in enumerate(self.segments[:-1]):
            if s.next < self.segments[i + 1].base:
                holes.append((s.next, self.segments[i + 1].base - 1))
                self.log.warning(
                    "TOPICLOG(%s): offsets %d-%d are lost (damaged records); reads skip them",
                    self.name,
                    s.next,
                    self.segments[i + 1].base - 1,
                )
        return holes

    def write(self, seg: Segment, data: bytes) -> None:
        """Write ``data`` at the end of ``seg``'s records; a failed or short write is cut
        back off. Raises OSError."""
        try:
            written = os.pwrite(self.fd, data, seg.size)
            if written != len(data):
                raise OSError(
                    errno.ENOSPC,
                    f"{os.strerror(errno.ENOSPC)} (short write: {written} of {len(data)} bytes)",
                )
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, seg.size)
            raise

    @staticmethod
    def extend(
        seg: Segment, entries: list[tuple[int, int, int]], size: int, end: int, ts: int
    ) -> None:
        """Records written to ``seg``: it takes in their index entries, size, end and time."""
        for e in entries:
            seg.add_index(*e)
        seg.size = size
        seg.next = end
        seg.last_ts = max(seg.last_ts, ts)

    def roll(self) -> Segment:
        """Close the newest segment (the caller synced it), its index written beside it, and
        start the next. Raises OSError."""
        old = self.segments[-1]
        os.close(self.fd)
        self.fd = -1
        try:
            write_atomic(old.index_path, old.encode_index())
        except OSError as err:  # the index is rebuilt by a scan at the next start
            self.log.warning(
                "TOPICLOG(%s): failed to write %s - %s", self.name, old.index_path, err
            )
        seg = Segment(self.directory, old.next)
        self.segments.append(seg)
        self.fd = os.open(seg.path, _NEW, 0o644)
        self.log.info("TOPICLOG(%s): new segment %d", self.name, seg.base)
        return seg

    def cut(self, offset: int) -> None:
        """Remove every record at ``offset`` and after: newest segments first, each step
        leaving files that open as a prefix of the old log (not fsynced). Raises OSError."""
        while len(self.segments) > 1 and self.segments[-1].base >= offset:
            seg = self.segments.pop()
            os.close(self.fd)
            self.fd = -1
            os.unlink(seg.path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(seg.index_path)
            self.fd = os.open(self.segments[-1].path, os.O_WRONLY | os.O_CLOEXEC)
        seg = self.segments[-1]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.index_path)  # rebuilt from the records at the next close or open
        if offset <= seg.base:
            pos, keep = 0, seg.base
        else:
            pos, keep = seg.position(offset)
        os.ftruncate(self.fd, pos)
        seg.size = pos
        seg.next = keep if offset > seg.base else seg.base
        i = bisect.bisect_left(seg.idx_pos, pos)
        del seg.idx_off[i:], seg.idx_pos[i:], seg.idx_ts[i:]
        if seg.unchecked is not None:
            del seg.unchecked[i:]  # one flag per entry (``Segment.check``)
        seg.last_ts = seg.idx_ts[-1] if seg.idx_ts else 0
        if pos:
            for _, ts, _, _ in seg.walk(seg.idx_pos[-1] if seg.idx_pos else 0, pos):
                seg.last_ts = max(seg.last_ts, ts)

    def empty_at(self, offset: int) -> None:
        """Remove every segment and start again, empty, at ``offset`` (fsynced). A crash
        mid-way leaves an empty log. Raises OSError."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for seg in reversed(self.segments):
            for path in (seg.path, seg.index_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        seg = Segment(self.directory, offset)
        self.segments = [seg]
        self.fd = os.open(seg.path, _NEW, 0o644)
        durable.fsync(self.fd)

    def remove_oldest(self) -> Segment:
        """Retention: the oldest (closed) segment goes."""
        seg = self.segments.pop(0)
        for path in (seg.path, seg.index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.log.info(
            "TOPICLOG(%s): retention removed segment %d (offsets %d-%d)",
            self.name,
            seg.base,
            seg.base,
            seg.next - 1,
        )
        return seg

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self, keep: tuple[str, ...] = ()) -> None:
        """Remove the directory's files but those named in ``keep`` (closed first); the
        directory goes once it is empty."""
        self.close()
        for entry in os.listdir(self.directory):
            if entry in keep:
                continue
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, entry))
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)
