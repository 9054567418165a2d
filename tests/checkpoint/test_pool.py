"""The memory pool: extents, sealed regions, tenants, quotas, clean-up and admin frees."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import shutil
import signal
import time

import pytest
from tierd_client.pool import PoolClient, PoolFull, PoolQuotaExceeded, PoolRequestError

from tierd.mempool.extents import ALIGN, Extents
from tierd.mempool.pool import FarMemory, MemPool, PoolError

from .conftest import OTHER_UID, Tierd, python_as

MiB = 1 << 20
needs_setpriv = pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                                   reason="needs root and setpriv for a second tenant")


def test_extents_first_fit_coalesce_and_fragmentation() -> None:
    e = Extents(10 * ALIGN)
    offs = [e.alloc(ALIGN) for _ in range(10)]
    assert offs == [i * ALIGN for i in range(10)] and e.alloc(1) is None
    for i in (1, 3, 5):
        e.release(i * ALIGN, ALIGN)
    assert e.free == 3 * ALIGN and e.largest == ALIGN
    assert e.fragmentation() == pytest.approx(2 / 3)
    assert e.alloc(2 * ALIGN) is None  # enough bytes in total, no extent large enough
    e.release(2 * ALIGN, ALIGN)  # joins 1..3 into one extent of 3
    assert e.largest == 3 * ALIGN and e.alloc(3 * ALIGN) == ALIGN
    with pytest.raises(ValueError):
        e.release(5 * ALIGN, ALIGN)  # already free: a double free is refused


def test_region_is_sealed_and_quota_checked_before_allocation() -> None:
    pool = MemPool(64 * MiB, default_quota=8 * MiB)
    r = pool.alloc(5, 3 * MiB)
    with pytest.raises(OSError) as e:
        os.ftruncate(r.fd, 100 * MiB)  # a tenant cannot grow its region past its quota
    assert e.value.errno == errno.EPERM
    assert fcntl.fcntl(r.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_GROW
    with pytest.raises(PoolError) as q:
        pool.alloc(5, 6 * MiB)
    assert q.value.errno == errno.EDQUOT and "quota" in str(q.value)
    pool.quotas[5] = 1 << 30  # a quota above the capacity: the pool is the limit
    with pytest.raises(PoolError) as full:
        pool.alloc(5, 128 * MiB)
    assert full.value.errno == errno.ENOSPC
    assert pool.stats()["tenants"]["5"]["used"] == 4 * MiB  # 3 MiB rounded to 2 MiB units
    pool.free(r.id)
    assert pool.used == 0 and pool.stats()["regions"] == 0


def test_far_memory_paces_moves_to_its_bandwidth() -> None:
    far = FarMemory(latency_us=1000, bandwidth=40 * MiB)
    copied: list[tuple[int, int]] = []
    t0 = time.monotonic()
    asyncio.run(far.move(8 * MiB, MiB, lambda off, n: copied.append((off, n))))
    elapsed = time.monotonic() - t0
    assert copied == [(i * MiB, MiB) for i in range(8)]
    assert elapsed >= 8 / 40 * 0.95  # never faster than the cap
    assert far.moved_out == 8 * MiB


def test_region_round_trip_and_stats(tierd: Tierd) -> None:
    with PoolClient(tierd.socket) as c:
        m = c.alloc(3 * MiB, name="scratch")
        m.mm[:5] = b"hello"
        again = c.open(m.id)  # a second mapping of the same memory: coherent
        assert again.mm[:5] == b"hello"
        st = c.stats()
        assert st["used"] == 4 * MiB and st["regions"] == 1
        assert [r["name"] for r in c.regions()] == ["scratch"]
        c.free(m.id)
        assert c.stats()["used"] == 0
        with pytest.raises(PoolRequestError) as e:
            c.open(m.id)
        assert e.value.errno == errno.ENOENT
        with pytest.raises(PoolRequestError) as e:
            c.call("no-such-op")
        assert e.value.errno == errno.ENOSYS


_TENANT = """
import errno, json, sys
from tierd_client.pool import PoolClient, PoolRequestError
c = PoolClient(sys.argv[1])
out = {"visible": [r["id"] for r in c.regions()]}
try:
    c.open(int(sys.argv[2]))
    out["open"] = "granted"
except PoolRequestError as e:
    out["open"] = errno.errorcode[e.errno]
try:
    m = c.alloc(int(sys.argv[3]))
    m.mm[:3] = b"abc"
    out["alloc"] = "ok"
except PoolRequestError as e:
    out["alloc"] = errno.errorcode[e.errno]
    out["message"] = str(e)
print(json.dumps(out))
"""


@needs_setpriv
def test_second_tenant_cannot_obtain_a_region_and_has_its_quota(tierd: Tierd) -> None:
    status, doc = tierd.admin_call("PUT", f"/v1/pool/quota/{OTHER_UID}", {"bytes": 4 * MiB})
    assert status == 200 and doc["quota"] == 4 * MiB
    with PoolClient(tierd.socket) as root:
        mine = root.alloc(2 * MiB)
        mine.mm[:6] = b"secret"
        r = python_as(OTHER_UID, _TENANT, tierd.socket, str(mine.id), str(8 * MiB))
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["visible"] == [] and out["open"] == "EACCES"
        assert out["alloc"] == "EDQUOT" and "quota" in out["message"]
        r = python_as(OTHER_UID, _TENANT, tierd.socket, str(mine.id), str(4 * MiB))
        assert json.loads(r.stdout)["alloc"] == "ok"
        # the tenant's process exited: its region went with its connection
        assert root.stats()["tenants"].get(str(OTHER_UID), {}).get("used", 0) == 0
        assert mine.mm[:6] == b"secret"


_HOLD = """
import sys, time
from tierd_client.pool import PoolClient
c = PoolClient(sys.argv[1])
a = c.alloc(2 << 20)
b = c.alloc(2 << 20, persistent=True)
print(a.id, b.id, flush=True)
time.sleep(600)
"""


def test_regions_freed_when_the_owner_dies_unless_persistent(tierd: Tierd) -> None:
    p = python_as(None, _HOLD, tierd.socket, wait=False)
    assert p.stdout is not None
    a, b = (int(x) for x in p.stdout.readline().split())
    with PoolClient(tierd.socket) as c:
        assert {r["id"] for r in c.regions()} == {a, b}
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        deadline = time.monotonic() + 10
        while {r["id"] for r in c.regions()} != {b} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {r["id"] for r in c.regions()} == {b}
    status, doc = tierd.admin_call("DELETE", f"/v1/pool/regions/{b}")
    assert status == 200 and doc["freed"] == b
    status, doc = tierd.admin_call("DELETE", f"/v1/pool/regions/{b}")
    assert status == 404 and doc["error"] == "enoent"
    status, doc = tierd.admin_call("GET", "/v1/pool")
    assert status == 200 and doc["used"] == 0 and doc["bytes_moved_out"] == 0


def test_pool_full_and_quota_exceeded_are_told_apart(tierd: Tierd) -> None:
    """A tenant without a quota of its own is limited by the pool: too large a request is
    "pool full" (ENOSPC), not "quota exceeded"; with a quota below the pool it is EDQUOT.
    A quota larger than the pool is refused (it would limit nothing)."""
    with PoolClient(tierd.socket) as c:
        with pytest.raises(PoolFull) as full:
            c.alloc(1 << 40)
        assert full.value.errno == errno.ENOSPC and str(1 << 40) in str(full.value)
        assert "memory pool full" in str(full.value) and "quota" not in str(full.value)
        status, _ = tierd.admin_call("PUT", "/v1/pool/quota/0", {"bytes": 8 * MiB})
        assert status == 200
        with pytest.raises(PoolQuotaExceeded) as quota:
            c.alloc(16 * MiB)
        assert quota.value.errno == errno.EDQUOT and not isinstance(quota.value, PoolFull)
        assert "quota exceeded" in str(quota.value)
        status, doc = tierd.admin_call("PUT", "/v1/pool/quota/0", {"bytes": 1 << 40})
        assert status == 400 and "larger than the pool" in doc["message"], doc
        status, doc = tierd.admin_call("GET", "/v1/pool")
        assert doc["tenants"]["0"]["quota"] == 8 * MiB  # the refused one changed nothing


def test_tierctl_pool_and_ckpt_commands(tierd: Tierd) -> None:
    import subprocess
    import sys

    import torch
    from tierd_client.checkpoint import Checkpointer

    def tierctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tierd_client.tierctl", "--admin-url",
                               tierd.admin, "--data-dir", str(tierd.data), *args],
                              capture_output=True, text=True, timeout=60)

    with Checkpointer(tierd.socket) as ck:
        ck.save("cli", 1, {"w": torch.ones(1000)})
        ck.wait_persisted("cli", 1, level="local")
        r = tierctl("pool", "quota", "set", "1234", "64MiB")
        assert r.returncode == 0 and "quota 64.0 MiB" in r.stdout, r.stdout + r.stderr
        r = tierctl("pool", "status")
        lines = [line.split() for line in r.stdout.splitlines()]
        assert r.returncode == 0 and ["1234", "0", "B", "64.0", "MiB", "0"] in lines, r.stdout
        assert ["regions", "1"] in lines
        r = tierctl("ckpt", "list", "cli")
        assert r.returncode == 0, r.stderr
        header, row = (line.split() for line in r.stdout.splitlines()[:2])
        assert header[:2] == ["STEP", "STATE"] and row[0] == "1", r.stdout
        assert row[1] in ("local", "persisted"), r.stdout
        r = tierctl("pool", "quota", "set", "1234", "lots")
        assert r.returncode != 0 and "is not a size" in r.stderr
        rid = PoolClient(tierd.socket).regions()[0]["id"]
        r = tierctl("pool", "free", str(rid))
        assert r.returncode == 0 and f"freed region {rid}" in r.stdout, r.stderr
        r = tierctl("pool", "free", str(rid))
        assert r.returncode != 0 and "no pool region" in r.stderr
        assert ck.list("cli")[0]["in_pool"] is False
        assert torch.equal(ck.load("cli", 1)["w"], torch.ones(1000))  # from hot
