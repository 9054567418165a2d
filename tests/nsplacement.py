"""A started namespace over a data directory, with the placement the daemon gives it.

The daemon always builds its namespace over a placement (a hot tier caching a cold store,
the system of record: :func:`tierd.placement.ops.placement_from_config`).  Tests and
benchmarks that open a :class:`~tierd.namespace.Namespace` without the daemon build it the
same way here, in one of two placements (:data:`PLACEMENTS`):

``hot-only``
    every byte stays on hot while the test runs: the persister waits an hour before it
    uploads a file, so the embedded ``file://`` cold store stays empty (the namespace still
    goes through every placement hook: queueing, admission, reads, cold listings);
``file-cold``
    write-back at once into a ``file://`` cold store in the data directory, and cold
    listings never cached: uploads, renames and deletes of cold objects run concurrently
    with the test's operations, and every lookup miss and listing asks the cold store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tierd.config import Config
from tierd.meta import MetaStore
from tierd.namespace import Namespace
from tierd.placement.ops import placement_from_config

PLACEMENTS: dict[str, dict[str, Any]] = {
    "hot-only": {"persist_delay": 3600.0},
    "file-cold": {"persist_delay": 0.0, "import_ttl": 0},
}


def placement_config(data_dir: Path, kind: str = "hot-only", **settings: Any) -> Config:
    """The daemon's settings for ``data_dir`` (hot in ``hot/``, cold in ``cold/``) with the
    placement ``kind`` and ``settings`` on top."""
    return Config(data_dir=Path(data_dir), **{**PLACEMENTS[kind], **settings})


async def open_namespace(meta: MetaStore, data_dir: Path, kind: str = "hot-only", *,
                         umask: int = 0o022, **settings: Any) -> Namespace:
    """A loaded namespace over ``meta`` and a started placement in ``data_dir``; close it
    with :func:`close_namespace` (the store stays the caller's)."""
    cfg = placement_config(data_dir, kind, **settings)
    for d in (cfg.hot_dir, cfg.cold_dir):
        d.mkdir(parents=True, exist_ok=True)
    p = await placement_from_config(cfg, meta)
    try:
        return await Namespace.load(meta, cfg.hot_dir, umask=umask, placement=p)
    except BaseException:
        await p.shutdown()
        raise


async def close_namespace(ns: Namespace) -> None:
    """Close ``ns``, then stop its placement (the persist queue stays for the next open),
    in the daemon's order."""
    try:
        await ns.close()
    finally:
        await ns.placement.shutdown()


async def abandon_namespace(ns: Namespace) -> None:
    """What a killed daemon leaves of ``ns``: its handles are never released and nothing
    is flushed; only the placement's tasks stop (a killed process runs none)."""
    await ns.placement.shutdown()
