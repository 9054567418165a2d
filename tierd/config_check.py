"""Checks of a loaded configuration as a whole: values each parser accepted alone, but that
cannot work together (or with the machine), rejected at load with a :class:`ConfigError`
naming the key and where its value came from -- never a traceback at start-up.

Each parser in :mod:`tierd.config_parsers` sees one value.  What only the combination
decides lives here: a low watermark above its high one, two directories the daemon would
mix up (a tier inside another, the mount over the data), ``cold_s3_*`` settings that an
``s3://``-less ``cold_url`` would silently ignore, transfer sizes the cold store refuses,
and a ``cold_url`` whose file system cannot be opened at all (``bogus://``, an FTP host
that does not resolve).  :func:`check_config` runs at the end of
:func:`tierd.config.load_config`, so ``tierd serve`` and ``tierd mount`` both answer with
one line and exit 2.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tierd.config_parsers import ConfigError

if TYPE_CHECKING:
    from tierd.config import Config

#: S3's limits on the parts of a multipart upload (the cold store's and the gateway's)
S3_MIN_PART = 5 << 20
S3_MAX_PART = 5 << 30
#: seconds an fsspec cold store may take to open while the configuration is checked
PROBE_TIMEOUT = 15.0
#: URL schemes opened without fsspec (tierd.tiers.open_object_tier)
_NATIVE = ("file", "s3", "s3a")


def _where(name: str, sources: Mapping[str, str]) -> str:
    return sources.get(name, "default")


def _fail(name: str, value: object, sources: Mapping[str, str], why: str) -> ConfigError:
    src = _where(name, sources)
    return ConfigError(f"invalid {name} = {value!r} ({src}): {why}", key=name, source=src)


def _within(inner: Path, outer: Path) -> bool:
    """``inner`` is ``outer`` or below it (paths are already absolute and normalized)."""
    return inner == outer or outer in inner.parents


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def _cold_path(c: Config) -> Path | None:
    """The directory of a ``file://`` cold store (None for other stores)."""
    if _scheme(c.cold_url) != "file":
        return None
    return Path(c.cold_url.split("://", 1)[1]) if "://" in c.cold_url else Path(c.cold_url)


def check_config(c: Config, sources: Mapping[str, str], *, probe: bool = True) -> None:
    """Raise :class:`ConfigError` for the first combination that cannot work.  ``sources``
    maps a setting to where its value came from (absent: the default); ``probe`` opens an
    fsspec cold store once to see that it can be opened."""
    _watermarks(c, sources)
    _sizes(c, sources)
    _cold_settings(c, sources)
    _addresses(c, sources)
    _directories(c, sources)
    _socket(c, sources)
    _cluster(c, sources)
    if probe:
        _probe_cold(c, sources)


def _cluster(c: Config, sources: Mapping[str, str]) -> None:
    """A node of a cluster (node_name) shares its namespace through a database every node
    reaches, serves its unpersisted bytes on the peer door and signs with the shared
    secret; without one of them the other nodes could not read what it writes."""
    if not c.node_name:
        for name in ("peer_listen", "peer_url", "cluster_secret"):
            if name in sources and getattr(c, name):
                raise _fail(name, "<redacted>" if name == "cluster_secret" else
                            str(getattr(c, name)), sources,
                            "only a node of a cluster uses it: set node_name too")
        return
    if not c.meta_url:
        raise _fail("node_name", c.node_name, sources,
                    "a cluster shares its namespace in a PostgreSQL database: set meta_url "
                    "(docs/cluster.md); the embedded lmdb store belongs to one node")
    if c.peer_listen is None:
        raise _fail("node_name", c.node_name, sources,
                    "a node of a cluster serves its unpersisted bytes to the others: set "
                    "peer_listen (HOST:PORT)")
    if len(c.cluster_secret) < 16:
        raise _fail("cluster_secret", "<redacted>", sources,
                    "a node of a cluster needs the cluster's shared secret, at least 16 "
                    "characters (TIERD_CLUSTER_SECRET)")


def _watermarks(c: Config, sources: Mapping[str, str]) -> None:
    for tier in ("hot", "warm"):
        high: int = getattr(c, f"{tier}_high_watermark")
        low: int = getattr(c, f"{tier}_low_watermark")
        if low >= high:
            name = (f"{tier}_low_watermark" if f"{tier}_low_watermark" in sources
                    else f"{tier}_high_watermark")
            raise _fail(name, getattr(c, name), sources,
                        f"{tier}_low_watermark ({low}, {_where(f'{tier}_low_watermark', sources)}"
                        f") must be below {tier}_high_watermark ({high}, "
                        f"{_where(f'{tier}_high_watermark', sources)}): eviction starts above "
                        "the high mark and frees down to the low one")


def _sizes(c: Config, sources: Mapping[str, str]) -> None:
    for name in ("cold_part_size", "cold_range_size", "cold_multipart_threshold",
                 "dirty_limit"):
        if getattr(c, name) <= 0:
            raise _fail(name, getattr(c, name), sources, "must be larger than 0")
    if c.s3_min_part_size > S3_MAX_PART:
        raise _fail("s3_min_part_size", c.s3_min_part_size, sources,
                    f"a part is at most {S3_MAX_PART} bytes (5 GiB): no upload could complete")
    if _scheme(c.cold_url) in ("s3", "s3a") and not (
            S3_MIN_PART <= c.cold_part_size <= S3_MAX_PART):
        raise _fail("cold_part_size", c.cold_part_size, sources,
                    f"an s3:// cold store takes parts of 5 MiB to 5 GiB ({S3_MIN_PART} to "
                    f"{S3_MAX_PART} bytes)")


def _cold_settings(c: Config, sources: Mapping[str, str]) -> None:
    s3 = _scheme(c.cold_url) in ("s3", "s3a")
    for name in ("cold_s3_endpoint", "cold_s3_region", "cold_s3_access_key",
                 "cold_s3_secret_key"):
        value = getattr(c, name)
        if value and not s3:
            shown = "<redacted>" if name == "cold_s3_secret_key" else value
            raise _fail(name, shown, sources,
                        f"cold_s3_* settings apply to s3:// cold stores only, and cold_url is "
                        f"{c.cold_url!r} ({_where('cold_url', sources)}): set cold_url too, "
                        "or remove this setting")
    if bool(c.cold_s3_access_key) != bool(c.cold_s3_secret_key):
        name = "cold_s3_access_key" if c.cold_s3_access_key else "cold_s3_secret_key"
        other = "cold_s3_secret_key" if c.cold_s3_access_key else "cold_s3_access_key"
        shown = "<redacted>" if name == "cold_s3_secret_key" else getattr(c, name)
        raise _fail(name, shown, sources, f"set {other} as well (or neither, for boto3's "
                    "credential chain)")


def _addresses(c: Config, sources: Mapping[str, str]) -> None:
    s3, admin = c.s3_listen, c.admin_listen
    if s3.port and s3.port == admin.port and (
            s3.host == admin.host or "0.0.0.0" in (s3.host, admin.host)
            or "::" in (s3.host, admin.host)):
        name = "admin_listen" if "admin_listen" in sources else "s3_listen"
        raise _fail(name, str(getattr(c, name)), sources,
                    f"s3_listen ({s3}) and admin_listen ({admin}) cannot share a port")


def _directories(c: Config, sources: Mapping[str, str]) -> None:
    """The metadata and tier directories must be distinct and not nested (a tier inside
    another would read the other's files as its own), and the mount must hide none of
    them (the daemon would wait on its own mount)."""
    dirs: list[tuple[str, Path]] = [("meta_dir", c.meta_dir), ("hot_dir", c.hot_dir),
                                    ("warm_dir", c.warm_dir)]
    cold = _cold_path(c)
    if cold is not None:
        dirs.append(("cold_url" if "cold_url" in sources else "cold_dir",
                     Path(os.path.normpath(cold))))
    for i, (a, pa) in enumerate(dirs):
        for b, pb in dirs[i + 1:]:
            if _within(pa, pb) or _within(pb, pa):
                name, other, path = (b, a, pb) if b in sources or a not in sources else (
                    a, b, pa)
                raise _fail(name, str(path), sources,
                            f"overlaps {other} ({dict(dirs)[other]}): every tier and the "
                            "metadata need a directory of their own")
    if c.mount is None:
        return
    mnt = c.mount
    for name, path in [("data_dir", c.data_dir), *dirs]:
        if _within(path, mnt) or (_within(mnt, path) and name != "data_dir"):
            raise _fail("mount", str(mnt), sources,
                        f"the mount would {'hide' if _within(path, mnt) else 'lie inside'} "
                        f"{name} ({path}); mount the namespace somewhere else")


#: the longest path a unix socket may have (sun_path holds 108 bytes with the NUL)
MAX_SOCKET_PATH = 107


def _socket(c: Config, sources: Mapping[str, str]) -> None:
    """The pool's socket path must fit a unix socket address (a deep data directory makes
    the default one too long)."""
    n = len(os.fsencode(c.pool_socket))
    if n > MAX_SOCKET_PATH:
        raise _fail("pool_socket" if "pool_socket" in sources else "data_dir",
                    str(c.pool_socket if "pool_socket" in sources else c.data_dir), sources,
                    f"the pool's socket path {c.pool_socket} is {n} bytes; a unix socket "
                    f"path has at most {MAX_SOCKET_PATH}: set pool_socket to a shorter path")


def _probe_cold(c: Config, sources: Mapping[str, str]) -> None:
    """Open an fsspec cold store once (``s3://`` and ``file://`` are checked by the rules
    above and open without network): an unknown protocol, a missing driver or a host that
    cannot be reached are configuration errors, not a traceback at start-up."""
    if _scheme(c.cold_url) in _NATIVE:
        return

    def open_store() -> None:
        import fsspec

        fsspec.core.url_to_fs(c.cold_url)

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tierd-config")
    try:
        pool.submit(open_store).result(PROBE_TIMEOUT)
    except concurrent.futures.TimeoutError:
        raise _fail("cold_url", c.cold_url, sources,
                    f"the cold store did not open within {PROBE_TIMEOUT:.0f} s") from None
    except Exception as e:  # whatever the driver raises: its message is the answer
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _fail("cold_url", c.cold_url, sources,
                    f"cannot open the cold store: {type(e).__name__}: {why}") from None
    finally:
        pool.shutdown(wait=False)
