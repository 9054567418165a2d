"""``GET /metrics`` and request ids against a real ``tierd serve``.

One daemon (JSON logs at debug level through ``TIERD_LOG_FORMAT``, a long persist delay so
written data stays dirty and queued, a FUSE mount when /dev/fuse exists) takes a workload
through S3, the admin API and the mount; the exposition is scraped with the admin token
before and after, parsed with prometheus_client's own parser, and the counters must have
moved by exactly what the workload did.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families
from s3.conftest import ROOT_KEY, ROOT_SECRET, Daemon, start_daemon
from tierd_fuse.mount import find_mount, unmount

from admin.conftest import Admin

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Scrape:
    """One parsed exposition: sample (name, labels) -> value, and family name -> type."""

    samples: Samples
    types: dict[str, str]

    def get(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)

    def labelled(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {lb: v for (n, lb), v in self.samples.items() if n == name}


def http(url: str, token: str | None, method: str = "GET", doc: Any = None
         ) -> tuple[int, dict[str, str], bytes]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()


def scrape(a: Admin) -> Scrape:
    status, headers, body = http(a.url + "/metrics", a.token)
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return Scrape(samples, types)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Admin, Path | None]]:
    data = tmp_path_factory.mktemp("metrics") / "data"
    mnt: Path | None = None
    args = ["--umask", "000", "--persist-delay", "600", "--log-level", "debug"]
    if os.path.exists("/dev/fuse") and shutil.which("fusermount3"):
        mnt = Path(tempfile.mkdtemp(prefix="tierd-metrics-mnt-"))
        args += ["--mount", str(mnt)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET,
               TIERD_LOG_FORMAT="json")
    d: Daemon = start_daemon(data, *args, env=env)
    a = Admin(d)
    try:
        yield a, mnt
    finally:
        d.stop()
        if mnt is not None:
            if find_mount(mnt) is not None:
                with contextlib.suppress(Exception):
                    unmount(mnt, lazy=True)
            shutil.rmtree(mnt, ignore_errors=True)
    assert "Traceback" not in a.log(), a.log()[-5000:]


def log_lines(a: Admin) -> list[dict[str, Any]]:
    out = []
    for line in a.log().splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                out.append(doc)
    return out


def test_counters_move_with_an_s3_workload(daemon: tuple[Admin, Path | None]) -> None:
    a, _ = daemon
    s3 = a.d.client()
    bucket = f"m-{uuid.uuid4().hex[:12]}"
    before = scrape(a)
    s3.create_bucket(Bucket=bucket)
    bodies = {f"k{i}": os.urandom(1000 * (i + 1)) for i in range(3)}
    for k, v in bodies.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)
    for k in ("k0", "k1"):
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == bodies[k]
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="missing")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"
    assert len(s3.list_objects_v2(Bucket=bucket)["Contents"]) == 3
    after = scrape(a)

    def moved(op: str, status: str) -> float:
        labels = {"door": "s3", "operation": op, "status": status}
        return (after.get("tierd_requests_total", **labels)
                - before.get("tierd_requests_total", **labels))

    assert after.types["tierd_requests"] == "counter"
    assert moved("CreateBucket", "2xx") == 1
    assert moved("PutObject", "2xx") == 3
    assert moved("GetObject", "2xx") == 2
    assert moved("GetObject", "4xx") == 1  # NoSuchKey is a 404
    assert moved("GetObject", "5xx") == 0
    assert moved("ListObjectsV2", "2xx") == 1
    # the latency histogram saw every GET, answered or not
    count = {"door": "s3", "operation": "GetObject"}
    assert (after.get("tierd_request_duration_seconds_count", **count)
            - before.get("tierd_request_duration_seconds_count", **count)) == 3
    assert after.types["tierd_request_duration_seconds"] == "histogram"
    assert after.get("tierd_request_duration_seconds_bucket", le="+Inf", **count) == \
        after.get("tierd_request_duration_seconds_count", **count)
    # this scrape is the one admin request in flight; the previous one was counted
    assert after.get("tierd_requests_in_flight", door="admin") == 1
    assert after.get("tierd_requests_in_flight", door="s3") == 0
    scrapes = {"door": "admin", "operation": "GET /metrics", "status": "2xx"}
    assert (after.get("tierd_requests_total", **scrapes)
            - before.get("tierd_requests_total", **scrapes)) == 1

    # tiers: the PUTs are on hot, dirty and queued (persist delay 600 s), cold is up
    total = sum(len(v) for v in bodies.values())
    assert after.get("tierd_tier_used_bytes", tier="hot") - \
        before.get("tierd_tier_used_bytes", tier="hot") >= total
    assert after.get("tierd_tier_capacity_bytes", tier="hot") > 0
    assert after.get("tierd_dirty_bytes") - before.get("tierd_dirty_bytes") >= total
    assert after.get("tierd_dirty_files") >= 3
    assert after.get("tierd_persist_queue_depth") - before.get("tierd_persist_queue_depth") >= 3
    assert after.get("tierd_persist_queue_oldest_age_seconds") > 0
    assert after.get("tierd_cold_store_up") == 1
    assert after.get("tierd_cold_store_errors_total", operation="persist") == 0
    assert after.types["tierd_tier_hits"] == "counter"
    # the GETs read data hot holds: hits, no cold fetch
    assert after.get("tierd_tier_hits_total", tier="hot") - \
        before.get("tierd_tier_hits_total", tier="hot") >= 2
    assert after.get("tierd_tier_misses_total", tier="hot") == \
        before.get("tierd_tier_misses_total", tier="hot")
    assert after.has("tierd_tier_evicted_bytes_total")
    # the memory pool and its tier
    assert after.get("tierd_pool_capacity_bytes") > 0
    assert after.types["tierd_pool_tenant_used_bytes"] == "gauge"
    assert after.get("tierd_tier_capacity_bytes", tier="mem") > 0
    assert after.types["tierd_checkpoint_duration_seconds"] == "histogram"


def test_metrics_need_the_token(daemon: tuple[Admin, Path | None]) -> None:
    a, _ = daemon
    before = scrape(a)
    status, headers, body = http(a.url + "/metrics", None)
    assert status == 401, body
    assert json.loads(body)["error"] == "unauthorized"
    assert len(headers["X-Request-Id"]) == 16
    status, _, body = http(a.url + "/metrics", "not-the-token-at-all")
    assert status == 401, body
    after = scrape(a)
    refused = {"door": "admin", "operation": "GET /metrics", "status": "4xx"}
    assert (after.get("tierd_requests_total", **refused)
            - before.get("tierd_requests_total", **refused)) == 2
    assert b"tierd_" not in body


def test_admin_operations_are_route_templates(daemon: tuple[Admin, Path | None]) -> None:
    a, _ = daemon
    for name in ("nobody1", "nobody2"):
        status, _, body = http(a.url + f"/v1/users/{name}", a.token)
        assert status == 404, body
    status, _, _ = http(a.url + "/v1/no-such-endpoint", a.token)
    assert status == 404
    after = scrape(a)
    ops = {dict(lb)["operation"] for lb in after.labelled("tierd_requests_total")
           if dict(lb)["door"] == "admin"}
    assert "GET /v1/users/{name}" in ops
    assert not any("nobody" in op for op in ops)  # no raw paths as label values
    assert "GET unmatched" in ops
    assert after.get("tierd_requests_total", door="admin", operation="GET /v1/users/{name}",
                     status="4xx") >= 2


def test_request_ids_in_the_logs(daemon: tuple[Admin, Path | None]) -> None:
    a, _ = daemon
    s3 = a.d.client()
    bucket = f"r-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="absent")
    s3_id = err.value.response["ResponseMetadata"]["RequestId"]
    assert len(s3_id) == 16
    # an admin change: its "user added" line is logged inside the handler
    name = f"u{uuid.uuid4().hex[:8]}"
    status, headers, body = http(a.url + "/v1/users", a.token, "POST",
                                 {"name": name, "uid": 4321})
    assert status == 201, body
    admin_id = headers["X-Request-Id"]
    lines = log_lines(a)
    assert lines, "no JSON log lines"
    mine = [ln for ln in lines if ln.get("request_id") == s3_id]
    access = [ln for ln in mine if ln["component"] == "s3.access"]
    assert len(access) == 1, mine
    assert access[0]["status"] == 404 and access[0]["path"] == f"/{bucket}/absent"
    admin = [ln for ln in lines if ln.get("request_id") == admin_id]
    msgs = {ln["msg"] for ln in admin}
    assert "user added" in msgs, admin
    assert "admin change" in msgs, admin
    added = next(ln for ln in admin if ln["msg"] == "user added")
    assert added["user"] == name
    # ids are per request: no other request shares them
    assert all(ln.get("path") in (None, f"/{bucket}/absent") for ln in mine)
    # records outside any request carry none
    ready = [ln for ln in lines if ln["msg"] == "tierd ready"]
    assert ready and "request_id" not in ready[0]


def test_fuse_requests_counted(daemon: tuple[Admin, Path | None]) -> None:
    a, mnt = daemon
    if mnt is None:
        pytest.skip("no FUSE here (/dev/fuse or fusermount3 missing)")
    bucket = f"f-{uuid.uuid4().hex[:12]}"
    a.d.client().create_bucket(Bucket=bucket)
    before = scrape(a)
    path = mnt / bucket / "file"
    path.write_bytes(b"x" * 5000)  # (write passthrough: the kernel writes the hot file)
    suid = mnt / bucket / "suid"
    suid.write_bytes(b"")
    os.chmod(suid, 0o4755)  # set-id files keep the WRITE path: their writes are requests
    with open(suid, "ab") as f:
        f.write(b"y" * 5000)
    missing = mnt / bucket / f"nope-{uuid.uuid4().hex}"
    assert not missing.exists()  # a lookup answered ENOENT (entries are not cached negative)
    after = scrape(a)

    def moved(op: str, status: str) -> float:
        labels = {"door": "fuse", "operation": op, "status": status}
        return (after.get("tierd_requests_total", **labels)
                - before.get("tierd_requests_total", **labels))

    assert moved("create", "ok") == 2
    assert moved("write", "ok") >= 1
    assert moved("flush", "ok") >= 2
    assert moved("lookup", "ENOENT") >= 1
    assert after.get("tierd_requests_in_flight", door="fuse") == 0
    assert (after.get("tierd_request_duration_seconds_count", door="fuse", operation="create")
            - before.get("tierd_request_duration_seconds_count", door="fuse",
                         operation="create")) == 2


def test_checkpoint_phases_observed(daemon: tuple[Admin, Path | None]) -> None:
    torch = pytest.importorskip("torch")
    from tierd_client.checkpoint import Checkpointer

    a, _ = daemon
    socket = json.loads((a.data / "endpoints.json").read_text())["pool_socket"]
    before = scrape(a)
    with Checkpointer(socket) as ck:
        ck.save("metrics-run", 1, {"w": torch.arange(1000, dtype=torch.float32)})
        assert ck.wait_persisted("metrics-run", 1, level="cold") == "persisted"
    after = scrape(a)
    for phase in ("stall", "local", "persisted"):
        key = "tierd_checkpoint_duration_seconds_count"
        assert after.get(key, phase=phase) - before.get(key, phase=phase) == 1, phase
    # the saving connection's tenant shows up in the pool's per-tenant figures
    assert after.labelled("tierd_pool_tenant_used_bytes"), "no tenant in the pool metrics"
    assert after.get("tierd_persisted_files_total") > before.get("tierd_persisted_files_total")
