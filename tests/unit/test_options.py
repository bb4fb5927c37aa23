"""The options table, Go duration text, and the example config file."""

from __future__ import annotations

import re
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

import pytest

from pynsqd.cli import parse_options
from pynsqd.internal.gotext import format_duration, parse_duration, parse_duration_ns
from pynsqd.internal.optiontable import config_key, flag_name, option_kind
from pynsqd.internal.optiontable import option_fields as _option_fields
from pynsqd.options import Options


def option_fields() -> tuple[Field[Any], ...]:
    return _option_fields(Options)


EXAMPLE = Path(__file__).resolve().parents[2] / "contrib" / "nsqd.cfg.example"

#: Every nsqd flag (nsqd 1.3.0's flags) other than --version.
NSQD_FLAGS = {
    "config", "log-level", "log-prefix", "verbose", "node-id", "worker-id", "tcp-address",
    "http-address", "https-address", "broadcast-address", "broadcast-tcp-port",
    "broadcast-http-port", "lookupd-tcp-address", "auth-http-address",
    "auth-http-request-method", "http-client-connect-timeout", "http-client-request-timeout",
    "topology-region", "topology-zone", "enable-experiment", "data-path", "mem-queue-size",
    "max-bytes-per-file", "sync-every", "sync-timeout", "queue-scan-worker-pool-max",
    "queue-scan-selection-count", "msg-timeout", "max-msg-timeout", "max-msg-size",
    "max-req-timeout", "max-body-size", "max-heartbeat-interval", "max-rdy-count",
    "max-output-buffer-size", "max-output-buffer-timeout", "min-output-buffer-timeout",
    "output-buffer-timeout", "max-channel-consumers", "statsd-address", "statsd-interval",
    "statsd-mem-stats", "statsd-prefix", "statsd-udp-packet-size", "statsd-exclude-ephemeral",
    "e2e-processing-latency-percentile", "e2e-processing-latency-window-time", "tls-cert",
    "tls-key", "tls-client-auth-policy", "tls-root-ca-file", "tls-required", "tls-min-version",
    "deflate", "max-deflate-level", "snappy",
}  # fmt: skip


#: pynsqd's own flags (features nsqd does not have; off by default).
PYNSQD_FLAGS = {
    "retention-time",
    "retention-bytes",
    "dedup-records",
    "dedup-window",
    "max-attempts",
    "msg-ttl",
    "max-channel-depth",
    "max-channel-bytes",
    "channel-bound-policy",
    "busy-poll",
    "workers",
    "host-label",
    # replicated topics (docs/replication.md)
    "etcd-endpoints",
    "cluster-name",
    "etcd-lease-ttl",
    "replicas",
    "replication-min-insync",
    "replication-acks",
    "replication-durability",
    "replication-timeout",
    "replica-lag-max",
    "replica-stall-max",
    "replica-replace-after",
    # message headers, for clients that ask for them in IDENTIFY (docs/headers.md)
    "max-headers",
    "max-header-bytes",
    # tracing of messages with a traceparent header (docs/headers.md)
    "otel-traces-file",
    "otel-exporter-otlp-endpoint",
    "otel-service-name",
}


def test_table_has_every_nsqd_flag_and_only_documented_extensions() -> None:
    assert {flag_name(f) for f in option_fields()} == NSQD_FLAGS | PYNSQD_FLAGS


def test_flag_names_and_config_keys_are_unique() -> None:
    flags = [flag_name(f) for f in option_fields()]
    keys = [config_key(f) for f in option_fields()]
    assert len(set(flags)) == len(flags)
    assert len(set(keys)) == len(keys)


def test_config_aliases_are_nsqds() -> None:
    keys = {f.name: config_key(f) for f in option_fields()}
    assert keys["node_id"] == "id"
    assert keys["lookupd_tcp_addresses"] == "nsqlookupd_tcp_addresses"
    assert keys["auth_http_addresses"] == "auth_http_addresses"
    assert keys["e2e_processing_latency_percentiles"] == "e2e_processing_latency_percentiles"
    assert keys["enable_experiment"] == "enable_experiment"


def test_every_option_has_help_and_a_kind() -> None:
    for f in option_fields():
        assert f.metadata["help"], f.name
        assert option_kind(f) in (
            "str", "int", "bool", "duration", "list", "floatlist", "deprecated_bool",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "default"),
    [
        ("log_level", "info"),
        ("log_prefix", "[nsqd] "),
        ("tcp_address", "0.0.0.0:4150"),
        ("http_address", "0.0.0.0:4151"),
        ("https_address", "0.0.0.0:4152"),
        ("mem_queue_size", 10000),
        ("max_bytes_per_file", 104857600),
        ("sync_every", 2500),
        ("sync_timeout", 2.0),
        ("msg_timeout", 60.0),
        ("max_msg_timeout", 900.0),
        ("max_msg_size", 1048576),
        ("max_req_timeout", 3600.0),
        ("max_body_size", 5242880),
        ("max_heartbeat_interval", 60.0),
        ("max_rdy_count", 2500),
        ("max_output_buffer_size", 65536),
        ("max_output_buffer_timeout", 30.0),
        ("min_output_buffer_timeout", 0.025),
        ("output_buffer_timeout", 0.25),
        ("max_channel_consumers", 0),
        ("statsd_interval", 60.0),
        ("statsd_mem_stats", True),
        ("statsd_prefix", "nsq.%s"),
        ("statsd_udp_packet_size", 508),
        ("e2e_processing_latency_window_time", 600.0),
        ("tls_required", "false"),
        ("tls_min_version", "tls1.0"),
        ("deflate", True),
        ("max_deflate_level", 6),
        ("snappy", True),
        ("auth_http_request_method", "get"),
        ("http_client_connect_timeout", 2.0),
        ("http_client_request_timeout", 5.0),
        ("queue_scan_worker_pool_max", 4),
        ("queue_scan_selection_count", 20),
    ],
)
def test_defaults_are_nsqds(name: str, default: object) -> None:
    assert getattr(Options(), name) == default


def test_node_id_default_is_a_hash_in_range() -> None:
    assert 0 <= Options().node_id < 1024


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("60s", 60_000_000_000),
        ("1h0m0s", 3_600_000_000_000),
        ("250ms", 250_000_000),
        ("2m30s", 150_000_000_000),
        ("1.5h", 5_400_000_000_000),
        ("300us", 300_000),
        ("300\u00b5s", 300_000),
        ("300\u03bcs", 300_000),
        ("7ns", 7),
        ("0", 0),
        ("+5s", 5_000_000_000),
        ("-1m", -60_000_000_000),
        (".5s", 500_000_000),
        ("1.s", 1_000_000_000),
        ("1h1m1s1ms", 3_661_001_000_000),
    ],
)
def test_parse_duration_as_go(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("60", 'time: missing unit in duration "60"'),
        ("", 'time: invalid duration ""'),
        ("s", 'time: invalid duration "s"'),
        (".", 'time: invalid duration "."'),
        ("5x", 'time: unknown unit "x" in duration "5x"'),
        ("1s2", 'time: missing unit in duration "1s2"'),
        ("99999999999h", 'time: invalid duration "99999999999h"'),
    ],
)
def test_parse_duration_errors_as_go(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (60.0, "1m0s"),
        (900.0, "15m0s"),
        (3600.0, "1h0m0s"),
        (0.25, "250ms"),
        (0.025, "25ms"),
        (2.0, "2s"),
        (1.5, "1.5s"),
        (0.0, "0s"),
        (0.0003, "300\u00b5s"),
        (5e-9, "5ns"),
        (5400.0, "1h30m0s"),
        (-1.0, "-1s"),
    ],
)
def test_format_duration_as_go(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_example_config_loads_to_the_defaults() -> None:
    opts = parse_options(["--config", str(EXAMPLE)])
    expected = Options(config=str(EXAMPLE))
    assert opts == expected


def test_example_config_documents_every_key() -> None:
    text = EXAMPLE.read_text()
    for f in option_fields():
        if f.name == "config":
            continue
        key = config_key(f)
        assert re.search(rf"^#? ?{key} = ", text, re.MULTILINE), key
        assert f.metadata["help"].split()[0] in text, key


def test_options_field_types_are_kept() -> None:
    types = {f.name: f.type for f in fields(Options)}
    assert types["msg_timeout"] == "float"
    assert types["mem_queue_size"] == "int"
    assert types["lookupd_tcp_addresses"] == "list[str]"
    assert types["e2e_processing_latency_percentiles"] == "list[float]"


def test_protocol_config_is_derived_from_the_options_table() -> None:
    from pynsqd.options import Options
    from pynsqd.server.nsqd import protocol_config

    opts = Options(msg_timeout=2.5, max_rdy_count=7, output_buffer_timeout=0.1)
    opts.tls_required = "tcp-https"
    cfg = protocol_config(opts)
    assert (cfg.msg_timeout_ms, cfg.max_rdy_count, cfg.output_buffer_timeout_ms) == (2500, 7, 100)
    assert cfg.tls_required and cfg.max_req_timeout_ms == 3_600_000
    assert cfg.heartbeat_interval_ms == 30_000  # nsqd's constant, not an option


def test_each_table_declares_its_own_checks() -> None:
    from dataclasses import fields

    from pynsqd.internal.flags import check_value
    from pynsqd.lookupd.options import LookupdOptions

    lookupd = {f.name: f for f in fields(LookupdOptions)}
    assert lookupd["tcp_address"].metadata["check"] is not None  # declared there, not by name
    with pytest.raises(ValueError, match="must not be empty"):
        check_value(lookupd["tcp_address"], "")
    nsqd = {f.name: f for f in fields(Options)}
    with pytest.raises(ValueError, match="must be > 0"):
        check_value(nsqd["sync_timeout"], 0.0)
    assert check_value(nsqd["node_id"], -5) == -5  # nsqd's own check comes after resolution
