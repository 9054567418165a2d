"""``torch.distributed.checkpoint`` storage on tierd checkpoints, for one process or many.

``dcp.save(sd, storage_writer=TierdStorageWriter("tierd://BUCKET/RUN/STEP"))`` writes every
planned item straight into a pool region (tensors with one copy each, byte items as they
come) and commits the step with DCP's metadata in the manifest; ``dcp.async_save`` does the
same from its thread.  ``TierdStorageReader`` maps the nearest copy and copies each
requested chunk into the planner's tensors.

Under ``torchrun`` each rank writes its **part** into the daemon of its own node (found as
the single-process SDK finds it: ``TIERD_POOL_SOCKET`` and friends), into a pool region of
its own; the coordinator commits the step with the global metadata once every rank's part
is committed, and only then does the step exist (:mod:`tierd.checkpoint.parts`).  Parts
are rank-indexed, and each item's ``storage_data`` names its part, so a load with another
world size reads whichever parts hold the chunks it needs (DCP's resharding).  Ranks on
other nodes than the coordinator's pass the commit to their daemon through the job's store
(:mod:`tierd_client.dcp_commit`).  A job of one process keeps the single data file layout.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import mmap
import os
import pickle
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tierd_client import dcp_commit
from tierd_client.checkpoint import (
    ALIGN,
    Checkpointer,
    _dtype,
    _dtype_name,
    _layout,
    region_view,
)
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

SCHEME = "tierd://"


@dataclass(frozen=True)
class Slot:
    """Where one write item's bytes are in the step's data (DCP's ``storage_data``)."""

    offset: int
    nbytes: int
    dtype: str = ""  # tensors only
    shape: tuple[int, ...] = ()
    part: int = -1  # the rank's part; -1: the one data file of a single-process step


@dataclass(frozen=True)
class _Save:
    """The coordinator's word to every rank (a global plan's ``storage_data``)."""

    save: str
    parts: int
    coordinator_node: str


_shared: dict[tuple[str, str], Checkpointer] = {}
_shared_lock = threading.Lock()


def _checkpointer(socket_path: str | os.PathLike[str] | None, bucket: str) -> Checkpointer:
    """One connection per daemon and bucket in a process, kept across saves: the run's
    regions stay mapped from step to step (and the run counts as active)."""
    key = (str(socket_path or ""), bucket)
    with _shared_lock:
        ck = _shared.get(key)
        if ck is None:
            ck = _shared[key] = Checkpointer(socket_path, bucket=bucket)
        return ck


def _parse_id(checkpoint_id: str | os.PathLike[str]) -> tuple[str, str, int]:
    """``tierd://BUCKET/RUN/STEP`` -> (bucket, run, step)."""
    s = str(checkpoint_id)
    if not s.startswith(SCHEME):
        raise ValueError(f"not a tierd checkpoint id (tierd://BUCKET/RUN/STEP): {s!r}")
    parts = s[len(SCHEME):].split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"checkpoint id must be tierd://BUCKET/RUN/STEP, not {s!r}")
    return parts[0], parts[1], int(parts[2])


class _Base:
    def __init__(self, checkpoint_id: str, socket_path: str | os.PathLike[str] | None = None,
                 checkpointer: Checkpointer | None = None) -> None:
        self.bucket, self.run, self.step = _parse_id(checkpoint_id)
        self._socket = socket_path
        self._ck = checkpointer
        self.rank = 0
        self.is_coordinator = True

    @property
    def ck(self) -> Checkpointer:
        if self._ck is None or self._ck.bucket != self.bucket:
            self._ck = _checkpointer(self._socket, self.bucket)
        return self._ck

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.bucket, self.run, self.step = _parse_id(checkpoint_id)

    def _set_up(self, is_coordinator: bool, rank: int | None) -> None:
        self.is_coordinator = is_coordinator
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = rank

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            _parse_id(checkpoint_id)
        except ValueError:
            return False
        return True


def _part_size(slots: list[Slot]) -> int:
    """A part's committed size from its items' places (as :func:`_layout` laid them)."""
    return max((s.offset + (s.nbytes + ALIGN - 1) // ALIGN * ALIGN for s in slots), default=0)


class TierdStorageWriter(_Base, StorageWriter):
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any,
                              rank: int | None = None, use_collectives: bool = True,
                              **kwargs: Any) -> None:
        if not use_collectives:
            raise NotImplementedError("TierdStorageWriter needs DCP's collectives (the "
                                      "coordinator commits every rank's part)")
        self._set_up(is_coordinator, rank)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # which daemon this rank writes into: the coordinator learns every rank's node
        return dataclasses.replace(plan, storage_data=self.ck.node())

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if len(plans) == 1:
            return plans  # one process: the single data file layout
        self._nodes = [p.storage_data for p in plans]
        word = _Save(uuid.uuid4().hex[:16], len(plans), self.ck.node())
        return [dataclasses.replace(p, storage_data=word) for p in plans]

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=f"{SCHEME}{self.bucket}/{self.run}/{self.step}")

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        word = plan.storage_data if isinstance(plan.storage_data, _Save) else None
        self._save = word
        blobs: dict[int, bytes] = {}
        tensors: dict[int, torch.Tensor] = {}
        sizes = []
        for i, item in enumerate(plan.items):
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                blobs[i] = data.getvalue()
                sizes.append(len(blobs[i]))
            else:
                assert isinstance(data, torch.Tensor)
                tensors[i] = data.detach()
                sizes.append(tensors[i].numel() * tensors[i].element_size())
        offsets, total = _layout(sizes)
        part = -1 if word is None else self.rank
        spec: dict[str, Any] = {} if word is None else {
            "part": part, "parts": word.parts, "save": word.save,
            "coordinator": self.is_coordinator}
        m = self.ck.stage(self.run, self.step, total, **spec)
        results, pairs = [], []
        try:
            for i, item in enumerate(plan.items):
                off, n = offsets[i], sizes[i]
                if i in blobs:
                    m.mm[off:off + n] = blobs[i]
                    slot = Slot(off, n, part=part)
                else:
                    t = tensors[i]
                    pairs.append((region_view(m.mm, off, n, t.dtype, list(t.shape)), t))
                    slot = Slot(off, n, _dtype_name(t.dtype), tuple(t.shape), part)
                results.append(WriteResult(index=item.index, size_in_bytes=n,
                                           storage_data=slot))
            self.ck.device.save(m.mm, pairs).synchronize()
            if word is not None:
                self.ck.commit(self.run, self.step, {"size": total}, part=part,
                               parts=word.parts, save=word.save)
        except BaseException:
            self.ck.abort(self.run, self.step, **spec)
            raise
        if word is not None and not self.is_coordinator \
                and self.ck.node() != word.coordinator_node:
            dcp_commit.follow(self.ck, self.run, self.step, part, word.parts, word.save)
        self._total = total
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        blob = base64.b64encode(pickle.dumps(metadata)).decode()
        word = self._save
        if word is None:
            self.ck.commit(self.run, self.step, {"size": self._total, "entries": [],
                                                 "dcp_metadata": blob})
            return
        slots: list[list[Slot]] = [[] for _ in range(word.parts)]
        for r in (r for rs in results for r in rs):
            slots[r.storage_data.part].append(r.storage_data)
        manifest = {"entries": [], "dcp_metadata": blob,
                    "parts": [{"part": i, "size": _part_size(s)} for i, s in enumerate(slots)]}
        remote = any(n != word.coordinator_node for n in self._nodes)
        dcp_commit.coordinator_commit(self.ck, self.run, self.step, word.parts, word.save,
                                      manifest, remote)


class TierdStorageReader(_Base, StorageReader):
    _mm: mmap.mmap | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        manifest, self._mm, self.where = self.ck.open_step(self.run, self.step)
        blob = manifest.get("dcp_metadata")
        if blob is None:
            raise ValueError(f"step {self.step} of run {self.run!r} was not saved with DCP")
        md = pickle.loads(base64.b64decode(blob))
        assert isinstance(md, Metadata)
        self._slots: dict[MetadataIndex, Slot] = md.storage_data
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              rank: int | None = None, **kwargs: Any) -> None:
        self._slots = metadata.storage_data
        self._set_up(is_coordinator, rank)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _data(self, part: int, maps: dict[int, mmap.mmap]) -> mmap.mmap:
        if part < 0:
            assert self._mm is not None, "a multi-part step's item without a part"
            return self._mm
        mm = maps.get(part)
        if mm is None:
            mm = maps[part] = self.ck.open_part(self.run, self.step, part)[0]
        return mm

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        maps: dict[int, mmap.mmap] = {}  # the parts this rank's chunks are in
        pairs, commits = [], []
        for req in sorted(plan.items, key=lambda r: getattr(self._slots[r.storage_index],
                                                            "part", -1)):
            slot = self._slots[req.storage_index]
            mm = self._data(slot.part, maps)
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(mm[slot.offset:slot.offset + slot.nbytes]))
                continue
            src = region_view(mm, slot.offset, slot.nbytes, _dtype(slot.dtype),
                              list(slot.shape))
            src = narrow_tensor_by_index(src, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            pairs.append((target, src))
            commits.append((req, target))
        self.ck.device.restore(pairs)  # GPU targets through the pinned double buffer
        for req, target in commits:
            planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut
