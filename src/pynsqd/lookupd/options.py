"""nsqlookupd's options table (``apps/nsqlookupd/main.go``), declared as nsqd's
is (``internal.optiontable``).

The flag parser, the TOML config loader and ``-h`` in ``internal.flags`` are built from whichever
table they are given, so nsqlookupd's flags behave exactly as nsqd's.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ..internal.optiontable import config_file, listen, log_level, opt, verbose


@dataclass
class LookupdOptions:
    config: str = config_file()
    log_level: str = log_level()
    log_prefix: str = opt("[nsqlookupd] ", "log message prefix")
    verbose: bool = verbose()
    tcp_address: str = listen("0.0.0.0:4160", "TCP", may_disable=False)
    http_address: str = listen("0.0.0.0:4161", "HTTP", may_disable=True)
    broadcast_address: str = opt("", "address of this lookupd node, (default to the OS hostname)")
    inactive_producer_timeout: float = opt(
        300.0,
        "duration of time a producer will remain in the active list since its last ping",
        kind="duration",
    )
    tombstone_lifetime: float = opt(
        45.0,
        "duration of time a producer will remain tombstoned if registration remains",
        kind="duration",
    )

    def __post_init__(self) -> None:
        if not self.broadcast_address:
            self.broadcast_address = socket.gethostname()
