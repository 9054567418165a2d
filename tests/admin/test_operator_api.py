"""What an operator reaches for in the first hour, through the admin API of a real daemon:
buckets made and removed, a placement policy removed, where each file of a prefix is, every
checkpoint run, and prefixes naming a bucket that does not exist -- refused with
``404 no_such_bucket`` instead of answered with zero (or, for ``pin``, a stored policy)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Admin, start_admin

#: every placement operation that takes a prefix: (method, path, body)
PREFIX_OPS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/placement/du?prefix=nosuch/", None),
    ("GET", "/v1/placement/ls?prefix=nosuch/", None),
    ("POST", "/v1/placement/warmup", {"prefix": "nosuch/"}),
    ("POST", "/v1/placement/evict", {"prefix": "nosuch/"}),
    ("POST", "/v1/placement/pin", {"prefix": "nosuch/"}),
    ("PUT", "/v1/placement/policy", {"prefix": "nosuch/", "mode": "write-through"}),
    ("POST", "/v1/placement/persist", {"prefix": "nosuch/", "timeout": 1}),
    ("POST", "/v1/placement/import", {"prefix": "nosuch/"}),
    ("POST", "/v1/jobs", {"kind": "warmup", "prefix": "nosuch/"}),
    ("POST", "/v1/jobs", {"kind": "pin", "prefix": "nosuch/"}),
    ("POST", "/v1/jobs", {"kind": "evict", "prefix": "nosuch/"}),
    ("POST", "/v1/jobs", {"kind": "persist", "prefix": "nosuch/", "timeout": 1}),
]


@pytest.fixture(scope="module")
def op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admin]:
    a = start_admin(tmp_path_factory.mktemp("operator") / "data")
    s3 = a.d.client()
    s3.create_bucket(Bucket="data")
    for key, n in (("set/a.bin", 300_000), ("set/b.bin", 1000), ("other/c.bin", 10)):
        s3.put_object(Bucket="data", Key=key, Body=b"x" * n)
    yield a
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]


def test_a_prefix_in_a_missing_bucket_is_404_everywhere(op: Admin) -> None:
    for method, path, body in PREFIX_OPS:
        status, doc = op.call(method, path, body)
        assert status == 404, (method, path, body, status, doc)
        assert doc["error"] == "no_such_bucket" and "'nosuch'" in doc["message"], doc
    # pin stored nothing
    _, pols = op.call("GET", "/v1/placement/policy")
    assert all(not p["prefix"].startswith("nosuch") for p in pols["policies"]), pols
    # a prefix of bucket names that matches none; one that matches, and the bucket itself
    status, doc = op.call("GET", "/v1/placement/du?prefix=zz")
    assert status == 404 and "no bucket name starts with 'zz'" in doc["message"]
    for prefix in ("da", "data", "data/", "data/set/", ""):
        status, doc = op.call("GET", f"/v1/placement/du?prefix={prefix}")
        assert status == 200, (prefix, doc)
    # unpin only removes: it works after the bucket is gone, and never stores a policy
    status, doc = op.call("POST", "/v1/placement/unpin", {"prefix": "nosuch/"})
    assert status == 200 and doc["pin"] is False


def test_a_bad_prefix_is_400_before_a_streamed_answer_starts(op: Admin) -> None:
    for prefix in ("data/\x00x", "\x00", 7, ["data/"], "data/\ud800"):
        status, doc = op.call("POST", "/v1/placement/warmup", {"prefix": prefix})
        assert status == 400 and doc["error"] == "bad_request", (prefix, status, doc)
        status, doc = op.call("POST", "/v1/jobs", {"kind": "warmup", "prefix": prefix})
        assert status == 400 and doc["error"] == "bad_request", (prefix, status, doc)
    # a good one streams: progress lines, the last with every byte done
    req = urllib.request.Request(op.url + "/v1/placement/warmup", method="POST",
                                 data=json.dumps({"prefix": "data/set/"}).encode(),
                                 headers={"Authorization": f"Bearer {op.token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        lines = [json.loads(line) for line in r]
    assert {k: lines[0][k] for k in ("done", "total", "files")} == {
        "done": 0, "total": 301_000, "files": 2}
    assert lines[-1]["done"] == 301_000


def test_buckets_are_created_and_removed(op: Admin) -> None:
    status, user = op.call("POST", "/v1/users", {"name": "cleo", "uid": 4343, "gid": 77})
    assert status == 201, user
    status, doc = op.call("POST", "/v1/buckets", {"name": "made-here"})
    assert status == 201 and doc["name"] == "made-here" and doc["owner_uid"] == 0, doc
    status, doc = op.call("POST", "/v1/buckets", {"name": "cleos", "owner": "cleo"})
    assert status == 201 and doc["owner"] == "cleo" and doc["owner_uid"] == 4343, doc
    # the S3 door sees them at once, and cleo's key owns hers
    names = {b["Name"] for b in op.d.client().list_buckets()["Buckets"]}
    assert {"made-here", "cleos"} <= names
    status, key = op.call("POST", "/v1/keys", {"user": "cleo"})
    cleo = op.d.client(key["access_key"], key["secret"])
    cleo.put_object(Bucket="cleos", Key="k", Body=b"v")
    assert cleo.head_object(Bucket="cleos", Key="k")["ContentLength"] == 1

    refused = [
        ({"name": "made-here"}, 409, "bucket_exists"),
        ({"name": "No_Such"}, 400, "invalid_bucket_name"),
        ({"name": "ok-name", "owner": "nobody-here"}, 404, "no_such_user"),
        ({"name": "ok-name", "acl": "public-read"}, 400, "bad_request"),
        ({"bucket": "ok-name"}, 400, "bad_request"),
    ]
    for body, want, code in refused:
        status, doc = op.call("POST", "/v1/buckets", body)
        assert (status, doc["error"]) == (want, code), (body, status, doc)
    assert op.call("GET", "/v1/buckets/ok-name")[0] == 404

    status, doc = op.call("DELETE", "/v1/buckets/cleos")
    assert status == 409 and doc["error"] == "bucket_not_empty", doc
    cleo.delete_object(Bucket="cleos", Key="k")
    for name in ("cleos", "made-here"):
        status, doc = op.call("DELETE", f"/v1/buckets/{name}")
        assert status == 200 and doc == {"bucket": name, "deleted": True}, doc
        assert op.call("GET", f"/v1/buckets/{name}")[0] == 404
    status, doc = op.call("DELETE", "/v1/buckets/made-here")
    assert status == 404 and doc["error"] == "no_such_bucket"


def test_a_placement_policy_is_removed(op: Admin) -> None:
    status, doc = op.call("PUT", "/v1/placement/policy",
                          {"prefix": "data/other/", "mode": "write-through", "pin": True})
    assert status == 200, doc
    status, doc = op.call("DELETE", "/v1/placement/policy?prefix=data/other/")
    assert status == 200 and doc == {"prefix": "data/other/", "deleted": True}
    _, pols = op.call("GET", "/v1/placement/policy")
    assert "data/other/" not in {p["prefix"] for p in pols["policies"]}
    status, doc = op.call("DELETE", "/v1/placement/policy?prefix=data/other/")
    assert status == 404 and doc["error"] == "no_such_policy"


def test_ls_says_where_each_file_is(op: Admin) -> None:
    status, doc = op.call("GET", "/v1/placement/ls?prefix=data/set/")
    assert status == 200, doc
    assert [f["key"] for f in doc["files"]] == ["data/set/a.bin", "data/set/b.bin"]
    assert doc["truncated"] is False and "hot" in doc["tiers"] and "cold" in doc["tiers"]
    a = doc["files"][0]
    assert a["size"] == 300_000 and a["tiers"]["hot"] == 300_000, a
    assert a["policy"] == {"mode": "write-back", "pin": False, "tier": "hot"}
    # persisted, then evicted from hot: cold has it all, hot nothing
    status, _ = op.call("POST", "/v1/placement/persist", {"prefix": "data/", "timeout": 60})
    assert status == 200
    status, _ = op.call("POST", "/v1/placement/evict", {"prefix": "data/set/a.bin"})
    assert status == 200
    _, doc = op.call("GET", "/v1/placement/ls?prefix=data/set/a")
    (a,) = doc["files"]
    assert a["state"] == "clean" and a["tiers"]["cold"] == 300_000 and a["tiers"]["hot"] == 0
    # bounded: limit=1 of three files
    status, doc = op.call("GET", "/v1/placement/ls?prefix=data/&limit=1")
    assert status == 200 and len(doc["files"]) == 1 and doc["truncated"] is True
    for bad in ("0", "x", "1000001"):
        status, doc = op.call("GET", f"/v1/placement/ls?prefix=data/&limit={bad}")
        assert status == 400 and "limit" in doc["message"]


def test_checkpoint_runs_on_disk_are_listed_and_steps_removed(op: Admin,
                                                               tmp_path: Path) -> None:
    """Runs the daemon has not seen since it started (a restart) are found on disk."""
    s3 = op.d.client()
    s3.create_bucket(Bucket="checkpoints")
    for step in (1, 2):
        s3.put_object(Bucket="checkpoints", Key=f"run-a/step-{step}/data", Body=b"w" * 10)
    s3.put_object(Bucket="checkpoints", Key="not-a-run/file", Body=b"x")
    status, doc = op.call("GET", "/v1/ckpt")
    assert status == 200, doc
    runs = {(r["bucket"], r["run"]): r for r in doc["runs"]}
    assert ("checkpoints", "not-a-run") not in runs
    assert [s["step"] for s in runs["checkpoints", "run-a"]["steps"]] == [1, 2]
    status, named = op.call("GET", "/v1/ckpt?bucket=checkpoints")
    assert status == 200 and named["runs"] == doc["runs"]
    status, doc = op.call("GET", "/v1/ckpt?bucket=no-such-ckpts")
    assert status == 404 and doc["error"] == "no_such_bucket"

    status, doc = op.call("DELETE", "/v1/ckpt?run=run-a&step=1")
    assert status == 200 and doc["deleted"] == 1, doc
    _, doc = op.call("GET", "/v1/ckpt?run=run-a")
    assert [s["step"] for s in doc["steps"]] == [2]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="checkpoints",
                                                 Prefix="run-a/")["Contents"]]
    assert keys == ["run-a/step-2/data"]
    status, doc = op.call("DELETE", "/v1/ckpt?run=run-a&step=1")
    assert status == 404, doc
    status, doc = op.call("DELETE", "/v1/ckpt?run=run-a&step=x")
    assert status == 400, doc


def test_a_step_removed_from_a_missing_bucket_is_404_and_leaves_no_trace(op: Admin) -> None:
    """A named bucket that does not exist is ``no_such_bucket`` for ``DELETE /v1/ckpt``
    as for the listing, and the typo leaves no phantom run in the listing (the status
    page shows that listing)."""
    status, doc = op.call("DELETE", "/v1/ckpt?bucket=no-such-ckpts&run=typo&step=1")
    assert status == 404 and doc["error"] == "no_such_bucket", doc
    status, doc = op.call("GET", "/v1/ckpt")
    assert status == 200, doc
    assert all(r["bucket"] != "no-such-ckpts" for r in doc["runs"]), doc


def test_asking_for_a_run_nobody_saved_leaves_no_phantom_run(op: Admin) -> None:
    """A read of a run that does not exist (a typo, a monitor probing names) answers empty
    and is not remembered: the listing, and the status page that shows it, do not grow
    with every name anybody asked for."""
    op.d.client().create_bucket(Bucket="phantom-ckpts")
    for name in ("typo-1", "typo-2"):
        status, doc = op.call("GET", f"/v1/ckpt?bucket=phantom-ckpts&run={name}")
        assert status == 200 and doc["steps"] == [], doc
    status, doc = op.call("GET", "/v1/ckpt?bucket=phantom-ckpts")
    assert status == 200 and doc["runs"] == [], doc
