"""Checkpoint benchmark: tierd's save/load against the limits and peers.

Three modes: the default (one process, below), ``--ranks N`` (a ``torchrun`` job of N CPU
ranks saving through DCP: each rank's stall against the stall of one process saving a
shard of the same size) and ``--gpu`` (the state on a CUDA device: save stall against the
pinned copy limit, restore into the device tensors against ``torch.load``).

A model state of ``--size-gib`` (fp32 tensors shaped like a small transformer: embedding,
then layers of qkv/out/fc1/fc2 and norms) is checkpointed ``--rounds`` times after two
warm-up saves (steady state: tierd reuses its region, DCP its cached staging buffers).  In
each round, alternately:

* ``copy_``: a warm copy into preallocated tensors (the limit of any in-memory save);
* tierd ``save`` (the training stall), then until durable on hot (``wait_persisted
  level=local``), then until persisted to the moto-backed cold tier;
* ``dcp.async_save`` to local disk with a caching stager: its stall (staging) and total;
* ``torch.save`` + fsync to local disk;
* boto3 ``upload_file`` of the same bytes to the same moto server (the cold baseline).

Loads (a restore = load + copy into the model's tensors): tierd from pool, hot and cold (after
``evict``) vs ``torch.load`` of the local file and ``dcp.load`` of the DCP directory, page
cache warm for the local files.  Ratios are tierd / baseline of medians.

    sudo .venv/bin/python bench/ckpt_bench.py --size-gib 2 --rounds 3 --out bench/results/ckpt.json
    .venv/bin/python bench/ckpt_bench.py --ranks 4 --size-gib 0.25 --out ckpt-ranks.json
    .venv/bin/python bench/ckpt_bench.py --gpu --size-gib 2.74 --out ckpt-gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import boto3
import torch
import torch.distributed.checkpoint as dcp
from benchlib import admin_call
from ckpt_modes import gpu_main, rank_worker, ranks_main, report, scratch_dir
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, running_moto
from s3.conftest import start_daemon
from tierd_client.checkpoint import Checkpointer
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

warnings.filterwarnings("ignore", message=".*single process.*")
COLD = "bench-cold"


def model_state(size: int) -> dict[str, torch.Tensor]:
    d, vocab = 2048, 32000
    sd = {"embed.weight": torch.randn(vocab, d)}
    i = 0
    while sum(t.numel() * 4 for t in sd.values()) < size:
        p = f"layers.{i}."
        for name, shape in (("attn.qkv", (3 * d, d)), ("attn.out", (d, d)),
                            ("mlp.fc1", (4 * d, d)), ("mlp.fc2", (d, 4 * d))):
            sd[p + name + ".weight"] = torch.randn(*shape)
            sd[p + name + ".bias"] = torch.randn(shape[0])
        sd[p + "ln1.weight"] = torch.ones(d)
        sd[p + "ln2.weight"] = torch.ones(d)
        i += 1
    return sd


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="scratch dir (default: a temp "
                    "dir on the root file system, where the daemon's data dir goes too)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/ckpt.json"))
    ap.add_argument("--ranks", type=int, default=0, help="a torchrun job of this many CPU "
                    "ranks saving through DCP (the state is split between them)")
    ap.add_argument("--gpu", action="store_true", help="the state on the CUDA device")
    ap.add_argument("--rank-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker is not None:
        rank_worker(args.rank_worker, args.rounds)
        return
    if args.ranks:
        ranks_main(args)
        return
    if args.gpu:
        gpu_main(args, model_state)
        return
    size = int(args.size_gib * (1 << 30))
    work = scratch_dir(args)
    sd = model_state(size)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"model state: {len(sd)} tensors, {nbytes / 2**30:.2f} GiB", flush=True)
    res: dict[str, list[float]] = {}

    def rec(k: str, v: float) -> None:
        res.setdefault(k, []).append(v)

    with running_moto() as moto:
        s3 = boto3.client("s3", endpoint_url=moto.url, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name=REGION)
        s3.create_bucket(Bucket=COLD)
        data = work / "data"
        d = start_daemon(data, "--pool-socket", str(work / "pool.sock"),
                         "--pool-capacity", str(2 * size + (1 << 30)),
                         "--cold-url", f"s3://{COLD}/tierd", "--cold-s3-endpoint", moto.url,
                         "--cold-s3-access-key", ACCESS_KEY, "--cold-s3-secret-key",
                         SECRET_KEY, "--cold-s3-region", REGION, "--cold-s3-addressing",
                         "path", "--ckpt-keep-local", "2", "--ckpt-keep-cold", "2")
        try:
            ck = Checkpointer(work / "pool.sock")
            pre = {k: torch.empty_like(v) for k, v in sd.items()}
            dcp_writer = dcp.FileSystemWriter(work / "dcp-0")
            # the best CPU-only stager: cached staging buffers (pinned memory needs CUDA),
            # staging finished before async_save returns
            stager = DefaultStager(StagingOptions(use_pinned_memory=False,
                                                  use_shared_memory=False,
                                                  use_async_staging=False,
                                                  use_non_blocking_copy=False))

            def copy_into() -> None:
                for k, v in sd.items():
                    pre[k].copy_(v)

            copy_into()
            step = 0
            for _ in range(2):  # warm-up: region allocated and mapped, stager cache filled
                ck.save("bench", step, sd)
                ck.wait_persisted("bench", step, timeout=3600)  # rounds start with no backlog
                step += 1
                dcp.async_save(sd, checkpoint_id=work / "dcp-w", storage_writer=dcp_writer,
                               async_stager=stager).result()
            for r in range(args.rounds):
                rec("copy_", timed(copy_into))
                t0 = time.perf_counter()
                ck.save("bench", step, sd)
                rec("tierd_stall", time.perf_counter() - t0)
                ck.wait_persisted("bench", step, level="local")
                rec("tierd_local", time.perf_counter() - t0)
                ck.wait_persisted("bench", step, timeout=3600)
                rec("tierd_cold", time.perf_counter() - t0)
                step += 1
                t0 = time.perf_counter()
                fut = dcp.async_save(sd, checkpoint_id=work / f"dcp-{r}",
                                     storage_writer=dcp_writer, async_stager=stager)
                rec("dcp_stall", time.perf_counter() - t0)
                fut.result()
                rec("dcp_total", time.perf_counter() - t0)
                local = work / f"torch-{r}.pt"

                def tsave(local: Path = local) -> None:
                    torch.save(sd, local)
                    fd = os.open(local, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
                rec("torch_save_fsync", timed(tsave))
                rec("boto3_upload", timed(lambda local=local, r=r: s3.upload_file(
                    str(local), COLD, f"baseline/{r}.pt")))
                s3.delete_object(Bucket=COLD, Key=f"baseline/{r}.pt")  # moto keeps all in RAM
                print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in res.items()),
                      flush=True)
                if r:
                    (work / f"torch-{r - 1}.pt").unlink()
                    shutil.rmtree(work / f"dcp-{r - 1}", ignore_errors=True)

            def restore(state: dict[str, torch.Tensor]) -> None:
                for k, v in state.items():
                    pre[k].copy_(v)

            last = step - 1
            for _ in range(args.rounds):
                rec("load_pool", timed(lambda: restore(ck.load("bench", last))))
                rec("load_hot", timed(lambda: restore(ck.load("bench", last - 1))))
                lf = work / f"torch-{args.rounds - 1}.pt"
                rec("torch_load", timed(lambda lf=lf: restore(torch.load(lf, mmap=False))))
                rec("dcp_load", timed(lambda: dcp.load(
                    pre, checkpoint_id=work / f"dcp-{args.rounds - 1}")))
            admin = json.loads((data / "endpoints.json").read_text())["admin"]["url"]
            for _ in range(args.rounds):
                admin_call(admin, data, "POST", "/v1/placement/evict",
                           {"prefix": "checkpoints/bench/", "tier": "all"})
                rec("load_cold", timed(lambda: restore(ck.load("bench", last - 1))))
            ck.close()
        finally:
            d.stop()
    shutil.rmtree(work, ignore_errors=True)

    m = {k: med(v) for k, v in res.items()}
    ratios = {
        "stall_vs_copy_": m["tierd_stall"] / m["copy_"],
        "stall_vs_dcp_async_stall": m["tierd_stall"] / m["dcp_stall"],
        "torch_save_fsync_vs_stall": m["torch_save_fsync"] / m["tierd_stall"],
        "local_vs_dcp_async_total": m["tierd_local"] / m["dcp_total"],
        "cold_vs_boto3_upload": m["tierd_cold"] / m["boto3_upload"],
        "load_pool_vs_torch_load": m["load_pool"] / m["torch_load"],
        "load_hot_vs_torch_load": m["load_hot"] / m["torch_load"],
        "load_cold_vs_torch_load": m["load_cold"] / m["torch_load"],
        "load_pool_vs_dcp_load": m["load_pool"] / m["dcp_load"],
    }
    targets = {"stall_vs_copy_": "<= 1.5", "stall_vs_dcp_async_stall": "<= 1.0",
               "torch_save_fsync_vs_stall": ">= 8", "local_vs_dcp_async_total": "<= 1.0",
               "cold_vs_boto3_upload": "<= 1.3"}
    report(f"GiB {nbytes / 2**30:.2f}, {args.rounds} rounds", m, ratios, targets, args.out,
           {"bytes": nbytes, "rounds": args.rounds, "runs": res})


if __name__ == "__main__":
    main()
