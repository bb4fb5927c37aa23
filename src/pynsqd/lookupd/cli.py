"""The ``nsqlookupd`` command line: the same Go flag syntax, TOML config file, logging and
``--version`` form as ``nsqd``, from nsqlookupd's own options table."""

from __future__ import annotations

import logging
import sys
from typing import Any

from ..internal.flags import UsageError, answer, parse_command_line, resolve
from ..internal.listener import is_unix_address
from ..internal.version import version_string
from ..log import configure_logging
from .options import LookupdOptions

PROGRAM = "nsqlookupd"
log = logging.getLogger("pynsqd.cli")


def _validate(opts: Any, warnings: list[str]) -> None:
    # nsqlookupd has no unix sockets, and its HTTP API cannot be turned off.
    for flag, value in (("--tcp-address", opts.tcp_address), ("--http-address", opts.http_address)):
        if not value or is_unix_address(value):
            raise UsageError(f"{flag} must be <addr>:<port> (got {value!r})", 1)


def parse_options(argv: list[str]) -> LookupdOptions:
    """The command line (and the config file it names) → validated ``LookupdOptions``."""
    opts, warnings = resolve(
        parse_command_line(argv, LookupdOptions, PROGRAM), LookupdOptions, _validate
    )
    for warning in warnings:
        log.warning("%s", warning)
    assert isinstance(opts, LookupdOptions)
    return opts


def main(argv: list[str] | None = None) -> int:
    """The ``nsqlookupd`` console script: parse, set up logging, run until SIGTERM/SIGINT."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command_line = parse_command_line(args, LookupdOptions, PROGRAM)
        if command_line.version:
            print(version_string(PROGRAM))
            return 0
        opts, warnings = resolve(command_line, LookupdOptions, _validate)
    except UsageError as e:
        return answer(PROGRAM, e)
    configure_logging(opts.log_level, opts.log_prefix)
    for warning in warnings:
        log.warning("%s", warning)
    logging.getLogger("pynsqd.lookupd").info("%s", version_string(PROGRAM))
    from .nsqlookupd import run

    return run(opts)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
