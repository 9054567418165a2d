"""Placement: where a file's blocks live (hot cache over the cold system of record), and
write-back persistence.  See docs/placement.md.

The namespace calls :class:`Placement`; placement never imports the namespace (layers only
import downward), so the namespace tells it which inodes have unflushed writes through
``Placement.busy``.
"""

from tierd.placement.cache import LRU, TwoQ
from tierd.placement.engine import HOT, MODES, PlacementSettings
from tierd.placement.placement import Placement

__all__ = ["HOT", "LRU", "MODES", "Placement", "PlacementSettings", "TwoQ"]
