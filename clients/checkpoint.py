"""Checkpoints through tierd's memory pool: ``save`` is one memory copy, then training goes on.

``save(run, step, state_dict)`` asks the daemon for a region (the run's previous one when it
is free again, so steady state maps nothing new), views it as tensors and ``copy_``-es each
tensor into place (a GPU tensor is copied device-to-host straight into the pool), pickles
whatever else the state holds next to them, and commits.  The daemon publishes the step as
``<bucket>/<run>/step-<N>/{data,manifest.json}`` and persists it in the background;
``wait_persisted`` waits for that.  ``load`` maps the nearest copy (pool, else the hot file,
fetched from cold first when needed) privately: tensors are views of the mapping until
someone writes to them.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle
import threading
from typing import Any

import torch
from tierd_client.device import Copier, Event, Runtime
from tierd_client.pool import Mapping, PoolClient

ALIGN = 64  # tensors start on cache-line boundaries (and every dtype's alignment)
OBJECTS = "__objects__"


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"checkpoint names an unknown dtype {name!r}")
    return dt


class _Pickler(pickle.Pickler):
    """Pickles the state with every tensor replaced by its index in ``tensors``."""

    def __init__(self, f: io.BytesIO) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._seen: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            i = self._seen.get(id(obj))
            if i is None:
                i = self._seen[id(obj)] = len(self.tensors)
                self.tensors.append(obj)
            return ("tensor", i)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(f)
        self.tensors = tensors

    def persistent_load(self, pid: Any) -> Any:
        kind, i = pid
        if kind != "tensor":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.tensors[i]


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    offsets, off = [], 0
    for n in sizes:
        offsets.append(off)
        off += (n + ALIGN - 1) // ALIGN * ALIGN
    return offsets, off


def region_view(mm: mmap.mmap, offset: int, nbytes: int, dtype: torch.dtype,
                shape: list[int]) -> torch.Tensor:
    """A tensor over ``nbytes`` of the mapping at ``offset`` (no copy)."""
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset)
    return flat.view(dtype).view(shape)


class Checkpointer:
    """Save and load checkpoints of runs in one bucket (default ``checkpoints``)."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *,
                 bucket: str = "checkpoints", keep_local: int | None = None,
                 keep_cold: int | None = None, runtime: Runtime | None = None) -> None:
        self.client = PoolClient(socket_path)
        #: how tensors reach pool memory and back (CUDA when torch has it; ``runtime``
        #: chooses another, e.g. on a machine without a GPU)
        self.device = Copier(runtime)
        self.bucket = bucket
        self.retention = {"keep_local": keep_local, "keep_cold": keep_cold}
        self._maps: dict[int, Mapping] = {}
        self._lock = threading.Lock()
        self._node: str | None = None
        self._recent: dict[tuple[str, int], list[int]] = {}

    def _where(self, run: str) -> dict[str, Any]:
        return {"bucket": self.bucket, "run": run}

    def node(self) -> str:
        """The daemon's name for itself (which node a rank's parts are on)."""
        if self._node is None:
            self._node = str(self.client.call("ckpt.hello")[0]["node"])
        return self._node

    def stage(self, run: str, step: int, size: int, **part: Any) -> Mapping:
        """A writable mapping of the pool region for ``step`` (see :meth:`save`); with
        ``part``, ``parts``, ``save`` and ``coordinator``: one rank's part of a multi-part
        step (:mod:`tierd_client.dcp`)."""
        reply, fds = self.client.call("ckpt.stage", **self._where(run), step=step, size=size,
                                      **self.retention, **part)
        rid = int(reply["region"]["id"])
        with self._lock:
            m = self._maps.get(rid)
            if m is not None and m.size == int(reply["region"]["size"]):
                for fd in fds:
                    os.close(fd)
                return m
            m = PoolClient.map_region(reply["region"], fds)
            with contextlib.suppress(OSError, AttributeError):
                m.mm.madvise(mmap.MADV_HUGEPAGE)
            self._maps[rid] = m
            # the daemon may give a run's older regions back to the pool (reclaim): the
            # memory returns only once no mapping holds it, so keep this writer's last two
            recent = self._recent.setdefault((run, part.get("part", -1)), [])
            recent.append(rid)
            for old in recent[:-2]:
                gone = self._maps.pop(old, None)
                if gone is not None:
                    self.device.region_unmapping(gone.mm)
                    with contextlib.suppress(BufferError):  # a caller's view keeps it
                        gone.close()
            del recent[:-2]
        return m

    def commit(self, run: str, step: int, manifest: dict[str, Any], **part: Any) -> str:
        """Commit a staged step; with ``part``: one rank's part (its manifest gives only its
        ``size``); with ``parts`` and ``save`` but no ``part``: a multi-part step, with the
        global manifest.  The step's state."""
        reply, _ = self.client.call("ckpt.commit", **self._where(run), step=step,
                                    manifest=manifest, **part)
        return str(reply["state"])

    def abort(self, run: str, step: int, **part: Any) -> None:
        self.client.call("ckpt.abort", **self._where(run), step=step, **part)

    def save(self, run: str, step: int, state_dict: Any, *,
             blocking: bool = True) -> SaveHandle:
        """Copy ``state_dict`` into the pool and commit it as ``step`` of ``run``.  When
        this returns the caller may change its tensors.  Not durable yet: see
        :meth:`wait_persisted`.  Quota or pool exhaustion raises before anything is copied.

        ``blocking=False``: GPU tensors' copies are only queued (on a side stream, into
        pinned pool memory) and the step is committed by the handle's ``wait()``, which the
        training loop calls before it next changes those tensors (the next optimizer step);
        until then it may compute.  Host tensors are copied before ``save`` returns either
        way (there is no copy engine to hand them to)."""
        buf = io.BytesIO()
        p = _Pickler(buf)
        p.dump(state_dict)
        objects = buf.getbuffer()
        tensors = p.tensors
        sizes = [t.numel() * t.element_size() for t in tensors] + [len(objects)]
        offsets, total = _layout(sizes)
        m = self.stage(run, step, total)
        try:
            entries, pairs = [], []
            for i, t in enumerate(tensors):
                shape = list(t.shape)
                pairs.append((region_view(m.mm, offsets[i], sizes[i], t.dtype, shape),
                              t.detach()))
                entries.append({"key": f"t{i}", "kind": "tensor", "offset": offsets[i],
                                "nbytes": sizes[i], "dtype": _dtype_name(t.dtype),
                                "shape": shape})
            event = self.device.save(m.mm, pairs)
            o = offsets[-1]
            m.mm[o:o + len(objects)] = objects
            entries.append({"key": OBJECTS, "kind": "pickle", "offset": o,
                            "nbytes": len(objects)})
            manifest = {"size": total, "entries": entries}
        except BaseException:
            with contextlib.suppress(OSError):
                self.abort(run, step)
            raise
        handle = SaveHandle(self, run, step, event, manifest)
        if blocking or event.query():
            handle.wait()
        return handle

    def wait_persisted(self, run: str, step: int | None = None, *, level: str = "cold",
                       timeout: float | None = None) -> str:
        """Block until ``step`` (default: the latest) is durable on the hot tier
        (``level="local"``) or in cold; returns its state."""
        if step is None:
            step = self.latest(run)
            if step is None:
                raise FileNotFoundError(f"run {run!r} has no checkpoints")
        reply, _ = self.client.call("ckpt.wait", **self._where(run), step=step, level=level,
                                    timeout=timeout)
        return str(reply["state"])

    def open(self, run: str, step: int | None = None) -> tuple[dict[str, Any], mmap.mmap,
                                                               str]:
        """(manifest, private mapping of the data, where it came from: pool/hot/cold)."""
        manifest, mm, where = self.open_step(run, step)
        if mm is None:
            raise ValueError(f"step {manifest.get('step')} of run {run!r} has "
                             f"{len(manifest['parts'])} parts (saved by a job of that many "
                             "ranks): read it with tierd_client.dcp.TierdStorageReader")
        return manifest, mm, where

    def open_step(self, run: str, step: int | None = None
                  ) -> tuple[dict[str, Any], mmap.mmap | None, str]:
        """Like :meth:`open`; a multi-part step gives its manifest and no mapping (its
        parts come from :meth:`open_part`)."""
        reply, fds = self.client.call("ckpt.open", **self._where(run), step=step)
        if not fds:
            return reply["manifest"], None, str(reply["where"])
        size = max(int(reply["manifest"]["size"]), 1)  # a region is never empty either
        m = PoolClient.map_region({"id": reply["step"], "size": size}, fds, private=True)
        return reply["manifest"], m.mm, str(reply["where"])

    def open_part(self, run: str, step: int, part: int, *, timeout: float | None = None
                  ) -> tuple[mmap.mmap, int, str]:
        """(private mapping, size, where from) of one rank's part of a multi-part step.  A
        part written on another node comes through the cold store: up to ``timeout`` s
        (default 60) are given for it to get there."""
        reply, fds = self.client.call("ckpt.open", **self._where(run), step=step, part=part,
                                      timeout=timeout)
        size = int(reply["size"])
        m = PoolClient.map_region({"id": step, "size": max(size, 1)}, fds, private=True)
        return m.mm, size, str(reply["where"])

    def load(self, run: str, step: int | None = None, *, into: Any = None,
             device: str | torch.device | None = None) -> Any:
        """The state saved as ``step`` (default: the latest) of ``run``; its tensors are
        copy-on-write views of the nearest copy.

        ``into``: a state of the same structure (e.g. ``model.state_dict()``, whose tensors
        are the parameters): its tensors are filled in place -- GPU ones through a pinned
        double buffer -- and the returned state holds them.  ``device``: tensors are
        created there and filled the same way (like ``map_location``)."""
        manifest, mm, _ = self.open(run, step)
        state = unpack(manifest, mm)
        if into is None and device is None:
            return state
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = _fill(state, into, device, pairs)
        self.device.restore(pairs)
        return out

    def list(self, run: str) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = self.client.call("ckpt.list", **self._where(run))[0][
            "steps"]
        return steps

    def latest(self, run: str) -> int | None:
        done = [s["step"] for s in self.list(run) if s["state"] != "failed"]
        return max(done) if done else None

    def delete(self, run: str, step: int) -> None:
        self.client.call("ckpt.delete", **self._where(run), step=step)

    def close(self) -> None:
        for m in self._maps.values():
            self.device.region_unmapping(m.mm)  # unpinned before it is unmapped
            m.close()
        self._maps.clear()
        self.client.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SaveHandle:
    """A save in flight (``Checkpointer.save(..., blocking=False)``): :meth:`wait` waits
    for the queued copies and commits the step; until then the step is not saved."""

    def __init__(self, ck: Checkpointer, run: str, step: int, event: Event,
                 manifest: dict[str, Any]) -> None:
        self.ck, self.run, self.step = ck, run, step
        self._event: Event | None = event
        self._manifest = manifest
        self.state = ""

    def done(self) -> bool:
        return self._event is None

    def wait(self) -> str:
        """Block until the copies are in pool memory, then commit; the step's state."""
        if self._event is None:
            return self.state
        event, self._event = self._event, None
        try:
            event.synchronize()
            self.state = self.ck.commit(self.run, self.step, self._manifest)
        except BaseException:
            with contextlib.suppress(OSError):
                self.ck.abort(self.run, self.step)
            raise
        return self.state


def _fill(state: Any, into: Any, device: str | torch.device | None,
          pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``state`` with each tensor replaced by its counterpart in ``into`` (same place in the
    structure) or a new tensor on ``device``; the copies to make go to ``pairs``."""
    if isinstance(state, torch.Tensor):
        if isinstance(into, torch.Tensor):
            if into.shape != state.shape or into.dtype != state.dtype:
                raise ValueError(f"cannot load a {state.dtype} tensor of shape "
                                 f"{tuple(state.shape)} into one of {into.dtype} "
                                 f"{tuple(into.shape)}")
            pairs.append((into.detach(), state))
            return into
        if device is None:
            return state
        t = torch.empty(state.shape, dtype=state.dtype, device=device)
        pairs.append((t, state))
        return t
    if isinstance(state, dict):
        sub = into if isinstance(into, dict) else {}
        return {k: _fill(v, sub.get(k), device, pairs) for k, v in state.items()}
    if isinstance(state, list | tuple):
        seq = into if isinstance(into, list | tuple) and len(into) == len(state) else \
            [None] * len(state)
        out = [_fill(v, w, device, pairs) for v, w in zip(state, seq, strict=True)]
        return out if isinstance(state, list) else type(state)(out)
    return state


def unpack(manifest: dict[str, Any], mm: mmap.mmap) -> Any:
    """Rebuild the state from a manifest and a mapping of its data."""
    tensors: list[torch.Tensor] = []
    objects = b""
    for e in manifest["entries"]:
        if e["kind"] == "tensor":
            tensors.append(region_view(mm, e["offset"], e["nbytes"], _dtype(e["dtype"]),
                                       e["shape"]))
        elif e["key"] == OBJECTS:
            objects = bytes(mm[e["offset"]:e["offset"] + e["nbytes"]])
    return _Unpickler(io.BytesIO(objects), tensors).load()
