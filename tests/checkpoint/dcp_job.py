"""A ``torchrun`` worker for the multi-rank DCP tests (CPU ranks, gloo).

    torchrun --standalone --nproc_per_node N dcp_job.py MODE STEP OUT

``TIERD_SOCKETS`` lists the daemons' pool sockets (comma-separated): rank r of W uses
socket ``r * len(sockets) // W``, so with two sockets the first half of the ranks writes to
one daemon and the second half to the other, as on two nodes.

* ``save``: the state of ``STEP``, sharded row-wise over the ranks (DTensor), saved with
  ``dcp.save`` as tierd step STEP, with ``dcp.async_save`` as step STEP+1, and with
  ``dcp.FileSystemWriter`` under OUT/fs-STEP (the reference).
* ``load``: the same state loaded into zeros sharded over this (other) world size from
  tierd step STEP, STEP+1 and from OUT/fs-STEP; each rank writes OUT/load-<rank>.json with
  whether its shards are byte-identical to the reference's and to the expected values.
* ``die``: like ``save``, but the last rank kills itself after staging its part and
  before committing it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tierd_client.dcp import TierdStorageReader, TierdStorageWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

warnings.filterwarnings("ignore")


def full_state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(64, 24, generator=g),
                  "emb": torch.randn(40, 8, generator=g).to(torch.bfloat16),
                  "b": torch.randn(24, generator=g),
                  "steps": torch.arange(12, dtype=torch.int64) * step},
        "optim": {"m": torch.randn(64, 24, generator=g), "lr": 0.5 / step},
        "extra": {"epoch": step, "name": f"step-{step}"},
    }


def sharded(state: Any, mesh: Any, zero: bool) -> Any:
    """Row-sharded DTensors for the 2-D tensors, plain (replicated) for the rest."""
    if isinstance(state, dict):
        return {k: sharded(v, mesh, zero) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        t = torch.zeros_like(state) if zero else state
        return distribute_tensor(t, mesh, [Shard(0)]) if t.dim() == 2 else t.clone()
    return type(state)(0) if zero and not isinstance(state, str) else (
        "" if zero else state)


def local(t: Any) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def flat(state: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(state, dict):
        out: dict[str, Any] = {}
        for k, v in state.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: state}


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


class DyingWriter(TierdStorageWriter):
    def write_data(self, plan: Any, planner: Any) -> Any:
        if self.rank == dist.get_world_size() - 1:
            self.ck.stage(self.run, self.step, 1 << 20, part=self.rank,
                          parts=plan.storage_data.parts, save=plan.storage_data.save)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write_data(plan, planner)


def main() -> None:
    mode, step, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sockets = os.environ["TIERD_SOCKETS"].split(",")
    sock = sockets[rank * len(sockets) // world]
    mesh = init_device_mesh("cpu", (world,))
    ck_id = f"tierd://ckr/ranks/{step}"
    if mode in ("save", "die"):
        state = sharded(full_state(step), mesh, zero=False)
        cls = DyingWriter if mode == "die" else TierdStorageWriter
        dcp.save(state, storage_writer=cls(ck_id, sock))
        dcp.async_save(state, storage_writer=TierdStorageWriter(
            f"tierd://ckr/ranks/{step + 1}", sock)).result(timeout=120)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(out / f"fs-{step}"))
    elif mode == "load":
        expect = flat(sharded(full_state(step), mesh, zero=False))
        ref = sharded(full_state(step), mesh, zero=True)
        dcp.load(ref, storage_reader=dcp.FileSystemReader(out / f"fs-{step}"))
        report: dict[str, Any] = {"rank": rank}
        for n in (step, step + 1):
            got = sharded(full_state(step), mesh, zero=True)
            dcp.load(got, storage_reader=TierdStorageReader(f"tierd://ckr/ranks/{n}", sock))
            bad = []
            for (k, v), r, e in zip(flat(got).items(), flat(ref).values(), expect.values(),
                                    strict=True):
                if isinstance(v, DTensor | torch.Tensor):
                    if not (same_bytes(local(v), local(r)) and same_bytes(local(v), local(e))):
                        bad.append(k)
                elif not v == r == e:
                    bad.append(k)
            report[str(n)] = {"bad": bad,
                              "shards": {k: list(local(v).shape) for k, v in flat(got).items()
                                         if isinstance(v, DTensor)}}
        (out / f"load-{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Every result is written (files closed, the checkpoints committed through the
    # daemon) and the process group destroyed: leave without the interpreter's teardown,
    # in which gloo's C++ threads now and then abort the process ("terminate called
    # without an active exception", SIGABRT: a torch teardown race the test is not about)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
