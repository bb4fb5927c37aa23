"""nsqd's options table: every flag, its config-file key, default, help and value check.

Each dataclass field of ``Options`` is one option, declared with ``internal.optiontable.opt``:
the flag is the field name with ``_`` → ``-`` (or its ``flag=``), the config key is the field
name (or its ``cfg=``). ``internal.flags`` builds the flag parser, the TOML loader and ``-h`` from
this table, and the HTTP API's ``/config/:opt`` reads it, so an option is written down once.

Durations are held as float seconds; on the wire they are converted to nsqd's units (ms in
IDENTIFY, ns in /info). Flags, the config file and ``/config`` speak Go's ``time.Duration`` text
(``1m0s``, ``250ms``; ``internal.gotext``).
"""

from __future__ import annotations

import hashlib
import socket
import zlib
from dataclasses import dataclass

from .internal import checks
from .internal.optiontable import config_file, listen, log_level, many, opt, verbose


def default_node_id() -> int:
    """nsqd's default: crc32(md5(hostname)) % 1024."""
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


def node_id_for_storage(storage: str) -> int:
    """A replicated node's default --node-id: from its data directory's storage id, so that
    nodes sharing a host (and a hostname) differ, and one data directory keeps its id."""
    return zlib.crc32(storage.encode()) % 1024


def _hostname() -> str:
    return socket.gethostname()


@dataclass
class Options:
    # -- basic
    config: str = config_file()
    log_level: str = log_level()
    log_prefix: str = opt("[nsqd] ", "log message prefix")
    verbose: bool = verbose()
    node_id: int = opt(
        -1,
        "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
        cfg="id",
        checked_later=True,
    )
    worker_id: bool = opt(
        False, "[deprecated] use --node-id", kind="deprecated_bool", deprecated="use --node-id"
    )
    https_address: str = listen("0.0.0.0:4152", "HTTPS", may_disable=True)
    http_address: str = listen("0.0.0.0:4151", "HTTP", may_disable=True, note=' ("" disables it)')
    tcp_address: str = listen("0.0.0.0:4150", "TCP", may_disable=False)
    broadcast_address: str = opt(
        "", "address that will be registered with lookupd (defaults to the OS hostname)"
    )
    broadcast_tcp_port: int = opt(
        0,
        "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)",
        check=checks.check_port,
    )
    broadcast_http_port: int = opt(
        0,
        "HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)",
        check=checks.check_port,
    )
    lookupd_tcp_addresses: list[str] = many(
        "lookupd TCP address",
        flag="lookupd-tcp-address",
        cfg="nsqlookupd_tcp_addresses",
        check=checks.check_lookupd_addresses,
    )
    auth_http_addresses: list[str] = many(
        "<addr>:<port> or a full url to query auth server",
        flag="auth-http-address",
        cfg="auth_http_addresses",
        check=checks.check_auth_addresses,
    )
    auth_http_request_method: str = opt(
        "get",
        "HTTP method to use for auth server requests (get or post)",
        check=checks.check_auth_http_request_method,
    )
    http_client_connect_timeout: float = opt(2.0, "timeout for HTTP connect", kind="duration")
    http_client_request_timeout: float = opt(5.0, "timeout for HTTP request", kind="duration")
    topology_region: str = opt(
        "", "region represents a larger domain, typically a geographic region"
    )
    topology_zone: str = opt("", "zone represents a smaller domain within a region")
    enable_experiment: list[str] = many("enable experimental feature", cfg="enable_experiment")
    # -- disk queue
    data_path: str = opt("", "path to store disk-backed messages (default: the current directory)")
    mem_queue_size: int = opt(10000, "number of messages to keep in memory (per topic/channel)")
    max_bytes_per_file: int = opt(
        104857600, "number of bytes per diskqueue file before rolling", positive=True
    )
    sync_every: int = opt(2500, "number of messages per diskqueue fsync", positive=True)
    sync_timeout: float = opt(
        2.0, "duration of time per diskqueue fsync", kind="duration", positive=True
    )
    busy_poll: float = opt(
        0.00005,
        "pynsqd: after reading from a client, keep polling the sockets for this long before sleeping, so a client waiting for each answer (PUB, then OK) is served without a wake-up; 0 turns it off",
        kind="duration",
    )
    workers: str = opt(
        "1",
        "pynsqd: serve the same addresses from this many worker processes, one per core ('auto': the cores this process may use); each keeps its data in <data-path>/worker-<i>",
        check=checks.check_workers,
    )
    # -- replayable topics (pynsqd; off by default)
    retention_time: float = opt(
        0.0,
        "pynsqd: keep every topic's messages in a log readable by offset for this long (0: no time bound; no log unless --retention-bytes is set; per topic: POST /topic/retention)",
        kind="duration",
    )
    retention_bytes: int = opt(
        0,
        "pynsqd: keep each topic's log to about this many bytes, whole segments of --max-bytes-per-file (0: no size bound)",
    )
    dedup_records: int = opt(
        100_000,
        "pynsqd: idempotent publishing keeps the bodies of a retained topic's newest N identified records for its conflict check (per topic: POST /topic/config)",
        positive=True,
    )
    dedup_window: float = opt(
        86400.0,
        "pynsqd: idempotent publishing remembers a producer this long after its last publish (or the topic's retention, if shorter): a retry later than that may be written twice (per topic: POST /topic/config)",
        kind="duration",
        positive=True,
    )
    # -- replicated topics (pynsqd; off unless --etcd-endpoints is given)
    etcd_endpoints: list[str] = opt(
        [],
        "pynsqd: etcd client URL (<addr>:<port> or http://...) that coordinates a cluster of replicated topics (may be given multiple times); without it nothing is replicated",
        kind="list",
        flag="etcd-endpoints",
        check=checks.check_auth_addresses,
    )
    cluster_name: str = opt(
        "pynsqd",
        "pynsqd: the cluster's name in etcd (its keys live under /pynsqd/<name>/); nodes with the same name and etcd form one cluster",
        check=checks.check_cluster_name,
    )
    host_label: str = opt(
        "",
        "pynsqd: the host this node runs on, for placing a replicated partition's copies on distinct hosts first, as Kafka's broker.rack (default: this machine's hostname)",
    )
    etcd_lease_ttl: float = opt(
        3.0,
        "pynsqd: how long a node that stops answering etcd keeps its membership and its partitions' leadership (whole seconds, at least 2)",
        kind="duration",
        check=checks.check_lease_ttl,
    )
    replicas: int = opt(
        1,
        "pynsqd: default copies of a retained topic's log on distinct nodes (1: not replicated; per topic: POST /topic/replication)",
        check=checks.check_replicas,
    )
    replication_min_insync: int = opt(
        0,
        "pynsqd: default replicas that must hold a record before a publish is answered OK (0: a majority of --replicas)",
    )
    replication_acks: str = opt(
        "all",
        "pynsqd: default for replicated topics: 'all' answers OK once min-insync replicas hold the records, 'leader' once the leader wrote them",
        check=checks.choice("all", "leader"),
    )
    replication_durability: str = opt(
        "fsync",
        "pynsqd: default for replicated topics: 'fsync' counts a replica once the records are fsynced there, 'pagecache' once written",
        check=checks.choice("fsync", "pagecache"),
    )
    replication_timeout: float = opt(
        5.0,
        "pynsqd: a publish to a replicated topic not committed within this long is answered E_PUB_FAILED (it may still commit)",
        kind="duration",
        positive=True,
    )
    replica_lag_max: float = opt(
        5.0,
        "pynsqd: a follower that has not caught up with its leader for this long leaves the in-sync set",
        kind="duration",
        positive=True,
    )
    replica_stall_max: float = opt(
        1.0,
        "pynsqd: a follower that has not asked its leader for records for this long after an answer (killed, paused, cut off) leaves the in-sync set",
        kind="duration",
        positive=True,
    )
    replica_replace_after: float = opt(
        15.0,
        "pynsqd: a copy whose node has left the cluster (its etcd lease lapsed) and not come back for this long is placed on a live node that holds none (0: at once; a node that comes back within it keeps its copy and fetches only what it missed)",
        kind="duration",
    )
    # -- message lifecycle (pynsqd; off by default)
    max_attempts: int = opt(
        0,
        "pynsqd: deliver a message at most this many times, then move it to its channel's dead-letter topic (<topic>.dead unless set per channel: POST /channel/config) (0: unlimited)",
        check=checks.check_max_attempts,
    )
    msg_ttl: float = opt(
        0.0,
        "pynsqd: drop a message not yet delivered this long after it was published (0: never; per topic: POST /topic/config)",
        kind="duration",
    )
    max_channel_depth: int = opt(
        0,
        "pynsqd: most messages (queued and deferred) a channel, or a topic without channels, may hold (0: unbounded; per topic/channel: POST /topic/config, /channel/config)",
    )
    max_channel_bytes: int = opt(
        0,
        "pynsqd: most body bytes (queued and deferred; on disk, about) a channel may hold (0: unbounded; per channel: POST /channel/config)",
    )
    channel_bound_policy: str = opt(
        "reject",
        "pynsqd: what a full queue does: reject (the publish fails, E_PUB_FAILED / HTTP 503) or drop-oldest",
        check=checks.check_bound_policy,
    )
    queue_scan_worker_pool_max: int = opt(
        4,
        "max concurrency for checking in-flight and deferred message timeouts (pynsqd: accepted, unused: timeouts fire from one timed queue per channel)",
    )
    queue_scan_selection_count: int = opt(
        20,
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts (pynsqd: accepted, unused)",
    )
    # -- msg and command
    msg_timeout: float = opt(
        60.0, "default duration to wait before auto-requeing a message", kind="duration"
    )
    max_msg_timeout: float = opt(
        900.0, "maximum duration before a message will timeout", kind="duration"
    )
    max_msg_size: int = opt(
        1048576,
        "maximum size of a single message in bytes",
        deprecated_flag="max-message-size",
        positive=True,
    )
    max_req_timeout: float = opt(3600.0, "maximum requeuing timeout for a message", kind="duration")
    max_body_size: int = opt(5242880, "maximum size of a single command body", positive=True)
    max_headers: int = opt(
        16,
        "pynsqd: most headers a message may carry (for clients that negotiate headers in IDENTIFY; 0: headers are refused)",
        check=checks.within(0, 4096, "0 to 4096"),
    )
    max_header_bytes: int = opt(
        4096,
        "pynsqd: most bytes of a message's headers, names and values encoded",
        check=checks.within(0, 65535, "0 to 65535"),
    )
    # -- tracing (docs/headers.md): messages with a traceparent header, OpenTelemetry spans
    otel_traces_file: str = opt(
        "",
        "pynsqd: write the spans of messages that carry a traceparent header to this file, one JSON line each (tracing is off unless an exporter is given)",
    )
    otel_exporter_otlp_endpoint: str = opt(
        "",
        "pynsqd: send those spans over OTLP/HTTP to this URL (e.g. http://127.0.0.1:4318/v1/traces)",
    )
    otel_service_name: str = opt("nsqd", "pynsqd: the service.name of those spans")
    # -- client overridable
    max_heartbeat_interval: float = opt(
        60.0,
        "maximum client configurable duration of time between client heartbeats",
        kind="duration",
    )
    max_rdy_count: int = opt(2500, "maximum RDY count for a client")
    max_output_buffer_size: int = opt(
        65536, "maximum client configurable size (in bytes) for a client output buffer"
    )
    max_output_buffer_timeout: float = opt(
        30.0,
        "maximum client configurable duration of time between flushing to a client",
        kind="duration",
    )
    min_output_buffer_timeout: float = opt(
        0.025,
        "minimum client configurable duration of time between flushing to a client",
        kind="duration",
    )
    output_buffer_timeout: float = opt(
        0.25, "default duration of time between flushing data to clients", kind="duration"
    )
    max_channel_consumers: int = opt(
        0,
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
    )
    # -- statsd
    statsd_address: str = opt(
        "",
        "UDP <addr>:<port> of a statsd daemon for pushing stats",
        check=checks.check_statsd_address,
    )
    statsd_interval: float = opt(
        60.0, "duration between pushing to statsd", kind="duration", positive=True
    )
    statsd_mem_stats: bool = opt(True, "toggle sending memory and GC stats to statsd")
    statsd_prefix: str = opt(
        "nsq.%s", "prefix used for keys sent to statsd (%s for host replacement)"
    )
    statsd_udp_packet_size: int = opt(508, "the size in bytes of statsd UDP packets", positive=True)
    statsd_exclude_ephemeral: bool = opt(
        False, "Skip ephemeral topics and channels when sending stats to statsd"
    )
    # -- e2e latency
    e2e_processing_latency_percentiles: list[float] = opt(
        [],
        "message processing time percentiles (as float (0, 1.0]) to track (can be specified multiple times or comma separated '1.0,0.99,0.95', default none)",
        kind="floatlist",
        flag="e2e-processing-latency-percentile",
        cfg="e2e_processing_latency_percentiles",
        check=checks.check_percentiles,
    )
    e2e_processing_latency_window_time: float = opt(
        600.0,
        "calculate end to end latency quantiles for this duration of time (ie: 60s would only show quantile calculations from the past 60 seconds)",
        kind="duration",
    )
    # -- TLS
    tls_cert: str = opt("", "path to certificate file")
    tls_key: str = opt("", "path to key file")
    tls_client_auth_policy: str = opt(
        "",
        "client certificate auth policy ('require' or 'require-verify')",
        check=checks.check_tls_client_auth_policy,
    )
    tls_root_ca_file: str = opt("", "path to certificate authority file")
    tls_required: str = opt(
        "false",
        "require TLS for client connections (true, false, tcp-https)",
        implicit="true",
        check=checks.check_tls_required,
    )
    tls_min_version: str = opt(
        "tls1.0",
        "minimum SSL/TLS version acceptable (tls1.0, tls1.1, tls1.2 or tls1.3)",
        check=checks.check_tls_min_version,
    )
    # -- compression
    deflate: bool = opt(True, "enable deflate feature negotiation (client compression)")
    max_deflate_level: int = opt(
        6,
        "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
        checked_later=True,
    )
    snappy: bool = opt(True, "enable snappy feature negotiation (client compression)")

    def options_given(self, names: set[str]) -> None:
        """``internal/flags.resolve``: the options set by a flag or the config file."""
        object.__setattr__(self, "_node_id_default", "node_id" not in names)

    @property
    def node_id_is_default(self) -> bool:
        """--node-id was not given (nor ``id`` in the config file)."""
        return bool(getattr(self, "_node_id_default", False))

    def __post_init__(self) -> None:
        # Whether --node-id was left to its default (a replicated node then takes its id from
        # its data directory: two nodes on one host would share the hostname's).
        object.__setattr__(self, "_node_id_default", self.node_id == -1)
        if self.node_id == -1:
            self.node_id = default_node_id()
        if not self.broadcast_address:
            self.broadcast_address = _hostname()
