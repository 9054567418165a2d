"""Asynchronous placement jobs (``/v1/jobs``) against a real daemon with a warm tier and a
``file://`` cold store: progress that adds up, the placement they leave behind, failures,
cancel of running and queued jobs, and bad requests."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from s3.conftest import ROOT_KEY, ROOT_SECRET

from tierd.admin.jobs import MAX_RUNNING
from tierd.tiers import BLOCK_SIZE

from .conftest import Admin, start_admin

SIZES = [BLOCK_SIZE + 1, 100, 2 * BLOCK_SIZE, 3, BLOCK_SIZE // 2]


@pytest.fixture(scope="module")
def jd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Admin, Path]]:
    base = tmp_path_factory.mktemp("jobs")
    cold = base / "cold"
    (cold / "dset").mkdir(parents=True)
    for i, size in enumerate(SIZES):
        (cold / "dset" / f"f{i}.bin").write_bytes(os.urandom(size))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET,
               TIERD_COLD_URL=f"file://{cold}", TIERD_WARM_ENABLED="true",
               TIERD_PERSIST_DELAY="60")
    a = start_admin(base / "data", env=env)
    yield a, cold
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]


def start(a: Admin, **doc: Any) -> dict[str, Any]:
    status, job = a.call("POST", "/v1/jobs", doc)
    assert status == 202, job
    assert job["state"] in ("queued", "running") and job["kind"] == doc["kind"]
    return dict(job)


def wait(a: Admin, job_id: str, until: tuple[str, ...] = ("done", "failed", "cancelled")
         ) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, job = a.call("GET", f"/v1/jobs/{job_id}")
        assert status == 200, job
        if job["state"] in until:
            return dict(job)
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {job['state']}")


def du(a: Admin, prefix: str) -> dict[str, Any]:
    status, doc = a.call("GET", f"/v1/placement/du?prefix={prefix}")
    assert status == 200, doc
    return dict(doc["tiers"])


def test_warmup_evict_pin_jobs_report_progress_and_place_data(
        jd: tuple[Admin, Path]) -> None:
    a, _ = jd
    total = sum(SIZES)
    job = wait(a, start(a, kind="warmup", prefix="dset/")["id"])
    assert job["state"] == "done", job
    assert job["done"] == job["total"] == total
    assert job["files_done"] == job["files"] == len(SIZES)
    assert job["eta_s"] is None and job["error"] is None and job["bytes_per_s"] > 0
    assert job["started"] >= job["created"] and job["finished"] >= job["started"]
    assert job["result"] == {"prefix": "dset/", "warmed": total, "files": len(SIZES),
                             "copied": {"hot": total}}
    assert du(a, "dset/")["hot"] == total

    job = wait(a, start(a, kind="evict", prefix="dset/", tier="hot")["id"])
    assert job["state"] == "done" and job["done"] == total and job["files_done"] == 5, job
    assert job["result"]["tiers"]["hot"] == total
    tiers = du(a, "dset/")
    assert tiers["hot"] == 0 and tiers["warm"] == total  # demoted, not dropped

    job = wait(a, start(a, kind="evict", prefix="dset/")["id"])  # tier: all
    assert job["state"] == "done" and job["result"]["evicted"] == total, job
    assert du(a, "dset/")["warm"] == 0

    job = wait(a, start(a, kind="pin", prefix="dset/")["id"])
    assert job["state"] == "done" and job["done"] == total, job
    assert job["result"]["policy"]["pin"] is True
    assert du(a, "dset/")["hot"] == total
    _, pol = a.call("GET", "/v1/placement/policy")
    assert {"prefix": "dset/", "mode": "write-back", "pin": True, "tier": "hot"} in pol[
        "policies"], pol
    job = wait(a, start(a, kind="evict", prefix="dset/")["id"])
    assert job["state"] == "done" and job["result"]["evicted"] == 0, job  # pinned
    assert du(a, "dset/")["hot"] == total
    status, _ = a.call("POST", "/v1/placement/unpin", {"prefix": "dset/"})
    assert status == 200

    status, listing = a.call("GET", "/v1/jobs?state=done")
    assert status == 200
    kinds = [j["kind"] for j in listing["jobs"]]
    assert kinds[:5] == ["evict", "pin", "evict", "evict", "warmup"]  # newest first


def test_persist_job_done_failed_and_cancelled(jd: tuple[Admin, Path]) -> None:
    a, cold = jd
    s3 = a.d.client()
    s3.create_bucket(Bucket="wbk")
    payload = os.urandom(BLOCK_SIZE + 5)
    s3.put_object(Bucket="wbk", Key="ok/a", Body=payload)
    job = wait(a, start(a, kind="persist", prefix="wbk/ok/")["id"])
    assert job["state"] == "done" and job["done"] == job["total"] == len(payload), job
    assert job["files_done"] == job["files"] == 1
    assert job["result"] == {"prefix": "wbk/ok/", "persisted": True}
    assert (cold / "wbk" / "ok" / "a").read_bytes() == payload

    # an object in cold where the file's parent directory must go: never persisted
    s3.put_object(Bucket="wbk", Key="stuck/x", Body=b"x" * 1000)
    (cold / "wbk").mkdir(exist_ok=True)
    (cold / "wbk" / "stuck").write_bytes(b"in the way")
    job = wait(a, start(a, kind="persist", prefix="wbk/stuck/", timeout=0.5)["id"])
    assert job["state"] == "failed" and "not persisted within 0.5 s" in job["error"], job
    assert job["result"] is None and job["done"] == 0 and job["total"] == 1000

    # MAX_RUNNING persist jobs that wait forever, and one more that must queue behind them
    stuck = [start(a, kind="persist", prefix="wbk/stuck/")["id"] for _ in range(MAX_RUNNING)]
    for jid in stuck:
        wait(a, jid, until=("running",))
    queued = start(a, kind="warmup", prefix="dset/")
    time.sleep(0.2)
    status, doc = a.call("GET", f"/v1/jobs/{queued['id']}")
    assert doc["state"] == "queued" and doc["started"] is None, doc
    status, doc = a.call("DELETE", f"/v1/jobs/{queued['id']}")
    assert status == 200 and doc["state"] == "cancelled" and doc["started"] is None, doc
    for jid in stuck:
        status, doc = a.call("DELETE", f"/v1/jobs/{jid}")
        assert status == 200 and doc["state"] == "cancelled", doc
        assert doc["finished"] is not None and doc["error"] is None
    status, again = a.call("DELETE", f"/v1/jobs/{stuck[0]}")  # finished: nothing to do
    assert status == 200 and again["state"] == "cancelled"
    status, listing = a.call("GET", "/v1/jobs?state=cancelled")
    assert {j["id"] for j in listing["jobs"]} >= {queued["id"], *stuck}
    (cold / "wbk" / "stuck").unlink()


@pytest.mark.parametrize(("doc", "message"), [
    ({}, "kind must be one of"),
    ({"kind": "defrag"}, "kind must be one of"),
    ({"kind": "warmup", "prefix": 3}, "prefix must be a string"),
    ({"kind": "warmup", "tier": "nvme"}, "nvme"),
    ({"kind": "pin", "tier": "all"}, "tier must be mem, hot or warm"),
    ({"kind": "evict", "tier": "cold"}, "tier must be mem, hot, warm or all"),
    ({"kind": "persist", "tier": "hot"}, "takes no tier"),
    ({"kind": "persist", "timeout": -1}, "timeout must be a positive number"),
    ({"kind": "persist", "timeout": True}, "timeout must be a positive number"),
    ({"kind": "warmup", "timeout": 5}, "takes no timeout"),
    ({"kind": "warmup", "priority": 1}, "unknown field 'priority'"),
    ([], "must be a JSON object"),
])
def test_bad_job_requests_are_400(jd: tuple[Admin, Path], doc: Any, message: str) -> None:
    a, _ = jd
    status, err = a.call("POST", "/v1/jobs", doc)
    assert status == 400 and err["error"] == "bad_request", err
    assert message in err["message"], err


def test_unknown_jobs_and_states(jd: tuple[Admin, Path]) -> None:
    a, _ = jd
    for method in ("GET", "DELETE"):
        status, err = a.call(method, "/v1/jobs/0123456789abcdef")
        assert status == 404 and err["error"] == "not_found", err
    status, err = a.call("GET", "/v1/jobs?state=sleeping")
    assert status == 400 and "state must be one of" in err["message"]
    status, err = a.call("POST", "/v1/jobs", body=b"{not json")
    assert status == 400 and err["error"] == "bad_request"
    status, _ = a.call("GET", "/v1/jobs", token=None)
    assert status == 401


def test_daemon_stops_cleanly_with_a_job_running(jd: tuple[Admin, Path]) -> None:
    """Last in the module: SIGTERM while a job runs cancels it and the daemon exits 0."""
    a, cold = jd
    a.d.client().put_object(Bucket="wbk", Key="late/x", Body=b"y" * 10)
    (cold / "wbk" / "late").write_bytes(b"in the way")
    jid = start(a, kind="persist", prefix="wbk/late/")["id"]
    wait(a, jid, until=("running",))
    a.d.stop()
    assert a.d.proc.returncode == 0, a.log()[-3000:]
    log = a.log()
    assert f"job={jid}" in log and "state=cancelled" in log.split(f"job={jid}")[-1]
    assert "stopped cleanly" in log
