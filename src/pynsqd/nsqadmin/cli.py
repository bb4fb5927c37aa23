"""The ``nsqadmin`` command: Go nsqadmin's flags, then the web UI until SIGTERM/SIGINT."""

from __future__ import annotations

import ipaddress
import logging
import sys
from typing import Any

from ..internal import process
from ..internal.checks import first_unreadable
from ..internal.flags import UsageError, answer, load_config, parse_command_line
from ..internal.version import version_string
from ..log import configure_logging
from .options import AdminOptions

PROGRAM = "nsqadmin"


def parse_options(argv: list[str]) -> tuple[AdminOptions, list[str]]:
    """Flags > ``--config`` file (TOML, Go nsqadmin's keys) > defaults; and the warnings to
    log. Raises UsageError."""
    command_line = parse_command_line(argv, AdminOptions, PROGRAM)
    if command_line.version:
        print(version_string(PROGRAM))
        raise SystemExit(0)
    warnings = list(command_line.warnings)
    config: dict[str, Any] = {}
    if command_line.values.get("config"):
        config, more = load_config(command_line.values["config"], AdminOptions)
        warnings += more
    opts = AdminOptions()
    for name, value in {**config, **command_line.values}.items():
        setattr(opts, name, value)
    if bool(opts.lookupd_http_addresses) == bool(opts.nsqd_http_addresses):
        raise UsageError(
            "use --lookupd-http-address or --nsqd-http-address (one of them, not both)", 1
        )
    bad = first_unreadable(
        (
            ("--http-client-tls-root-ca-file", opts.http_client_tls_root_ca_file),
            ("--http-client-tls-cert", opts.http_client_tls_cert),
            ("--http-client-tls-key", opts.http_client_tls_key),
        )
    )
    if bad is not None:
        raise UsageError("{}={}: {}".format(*bad), 1)
    if opts.http_client_tls_key and not opts.http_client_tls_cert:
        raise UsageError("--http-client-tls-key needs --http-client-tls-cert", 1)
    if opts.allow_config_from_cidr:
        try:
            ipaddress.ip_network(opts.allow_config_from_cidr, strict=False)
        except ValueError as err:
            raise UsageError(f"--allow-config-from-cidr: {err}", 1) from None
    if opts.graphite_url and not opts.graphite_url.startswith(("http://", "https://")):
        raise UsageError(f"--graphite-url={opts.graphite_url}: not an http(s):// URL", 1)
    if opts.proxy_graphite and not opts.graphite_url:
        raise UsageError("--proxy-graphite needs --graphite-url", 1)
    return opts, warnings


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        opts, warnings = parse_options(args)
    except UsageError as e:
        return answer(PROGRAM, e)
    configure_logging(opts.log_level, opts.log_prefix)
    log = logging.getLogger("pynsqd.nsqadmin")
    for warning in warnings:
        log.warning("%s", warning)
    log.info("%s", version_string(PROGRAM))
    from .server import AdminService

    return process.run(lambda loop: AdminService(opts), PROGRAM, log)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
