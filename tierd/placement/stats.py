"""Placement's running counters (``Placement.stats``): one typed field per figure.

They feed ``/metrics`` (:mod:`tierd.metrics`), ``GET /v1/tiers`` and the ``placement.stats``
part of ``/v1/status``.  Figures kept per tier are counters keyed by tier name, so the
metrics read the labels from the keys instead of parsing them back out of a name.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields


@dataclass
class PlacementStats:
    """Counts since start (never reset), each updated where the event happens."""

    #: reads served by hot without fetching (tierd_tier_hits_total{tier="hot"})
    hits: int = 0
    #: reads that had to fetch blocks from warm or cold (tierd_tier_misses_total)
    misses: int = 0
    #: warm blocks promoted to hot on their second reference
    promoted_blocks: int = 0
    #: bytes read from warm
    warm_read_bytes: int = 0
    #: bytes read from the cold store
    fetched_bytes: int = 0
    #: bytes read from other nodes of a cluster (versions they hold, not yet in cold)
    peer_read_bytes: int = 0
    #: ranges served to other nodes of a cluster from this node's hot tier
    peer_served_bytes: int = 0
    #: failed cold reads (tierd_cold_store_errors_total{operation="read"})
    cold_read_errors: int = 0
    #: failed uploads, retried (tierd_cold_store_errors_total{operation="persist"})
    persist_failures: int = 0
    #: bytes evicted from hot to make room for a write
    write_evicted_bytes: int = 0
    #: writes refused because hot was full of what cannot be evicted
    write_full_refusals: int = 0
    #: bytes evicted from hot
    evicted_bytes: int = 0
    #: bytes not demoted to warm on eviction (warm had no room: cold has them)
    demote_skipped_bytes: int = 0
    #: bytes moved from hot to warm on eviction
    demoted_bytes: int = 0
    #: uploads in flight cancelled because their file was deleted
    uploads_cancelled: int = 0
    #: files brought in line with the cold store
    persisted: int = 0
    #: bytes uploaded to the cold store
    uploaded_bytes: int = 0
    #: writes that waited for dirty data to drain below dirty_limit
    write_waits: int = 0
    #: files queued again from their complete local copy after their cold object vanished
    reuploaded: int = 0
    #: files dropped because their cold object vanished outside tierd
    vanished: int = 0
    #: objects deleted from the cold store
    cold_deleted: int = 0
    #: files made whole on hot before the cold object they need was replaced
    rescued: int = 0
    #: bytes brought onto a tier from a lower one, by (destination, source) tier name
    filled: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: bytes evicted, by local tier name
    evicted_from: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        """The figures that are not zero, by name, sorted (``/v1/status``): per-tier ones as
        ``filled_<dst>_from_<src>`` and ``evicted_<tier>_bytes``."""
        out = {f.name: v for f in fields(self)
               if isinstance(v := getattr(self, f.name), int) and v}
        out.update({f"filled_{dst}_from_{src}": n for (dst, src), n in self.filled.items() if n})
        out.update({f"evicted_{tier}_bytes": n for tier, n in self.evicted_from.items() if n})
        return dict(sorted(out.items()))
