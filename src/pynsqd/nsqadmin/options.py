"""nsqadmin's options table (Go nsqadmin's flags that pynsqd's nsqadmin serves)."""

from __future__ import annotations

from dataclasses import dataclass

from ..internal import checks
from ..internal.optiontable import opt


@dataclass
class AdminOptions:
    http_address: str = opt(
        "0.0.0.0:4171",
        "<addr>:<port> to listen on for HTTP clients",
        check=checks.listen_address(may_disable=False),
    )
    base_path: str = opt("/", "URL base path")
    lookupd_http_addresses: list[str] = opt(
        [],
        "lookupd HTTP address (may be given multiple times)",
        kind="list",
        flag="lookupd-http-address",
    )
    nsqd_http_addresses: list[str] = opt(
        [], "nsqd HTTP address (may be given multiple times)", kind="list", flag="nsqd-http-address"
    )
    acl_http_header: str = opt(
        "X-Forwarded-User", "HTTP header to check for authenticated admin users"
    )
    admin_users: list[str] = opt(
        [], "admin user (may be given multiple times)", kind="list", flag="admin-user"
    )
    notification_http_endpoint: str = opt(
        "",
        "HTTP endpoint (fully qualified) to which POST notifications of admin actions will be sent",
    )
    http_client_request_timeout: float = opt(5.0, "timeout for HTTP request", kind="duration")
    log_level: str = opt(
        "info",
        "set log verbosity: debug, info, warn, error, or fatal",
        check=checks.check_log_level,
    )
    log_prefix: str = opt("[nsqadmin] ", "log message prefix")
