"""nsqadmin's options table (Go nsqadmin's flags that pynsqd's nsqadmin serves)."""

from __future__ import annotations

from dataclasses import dataclass

from ..internal.optiontable import config_file, listen, log_level, many, opt, verbose


@dataclass
class AdminOptions:
    http_address: str = listen("0.0.0.0:4171", "HTTP", may_disable=False)
    base_path: str = opt("/", "URL base path")
    lookupd_http_addresses: list[str] = many(
        "lookupd HTTP address", flag="lookupd-http-address", cfg="nsqlookupd_http_addresses"
    )
    nsqd_http_addresses: list[str] = many("nsqd HTTP address", flag="nsqd-http-address")
    acl_http_header: str = opt(
        "X-Forwarded-User", "HTTP header to check for authenticated admin users"
    )
    admin_users: list[str] = many("admin user", flag="admin-user", cfg="admin_users")
    notification_http_endpoint: str = opt(
        "",
        "HTTP endpoint (fully qualified) to which POST notifications of admin actions will be sent",
    )
    http_client_connect_timeout: float = opt(2.0, "timeout for HTTP connect", kind="duration")
    http_client_request_timeout: float = opt(5.0, "timeout for HTTP request", kind="duration")
    http_client_tls_insecure_skip_verify: bool = opt(
        False, "configure the HTTP client to skip verification of TLS certificates"
    )
    http_client_tls_root_ca_file: str = opt("", "path to CA file for the HTTP client")
    http_client_tls_cert: str = opt("", "path to certificate file for the HTTP client")
    http_client_tls_key: str = opt("", "path to key file for the HTTP client")
    allow_config_from_cidr: str = opt(
        "127.0.0.1/8", "A CIDR from which to allow HTTP requests to the /config endpoint"
    )
    config: str = config_file()
    dev_static_dir: str = opt("", "(development use only)")
    graphite_url: str = opt("", "graphite HTTP address")
    proxy_graphite: bool = opt(False, "proxy HTTP requests to graphite")
    statsd_counter_format: str = opt(
        "stats.counters.%s.count",
        "The counter stats key formatting applied by the implementation of statsd. If no "
        "formatting is desired, set this to an empty string.",
    )
    statsd_gauge_format: str = opt(
        "stats.gauges.%s",
        "The gauge stats key formatting applied by the implementation of statsd. If no "
        "formatting is desired, set this to an empty string.",
    )
    statsd_interval: float = opt(
        60.0,
        "time interval nsqd is configured to push to statsd (must match nsqd)",
        kind="duration",
    )
    statsd_prefix: str = opt(
        "nsq.%s",
        "prefix used for keys sent to statsd (%s for host replacement, must match nsqd)",
    )
    verbose: bool = verbose()
    log_level: str = log_level()
    log_prefix: str = opt("[nsqadmin] ", "log message prefix")
