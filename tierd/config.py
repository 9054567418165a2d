"""tierd's settings: one typed, frozen :class:`Config` and the loader that fills it.

Zero configuration must work, so every setting has a default.  Sources, in increasing
precedence::

    defaults  <  TOML file (--config FILE or TIERD_CONFIG)  <  TIERD_* env vars  <  CLI flags

**The settings table is the dataclass.**  Each :class:`Config` field is declared as
``field(default=..., metadata=setting(parse=..., help=...))``; the environment variable
(``TIERD_<KEY>``), the CLI flag (``--<key-with-dashes>``), the TOML key and the reference in
``docs/config.md`` all follow from the field name.  A new setting is one more field here
(and a paragraph in ``docs/config.md``; a test checks the doc mentions every setting).

Every value from every source goes through the same parser, so a bad value is rejected the
same way wherever it came from, with a :class:`ConfigError` naming the key and the source
(file path, environment variable or flag).  Unknown keys are rejected too: a typo in a config
file must not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import platformdirs

from tierd.config_check import check_config
from tierd.config_parsers import (
    _META_KEY,
    DERIVED,
    ConfigError,
    HostPort,
    ParseContext,
    Parser,
    SettingInfo,
    parse_bool,
    parse_choice,
    parse_cold_url,
    parse_domains,
    parse_float,
    parse_host_port,
    parse_http_url,
    parse_int,
    parse_optional_path,
    parse_optional_region,
    parse_optional_str,
    parse_path,
    parse_region,
    parse_size,
    parse_str,
    parse_umask,
    setting,
)
from tierd.mempool.wire import SHARED_SOCKET

T = TypeVar("T")

ENV_PREFIX = "TIERD_"

#: ``TIERD_*`` environment variables that are not settings and are therefore not rejected as
#: unknown.  Documented in docs/config.md; add a name here when a new one is introduced.
NON_SETTING_ENV: frozenset[str] = frozenset(
    {
        "TIERD_CONFIG",  # path of the TOML config file
        "TIERD_ROOT_ACCESS_KEY",  # bootstrap S3 credentials of the root user
        "TIERD_ROOT_SECRET_KEY",
        "TIERD_ADMIN_URL",  # tierctl: where the admin API listens
        "TIERD_ADMIN_TOKEN",  # admin API bearer token (tierd.admin.auth, tierctl)
        "TIERD_VENV",  # dev.sh: location of the virtual environment
        "TIERD_CRASHPOINT",  # tests: die at a named step (tierd.namespace.crashpoint)
        "TIERD_LIFECYCLE_DAY_SECONDS",  # tests: a lifecycle "day" (tierd.namespace.lifecycle)
    }
)


def _default_pool_socket(c: Config) -> Path:
    """DATA_DIR/pool.sock; for root with the default data directory (in root's home, which
    training users cannot traverse) the shared location every uid can reach and every
    client looks at."""
    if os.geteuid() == 0 and c.data_dir == Path(platformdirs.user_data_dir("tierd")):
        return SHARED_SOCKET
    return c.data_dir / "pool.sock"


# --- the settings table ---------------------------------------------------------------------


def parse_meta_url(value: object, ctx: ParseContext) -> str:
    """``meta_url``: empty (lmdb) or a ``postgresql://`` / ``postgres://`` URL."""
    s = parse_optional_str(value, ctx)
    if s and not s.lower().startswith(("postgresql://", "postgres://")):
        raise ValueError(f"{s.split('://')[0]!r} is not a metadata engine: give a "
                         "postgresql:// URL, or nothing for the embedded lmdb store")
    return s


_NODE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")


def parse_node_name(value: object, ctx: ParseContext) -> str:
    """``node_name``: empty (a single node) or a short DNS-label-like name."""
    s = parse_optional_str(value, ctx).strip()
    if s and not _NODE_NAME.match(s):
        raise ValueError(f"{s!r} is not a node name: 1-32 of a-z, 0-9 and '-', starting "
                         "with a letter or digit")
    return s


def parse_optional_host_port(value: object, ctx: ParseContext) -> HostPort | None:
    """An optional ``HOST:PORT``: empty means none."""
    if isinstance(value, str) and not value.strip():
        return None
    return parse_host_port(value, ctx)


@dataclass(frozen=True)
class Config:
    """Every tierd setting, typed and validated.  Build one with :func:`load_config`.

    Constructing ``Config(...)`` directly (tests, embedding) skips parsing: pass typed values.
    """

    data_dir: Path = field(
        default_factory=lambda: Path(platformdirs.user_data_dir("tierd")),
        metadata=setting(
            parse=parse_path,
            help="Directory holding metadata and the hot, warm and cold tiers.",
            metavar="DIR",
        ),
    )
    s3_listen: HostPort = field(
        default=HostPort("127.0.0.1", 9000),
        metadata=setting(
            parse=parse_host_port,
            help="HOST:PORT of the S3 gateway (port 0: any free port).",
            metavar="HOST:PORT",
        ),
    )
    admin_listen: HostPort = field(
        default=HostPort("127.0.0.1", 9001),
        metadata=setting(
            parse=parse_host_port,
            help="HOST:PORT of the admin API (port 0: any free port).",
            metavar="HOST:PORT",
        ),
    )
    mount: Path | None = field(
        default=None,
        metadata=setting(
            parse=parse_optional_path,
            help="Where to mount the namespace with FUSE (empty: no mount).",
            metavar="DIR",
        ),
    )
    fuse_backend: str = field(
        default="kernel",
        metadata=setting(
            parse=parse_choice("kernel", "pyfuse3"),
            help="How the mount talks to the kernel: kernel (the daemon speaks the FUSE "
            "protocol on /dev/fuse itself) or pyfuse3 (libfuse, the fallback; "
            "docs/fuse.md).",
            metavar="kernel|pyfuse3",
        ),
    )
    fuse_passthrough: bool = field(
        default=True,
        metadata=setting(
            parse=parse_bool,
            help="With fuse_backend = kernel: read-only opens of files wholly on the hot "
            "tier are served by the kernel from the hot file (FUSE passthrough); with "
            "fuse_passthrough_writes only files a writer could pass through too, else a "
            "writer waits for such readers to close (docs/fuse.md).",
            metavar="BOOL",
        ),
    )
    fuse_passthrough_writes: bool = field(
        default=True,
        metadata=setting(
            parse=parse_bool,
            help="With fuse_passthrough: writable opens of files wholly on the hot tier "
            "(not in the memory tier, a versioned bucket or on a cluster node) are passed "
            "through too: the kernel writes the hot file, the daemon commits at "
            "flush/fsync/close (docs/fuse.md).",
            metavar="BOOL",
        ),
    )
    fuse_poll_us: int = field(
        default=100,
        metadata=setting(
            parse=parse_int(0, 10_000),
            help="With fuse_backend = kernel: microseconds the request loop reads /dev/fuse "
            "again before it sleeps, so the next request of a file operation is taken "
            "without a wake-up (on VMs whose idle vCPUs halt, each costs more than the wait); "
            "stops by itself while requests come further apart; 0: off (docs/fuse.md).",
            metavar="MICROSECONDS",
        ),
    )
    log_level: str = field(
        default="info",
        metadata=setting(
            parse=parse_choice("debug", "info", "warning", "error", "critical"),
            help="Lowest log level written: debug, info, warning, error or critical.",
            metavar="LEVEL",
        ),
    )
    log_format: str = field(
        default="text",
        metadata=setting(
            parse=parse_choice("text", "json"),
            help="Log line format: text (key=value) or json (one object per line).",
            metavar="text|json",
        ),
    )
    umask: int = field(
        default=0o022,
        metadata=setting(
            parse=parse_umask,
            help='Mask applied to the mode of new files and directories (octal, e.g. "022").',
            metavar="OCTAL",
        ),
    )
    region: str = field(
        default="us-east-1",
        metadata=setting(
            parse=parse_region,
            help="Region name the S3 gateway reports and expects in signatures.",
            metavar="NAME",
        ),
    )
    meta_sync: str = field(
        default="group",
        metadata=setting(
            parse=parse_choice("group", "commit", "durability-points"),
            help="When metadata reaches stable storage: group (group commit: changes are "
            "written in durable groups every few milliseconds and at once at every "
            "durability point — fsync, close of a written file, an S3 acknowledgement; a "
            "crash loses at most the last few milliseconds of changes nobody waited for), "
            "commit (every transaction fdatasynced before it returns: ~4,000/s) or "
            "durability-points (no fdatasync between durability points; a machine crash "
            "can corrupt the metadata store: scratch nodes only).",
            metavar="group|commit|durability-points",
        ),
    )
    meta_map_size: int = field(
        default=64 << 30,
        metadata=setting(
            parse=parse_size,
            help="Largest size of the metadata store (lmdb's map: address space, the file "
            "grows as needed).  When it is full, changes that add metadata fail with ENOSPC "
            "(S3 507 InsufficientStorage) and deletions still work; raise it and restart.  "
            "Never smaller than the store already is.",
            metavar="SIZE",
        ),
    )
    meta_url: str = field(
        default="",
        metadata=setting(
            parse=parse_meta_url,
            help="Where the metadata lives: empty for the embedded lmdb store in meta_dir "
            "(the default; no database needed), or a PostgreSQL database, "
            "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (libpq URL parameters allowed, e.g. "
            "?sslmode=require or ?options=-csearch_path%3DSCHEMA), which every node of a "
            "cluster names.  Its tables are created, or migrated, at start.  Every "
            "transaction is then one database transaction, durable when it returns: "
            "meta_sync's group commit does not apply (a per-node overlay would let two nodes "
            "hand out the same inode numbers).",
            secret=True,  # it may carry a password
            metavar="postgresql://USER@HOST:PORT/DB",
        ),
    )
    node_name: str = field(
        default="",
        metadata=setting(
            parse=parse_node_name,
            help="This node's name in a cluster (several daemons sharing one meta_url "
            "database; docs/cluster.md): 1-32 of a-z, 0-9 and '-', starting with a letter or "
            "digit, unique in the cluster and kept across restarts (the node's unpersisted "
            "files are recorded under it).  Empty: a single node.  Required with meta_url.",
            metavar="NAME",
        ),
    )
    peer_listen: HostPort | None = field(
        default=None,
        metadata=setting(
            parse=parse_optional_host_port,
            help="HOST:PORT of the peer data door, from which the other nodes of a cluster "
            "read the bytes this node holds and has not yet persisted (port 0: any free "
            "port).  Empty: off (a single node).  Required with node_name.",
            metavar="HOST:PORT",
        ),
    )
    peer_url: str = field(
        default="",
        metadata=setting(
            parse=parse_http_url,
            help="How the other nodes reach this node's peer data door (default: "
            "http://PEER_LISTEN with the port it got; set it when they must use another "
            "address, e.g. the node's host name when peer_listen is 0.0.0.0).",
            metavar="URL",
        ),
    )
    cluster_secret: str = field(
        default="",
        metadata=setting(
            parse=parse_optional_str,
            help="The secret every node of a cluster shares: it signs the requests of the "
            "peer data door.  Required with node_name; at least 16 characters.",
            secret=True,
            metavar="SECRET",
        ),
    )
    s3_domain: tuple[str, ...] = field(
        default=(),
        metadata=setting(
            parse=parse_domains,
            help="Domain(s) for virtual-host-style S3 addressing (BUCKET.DOMAIN), "
            "comma-separated; empty: path style only.",
            metavar="DOMAIN[,DOMAIN]",
        ),
    )
    s3_max_clock_skew: int = field(
        default=900,
        metadata=setting(
            parse=parse_int(1, 7 * 24 * 3600),
            help="Seconds a signed S3 request's time may differ from the server's "
            "(RequestTimeTooSkewed beyond).",
            metavar="SECONDS",
        ),
    )
    s3_allow_sigv2: str = field(
        default="presigned",
        metadata=setting(
            parse=parse_choice("presigned", "all", "off"),
            help="Signature Version 2 on the S3 gateway: presigned (presigned GET, HEAD and "
            "PUT URLs and POST forms only), all (also the Authorization header and every "
            "method) or off.",
            metavar="presigned|all|off",
        ),
    )
    s3_min_part_size: int = field(
        default=5 << 20,
        metadata=setting(
            parse=parse_size,
            help='Smallest size of a multipart part other than the last (e.g. "5MiB").',
            metavar="SIZE",
        ),
    )
    s3_idle_timeout: float = field(
        default=60.0,
        metadata=setting(
            parse=parse_float(0.1, 24 * 3600),
            help="Seconds an S3 connection may stay idle, or take to send a request's "
            "headers, before it is closed.",
            metavar="SECONDS",
        ),
    )
    s3_body_timeout: float = field(
        default=60.0,
        metadata=setting(
            parse=parse_float(0.1, 24 * 3600),
            help="Seconds an S3 request body may stall (no bytes arriving) before the "
            "request fails with RequestTimeout.",
            metavar="SECONDS",
        ),
    )
    s3_complete_keepalive: float = field(
        default=10.0,
        metadata=setting(
            parse=parse_float(0.1, 3600),
            help="Seconds a CompleteMultipartUpload may run before its answer starts, as S3's "
            "does: 200 and the XML declaration, then a space every half that time until "
            "the result or the error, so clients and load balancers keep the connection.",
            metavar="SECONDS",
        ),
    )
    lifecycle_interval: float = field(
        default=3600.0,
        metadata=setting(
            parse=parse_float(0.01, 7 * 24 * 3600),
            help="Seconds between passes of the lifecycle job, which applies the buckets' S3 "
            "lifecycle rules (expiration, aborting old multipart uploads, noncurrent "
            "versions); rules count whole days, so hourly passes act within an hour of "
            "midnight UTC.",
            metavar="SECONDS",
        ),
    )
    meta_dir: Path = field(
        default=DERIVED,
        metadata=setting(
            derive=lambda c: c.data_dir / "meta",
            parse=parse_path,
            help="Metadata engine directory (default: DATA_DIR/meta).",
            metavar="DIR",
        ),
    )
    hot_dir: Path = field(
        default=DERIVED,
        metadata=setting(
            derive=lambda c: c.data_dir / "hot",
            parse=parse_path,
            help="Hot (NVMe) tier directory (default: DATA_DIR/hot).",
            metavar="DIR",
        ),
    )
    warm_dir: Path = field(
        default=DERIVED,
        metadata=setting(
            derive=lambda c: c.data_dir / "warm",
            parse=parse_path,
            help="Warm (SSD) tier directory (default: DATA_DIR/warm).",
            metavar="DIR",
        ),
    )
    cold_dir: Path = field(
        default=DERIVED,
        metadata=setting(
            derive=lambda c: c.data_dir / "cold",
            parse=parse_path,
            help="Cold tier directory, the local object store (default: DATA_DIR/cold).",
            metavar="DIR",
        ),
    )
    cold_url: str = field(
        default=DERIVED,
        metadata=setting(
            derive=lambda c: "file://" + str(c.cold_dir),
            parse=parse_cold_url,
            help="Cold store, the system of record: file:///DIR, s3://BUCKET/PREFIX, s3:// "
            "(one S3 bucket per tierd bucket) or another fsspec URL (default: "
            "file://COLD_DIR).",
            metavar="URL",
        ),
    )
    cold_s3_endpoint: str = field(
        default="",
        metadata=setting(
            parse=parse_http_url,
            help="S3 endpoint of the cold store (MinIO, Ceph RGW); empty: AWS.",
            metavar="URL",
        ),
    )
    cold_s3_region: str = field(
        default="",
        metadata=setting(
            parse=parse_optional_region,
            help="Region of the cold S3 store; empty: boto3's default (AWS_REGION, config).",
            metavar="REGION",
        ),
    )
    cold_s3_access_key: str = field(
        default="",
        metadata=setting(
            parse=parse_optional_str,
            help="Access key for the cold S3 store; empty: boto3's credential chain.",
            metavar="KEY",
        ),
    )
    cold_s3_secret_key: str = field(
        default="",
        metadata=setting(
            parse=parse_optional_str,
            help="Secret key for the cold S3 store; empty: boto3's credential chain.",
            secret=True,
            metavar="SECRET",
        ),
    )
    cold_s3_addressing: str = field(
        default="auto",
        metadata=setting(
            parse=parse_choice("auto", "path", "virtual"),
            help="S3 addressing style: auto, path (MinIO, Ceph) or virtual (BUCKET.HOST).",
            metavar="auto|path|virtual",
        ),
    )
    cold_s3_retry_mode: str = field(
        default="standard",
        metadata=setting(
            parse=parse_choice("standard", "adaptive"),
            help="botocore retry mode: standard (backoff with jitter) or adaptive (also "
            "rate-limits itself when throttled).",
            metavar="standard|adaptive",
        ),
    )
    cold_s3_max_attempts: int = field(
        default=5,
        metadata=setting(
            parse=parse_int(1, 50),
            help="Tries per S3 request (first try included) before the store counts as "
            "unavailable.",
            metavar="N",
        ),
    )
    cold_s3_checksum: str = field(
        default="crc32",
        metadata=setting(
            parse=parse_choice("crc32", "md5"),
            help="How the store checks multipart upload parts: crc32 (S3 flexible "
            "checksums) or md5 (Content-MD5, for stores without flexible checksums).",
            metavar="crc32|md5",
        ),
    )
    cold_multipart_threshold: int = field(
        default=64 << 20,
        metadata=setting(
            parse=parse_size,
            help='Files at least this large are uploaded to cold in parts (e.g. "64MiB").',
            metavar="SIZE",
        ),
    )
    cold_part_size: int = field(
        default=16 << 20,
        metadata=setting(
            parse=parse_size,
            help='Part size of multipart uploads to cold (S3: at least "5MiB").',
            metavar="SIZE",
        ),
    )
    cold_range_size: int = field(
        default=8 << 20,
        metadata=setting(
            parse=parse_size,
            help="Size of each ranged GET when large reads from cold run in parallel.",
            metavar="SIZE",
        ),
    )
    cold_concurrency: int = field(
        default=16,
        metadata=setting(
            parse=parse_int(1, 256),
            help="Parallel ranged GETs / part uploads per cold transfer.",
            metavar="N",
        ),
    )
    cold_timeout: float = field(
        default=30.0,
        metadata=setting(
            parse=parse_float(0.1, 3600),
            help="Seconds a cold-store metadata call (list, head, delete, probe) may take, "
            "retries included, and a transfer may go without progress, before the store "
            "counts as unreachable (persisting pauses, /v1/tiers and status say so).",
            metavar="SECONDS",
        ),
    )
    cold_probe_interval: float = field(
        default=10.0,
        metadata=setting(
            parse=parse_float(0.1, 3600),
            help="An idle cold store is asked whether it answers this often, so a hung or "
            "stopped store shows as unreachable even when nothing uses it.",
            metavar="SECONDS",
        ),
    )
    cold_s3_connect_timeout: float = field(
        default=5.0,
        metadata=setting(
            parse=parse_float(0.1, 600),
            help="Seconds to open a connection to the cold S3 store (each try).",
            metavar="SECONDS",
        ),
    )
    cold_s3_read_timeout: float = field(
        default=20.0,
        metadata=setting(
            parse=parse_float(0.1, 3600),
            help="Seconds the cold S3 store may go without sending a byte of an answer "
            "(each try) before the try fails.",
            metavar="SECONDS",
        ),
    )
    hot_capacity: int = field(
        default=0,
        metadata=setting(
            parse=parse_size,
            help="Bytes the hot tier may use; 0: the size of its file system.",
            metavar="SIZE",
        ),
    )
    warm_capacity: int = field(
        default=0,
        metadata=setting(
            parse=parse_size,
            help="Bytes the warm tier may use; 0: the size of its file system.",
            metavar="SIZE",
        ),
    )
    warm_enabled: bool = field(
        default=False,
        metadata=setting(parse=parse_bool, metavar="BOOL",
                         help="Use warm_dir as a warm (SSD) tier below hot: hot evicts by "
                              "demoting blocks there. Off: no warm tier."),
    )
    warm_high_watermark: int = field(
        default=90,
        metadata=setting(parse=parse_int(1, 100), metavar="PERCENT",
                         help="Eviction from the warm tier starts when it is fuller than this."),
    )
    warm_low_watermark: int = field(
        default=80,
        metadata=setting(parse=parse_int(0, 100), metavar="PERCENT",
                         help="Eviction frees the warm tier down to this."),
    )
    dirty_limit: int = field(
        default=1 << 30,
        metadata=setting(parse=parse_size, metavar="SIZE",
                         help="Bytes written but not yet in cold before writers wait "
                              "(FUSE) or get 503 SlowDown (S3)."),
    )
    import_ttl: int = field(
        default=5,
        metadata=setting(parse=parse_int(0, 86400), metavar="SECONDS",
                         help="How long a directory's listing of cold stays fresh for import."),
    )
    io_threads: int = field(
        default=32,
        metadata=setting(parse=parse_int(1, 1024), metavar="N",
                         help="Threads for blocking file calls (writes of large requests, "
                         "fsync, cold-disk reads): they wait on the disk, not the CPU."),
    )
    persist_delay: float = field(
        default=5.0,
        metadata=setting(parse=parse_float(0, 3600), metavar="SECONDS",
                         help="How long a written file waits before write-back uploads it "
                         "(from when it was first changed, like the kernel's dirty expiry): "
                         "files removed or rewritten within it never reach the cold store. "
                         "0: at once. While files keep being written or removed it waits for a "
                         "pause, at most as long again. No wait for write-through, persist "
                         "--wait, or when dirty data passes half of dirty_limit."),
    )
    persist_parallel: int = field(
        default=4,
        metadata=setting(parse=parse_int(1, 256), metavar="N",
                         help="Files uploaded to cold at once."),
    )
    hot_high_watermark: int = field(
        default=90,
        metadata=setting(parse=parse_int(1, 100), metavar="PERCENT",
                         help="Eviction starts when the hot tier is fuller than this."),
    )
    hot_low_watermark: int = field(
        default=80,
        metadata=setting(parse=parse_int(0, 100), metavar="PERCENT",
                         help="Eviction frees the hot tier down to this."),
    )

    pool_capacity: int = field(
        default=1 << 30, metadata=setting(parse=parse_size, metavar="SIZE", help=(
            "Bytes of shared memory in the memory pool (regions, checkpoints).")))
    pool_socket: Path = field(
        default=DERIVED, metadata=setting(
            derive=_default_pool_socket, parse=parse_path, metavar="PATH",
            help="Unix socket of the memory pool (default: DATA_DIR/pool.sock; "
                 "/run/tierd/pool.sock for root with the default data_dir)."))
    pool_default_quota: int = field(
        default=0, metadata=setting(parse=parse_size, metavar="SIZE", help=(
            "Pool bytes a tenant (uid) without its own quota may hold; 0: the whole pool.")))
    pool_latency_us: float = field(
        default=0.0, metadata=setting(parse=parse_float(0, 1e6), metavar="MICROSECONDS",
                                      help="Far-memory emulation: added latency per batch "
                                      "the daemon moves in or out of the pool (0: off)."))
    pool_bandwidth: int = field(
        default=0, metadata=setting(parse=parse_size, metavar="SIZE", help=(
            "Far-memory emulation: bytes/s cap on the daemon's pool moves (0: off).")))
    pool_mem_tier_share: float = field(
        default=0.5, metadata=setting(parse=parse_float(0, 1), metavar="FRACTION", help=(
            "Largest file the memory tier (policies with tier mem) copies into the pool, "
            "as a fraction of pool_capacity; larger files stay on hot.")))
    ckpt_keep_local: int = field(
        default=2, metadata=setting(parse=parse_int(1, 10**6), metavar="N", help=(
            "Checkpoints per run kept in the pool and hot tier (default per run).")))
    ckpt_keep_cold: int = field(
        default=0, metadata=setting(parse=parse_int(0, 10**6), metavar="N", help=(
            "Checkpoints per run kept in cold; older ones are deleted (0: all).")))

    def __post_init__(self) -> None:
        # Fill derived defaults now that the settings they depend on are known.
        for f in dataclasses.fields(self):
            info = f.metadata[_META_KEY]
            if info.derive is not None and getattr(self, f.name) is DERIVED:
                object.__setattr__(self, f.name, info.derive(self))

    @property
    def lock_file(self) -> Path:
        """Held (flock) by the running daemon; contains its PID."""
        return self.data_dir / "tierd.lock"

    @property
    def endpoints_file(self) -> Path:
        """Written by the running daemon: the addresses it actually listens on."""
        return self.data_dir / "endpoints.json"

    def as_dict(self) -> dict[str, object]:
        """Settings as TOML-compatible plain values (secrets redacted)."""
        out: dict[str, object] = {}
        for spec in SETTINGS:
            value = getattr(self, spec.name)
            if spec.info.secret:
                out[spec.name] = "<redacted>"
            elif isinstance(value, Path | HostPort):
                out[spec.name] = str(value)
            elif isinstance(value, tuple):
                out[spec.name] = ",".join(value)
            elif spec.name == "umask":
                out[spec.name] = f"{value:03o}"
            else:
                out[spec.name] = "" if value is None else value
        return out


class Setting(NamedTuple):
    """A setting as the outside world sees it: key, env var, CLI flag and table entry."""

    name: str
    env: str
    flag: str
    info: SettingInfo[Any]


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(
        name=f.name,
        env=ENV_PREFIX + f.name.upper(),
        flag="--" + f.name.replace("_", "-"),
        info=f.metadata[_META_KEY],
    )
    for f in dataclasses.fields(Config)
)
_BY_NAME = {s.name: s for s in SETTINGS}
_BY_ENV = {s.env: s for s in SETTINGS}


# --- loading --------------------------------------------------------------------------------


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _unknown_setting(key: str, source: str) -> ConfigError:
    known = list(_BY_NAME)
    return ConfigError(
        f"unknown setting {key!r} ({source}){_did_you_mean(key, known)}; "
        f"known settings: {', '.join(known)}",
        key=key,
        source=source,
    )


def _unknown_env(name: str) -> ConfigError:
    known = sorted(_BY_ENV)
    return ConfigError(
        f"unknown environment variable {name}: not a tierd setting"
        f"{_did_you_mean(name, known)}; settings: {', '.join(known)}; "
        f"other TIERD_ variables: {', '.join(sorted(NON_SETTING_ENV))}",
        key=name,
        source=f"environment variable {name}",
    )


def _parse_one(
    spec: Setting, raw: object, source: str, ctx: ParseContext, values: dict[str, object],
    sources: dict[str, str] | None = None,
) -> None:
    if sources is not None:
        sources[spec.name] = source  # what check_config names when a combination fails
    try:
        values[spec.name] = spec.info.parse(raw, ctx)
    except ValueError as e:
        shown = "" if spec.info.secret else f" = {raw!r}"
        raise ConfigError(
            f"invalid {spec.name}{shown} ({source}): {e}", key=spec.name, source=source
        ) from None


def read_config_file(path: Path, values: dict[str, object],
                     sources: dict[str, str] | None = None) -> None:
    """Parse the TOML file at ``path`` into ``values`` (settings keyed by name; ``sources``
    records where each came from)."""
    src = f"config file {path}"
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{src}: no such file", source=src) from None
    except OSError as e:
        raise ConfigError(f"{src}: cannot read: {e.strerror}", source=src) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{src}: invalid TOML: {e}", source=src) from None
    ctx = ParseContext(base_dir=path.parent)
    for key, raw in doc.items():
        spec = _BY_NAME.get(key)
        if spec is None:
            raise _unknown_setting(key, src)
        _parse_one(spec, raw, src, ctx, values, sources)


def load_config(
    *,
    cli: Mapping[str, object | None] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
    cwd: Path | None = None,
) -> Config:
    """Build the effective :class:`Config` from all sources.

    ``cli`` maps setting names to command-line values (``None`` = not given); ``env``
    defaults to ``os.environ``; ``config_file`` (from ``--config``) beats ``TIERD_CONFIG``.
    Raises :class:`ConfigError` naming the key and source of the first bad value, or of
    the first combination of values that cannot work together
    (:func:`tierd.config_check.check_config`).
    """
    env = os.environ if env is None else env
    ctx = ParseContext(base_dir=cwd or Path.cwd())
    values: dict[str, object] = {}
    sources: dict[str, str] = {}

    # 1. config file
    path_raw: str | None = None
    if config_file is not None and str(config_file) != "":
        path_raw = str(config_file)
    elif env.get("TIERD_CONFIG"):
        path_raw = env["TIERD_CONFIG"]
    if path_raw is not None:
        read_config_file(Path(os.path.normpath(ctx.base_dir / Path(path_raw).expanduser())), values,
                         sources)

    # 2. environment
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in NON_SETTING_ENV:
            continue
        spec = _BY_ENV.get(name)
        if spec is None:
            raise _unknown_env(name)
        _parse_one(spec, env[name], f"environment variable {name}", ctx, values, sources)

    # 3. command line
    for key, raw in (cli or {}).items():
        if raw is None:
            continue
        spec = _BY_NAME.get(key)
        if spec is None:
            raise _unknown_setting(key, "command line")
        _parse_one(spec, raw, f"command-line option {spec.flag}", ctx, values, sources)

    config = Config(**values)  # type: ignore[arg-type]
    check_config(config, sources)
    return config


__all__ = [
    "DERIVED",
    "ENV_PREFIX",
    "NON_SETTING_ENV",
    "SETTINGS",
    "_META_KEY",
    "Config",
    "ConfigError",
    "HostPort",
    "ParseContext",
    "Parser",
    "Setting",
    "SettingInfo",
    "load_config",
    "parse_bool",
    "parse_choice",
    "parse_cold_url",
    "parse_domains",
    "parse_host_port",
    "parse_http_url",
    "parse_int",
    "parse_optional_path",
    "parse_optional_region",
    "parse_optional_str",
    "parse_path",
    "parse_region",
    "parse_size",
    "parse_str",
    "parse_umask",
    "read_config_file",
    "setting",
]
