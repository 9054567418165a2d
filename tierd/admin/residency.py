"""``GET /v1/placement/ls?prefix=P[&limit=N]``: where each file under a prefix is
(``tierctl ls``).

``du`` answers "how many bytes of this prefix are on each tier"; an operator chasing a slow
epoch or checking that a warmup did what it should needs the same per file: how much of it
is in the memory tier, on hot, on warm, whether cold has this version, whether it is dirty,
and the placement policy that applies to it.

The walk is bounded: it stops after ``limit`` files (default :data:`DEFAULT_LIMIT`, at most
:data:`MAX_LIMIT`) and says ``truncated`` when there are more, so a prefix of millions of
files costs ``limit`` files, not a walk of the data set on the event loop.  The files
returned are those the walk met first, sorted by key; narrow the prefix to see others.
"""

from __future__ import annotations

from typing import Any

from tierd.meta import STATE_CLEAN, STATE_DIRTY, STATE_PERSISTING, Inode, MetaTxn
from tierd.placement import bitmap
from tierd.placement.engine import HOT, WARM
from tierd.placement.memtier import MEM
from tierd.placement.ops import PlacementOps
from tierd.placement.paths import file_keys, files_under

DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000
_STATES = {STATE_DIRTY: "dirty", STATE_PERSISTING: "persisting", STATE_CLEAN: "clean"}


def parse_limit(raw: str | None) -> int:
    """The ``limit`` query parameter; ValueError with the rule otherwise."""
    if raw is None:
        return DEFAULT_LIMIT
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_LIMIT:
        raise ValueError(f"limit must be a number from 1 to {MAX_LIMIT}")
    return n


def _bytes(bm: bytes | None, size: int) -> int:
    return sum(bitmap.block_bytes(size, b) for b in bitmap.present(bm, size))


def _file_doc(o: PlacementOps, tx: MetaTxn, inode: Inode, key: str) -> dict[str, Any]:
    p = o.p
    mem = p.mem is not None and p.mem.get(inode.ino, inode.version) is not None
    cold = tx.get_cold(inode.ino)
    in_cold = cold is not None and cold.version == inode.version
    pol = p.policy_for(key)
    return {
        "key": key, "ino": inode.ino, "size": inode.size, "version": inode.version,
        # an empty file has nothing to persist (state none): it is as good as clean
        "state": _STATES.get(inode.state, "clean"),
        "tiers": {MEM: inode.size if mem else 0,
                  HOT: _bytes(inode.blocks.get(HOT), inode.size),
                  WARM: _bytes(inode.blocks.get(WARM, b""), inode.size),
                  "cold": inode.size if in_cold else 0},
        "policy": {"mode": pol.mode, "pin": pol.pin, "tier": pol.tier},
    }


def ls_doc(o: PlacementOps, prefix: str, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """The ``GET /v1/placement/ls`` document (see the module docstring)."""
    p = o.p
    found: list[tuple[str, Inode]] = []
    truncated = False
    with p.meta.snapshot() as tx:
        for inode in files_under(tx, prefix):
            if len(found) == limit:
                truncated = True
                break
            keys = file_keys(tx, inode.ino)
            found.append((keys[0] if keys else f"(ino {inode.ino})", inode))
        found.sort(key=lambda kv: kv[0])
        files = [_file_doc(o, tx, inode, key) for key, inode in found]
    tiers = ([MEM] if p.mem is not None else []) + [tc.name for tc in p.tiers()] + ["cold"]
    return {"prefix": prefix, "files": files, "truncated": truncated, "limit": limit,
            "tiers": tiers}
