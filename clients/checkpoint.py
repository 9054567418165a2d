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
from typing import Any

import torch
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
                 keep_cold: int | None = None) -> None:
        self.client = PoolClient(socket_path)
        self.bucket = bucket
        self.retention = {"keep_local": keep_local, "keep_cold": keep_cold}
        self._maps: dict[int, Mapping] = {}

    def _where(self, run: str) -> dict[str, Any]:
        return {"bucket": self.bucket, "run": run}

    def stage(self, run: str, step: int, size: int) -> Mapping:
        """A writable mapping of the pool region for ``step`` (see :meth:`save`)."""
        reply, fds = self.client.call("ckpt.stage", **self._where(run), step=step, size=size,
                                      **self.retention)
        rid = int(reply["region"]["id"])
        m = self._maps.get(rid)
        if m is not None and m.size == int(reply["region"]["size"]):
            for fd in fds:
                os.close(fd)
            return m
        m = PoolClient.map_region(reply["region"], fds)
        with contextlib.suppress(OSError, AttributeError):
            m.mm.madvise(mmap.MADV_HUGEPAGE)
        self._maps[rid] = m
        return m

    def commit(self, run: str, step: int, manifest: dict[str, Any]) -> None:
        self.client.call("ckpt.commit", **self._where(run), step=step, manifest=manifest)

    def abort(self, run: str, step: int) -> None:
        self.client.call("ckpt.abort", **self._where(run), step=step)

    def save(self, run: str, step: int, state_dict: Any) -> None:
        """Copy ``state_dict`` into the pool and commit it as ``step`` of ``run``.  When
        this returns the caller may change its tensors.  Not durable yet: see
        :meth:`wait_persisted`.  Quota or pool exhaustion raises before anything is copied."""
        buf = io.BytesIO()
        p = _Pickler(buf)
        p.dump(state_dict)
        objects = buf.getbuffer()
        tensors = p.tensors
        sizes = [t.numel() * t.element_size() for t in tensors] + [len(objects)]
        offsets, total = _layout(sizes)
        m = self.stage(run, step, total)
        try:
            entries = []
            for i, t in enumerate(tensors):
                shape = list(t.shape)
                region_view(m.mm, offsets[i], sizes[i], t.dtype, shape).copy_(t.detach())
                entries.append({"key": f"t{i}", "kind": "tensor", "offset": offsets[i],
                                "nbytes": sizes[i], "dtype": _dtype_name(t.dtype),
                                "shape": shape})
            o = offsets[-1]
            m.mm[o:o + len(objects)] = objects
            entries.append({"key": OBJECTS, "kind": "pickle", "offset": o,
                            "nbytes": len(objects)})
            self.commit(run, step, {"size": total, "entries": entries})
        except BaseException:
            with contextlib.suppress(OSError):
                self.abort(run, step)
            raise

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
        reply, fds = self.client.call("ckpt.open", **self._where(run), step=step)
        size = max(int(reply["manifest"]["size"]), 1)  # a region is never empty either
        m = PoolClient.map_region({"id": reply["step"], "size": size}, fds, private=True)
        return reply["manifest"], m.mm, str(reply["where"])

    def load(self, run: str, step: int | None = None) -> Any:
        """The state saved as ``step`` (default: the latest) of ``run``; its tensors are
        copy-on-write views of the nearest copy."""
        manifest, mm, _ = self.open(run, step)
        return unpack(manifest, mm)

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
            m.close()
        self._maps.clear()
        self.client.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
