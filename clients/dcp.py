"""``torch.distributed.checkpoint`` storage on tierd checkpoints.

``dcp.save(sd, storage_writer=TierdStorageWriter("run", step))`` writes every planned item
straight into a pool region (tensors with one ``copy_`` each, byte items as they come) and
commits the step with DCP's metadata carried in the manifest; ``dcp.async_save`` works the
same from its background thread.  ``TierdStorageReader`` maps the nearest copy and copies
each requested chunk into the planner's tensors.  The step is an ordinary tierd checkpoint
(``Checkpointer.list``, ``wait_persisted``, the mount and S3 all see it).

One process (no process group, or world size 1): every rank of a multi-rank job would
need its own part of the step, which the manifest format does not have yet.
"""

from __future__ import annotations

import base64
import io
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch
from tierd_client.checkpoint import Checkpointer, _dtype, _dtype_name, _layout, region_view
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

    @property
    def ck(self) -> Checkpointer:
        if self._ck is None or self._ck.bucket != self.bucket:
            self._ck = Checkpointer(self._socket, bucket=self.bucket)
        return self._ck

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.bucket, self.run, self.step = _parse_id(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            _parse_id(checkpoint_id)
        except ValueError:
            return False
        return True


class TierdStorageWriter(_Base, StorageWriter):
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if len(plans) > 1:
            raise NotImplementedError("TierdStorageWriter writes from one process only")
        return plans

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=f"{SCHEME}{self.bucket}/{self.run}/{self.step}")

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
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
        m = self.ck.stage(self.run, self.step, total)
        results = []
        try:
            for i, item in enumerate(plan.items):
                off, n = offsets[i], sizes[i]
                if i in blobs:
                    m.mm[off:off + n] = blobs[i]
                    slot = Slot(off, n)
                else:
                    t = tensors[i]
                    region_view(m.mm, off, n, t.dtype, list(t.shape)).copy_(t)
                    slot = Slot(off, n, _dtype_name(t.dtype), tuple(t.shape))
                results.append(WriteResult(index=item.index, size_in_bytes=n,
                                           storage_data=slot))
        except BaseException:
            self.ck.abort(self.run, self.step)
            raise
        self._total = total
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        blob = base64.b64encode(pickle.dumps(metadata)).decode()
        self.ck.commit(self.run, self.step, {"size": self._total, "entries": [],
                                             "dcp_metadata": blob})


class TierdStorageReader(_Base, StorageReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        manifest, self._mm, self.where = self.ck.open(self.run, self.step)
        blob = manifest.get("dcp_metadata")
        if blob is None:
            raise ValueError(f"step {self.step} of run {self.run!r} was not saved with DCP")
        md = pickle.loads(base64.b64decode(blob))
        assert isinstance(md, Metadata)
        self._slots: dict[MetadataIndex, Slot] = md.storage_data
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self._slots = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            slot = self._slots[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(
                    self._mm[slot.offset:slot.offset + slot.nbytes]))
                continue
            src = region_view(self._mm, slot.offset, slot.nbytes, _dtype(slot.dtype),
                              list(slot.shape))
            src = narrow_tensor_by_index(src, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            target.copy_(src)
            planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut
