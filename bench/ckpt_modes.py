"""The ``--ranks`` and ``--gpu`` modes of ``bench/ckpt_bench.py``.

``--ranks N``: a state of ``--size-gib`` split into N shards; a ``torchrun`` job of N CPU
ranks (gloo) saves it, each rank its shard as a row-sharded DTensor, and each rank times
its ``dcp.save`` (planning, the copy into its pool region, the part's commit, the
coordinator's commit).  After each round rank 0 alone saves a shard of the same size as a
one-process DCP save (world size 1) -- the single-rank stall, interleaved so that both see
the same machine.  Two warm-up rounds (regions reused); every save starts once the previous
step is on hot.  The ratio is the median over rounds of the slowest rank's stall over the
single save's.

``--gpu``: the state on the CUDA device.  Per round: the copy into preallocated pinned host
memory (the copy engine's limit) and into pageable memory, ``Checkpointer.save`` (its
region registered as pinned once, at the first save), ``save(blocking=False)`` (returned /
until ``wait()``), ``torch.save`` + fsync.  Restores into the device tensors: from the
pool and from hot (``load(into=...)``, through the pinned double buffer) against
``torch.load(map_location="cuda")`` + the copy into the same tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from s3.conftest import start_daemon
from tierd_client.checkpoint import Checkpointer
from tierd_client.dcp import TierdStorageWriter

ROWS = 1024  # a shard's tensors are [ROWS, n] fp32, about 16 MiB each


def shard_state(nbytes: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cols = 4096
    out, left, i = {}, nbytes, 0
    while left > 0:
        n = min(cols, max(1, left // (ROWS * 4)))
        out[f"p{i}"] = torch.randn(ROWS, n, generator=g)
        left -= ROWS * n * 4
        i += 1
    return out


def scratch_dir(args: argparse.Namespace) -> Path:
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.work or "/var/tmp"))
    work.chmod(0o755)
    return work


def report(title: str, medians: dict[str, float], ratios: dict[str, float],
            targets: dict[str, str], out: Path, extra: dict[str, Any]) -> None:
    print(f"\n{'measure':28} {'median s':>9}   ({title})")
    for k, v in medians.items():
        print(f"{k:28} {v:9.4f}")
    print()
    for k, v in ratios.items():
        print(f"{k:28} {v:7.2f}   target {targets.get(k, '-')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**extra, "medians": medians, "ratios": ratios,
                               "targets": targets}, indent=2) + "\n")
    print(f"\nwritten {out}")


# -- --ranks ----------------------------------------------------------------------------
def ranks_main(args: argparse.Namespace) -> None:
    n, rounds = args.ranks, args.rounds
    size = int(args.size_gib * (1 << 30))
    shard = size // n
    work = scratch_dir(args)
    sock = str(work / "pool.sock")
    d = start_daemon(work / "data", "--pool-socket", sock,
                     "--pool-capacity", str(3 * size + 3 * shard + (256 << 20)))
    try:
        cfg = work / "ranks.json"
        cfg.write_text(json.dumps({"socket": sock, "shard": shard, "out": str(work)}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        env["OMP_NUM_THREADS"] = "1"
        job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc_per_node={n}", __file__.replace("ckpt_modes",
                                                                        "ckpt_bench"),
                              "--rank-worker", str(cfg), "--rounds", str(rounds)],
                             env=env, capture_output=True, text=True)
        if job.returncode != 0:
            sys.exit(f"the torchrun job failed:\n{job.stderr[-4000:]}")
        docs = [json.loads((work / f"rank-{r}.json").read_text()) for r in range(n)]
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)
    single = docs[0]["single"]
    per_rank = {r: doc["stalls"] for r, doc in enumerate(docs)}
    print("single process: " + ", ".join(f"{x:.3f}s" for x in single))
    for r, xs in per_rank.items():
        print(f"rank {r}: " + ", ".join(f"{x:.3f}s" for x in xs))
    m = {"single_rank_stall": statistics.median(single)}
    for r, xs in per_rank.items():
        m[f"rank{r}_stall"] = statistics.median(xs)
    slowest = [max(xs[i] for xs in per_rank.values()) for i in range(rounds)]
    ratios = {"slowest_rank_vs_single": statistics.median(
                  s / one for s, one in zip(slowest, single, strict=True)),
              "mean_rank_vs_single": statistics.mean(
                  m[f"rank{r}_stall"] for r in per_rank) / m["single_rank_stall"]}
    report(f"{n} ranks, shard {shard / 2**20:.0f} MiB, {rounds} rounds", m, ratios,
            {"slowest_rank_vs_single": "<= 1.2"}, args.out,
            {"ranks": n, "shard_bytes": shard, "rounds": rounds, "single": single,
             "per_rank": per_rank, "cpus": os.cpu_count()})


def rank_worker(cfg_path: Path, rounds: int) -> None:
    """One rank of the ``--ranks`` job (run by torchrun).  Each round: every rank saves
    its shard of the job's step and times it; then rank 0 alone saves a shard of the same
    size as a one-process DCP save (no process group) while the others wait -- the
    single-rank stall, measured in the same conditions as the round it follows."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    cfg = json.loads(cfg_path.read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    local = shard_state(int(cfg["shard"]), rank)
    state = {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False)
             for k, v in local.items()}
    ck = Checkpointer(cfg["socket"], bucket="bench") if rank == 0 else None
    stalls, single = [], []
    for i in range(2 + rounds):
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=TierdStorageWriter(f"tierd://bench/ranks/{i}",
                                                          cfg["socket"]))
        dt = time.perf_counter() - t0
        if ck is not None:
            ck.wait_persisted("ranks", i, level="local")  # the next save starts clean
            t0 = time.perf_counter()
            dcp.save(local, storage_writer=TierdStorageWriter(f"tierd://bench/single/{i}",
                                                              cfg["socket"]), no_dist=True)
            one = time.perf_counter() - t0
            ck.wait_persisted("single", i, level="local")
            if i >= 2:
                single.append(one)
        if i >= 2:
            stalls.append(dt)
    Path(cfg["out"], f"rank-{rank}.json").write_text(json.dumps({"stalls": stalls,
                                                                 "single": single}))
    dist.barrier()
    dist.destroy_process_group()


# -- --gpu ------------------------------------------------------------------------------
def gpu_main(args: argparse.Namespace,
             model_state: Callable[[int], dict[str, torch.Tensor]]) -> None:
    if not torch.cuda.is_available():
        sys.exit("--gpu needs torch with CUDA and a GPU; this machine has none "
                 "(torch.cuda.is_available() is False): nothing measured")
    size = int(args.size_gib * (1 << 30))
    rounds = args.rounds
    sd = {k: v.cuda() for k, v in model_state(size).items()}
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"model state on {torch.cuda.get_device_name()}: {len(sd)} tensors, "
          f"{nbytes / 2**30:.2f} GiB", flush=True)
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in sd.items()}
    pageable = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in sd.items()}
    res: dict[str, list[float]] = {}

    def rec(k: str, fn: Callable[[], object]) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        res.setdefault(k, []).append(time.perf_counter() - t0)

    def copy_into(dst: dict[str, torch.Tensor]) -> None:
        for k, v in sd.items():
            dst[k].copy_(v, non_blocking=True)

    work = scratch_dir(args)
    sock = str(work / "pool.sock")
    d = start_daemon(work / "data", "--pool-socket", sock,
                     "--pool-capacity", str(2 * size + (1 << 30)))
    try:
        ck = Checkpointer(sock)
        step = 0
        for _ in range(2):  # warm-up: the region is mapped and registered as pinned once
            ck.save("gpu", step, sd)
            ck.wait_persisted("gpu", step, level="local")
            step += 1
        local = work / "torch.pt"
        for r in range(rounds):
            rec("pinned_copy", lambda: copy_into(pinned))
            rec("pageable_copy", lambda: copy_into(pageable))
            rec("tierd_stall", lambda s=step: ck.save("gpu", s, sd))
            ck.wait_persisted("gpu", step, level="local")
            step += 1
            t0 = time.perf_counter()
            handle = ck.save("gpu", step, sd, blocking=False)
            res.setdefault("tierd_nonblocking_return", []).append(time.perf_counter() - t0)
            handle.wait()
            res.setdefault("tierd_nonblocking_wait", []).append(time.perf_counter() - t0)
            ck.wait_persisted("gpu", step, level="local")
            step += 1

            def tsave() -> None:
                torch.save(sd, local)
                fd = os.open(local, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            rec("torch_save_fsync", tsave)
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in res.items()),
                  flush=True)
        last = step - 1
        for _ in range(rounds):
            rec("restore_pool", lambda: ck.load("gpu", last, into=sd))
            rec("restore_hot", lambda: ck.load("gpu", last - 1, into=sd))

            def tload() -> None:
                got = torch.load(local, map_location="cuda")
                for k, v in got.items():
                    sd[k].copy_(v)
            rec("torch_load_cuda", tload)
        ck.close()
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)
    m = {k: statistics.median(v) for k, v in res.items()}
    ratios = {"stall_vs_pinned_copy": m["tierd_stall"] / m["pinned_copy"],
              "nonblocking_return_vs_pinned_copy": m["tierd_nonblocking_return"]
              / m["pinned_copy"],
              "torch_load_vs_restore_pool": m["torch_load_cuda"] / m["restore_pool"],
              "torch_load_vs_restore_hot": m["torch_load_cuda"] / m["restore_hot"]}
    report(f"GiB {nbytes / 2**30:.2f} on {torch.cuda.get_device_name()}", m, ratios,
            {"stall_vs_pinned_copy": "<= 1.2", "torch_load_vs_restore_pool": ">= 4"},
            args.out, {"bytes": nbytes, "rounds": rounds, "runs": res,
                       "device": torch.cuda.get_device_name()})
