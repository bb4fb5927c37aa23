"""What the tools share: Go-style flags from an options table, and their exit on bad input."""

from __future__ import annotations

import sys
from typing import Any

from ..internal.flags import HelpRequested, UsageError, parse_command_line
from ..internal.version import version_string


def parse(program: str, options: type[Any], argv: list[str] | None) -> Any:
    """The tool's options from Go-style flags (no config file). ``--version``, ``-h`` and a bad
    flag are answered here: ``SystemExit`` with the exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command_line = parse_command_line(args, options, program)
        if command_line.version:
            print(version_string(program))
            raise SystemExit(0)
        opts = options()
        for name, value in command_line.values.items():
            setattr(opts, name, value)
    except HelpRequested as e:
        sys.stdout.write(e.message)
        raise SystemExit(0) from None
    except UsageError as e:
        print(f"{program}: {e.message}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None
    return opts
