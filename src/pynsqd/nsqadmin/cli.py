"""The ``nsqadmin`` command: Go nsqadmin's flags, then the web UI until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import sys

from ..internal import process
from ..internal.flags import HelpRequested, UsageError, parse_command_line
from ..internal.version import version_string
from ..log import configure_logging
from .options import AdminOptions

PROGRAM = "nsqadmin"


def parse_options(argv: list[str]) -> AdminOptions:
    command_line = parse_command_line(argv, AdminOptions, PROGRAM)
    opts = AdminOptions()
    for name, value in command_line.values.items():
        setattr(opts, name, value)
    if command_line.version:
        print(version_string(PROGRAM))
        raise SystemExit(0)
    if bool(opts.lookupd_http_addresses) == bool(opts.nsqd_http_addresses):
        raise UsageError(
            "use --lookupd-http-address or --nsqd-http-address (one of them, not both)", 1
        )
    return opts


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_options(args)
    except HelpRequested as e:
        sys.stdout.write(e.message)
        return 0
    except UsageError as e:
        print(f"{PROGRAM}: {e.message}", file=sys.stderr)
        return e.exit_code
    configure_logging(opts.log_level, opts.log_prefix)
    log = logging.getLogger("pynsqd.nsqadmin")
    log.info("%s", version_string(PROGRAM))
    from .server import AdminService

    return process.run(lambda loop: AdminService(opts), PROGRAM, log)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
