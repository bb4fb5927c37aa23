"""The ``nsqd`` command line: nsqd's options table through the shared flag engine
(``internal.flags``), then nsqd's own cross-option checks, logging, and the server.

Every error is one line naming the flag or input, never a traceback: exit 2 for the command line
(as Go's ``flag`` package), 1 for the config file and validation (as nsqd's fatal errors).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from pynsqd.internal import checks, flags
from pynsqd.internal.flags import CommandLine, HelpRequested, UsageError, answer
from pynsqd.internal.version import version_string
from pynsqd.log import LOG_LEVELS, configure_logging
from pynsqd.options import Options

PROGRAM = "nsqd"
log = logging.getLogger("pynsqd.cli")

#: ``--enable-experiment`` values nsqd knows (master).
EXPERIMENTS = ("topology-aware-consumption",)


def _validate(opts: Options, warnings: list[str]) -> None:
    """nsqd's checks in ``nsqd.New``, with its messages; then the TLS implications."""
    if not 1 <= opts.max_deflate_level <= 9:
        raise UsageError(f"--max-deflate-level must be [1,9] (got {opts.max_deflate_level})", 1)
    if not 0 <= opts.node_id < 1024:
        raise UsageError(f"--node-id must be [0,1024) (got {opts.node_id})", 1)
    if bool(opts.tls_cert) != bool(opts.tls_key):
        given = "--tls-cert" if opts.tls_cert else "--tls-key"
        raise UsageError(f"--tls-cert and --tls-key must be given together (only {given})", 1)
    if opts.tls_client_auth_policy and opts.tls_required == "false":
        opts.tls_required = "true"  # nsqd: a client auth policy implies TLS is required
    if opts.tls_required != "false" and not opts.tls_cert:
        raise UsageError(
            "cannot require TLS client connections without TLS key and cert"
            f" (--tls-required={opts.tls_required})",
            1,
        )
    for name in opts.enable_experiment:
        if name not in EXPERIMENTS:
            warnings.append(f"--enable-experiment={name} is not an experiment nsqd knows")


def parse_command_line(argv: Sequence[str]) -> CommandLine:
    """nsqd's flags (Go ``flag`` syntax). Raises ``UsageError``, ``HelpRequested`` for -h."""
    return flags.parse_command_line(argv, Options, PROGRAM)


def resolve(command_line: CommandLine) -> tuple[Options, list[str]]:
    """Flags > config file > defaults, then nsqd's checks; the warnings to log later."""
    opts, warnings = flags.resolve(command_line, Options, _validate)
    assert isinstance(opts, Options)
    return opts, warnings


def usage() -> str:
    """nsqd's ``-h`` text."""
    return flags.usage(Options, PROGRAM)


def parse_options(argv: list[str]) -> Options:
    """The command line (and the config file it names) → validated ``Options``.

    Raises ``UsageError`` with one line naming the flag and value (``HelpRequested`` for -h).
    Warnings (deprecated flags, unknown config keys) go to the ``pynsqd.cli`` logger.
    """
    opts, warnings = resolve(parse_command_line(argv))
    for warning in warnings:
        log.warning("%s", warning)
    return opts


def main(argv: list[str] | None = None) -> int:
    """The ``nsqd`` console script: parse, set up logging, run until SIGTERM/SIGINT."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command_line = parse_command_line(args)
        if command_line.version:
            print(version_string())
            return 0
        opts, warnings = resolve(command_line)
    except UsageError as e:
        return answer(PROGRAM, e)
    # Imported here so that parsing never pays for (or depends on) the server.
    from pynsqd.server.workers.spec import WorkerSpec, worker_options

    worker = WorkerSpec.from_env()
    if worker is not None:  # one worker of --workers N, started by its supervisor
        worker_options(opts, worker)
    configure_logging(opts.log_level, opts.log_prefix)
    if worker is None:
        for warning in warnings:
            log.warning("%s", warning)
    count = checks.workers_count(opts.workers)
    if worker is None and count > 1:
        from pynsqd.server.workers.supervisor import run_supervisor

        return run_supervisor(opts, args, count)
    from pynsqd.server.nsqd import run

    return run(opts, worker)


__all__ = [
    "EXPERIMENTS",
    "LOG_LEVELS",
    "CommandLine",
    "HelpRequested",
    "UsageError",
    "main",
    "parse_command_line",
    "parse_options",
    "resolve",
    "usage",
    "version_string",
]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
