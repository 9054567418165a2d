"""Checkpoints end to end against a real daemon: save/load, atomicity across SIGKILL,
loading from a moto-backed cold tier, retention, a client killed mid-save, DCP."""

from __future__ import annotations

import errno
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from tierd_client.checkpoint import Checkpointer
from tierd_client.pool import PoolClient, PoolQuotaExceeded, PoolRequestError

from .conftest import Tierd, python_as

COLD_BUCKET = "tierd-cold"


def state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(300, 200, generator=g)
    return {
        "model": {"w": big, "b": torch.randn(200, generator=g).to(torch.bfloat16),
                  "mask": torch.rand(17, generator=g) > 0.5, "t": big.t()[:50, :7],
                  "scalar": torch.tensor(3.5, dtype=torch.float64),
                  "empty": torch.zeros(0, 4, dtype=torch.int32)},
        "optim": [{"step": seed, "m": torch.arange(10, dtype=torch.int64) * seed}],
        "meta": {"epoch": seed, "name": f"run-{seed}", "lr": 1e-3},
    }


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_save_load_list_delete(tierd: Tierd) -> None:
    with Checkpointer(tierd.socket) as ck:
        with pytest.raises(PoolRequestError) as e:
            ck.load("r1")
        assert e.value.errno == errno.ENOENT and "no checkpoints" in str(e.value)
        sd = state(1)
        ck.save("r1", 10, sd)
        sd["model"]["w"].add_(1)  # training goes on: the checkpoint must not change
        _manifest, _mm, where = ck.open("r1", 10)
        assert where == "pool"
        got = ck.load("r1", 10)
        assert same(got, state(1))
        got["model"]["w"].zero_()  # a private mapping: the stored copy stays
        assert same(ck.load("r1", 10), state(1))
        ck.save("r1", 20, state(2))
        assert ck.latest("r1") == 20 and same(ck.load("r1"), state(2))
        with pytest.raises(PoolRequestError) as e:
            ck.save("r1", 20, state(3))
        assert e.value.errno == errno.EEXIST
        assert ck.wait_persisted("r1", 20, level="local") in ("local", "persisted")
        with pytest.raises(PoolRequestError) as e:
            ck.load("r1", 15)
        assert e.value.errno == errno.ENOENT and "[10, 20]" in str(e.value)
        ck.wait_persisted("r1", 10)
        ck.delete("r1", 10)
        assert [s["step"] for s in ck.list("r1")] == [20]
    # the step is an ordinary directory of objects, readable through S3
    s3 = tierd.d.client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="checkpoints")["Contents"]]
    assert keys == ["r1/step-20/data", "r1/step-20/manifest.json"]
    doc = json.loads(s3.get_object(Bucket="checkpoints",
                                   Key="r1/step-20/manifest.json")["Body"].read())
    assert doc["step"] == 20 and doc["format"] == "tierd-ckpt/1"
    data = s3.get_object(Bucket="checkpoints", Key="r1/step-20/data")["Body"].read()
    assert len(data) == doc["size"]


def test_quota_refused_before_any_copy(tierd: Tierd) -> None:
    status, _ = tierd.admin_call("PUT", "/v1/pool/quota/0", {"bytes": 4 << 20})
    assert status == 200
    with Checkpointer(tierd.socket) as ck:
        with pytest.raises(PoolQuotaExceeded) as e:
            ck.save("big", 1, {"w": torch.zeros(4 << 20)})
        assert e.value.errno == errno.EDQUOT
        assert ck.list("big") == []
        ck.save("big", 2, {"w": torch.zeros(1000)})
        assert [s["step"] for s in ck.list("big")] == [2]


def test_sigkill_before_and_after_commit(public_dir: Path) -> None:
    t = Tierd(public_dir / "data")
    try:
        with Checkpointer(t.socket) as ck:
            ck.save("crash", 1, state(1))
            ck.wait_persisted("crash", 1, level="local")
            m = ck.stage("crash", 2, 1 << 20)  # staged, never committed
            m.mm[:4] = b"half"
            t.kill()
        t.restart()
        with Checkpointer(t.socket) as ck:
            assert [s["step"] for s in ck.list("crash")] == [1]
            assert same(ck.load("crash", 1), state(1))
            ck.save("crash", 3, state(3))  # committed; the daemon may die before hot has it
            t.kill()
        t.restart()
        with Checkpointer(t.socket) as ck:
            steps = [s["step"] for s in ck.list("crash")]
            assert steps in ([1], [1, 3])  # absent or whole, never partial
            if 3 in steps:
                assert same(ck.load("crash", 3), state(3))
            ck.save("crash", 2, state(2))  # the staged step left nothing in the way
            assert same(ck.load("crash", 2), state(2))
            ck.wait_persisted("crash", 2, level="local")  # (its temporary name is gone)
        keys = [o["Key"] for o in t.d.client().list_objects_v2(
            Bucket="checkpoints", Prefix="crash/")["Contents"]]
        assert not [k for k in keys if ".tierd-tmp" in k]
    finally:
        t.stop()


_MID_SAVE = """
import os, signal, sys
from tierd_client.checkpoint import Checkpointer
ck = Checkpointer(sys.argv[1])
m = ck.stage("midsave", 7, 8 << 20)
m.mm[: 4 << 20] = b"x" * (4 << 20)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_client_killed_mid_save_leaves_nothing(tierd: Tierd) -> None:
    r = python_as(None, _MID_SAVE, tierd.socket)
    assert r.returncode == -signal.SIGKILL, r.stderr
    with Checkpointer(tierd.socket) as ck:
        deadline = time.monotonic() + 10
        while ck.client.stats()["regions"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ck.client.stats()["regions"] == 0
        assert ck.list("midsave") == []
        ck.save("midsave", 7, {"ok": torch.ones(3)})  # the step number is free
        assert torch.equal(ck.load("midsave", 7)["ok"], torch.ones(3))


def test_persisted_to_moto_then_loaded_from_cold(public_dir: Path, moto: MotoServer) -> None:
    prefix = f"ckpt-{time.time_ns()}"
    t = Tierd(public_dir / "data", "--cold-url", f"s3://{COLD_BUCKET}/{prefix}",
              "--cold-s3-endpoint", moto.url, "--cold-s3-access-key", ACCESS_KEY,
              "--cold-s3-secret-key", SECRET_KEY, "--cold-s3-region", REGION,
              "--cold-s3-addressing", "path", "--ckpt-keep-local", "1", "--ckpt-keep-cold", "2")
    try:
        with Checkpointer(t.socket) as ck:
            for step in (1, 2, 3, 4):
                ck.save("cold", step, state(step))
                assert ck.wait_persisted("cold", step, timeout=60) == "persisted"
            # retention: two steps left in cold, the newest kept
            assert [s["step"] for s in ck.list("cold")] == [3, 4]
        stored = {o["Key"][len(prefix) + 1:] for o in moto.client().list_objects_v2(
            Bucket=COLD_BUCKET, Prefix=prefix + "/")["Contents"]}
        assert {"checkpoints/cold/step-3/data", "checkpoints/cold/step-4/data"} <= stored
        assert not [k for k in stored if "step-1" in k or "step-2" in k]
        status, doc = t.admin_call("POST", "/v1/placement/evict",
                                   {"prefix": "checkpoints/cold/", "tier": "all"})
        assert status == 200 and doc["evicted"] > 0
        t.restart()  # no pool copy either
        with Checkpointer(t.socket) as ck:
            _manifest, _mm, where = ck.open("cold", 3)
            assert where == "cold"
            assert same(ck.load("cold", 3), state(3))
            assert same(ck.load("cold", 4), state(4))
            status, doc = t.admin_call("GET", "/v1/ckpt?run=cold")
            assert status == 200 and [s["state"] for s in doc["steps"]] == ["persisted"] * 2
    finally:
        t.stop()


def test_region_reused_in_steady_state(tierd: Tierd) -> None:
    with Checkpointer(tierd.socket, keep_local=1) as ck:
        for step in range(5):
            ck.save("steady", step, state(step))
            ck.wait_persisted("steady", step, level="local")
        assert len(ck._maps) == 1  # one region mapped once, reused by every save
        assert PoolClient(tierd.socket).stats()["regions"] == 1
        assert same(ck.load("steady", 4), state(4))
        assert same(ck.load("steady", 0), state(0))  # from hot: its pool copy is gone


_OTHER = """
import errno, json, sys
from tierd_client.checkpoint import Checkpointer
from tierd_client.pool import PoolRequestError
import torch
ck = Checkpointer(sys.argv[1])
out = {}
for name, fn in (("save", lambda: ck.save("r", 2, {"x": torch.ones(2)})),
                 ("delete", lambda: ck.delete("r", 1))):
    try:
        fn()
        out[name] = "ok"
    except PoolRequestError as e:
        out[name] = errno.errorcode[e.errno]
_, _, out["where"] = ck.open("r", 1)
out["same"] = bool(torch.equal(ck.load("r", 1)["x"], torch.arange(5)))
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/usr/bin/setpriv").exists(), reason="needs setpriv")
def test_other_tenant_gets_the_namespace_answer(tierd: Tierd) -> None:
    from .conftest import OTHER_UID

    with Checkpointer(tierd.socket) as ck:
        ck.save("r", 1, {"x": torch.arange(5)})  # the bucket is root's, private
        ck.wait_persisted("r", 1, level="local")
        # objects are their owner's alone by default: root shares the run with every user
        # (mode bits, as PutObjectAcl authenticated-read sets them)
        s3 = tierd.d.client()
        s3.put_bucket_acl(Bucket="checkpoints", ACL="authenticated-read")
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="checkpoints")["Contents"]}
        prefixes = {k[: i + 1] for k in keys for i, c in enumerate(k) if c == "/"}
        for key in sorted(prefixes | keys):
            s3.put_object_acl(Bucket="checkpoints", Key=key, ACL="authenticated-read")
        r = python_as(OTHER_UID, _OTHER, tierd.socket)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        # refused at stage, before any copy; delete refused by the namespace; the pool copy
        # is root's region, so the reader gets the (world-readable) file instead
        assert out == {"save": "EACCES", "delete": "EACCES", "where": "hot", "same": True}
        assert [s["step"] for s in ck.list("r")] == [1]
