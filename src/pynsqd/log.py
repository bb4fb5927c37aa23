"""Logging in nsqd's style, on the standard ``logging`` module.

nsqd writes every line as ``<prefix><date> <time.µs> <LEVEL>: <message>`` to stderr, e.g.
``[nsqd] 2026/11/23 10:00:00.123456 INFO: TCP: listening on 127.0.0.1:4150``. Code logs to the
``pynsqd`` logger (or a child of it); ``configure_logging`` installs the one handler that writes
this format, with the level from ``--log-level``.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime

LOGGER_NAME = "pynsqd"

#: ``--log-level`` values, as nsqd's ``lg.ParseLogLevel`` takes them (case-insensitive).
LOG_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

_LEVEL_NAMES: dict[int, str] = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARN",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "FATAL",
}


def parse_log_level(name: str) -> int:
    """``warn`` → ``logging.WARNING``; raises ``ValueError`` with nsqd's message otherwise."""
    level = LOG_LEVELS.get(name.lower())
    if level is None:
        raise ValueError(f"invalid log level '{name}' (debug, info, warn, error, fatal)")
    return level


def level_name(levelno: int) -> str:
    """nsqd's name for a ``logging`` level: WARNING → ``WARN``, CRITICAL → ``FATAL``."""
    name = _LEVEL_NAMES.get(levelno)
    if name is not None:
        return name
    return logging.getLevelName(levelno)


class NsqdFormatter(logging.Formatter):
    """``[nsqd] 2026/11/23 10:00:00.123456 INFO: message`` (local time, as Go's ``log``)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).strftime("%Y/%m/%d %H:%M:%S.%f")
        line = f"{self.prefix}{stamp} {level_name(record.levelno)}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (test harnesses replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream = sys.stderr
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def configure_logging(level: str, prefix: str) -> None:
    """Send the ``pynsqd`` logger to stderr in nsqd's format at ``level`` (debug..fatal).

    Calling it again replaces the earlier configuration. Raises ``ValueError`` for a level
    nsqd would not take.
    """
    levelno = parse_log_level(level)
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        if isinstance(handler, _StderrHandler):
            logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(NsqdFormatter(prefix))
    logger.addHandler(handler)
    logger.setLevel(levelno)
    # nsqd's lines only: a root handler configured by an embedding program would repeat them.
    logger.propagate = False
