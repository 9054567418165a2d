"""The checkpoint service's in-memory picture of runs, steps and the parts of a step.

A step saved by one process has one data file; a step saved by a job of W ranks
(``torch.distributed.checkpoint`` under ``torchrun``) has W **parts**, one per rank, each
staged in its own pool region of the daemon on the rank's node.  A part's life:
``staging`` (its writer copies into the region) → ``prepared`` (its writer committed it;
the daemon writes it to the step's temporary directory on hot) → ``written`` (durable
there, unpublished).  The step itself is committed by the job's coordinator with the
global manifest; each daemon that holds parts then renames its temporary directory into
``step-N`` (see :mod:`tierd.checkpoint.parts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from tierd.acl import Identity
from tierd.mempool.pool import Region

STAGING, COMMITTED, LOCAL, PERSISTED, FAILED = (
    "staging", "committed", "local", "persisted", "failed")
PREPARED, WRITTEN = "prepared", "written"


@dataclass
class Part:
    """One rank's share of a multi-part step on this daemon."""

    index: int
    conn: int
    region: Region | None
    state: str = STAGING
    size: int = 0
    #: the job's coordinator wrote this part: its connection also brings the commit
    coordinator: bool = False
    ino: int = 0
    #: its writer's connection is gone (a prepared part then waits for the step's outcome)
    closed: bool = False
    written: asyncio.Event = field(default_factory=asyncio.Event)

    def busy(self) -> bool:
        """Its region holds the only copy of its bytes (not yet durable on hot)."""
        return self.state in (STAGING, PREPARED)


@dataclass
class Step:
    step: int
    ident: Identity
    state: str
    region: Region | None = None
    conn: int = 0
    manifest: dict[str, Any] | None = None
    inos: list[int] = field(default_factory=list)
    error: str = ""
    local: asyncio.Event = field(default_factory=asyncio.Event)
    persisted: asyncio.Event = field(default_factory=asyncio.Event)
    #: monotonic times of stage and commit (the phase durations tierd.metrics observes)
    staged_at: float = field(default_factory=time.monotonic)
    committed_at: float = 0.0
    #: multi-part steps: the job's world size (0: one data file), its save's id, the parts
    #: held here (the others are held by other daemons)
    parts: int = 0
    save: str = ""
    members: dict[int, Part] = field(default_factory=dict)
    #: monotonic time since when no writer of its prepared parts is connected (in doubt)
    orphaned_at: float = 0.0
    #: the placement hold that keeps the persister off the temporary directory
    hold: contextlib.ExitStack | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def describe(self) -> dict[str, Any]:
        doc = {"step": self.step, "state": self.state,
               "in_pool": bool(self.regions()),
               "size": (self.manifest or {}).get("size"), "error": self.error or None}
        if self.parts:
            doc["size"] = sum(int(p.get("size", 0)) for p in
                              (self.manifest or {}).get("parts", [])) or None
            doc["parts"] = self.parts
            doc["parts_here"] = sorted(self.members)
        return doc

    def regions(self) -> list[Region]:
        out = [self.region] if self.region is not None else []
        return out + [p.region for p in self.members.values() if p.region is not None]

    def holds_busy(self, r: Region) -> bool:
        """Whether region ``r`` holds bytes of this step that only the pool has."""
        if self.region is r and self.state in (STAGING, COMMITTED):
            return True
        return any(p.region is r and p.busy() for p in self.members.values())

    def forget_region(self, r: Region) -> None:
        if self.region is r:
            self.region = None
        for p in self.members.values():
            if p.region is r:
                p.region = None


@dataclass
class Run:
    bucket: str
    name: str
    keep_local: int
    keep_cold: int
    steps: dict[int, Step] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    scanned: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # one retention pass at a time: every step's persist task runs one, and two at once
    # removed the same old step (the second failed, and marked its own step failed)
    retaining: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: monotonic time of the last save or load (the pool's reclaim takes the least recent)
    used_at: float = field(default_factory=time.monotonic)
    #: which part a region last held (a rank gets its own region back: its mapping is warm)
    region_part: dict[int, int] = field(default_factory=dict)
    #: recent multi-part steps dropped: step -> (its save, why); a late commit gets the
    #: reason, and a late part of that save is refused instead of starting the step again
    aborted: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: connections that saved to the run and are still open (the run is active)
    conns: set[int] = field(default_factory=set)

    def committed(self) -> list[int]:
        """Steps a reader may see, oldest first."""
        return sorted(n for n, s in self.steps.items() if s.state in (COMMITTED, LOCAL,
                                                                      PERSISTED))

    def region_busy(self, r: Region) -> bool:
        return any(s.holds_busy(r) for s in self.steps.values())

    def signal(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()
