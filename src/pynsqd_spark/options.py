"""Parsing and checking the data source options (names are case-insensitive, as in Spark)."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pynsqd import __version__
from pynsqd.client import ClientOptions, parse_address
from pynsqd.client.errors import DEFAULT_LOOKUPD_HTTP_PORT

_NAME = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")


class NsqOptionError(ValueError):
    """A data source option is missing or has a bad value; the message names the option."""


def unknown_options(unknown: list[str], mode: str, valid: list[str]) -> NsqOptionError:
    """Options no mode reads: each named, with the valid name nearest to it when there is one
    (``chanel``: did you mean ``channel``?), then every valid one."""
    by_lower = {v.lower(): v for v in valid}
    hints = []
    for k in unknown:
        near = difflib.get_close_matches(k, list(by_lower), n=1, cutoff=0.75)
        if near:
            hints.append(f"{k!r}: did you mean {by_lower[near[0]]!r}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return NsqOptionError(
        f"unknown option(s) {', '.join(repr(k) for k in unknown)} for mode {mode!r}{hint}; "
        f"valid: {', '.join(valid)}"
    )


class OptionReader:
    def __init__(self, options: Mapping[str, str]) -> None:
        self._o = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
        self._asked: dict[str, str] = {}  # lowercased name -> name as documented

    def get(self, name: str) -> str | None:
        self._asked.setdefault(name.lower(), name)
        v = self._o.get(name.lower())
        return v if v is None or v.strip() != "" else None

    def string(self, name: str, default: str) -> str:
        v = self.get(name)
        return default if v is None else v

    def integer(self, name: str, default: int, minimum: int = 0) -> int:
        v = self.get(name)
        if v is None:
            return default
        try:
            n = int(v.strip())
        except ValueError:
            raise NsqOptionError(f"option {name!r} must be an integer, got {v!r}") from None
        if n < minimum:
            raise NsqOptionError(f"option {name!r} must be >= {minimum}, got {n}")
        return n

    def boolean(self, name: str, default: bool) -> bool:
        v = self.get(name)
        if v is None:
            return default
        low = v.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise NsqOptionError(f"option {name!r} must be true or false, got {v!r}")

    def reject_unknown(self, mode: str, also: tuple[str, ...] = ()) -> None:
        """Options nobody read are a mistake (a typo, or an option of the other mode): say
        which, and list the valid ones."""
        known = set(self._asked) | {a.lower() for a in also} | {"path"}
        unknown = sorted(k for k in self._o if k not in known)
        if unknown:
            raise unknown_options(unknown, mode, sorted({*self._asked.values(), *also}))

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.string(name, default).strip().lower()
        if v not in choices:
            raise NsqOptionError(f"option {name!r} must be one of {', '.join(choices)}, got {v!r}")
        return v

    def addresses(self, name: str, default_port: int) -> list[str]:
        v = self.get(name)
        if v is None:
            return []
        out: list[str] = []
        for part in v.split(","):
            if not part.strip():
                continue
            try:
                if name.lower().startswith("nsqlookupd") and "://" in part:
                    out.append(part.strip())
                    continue
                host, port = parse_address(part, default_port)
            except ValueError as e:
                raise NsqOptionError(f"option {name!r}: {e}") from None
            out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        return out


def check_name(kind: str, option: str, value: str) -> str:
    if not (1 <= len(value) <= 64 and _NAME.match(value)):
        raise NsqOptionError(
            f"option {option!r}: {value!r} is not a valid NSQ {kind} name "
            "(1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral)"
        )
    return value


def _client_options(o: OptionReader, msg_timeout_ms: int = 0) -> ClientOptions:
    secret = o.get("authSecret")
    env = o.get("authSecretEnv")
    if secret is None and env is not None:
        secret = os.environ.get(env)
        if secret is None:
            raise NsqOptionError(f"option 'authSecretEnv': environment variable {env!r} is not set")
    return ClientOptions(
        connect_timeout=o.integer("connectTimeoutMs", 5000, 1) / 1000,
        timeout=o.integer("timeoutMs", 30000, 1) / 1000,
        heartbeat_interval_ms=o.integer("heartbeatIntervalMs", 0),
        msg_timeout_ms=msg_timeout_ms,
        client_id=o.string("clientId", ""),
        tls=o.boolean("tls", False),
        tls_verify=o.boolean("tlsVerify", True),
        tls_ca_file=o.get("tlsCaFile"),
        tls_cert_file=o.get("tlsCertFile"),
        tls_key_file=o.get("tlsKeyFile"),
        auth_secret=secret,
        user_agent=f"pynsqd_spark/{__version__}",
    )


def _nodes(o: OptionReader) -> tuple[list[str], list[str]]:
    nsqd = o.addresses("nsqdTcpAddresses", 4150)
    lookupd = o.addresses("nsqlookupdHttpAddresses", DEFAULT_LOOKUPD_HTTP_PORT)
    return nsqd, lookupd


def _some_nodes(nsqd: list[str], lookupd: list[str]) -> None:
    if not nsqd and not lookupd:
        raise NsqOptionError(
            "set option 'nsqdTcpAddresses' (host:port,...) or 'nsqlookupdHttpAddresses' "
            "(host:port,...)"
        )


@dataclass(frozen=True)
class SourceOptions:
    topic: str
    channel: str
    nsqd_addresses: list[str]
    lookupd_addresses: list[str]
    client: ClientOptions
    max_messages_per_batch: int
    max_bytes_per_batch: int
    max_in_flight: int
    connections_per_node: int  # 0: enough for max_in_flight given nsqd's max_rdy_count
    msg_timeout_ms: int
    touch_interval_ms: int
    lookupd_poll_interval_ms: int
    flush_empty_batch: bool
    available_now_idle_ms: int
    available_now_clock_skew_ms: int
    max_messages_per_partition: int
    max_bytes_per_partition: int
    reconnect_backoff_max_ms: int = 30000
    #: ``includeHeaders``: a ``headers`` column (``docs/headers.md``); the connections ask.
    include_headers: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        o = OptionReader(options)
        topic = o.get("topic")
        channel = o.get("channel")
        # Every option is read before any is refused: a misspelled one is named first (a
        # missing 'channel' is most often a misspelled one).
        fields = cls._read(o)
        o.reject_unknown("channel", also=("mode", "nsqdHttpAddresses"))
        if topic is None:
            raise NsqOptionError("option 'topic' is required (the NSQ topic to read)")
        if channel is None:
            raise NsqOptionError(
                "option 'channel' is required (the NSQ channel to consume; queries sharing a "
                "channel share its messages)"
            )
        check_name("topic", "topic", topic)
        check_name("channel", "channel", channel)
        _some_nodes(fields["nsqd_addresses"], fields["lookupd_addresses"])
        return cls(topic=topic, channel=channel, **fields)

    @staticmethod
    def _read(o: OptionReader) -> dict[str, Any]:
        nsqd, lookupd = _nodes(o)
        max_batch = o.integer("maxMessagesPerBatch", 10000, 1)
        msg_timeout = o.integer("msgTimeoutMs", 60000, 1000)
        headers = o.boolean("includeHeaders", False)
        client = _client_options(o, msg_timeout)
        return dict(
            nsqd_addresses=nsqd,
            lookupd_addresses=lookupd,
            client=dataclasses.replace(client, headers=True) if headers else client,
            include_headers=headers,
            max_messages_per_batch=max_batch,
            max_bytes_per_batch=o.integer("maxBytesPerBatch", 256 * 1024 * 1024, 1),
            max_in_flight=o.integer("maxInFlight", 2 * max_batch, 1),
            connections_per_node=o.integer("connectionsPerNode", 0),
            msg_timeout_ms=msg_timeout,
            touch_interval_ms=o.integer("touchIntervalMs", max(500, msg_timeout // 2), 100),
            lookupd_poll_interval_ms=o.integer("lookupdPollIntervalMs", 15000, 100),
            flush_empty_batch=o.boolean("flushEmptyBatch", True),
            available_now_idle_ms=o.integer("availableNowIdleMs", 1000, 0),
            available_now_clock_skew_ms=o.integer("availableNowClockSkewMs", 1000, 0),
            max_messages_per_partition=o.integer("maxMessagesPerPartition", 50000, 1),
            max_bytes_per_partition=min(
                o.integer("maxBytesPerPartition", 8 * 1024 * 1024, 1), 1 << 30
            ),
        )


@dataclass(frozen=True)
class SinkOptions:
    topic: str | None
    nsqd_addresses: list[str]
    lookupd_addresses: list[str]
    client: ClientOptions
    max_msg_size: int
    max_body_size: int
    max_messages_per_mpub: int
    oversize: str  # fail | skip
    empty_body: str  # fail | skip
    max_retries: int
    retry_backoff_ms: int
    pipeline: int
    #: Each row's identity (query, batch, partition, position): retries write it once.
    exactly_once: bool

    @classmethod
    def parse(cls, options: Mapping[str, str], has_topic_column: bool) -> SinkOptions:
        o = OptionReader(options)
        topic = o.get("topic")
        nsqd, lookupd = _nodes(o)
        max_body = o.integer("maxBodySize", 5 * 1024 * 1024, 16)
        max_msg = o.integer("maxMsgSize", 1024 * 1024, 1)
        parsed = cls(
            topic=topic,
            nsqd_addresses=nsqd,
            lookupd_addresses=lookupd,
            client=_client_options(o),
            max_msg_size=max_msg,
            max_body_size=max_body,
            max_messages_per_mpub=o.integer("maxMessagesPerMpub", 10000, 1),
            oversize=o.choice("oversize", "fail", ("fail", "skip")),
            empty_body=o.choice("emptyBody", "fail", ("fail", "skip")),
            max_retries=o.integer("maxRetries", 5, 0),
            retry_backoff_ms=o.integer("retryBackoffMs", 200, 0),
            pipeline=o.integer("pipelineDepth", 4, 1),
            exactly_once=o.boolean("exactlyOnce", True),
        )
        # Every option was read: a misspelled one is named before a missing one.
        o.reject_unknown("sink", also=SPARK_SINK_OPTIONS)
        if topic is None and not has_topic_column:
            raise NsqOptionError(
                "option 'topic' is required unless the DataFrame has a 'topic' column"
            )
        if topic is not None:
            check_name("topic", "topic", topic)
        _some_nodes(nsqd, lookupd)
        if max_msg + 8 > max_body:
            raise NsqOptionError("option 'maxMsgSize' must be at most 'maxBodySize' - 8")
        return parsed


#: Options Spark itself takes through ``.option()`` of a writer: not the sink's, not refused.
SPARK_SINK_OPTIONS = ("checkpointLocation", "mode", "path", "queryName")


# -- log mode ------------------------------------------------------------------------------


#: Every option log mode reads (names are case-insensitive).
LOG_OPTIONS = (
    "mode",
    "topic",
    "nsqdHttpAddresses",
    "nsqlookupdHttpAddresses",
    "startingOffsets",
    "startingTimestamp",
    "endingOffsets",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "readerName",
    "includeHeaders",
    "readRetryTimeoutMs",
    "readRetryBackoffMs",
    "authSecret",
    "authSecretEnv",
    "timeoutMs",
    "tls",
    "tlsVerify",
    "tlsCaFile",
    "tlsCertFile",
    "tlsKeyFile",
)


@dataclass(frozen=True)
class LogOptions:
    topic: str
    nodes: tuple[str, ...]  # given nsqd HTTP addresses
    lookupd: tuple[str, ...]  # nsqlookupd HTTP addresses: nodes discovered for the topic
    starting: str | dict[str, int]  # "earliest", "latest" or {node: offset}
    starting_timestamp_ms: int | None
    ending: str | dict[str, int]  # batch reads: "latest" or {node: offset}
    max_offsets_per_trigger: int
    min_partitions: int
    fail_on_data_loss: bool
    #: How to talk to each node's HTTP port (TLS: the addresses are nsqd's --https-address;
    #: the auth secret unless it comes from ``authSecretEnv``; the timeout).
    client: ClientOptions
    #: ``authSecretEnv``: the variable holding the secret, read where it is used (on each
    #: executor too), so the secret never travels inside the options.
    auth_secret_env: str | None = None
    #: How long a read of a planned range keeps trying a node that does not answer (it may be
    #: restarting) before the task fails; the first wait between tries (doubling, at most 2 s).
    read_retry_timeout_ms: int = 60_000
    read_retry_backoff_ms: int = 100
    #: ``readerName``: what a streaming query is called in the nodes' ``/stats`` (its committed
    #: offsets and lag); by default ``spark-<topic>-`` and a digest of its options.
    reader_name: str = ""
    #: ``includeHeaders``: a ``headers`` column (each message's, ``docs/headers.md``), as
    #: Spark's Kafka source has with the same option.
    include_headers: bool = False

    @property
    def http(self) -> ClientOptions:
        """The client options with the auth secret, from ``authSecretEnv`` when given."""
        env = self.auth_secret_env
        if env is None:
            return self.client
        secret = os.environ.get(env)
        if secret is None:
            raise NsqOptionError(
                f"option 'authSecretEnv': environment variable {env!r} is not set here (on "
                f"the executors, set it with spark.executorEnv.{env})"
            )
        return dataclasses.replace(self.client, auth_secret=secret)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> LogOptions:
        o = OptionReader(options)
        unknown = sorted(
            k for k in o._o if k not in {n.lower() for n in LOG_OPTIONS} and k != "path"
        )
        if unknown:
            raise unknown_options(unknown, "log", list(LOG_OPTIONS))
        topic = o.get("topic")
        if topic is None:
            raise NsqOptionError("option 'topic' is required")
        check_name("topic", "topic", topic)
        nodes = tuple(o.addresses("nsqdHttpAddresses", 4151))
        lookupd = tuple(o.addresses("nsqlookupdHttpAddresses", 4161))
        if not nodes and not lookupd:
            raise NsqOptionError(
                "mode 'log' reads each nsqd's HTTP port: set option 'nsqdHttpAddresses' "
                "(host:port,...) or 'nsqlookupdHttpAddresses'"
            )
        tls = o.boolean("tls", False)
        if tls and lookupd:
            raise NsqOptionError(
                "option 'tls' in mode 'log': give each nsqd's HTTPS address in "
                "'nsqdHttpAddresses' (nsqlookupd only knows their plain HTTP ports)"
            )
        return cls(
            topic=topic,
            nodes=nodes,
            lookupd=lookupd,
            starting=_offsets_option(o, "startingOffsets", "earliest", nodes),
            starting_timestamp_ms=(
                o.integer("startingTimestamp", 0) if o.get("startingTimestamp") else None
            ),
            ending=_offsets_option(o, "endingOffsets", "latest", nodes),
            max_offsets_per_trigger=o.integer("maxOffsetsPerTrigger", 0),
            min_partitions=o.integer("minPartitions", len(nodes), 1),
            fail_on_data_loss=o.boolean("failOnDataLoss", True),
            auth_secret_env=None if o.get("authSecret") else o.get("authSecretEnv"),
            read_retry_timeout_ms=o.integer("readRetryTimeoutMs", 60_000),
            read_retry_backoff_ms=o.integer("readRetryBackoffMs", 100, 1),
            reader_name=o.get("readerName") or _reader_name(topic, options),
            include_headers=o.boolean("includeHeaders", False),
            client=ClientOptions(
                timeout=o.integer("timeoutMs", 30000, 1) / 1000,
                tls=tls,
                tls_verify=o.boolean("tlsVerify", True),
                tls_ca_file=o.get("tlsCaFile"),
                tls_cert_file=o.get("tlsCertFile"),
                tls_key_file=o.get("tlsKeyFile"),
                auth_secret=o.get("authSecret"),
            ),
        )


def _reader_name(topic: str, options: Mapping[str, str]) -> str:
    """A query's default ``readerName``: its topic and a digest of its options (the same
    query, restarted, is the same reader; secrets are left out)."""
    kept = sorted((k.lower(), v) for k, v in options.items() if "secret" not in k.lower())
    digest = hashlib.sha1(json.dumps(kept).encode()).hexdigest()[:8]
    return f"spark-{topic}-{digest}"


def _offsets_option(
    o: OptionReader, name: str, default: str, nodes: tuple[str, ...]
) -> str | dict[str, int]:
    v = o.get(name)
    if v is None:
        return default
    v = v.strip()
    if v.lower() in ("earliest", "latest"):
        return v.lower()
    try:
        doc = json.loads(v)
        if not isinstance(doc, dict) or not all(
            isinstance(n, int) and n >= -2 for n in doc.values()
        ):
            raise ValueError
    except ValueError:
        raise NsqOptionError(
            f"option {name!r} must be 'earliest', 'latest' or JSON {{\"host:port\": offset}}"
            f" (-2 earliest, -1 latest), got {v!r}"
        ) from None
    # Nodes are named by address; a log may also be named by its storage id, a replicated
    # topic's partition by ``<cluster>/<origin>``.
    stray = sorted(k for k in set(doc) - set(nodes) if ":" in k and "/" not in k)
    if stray and nodes:
        raise NsqOptionError(f"option {name!r} names nodes not in 'nsqdHttpAddresses': {stray}")
    return {str(k): int(n) for k, n in doc.items()}
