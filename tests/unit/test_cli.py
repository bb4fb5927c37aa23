"""The nsqd command line: Go flag syntax, the config file, precedence and validation messages."""

from __future__ import annotations

import logging
import re
from dataclasses import Field
from pathlib import Path
from typing import Any

import pytest

from pynsqd.cli import (
    HelpRequested,
    UsageError,
    main,
    parse_command_line,
    parse_options,
    usage,
    version_string,
)
from pynsqd.internal.optiontable import config_key, flag_name, option_kind
from pynsqd.internal.optiontable import option_fields as _option_fields
from pynsqd.log import configure_logging
from pynsqd.options import Options


def option_fields() -> tuple[Field[Any], ...]:
    return _option_fields(Options)


def parse_error(argv: list[str]) -> UsageError:
    with pytest.raises(UsageError) as info:
        parse_options(argv)
    assert "\n" not in info.value.message
    return info.value


@pytest.fixture
def write_config(tmp_path: Path) -> Any:
    def write(text: str) -> str:
        path = tmp_path / "nsqd.cfg"
        path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def tls_files(tmp_path: Path) -> list[str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("cert")
    key.write_text("key")
    return [f"--tls-cert={cert}", f"--tls-key={key}"]


# -- Go flag syntax ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["-mem-queue-size", "7"],
        ["-mem-queue-size=7"],
        ["--mem-queue-size", "7"],
        ["--mem-queue-size=7"],
    ],
)
def test_the_four_syntaxes(argv: list[str]) -> None:
    assert parse_options(argv).mem_queue_size == 7


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-snappy"], True),
        (["--snappy"], True),
        (["-snappy=false"], False),
        (["--snappy=false"], False),
        (["-snappy=0"], False),
        (["-snappy=F"], False),
        (["-snappy=FALSE"], False),
        (["-snappy=t"], True),
        (["-snappy=1"], True),
        (["-snappy=false", "-snappy"], True),
    ],
)
def test_boolean_flags(argv: list[str], expected: bool) -> None:
    assert parse_options(argv).snappy is expected


def test_a_boolean_flag_never_takes_the_next_argument() -> None:
    opts = parse_options(["-deflate", "-snappy=false"])
    assert opts.deflate is True
    assert opts.snappy is False
    err = parse_error(["-snappy", "false"])
    assert err.message == 'unexpected argument "false" (a boolean flag takes -snappy=false)'
    assert err.exit_code == 2


def test_bad_boolean_value() -> None:
    err = parse_error(["-snappy=yes"])
    assert (
        err.message == 'invalid boolean value "yes" for flag -snappy: not a boolean (true or false)'
    )


def test_a_value_flag_takes_the_next_argument_even_with_a_dash() -> None:
    err = parse_error(["--node-id", "-1"])
    assert err.message == "--node-id must be [0,1024) (got -1)"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16", 16),
        ("0x10", 16),
        ("0o20", 16),
        ("020", 16),
        ("0b10000", 16),
        ("1_6", 16),
        ("+16", 16),
    ],
)
def test_integers_as_go_parses_them(text: str, value: int) -> None:
    assert parse_options([f"--mem-queue-size={text}"]).mem_queue_size == value


@pytest.mark.parametrize("text", ["abc", "1.5", "", " 5", "16k", "99999999999999999999"])
def test_bad_integers(text: str) -> None:
    err = parse_error([f"--mem-queue-size={text}"])
    assert err.message.startswith(f'invalid value "{text}" for flag -mem-queue-size: ')


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("60s", 60.0),
        ("1h0m0s", 3600.0),
        ("250ms", 0.25),
        ("2m30s", 150.0),
        ("1.5h", 5400.0),
        ("300us", 0.0003),
        ("300\u00b5s", 0.0003),
        ("1000000ns", 0.001),
        ("0", 0.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_options(["--msg-timeout", text]).msg_timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("60", 'time: missing unit in duration "60"'),
        ("abc", 'time: invalid duration "abc"'),
        ("5d", 'time: unknown unit "d" in duration "5d"'),
        ("-1s", "must not be negative"),
    ],
)
def test_bad_durations_name_the_flag(text: str, reason: str) -> None:
    err = parse_error([f"--msg-timeout={text}"])
    assert err.message == f'invalid value "{text}" for flag -msg-timeout: {reason}'
    assert err.exit_code == 2


def test_repeatable_flags() -> None:
    opts = parse_options(
        [
            "--lookupd-tcp-address=127.0.0.1:4160",
            "-lookupd-tcp-address",
            "10.0.0.2:4160",
            "--auth-http-address=127.0.0.1:4181",
            "--auth-http-address=https://auth.example.com/auth",
            "--enable-experiment=topology-aware-consumption",
        ]
    )
    assert opts.lookupd_tcp_addresses == ["127.0.0.1:4160", "10.0.0.2:4160"]
    assert opts.auth_http_addresses == ["127.0.0.1:4181", "https://auth.example.com/auth"]
    assert opts.enable_experiment == ["topology-aware-consumption"]


def test_percentiles_repeated_or_comma_separated_sorted_as_nsqd() -> None:
    opts = parse_options(
        [
            "--e2e-processing-latency-percentile=0.95,1.0",
            "--e2e-processing-latency-percentile",
            "0.99",
        ]
    )
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.99, 0.95]


@pytest.mark.parametrize("text", ["0", "1.5", "-0.1", "0.5,2"])
def test_percentiles_out_of_range(text: str) -> None:
    err = parse_error([f"--e2e-processing-latency-percentile={text}"])
    assert "for flag -e2e-processing-latency-percentile: invalid E2E processing latency" in (
        err.message
    )


def test_percentile_not_a_number() -> None:
    err = parse_error(["--e2e-processing-latency-percentile=0.5,x"])
    assert err.message == (
        'invalid value "0.5,x" for flag -e2e-processing-latency-percentile: not a number'
    )


def test_the_last_of_a_repeated_scalar_flag_wins() -> None:
    assert parse_options(["--max-rdy-count=5", "--max-rdy-count=9"]).max_rdy_count == 9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "flag provided but not defined: -bogus"),
        (["-bogus=1"], "flag provided but not defined: -bogus"),
        (["---snappy"], "bad flag syntax: ---snappy"),
        (["-=5"], "bad flag syntax: -=5"),
        (["--=5"], "bad flag syntax: --=5"),
        (["--mem-queue-size"], "flag needs an argument: -mem-queue-size"),
        (["nsqd.cfg"], 'unexpected argument "nsqd.cfg" (see -h)'),
        (["-"], 'unexpected argument "-" (see -h)'),
        (["--", "-snappy"], 'unexpected argument "-snappy" after --'),
    ],
)
def test_command_line_errors(argv: list[str], message: str) -> None:
    err = parse_error(argv)
    assert err.message == message
    assert err.exit_code == 2


def test_double_dash_ends_the_flags() -> None:
    assert parse_options(["--max-rdy-count=3", "--"]).max_rdy_count == 3


@pytest.mark.parametrize("arg", ["-h", "--h", "-help", "--help", "-help=1"])
def test_help(arg: str) -> None:
    with pytest.raises(HelpRequested) as info:
        parse_command_line(["--max-rdy-count=3", arg, "--bogus"])
    assert info.value.exit_code == 0
    assert info.value.message == usage()


def test_usage_is_go_style_and_lists_every_flag() -> None:
    text = usage()
    assert text.startswith("Usage of nsqd:\n")
    for f in option_fields():
        assert f"\n  -{flag_name(f)}" in text
    assert "\n  -version\n    \tprint version string\n" in text
    assert "\n  -mem-queue-size int\n    \tnumber of messages to keep in memory" in text
    assert "(per topic/channel) (default 10000)\n" in text
    assert "\n  -msg-timeout duration\n" in text
    assert "auto-requeing a message (default 1m0s)\n" in text
    assert "\n  -snappy\n    \tenable snappy" in text
    assert "(client compression) (default true)\n" in text
    assert '(default "0.0.0.0:4150")' in text
    assert "\n  -lookupd-tcp-address value\n" in text
    assert "\n  -max-message-size int\n    \t[deprecated] use --max-msg-size\n" in text
    names = re.findall(r"^  -([a-z0-9-]+)", text, re.MULTILINE)
    assert names == sorted(names)


def test_main_prints_help_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-h"]) == 0
    out, err = capsys.readouterr()
    assert out == usage()
    assert err == ""


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    out, err = capsys.readouterr()
    assert out == version_string() + "\n"
    assert err == ""
    assert re.fullmatch(r"nsqd v1\.3\.0 \(built w/[a-z0-9.-]+\)", version_string())
    assert version_string().startswith("nsqd v1.3.0 (built w/pynsqd-")


def test_version_is_checked_before_the_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-version", "--config=/nonexistent/nsqd.cfg"]) == 0
    assert capsys.readouterr().out.startswith("nsqd v1.3.0 ")


def test_main_reports_one_line_and_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--node-id=1024"]) == 1
    assert main(["--nope"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "nsqd: --node-id must be [0,1024) (got 1024)",
        "nsqd: flag provided but not defined: -nope",
    ]


# -- deprecated flags --------------------------------------------------------------------------


def test_verbose_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pynsqd.cli"):
        opts = parse_options(["--verbose"])
    assert opts.log_level == "info"
    assert "--verbose is deprecated and has no effect (use --log-level)" in caplog.text


@pytest.mark.parametrize("argv", [["--worker-id"], ["--worker-id=5"], ["--worker-id", "5"]])
def test_worker_id_is_accepted_with_a_warning(
    argv: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pynsqd.cli"):
        opts = parse_options([*argv, "--max-rdy-count=7"])
    assert opts.node_id == Options().node_id
    assert opts.max_rdy_count == 7
    assert "--worker-id is deprecated and has no effect (use --node-id)" in caplog.text


def test_max_message_size_sets_max_msg_size_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="pynsqd.cli"):
        assert parse_options(["--max-message-size=2048"]).max_msg_size == 2048
    assert "use of the --max-message-size command line flag is deprecated (use --max-msg-size)" in (
        caplog.text
    )
    with caplog.at_level(logging.WARNING, logger="pynsqd.cli"):
        opts = parse_options(["--max-message-size=2048", "--max-msg-size=4096"])
    assert opts.max_msg_size == 4096
    assert "--max-message-size is deprecated and overridden by --max-msg-size" in caplog.text


# -- every option through a flag and through the config file -----------------------------------

SAMPLES: dict[str, tuple[str, Any]] = {
    "workers": ("4", "4"),
    "otel_traces_file": ("/tmp/spans.jsonl", "/tmp/spans.jsonl"),
    "otel_exporter_otlp_endpoint": (
        "http://127.0.0.1:4318/v1/traces",
        "http://127.0.0.1:4318/v1/traces",
    ),
    "otel_service_name": ("orders", "orders"),
    "host_label": ("rack-a", "rack-a"),
    # field name: (text on the command line, parsed value)
    "log_level": ("DEBUG", "debug"),
    "log_prefix": ("[x] ", "[x] "),
    "node_id": ("17", 17),
    "https_address": ("127.0.0.1:0", "127.0.0.1:0"),
    "http_address": ("[::1]:4151", "[::1]:4151"),
    "tcp_address": ("/tmp/nsqd.sock", "/tmp/nsqd.sock"),
    "broadcast_address": ("nsqd1.example.com", "nsqd1.example.com"),
    "broadcast_tcp_port": ("5150", 5150),
    "broadcast_http_port": ("5151", 5151),
    "lookupd_tcp_addresses": ("127.0.0.1:4160", ["127.0.0.1:4160"]),
    "auth_http_addresses": ("127.0.0.1:4181", ["127.0.0.1:4181"]),
    "auth_http_request_method": ("post", "post"),
    "topology_region": ("eu", "eu"),
    "topology_zone": ("eu-1a", "eu-1a"),
    "enable_experiment": ("topology-aware-consumption", ["topology-aware-consumption"]),
    "data_path": ("/var/lib/nsqd", "/var/lib/nsqd"),
    "statsd_address": ("127.0.0.1:8125", "127.0.0.1:8125"),
    "statsd_prefix": ("nsq.%s.x", "nsq.%s.x"),
    "e2e_processing_latency_percentiles": ("0.5", [0.5]),
    "tls_client_auth_policy": ("", ""),
    "tls_root_ca_file": ("/etc/ca.pem", "/etc/ca.pem"),
    "tls_required": ("false", "false"),
    "tls_min_version": ("TLS1.3", "tls1.3"),
    "max_deflate_level": ("9", 9),
    "tls_cert": ("", ""),
    "tls_key": ("", ""),
    "channel_bound_policy": ("drop-oldest", "drop-oldest"),
    "etcd_endpoints": ("127.0.0.1:2379", ["127.0.0.1:2379"]),
    "cluster_name": ("prod-eu", "prod-eu"),
    "replication_acks": ("leader", "leader"),
    "replication_durability": ("pagecache", "pagecache"),
}


def _sample(f: Field[Any]) -> tuple[str, Any]:
    if f.name in SAMPLES:
        return SAMPLES[f.name]
    kind = option_kind(f)
    default = getattr(Options(), f.name)
    if kind == "int":
        return str(default + 3), default + 3
    if kind == "duration":
        return "1m30s", 90.0
    if kind in ("bool", "deprecated_bool"):
        return ("false", False) if default else ("true", True)
    raise AssertionError(f"no sample for {f.name}")


OPTIONS = [f for f in option_fields() if f.name != "config"]


@pytest.mark.parametrize("f", OPTIONS, ids=[f.name for f in OPTIONS])
def test_every_option_as_a_flag(f: Field[Any]) -> None:
    text, value = _sample(f)
    opts = parse_options([f"--{flag_name(f)}={text}"])
    if option_kind(f) != "deprecated_bool":
        assert getattr(opts, f.name) == value
    changed = {
        g.name for g in option_fields() if getattr(opts, g.name) != getattr(Options(), g.name)
    }
    assert changed <= {f.name}


def _toml(f: Field[Any], value: Any) -> str:
    kind = option_kind(f)
    if kind == "duration":
        return '"1m30s"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]"
    return str(value)


@pytest.mark.parametrize("f", OPTIONS, ids=[f.name for f in OPTIONS])
def test_every_option_as_a_config_key(f: Field[Any], write_config: Any) -> None:
    _text, value = _sample(f)
    path = write_config(f"{config_key(f)} = {_toml(f, value)}\n")
    opts = parse_options([f"--config={path}"])
    if option_kind(f) != "deprecated_bool":
        assert getattr(opts, f.name) == value


# -- the config file and precedence ------------------------------------------------------------


def test_precedence_flag_over_config_over_default(write_config: Any) -> None:
    path = write_config(
        'msg_timeout = "2m"\n'
        "mem_queue_size = 50\n"
        'nsqlookupd_tcp_addresses = ["10.0.0.1:4160", "10.0.0.2:4160"]\n'
        "snappy = false\n"
    )
    opts = parse_options(
        ["--config", path, "--mem-queue-size=60", "--lookupd-tcp-address=10.0.0.3:4160"]
    )
    assert opts.mem_queue_size == 60  # flag
    assert opts.lookupd_tcp_addresses == ["10.0.0.3:4160"]  # flag replaces the config's list
    assert opts.msg_timeout == 120.0  # config
    assert opts.snappy is False  # config
    assert opts.max_rdy_count == 2500  # default
    # A flag given explicitly with the default value still beats the config file.
    assert parse_options(["--config", path, "--snappy=true"]).snappy is True


def test_config_aliases_and_field_names(write_config: Any) -> None:
    path = write_config(
        "id = 42\n"
        'nsqlookupd_tcp_addresses = ["127.0.0.1:4160"]\n'
        'auth_http_addresses = ["127.0.0.1:4181"]\n'
        "e2e_processing_latency_percentiles = [0.95, 1, 0.99]\n"
        'enable_experiment = ["topology-aware-consumption"]\n'
    )
    opts = parse_options(["--config", path])
    assert opts.node_id == 42
    assert opts.lookupd_tcp_addresses == ["127.0.0.1:4160"]
    assert opts.auth_http_addresses == ["127.0.0.1:4181"]
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.99, 0.95]
    assert opts.enable_experiment == ["topology-aware-consumption"]
    assert parse_options(["--config", write_config("node_id = 43\n")]).node_id == 43


def test_config_durations_strings_or_milliseconds(write_config: Any) -> None:
    path = write_config('msg_timeout = "1h0m0s"\nsync_timeout = 1500\n')
    opts = parse_options(["--config", path])
    assert opts.msg_timeout == 3600.0
    assert opts.sync_timeout == 1.5  # go-options reads an integer duration as milliseconds


def test_config_comma_separated_strings_as_go_options(write_config: Any) -> None:
    path = write_config(
        'nsqlookupd_tcp_addresses = "a:4160,b:4160"\ne2e_processing_latency_percentiles = "0.5,1"\n'
    )
    opts = parse_options(["--config", path])
    assert opts.lookupd_tcp_addresses == ["a:4160", "b:4160"]
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.5]


def test_config_tls_values_as_nsqd(write_config: Any, tls_files: list[str]) -> None:
    path = write_config('tls_required = true\ntls_min_version = "TLS1.2"\n')
    opts = parse_options(["--config", path, *tls_files])
    assert opts.tls_required == "true"
    assert opts.tls_min_version == "tls1.2"
    path = write_config('tls_required = "tcp-https"\n')
    assert parse_options(["--config", path, *tls_files]).tls_required == "tcp-https"


def test_config_unknown_keys_are_ignored_with_a_warning(
    write_config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config('bogus = 1\nmax_rdy_count = 3\n[section]\nkey = "v"\n')
    with caplog.at_level(logging.WARNING, logger="pynsqd.cli"):
        opts = parse_options(["--config", path])
    assert opts.max_rdy_count == 3
    assert f"config file {path}: ignoring unknown keys: bogus, section" in caplog.text


def test_config_deprecated_keys_warn(write_config: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = write_config("verbose = true\n")
    with caplog.at_level(logging.WARNING, logger="pynsqd.cli"):
        parse_options(["--config", path])
    assert f"config file {path} line 1: verbose is deprecated and has no effect" in caplog.text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('\n\nmsg_timeout = "60"\n', 'line 3: invalid value "60" for msg_timeout: time: missing'),
        ("msg_timeout = 1.5\n", "line 1: invalid value 1.5 for msg_timeout: not a duration"),
        ('mem_queue_size = "lots"\n', 'invalid value "lots" for mem_queue_size: not an integer'),
        ("mem_queue_size = 1.5\n", "invalid value 1.5 for mem_queue_size: not an integer"),
        ("snappy = 1\n", "invalid value 1 for snappy: not a boolean (true or false)"),
        ("tcp_address = 4150\n", "invalid value 4150 for tcp_address: not a string"),
        ('log_level = "loud"\n', "invalid log level 'loud' (debug, info, warn, error, fatal)"),
        ("nsqlookupd_tcp_addresses = [1]\n", "not a list of strings"),
        ('tls_min_version = "ssl3.0"\n', "SSL 3.0 is not supported"),
        ('tls_required = "maybe"\n', "tls_required: must be true, false or tcp-https"),
        ("id = 1\nnode_id = 2\n", "line 2: node_id repeats id"),
        ("e2e_processing_latency_percentiles = [2]\n", "invalid E2E processing latency percentile"),
    ],
)
def test_config_value_errors_name_the_file_line_and_key(
    text: str, message: str, write_config: Any
) -> None:
    path = write_config(text)
    err = parse_error(["--config", path])
    assert err.message.startswith(f"config file {path}")
    assert message in err.message
    assert err.exit_code == 1


def test_invalid_toml_names_the_file_and_line(write_config: Any) -> None:
    path = write_config('tcp_address = "0.0.0.0:4150"\n\nthis is not toml\n')
    err = parse_error(["--config", path])
    assert err.message.startswith(f"failed to load config file {path} - line 3, column ")
    assert err.exit_code == 1


def test_unreadable_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.cfg"
    err = parse_error(["--config", str(missing)])
    assert err.message == f"failed to load config file {missing} - No such file or directory"
    err = parse_error(["--config", str(tmp_path)])
    assert err.message.startswith(f"failed to load config file {tmp_path} - ")


def test_config_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "nsqd.cfg"
    path.write_bytes(b'log_prefix = "a"\nlog_prefix2 = "\xff"\n')
    err = parse_error(["--config", str(path)])
    assert err.message == f"failed to load config file {path} - line 2: not UTF-8"


# -- validation with nsqd's messages -----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node-id=1024"], "--node-id must be [0,1024) (got 1024)"),
        (["--node-id=-5"], "--node-id must be [0,1024) (got -5)"),
        (["--max-deflate-level=0"], "--max-deflate-level must be [1,9] (got 0)"),
        (["--max-deflate-level=10"], "--max-deflate-level must be [1,9] (got 10)"),
        (
            ["--tls-required"],
            "cannot require TLS client connections without TLS key and cert (--tls-required=true)",
        ),
        (
            ["--tls-required=tcp-https"],
            "cannot require TLS client connections without TLS key and cert"
            " (--tls-required=tcp-https)",
        ),
        (
            ["--tls-client-auth-policy=require"],
            "cannot require TLS client connections without TLS key and cert (--tls-required=true)",
        ),
        (
            ["--tls-cert=/x.pem"],
            "--tls-cert and --tls-key must be given together (only --tls-cert)",
        ),
    ],
)
def test_validation_errors(argv: list[str], message: str) -> None:
    err = parse_error(argv)
    assert err.message == message
    assert err.exit_code == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--tls-min-version=ssl3.0"],
            'invalid value "ssl3.0" for flag -tls-min-version: SSL 3.0 is not supported;'
            " must be tls1.0, tls1.1, tls1.2 or tls1.3",
        ),
        (
            ["--tls-min-version=tls1.4"],
            'invalid value "tls1.4" for flag -tls-min-version:'
            " must be tls1.0, tls1.1, tls1.2 or tls1.3",
        ),
        (
            ["--tls-required=maybe"],
            'invalid value "maybe" for flag -tls-required: must be true, false or tcp-https',
        ),
        (
            ["--tls-client-auth-policy=always"],
            'invalid value "always" for flag -tls-client-auth-policy:'
            " must be require or require-verify",
        ),
        (
            ["--auth-http-request-method=put"],
            'invalid value "put" for flag -auth-http-request-method:'
            " --auth-http-request-method must be post or get",
        ),
        (
            ["--log-level=loud"],
            'invalid value "loud" for flag -log-level:'
            " invalid log level 'loud' (debug, info, warn, error, fatal)",
        ),
        (
            ["--tcp-address="],
            'invalid value "" for flag -tcp-address: must not be empty',
        ),
        (
            ["--tcp-address=0.0.0.0:70000"],
            'invalid value "0.0.0.0:70000" for flag -tcp-address: port 70000 out of range',
        ),
        (
            ["--http-address=::1:4151"],
            'invalid value "::1:4151" for flag -http-address:'
            " an IPv6 address needs brackets, as in [::1]:4150",
        ),
        (
            ["--tcp-address=[::1]"],
            'invalid value "[::1]" for flag -tcp-address:'
            " an IPv6 address needs a port, as in [::1]:4150",
        ),
        (
            ["--lookupd-tcp-address=lookupd"],
            'invalid value "lookupd" for flag -lookupd-tcp-address:'
            ' "lookupd": must be <addr>:<port>',
        ),
        (
            ["--lookupd-tcp-address=lookupd:0"],
            'invalid value "lookupd:0" for flag -lookupd-tcp-address:'
            ' "lookupd:0": port 0 out of range',
        ),
        (
            ["--auth-http-address=auth"],
            'invalid value "auth" for flag -auth-http-address:'
            ' "auth": must be <addr>:<port> or a full URL',
        ),
        (
            ["--statsd-address=statsd"],
            'invalid value "statsd" for flag -statsd-address: must be <addr>:<port>',
        ),
        (
            ["--broadcast-tcp-port=65536"],
            'invalid value "65536" for flag -broadcast-tcp-port: must be a port number [0,65535]',
        ),
        (
            ["--mem-queue-size=-1"],
            'invalid value "-1" for flag -mem-queue-size: must not be negative',
        ),
        (["--max-msg-size=0"], 'invalid value "0" for flag -max-msg-size: must be > 0'),
        # a zero interval would spin a core (a statsd push or a sync per loop turn)
        (["--statsd-interval=0s"], 'invalid value "0s" for flag -statsd-interval: must be > 0'),
        (["--sync-timeout=0"], 'invalid value "0" for flag -sync-timeout: must be > 0'),
    ],
)
def test_value_errors_name_the_flag_and_value(argv: list[str], message: str) -> None:
    err = parse_error(argv)
    assert err.message == message
    assert err.exit_code == 2


def test_unix_socket_path_too_long() -> None:
    err = parse_error(["--tcp-address=/" + "x" * 200])
    assert err.message.endswith("a unix socket path is at most 107 bytes")


@pytest.mark.parametrize(
    "address", ["127.0.0.1:0", "0.0.0.0:4150", "[::1]:4150", "[::]:0", ":4150", "/tmp/nsqd.sock"]
)
def test_listen_addresses(address: str) -> None:
    assert parse_options([f"--tcp-address={address}"]).tcp_address == address
    assert parse_options([f"--http-address={address}"]).http_address == address


def test_http_can_be_disabled() -> None:
    assert parse_options(["--http-address="]).http_address == ""
    assert parse_options(["--http-address", ""]).http_address == ""


def test_tls_configured(tls_files: list[str]) -> None:
    opts = parse_options([*tls_files, "--tls-required"])
    assert opts.tls_required == "true"
    opts = parse_options([*tls_files, "--tls-client-auth-policy=require-verify"])
    assert opts.tls_required == "true"  # nsqd: a client auth policy implies required
    opts = parse_options([*tls_files, "-tls-required=tcp-https"])
    assert opts.tls_required == "tcp-https"


def test_unknown_experiment_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pynsqd.cli"):
        parse_options(["--enable-experiment=warp-drive"])
    assert "--enable-experiment=warp-drive is not an experiment nsqd knows" in caplog.text


def test_empty_broadcast_address_means_the_hostname() -> None:
    assert parse_options(["--broadcast-address="]).broadcast_address == Options().broadcast_address


# -- logging -----------------------------------------------------------------------------------

LINE = re.compile(r"\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} (\w+): (.*)")


@pytest.fixture
def restore_logger() -> Any:
    logger = logging.getLogger("pynsqd")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_log_lines_in_nsqd_style(capsys: pytest.CaptureFixture[str], restore_logger: Any) -> None:
    configure_logging("DEBUG", "[nsqd] ")
    log = logging.getLogger("pynsqd.test")
    log.debug("d")
    log.info("TCP: listening on %s", "127.0.0.1:4150")
    log.warning("w")
    log.error("e")
    log.critical("f")
    lines = capsys.readouterr().err.splitlines()
    assert [LINE.fullmatch(line).groups() for line in lines] == [  # type: ignore[union-attr]
        ("DEBUG", "d"),
        ("INFO", "TCP: listening on 127.0.0.1:4150"),
        ("WARN", "w"),
        ("ERROR", "e"),
        ("FATAL", "f"),
    ]


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("debug", ["DEBUG", "INFO", "WARN", "ERROR", "FATAL"]),
        ("info", ["INFO", "WARN", "ERROR", "FATAL"]),
        ("warn", ["WARN", "ERROR", "FATAL"]),
        ("ERROR", ["ERROR", "FATAL"]),
        ("fatal", ["FATAL"]),
    ],
)
def test_log_level_filters(
    level: str, shown: list[str], capsys: pytest.CaptureFixture[str], restore_logger: Any
) -> None:
    configure_logging(level, "")
    log = logging.getLogger("pynsqd")
    for fn in (log.debug, log.info, log.warning, log.error, log.critical):
        fn("x")
    levels = [line.split()[2].rstrip(":") for line in capsys.readouterr().err.splitlines()]
    assert levels == shown


def test_configure_logging_twice_keeps_one_handler(
    capsys: pytest.CaptureFixture[str], restore_logger: Any
) -> None:
    configure_logging("info", "[a] ")
    configure_logging("info", "[b] ")
    logging.getLogger("pynsqd").info("once")
    err = capsys.readouterr().err
    assert err.count("once") == 1
    assert err.startswith("[b] ")


def test_configure_logging_rejects_unknown_levels(restore_logger: Any) -> None:
    with pytest.raises(ValueError, match="invalid log level 'loud'"):
        configure_logging("loud", "")
