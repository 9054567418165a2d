"""The ``tierctl`` commands a user reaches for in the first hour, end to end against a real
daemon: ``--version``, ``bucket``, ``bucket policy``, ``ls``, ``policy rm``, ``ckpt list``
without a run and ``ckpt rm``, ``health --json``, and a bucket that does not exist ("no such
bucket", exit 1, nothing changed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from admin.conftest import Admin

import tierd

from .conftest import run_ctl
from .test_tierctl import DS, api, fails, keyed, ok, table


def test_version() -> None:
    for flag in ("--version", "-V"):
        r = run_ctl(flag)
        assert r.returncode == 0 and r.stdout == f"tierctl {tierd.__version__}\n", r


def test_a_missing_bucket_is_an_error_and_changes_nothing(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    before = api(a, "/v1/placement/policy")
    for args in (("warmup", "nosuch/"), ("warmup", "nosuch/", "--detach"), ("du", "nosuch/"),
                 ("evict", "nosuch/"), ("persist", "nosuch/"), ("import", "nosuch/"),
                 ("pin", "nosuch/"), ("ls", "nosuch/"), ("policy", "set", "nosuch/",
                                                          "--mode", "write-through")):
        line = fails(a.tierctl(*args), 1)
        assert "no such bucket 'nosuch'" in line, (args, line)
    assert api(a, "/v1/placement/policy") == before  # pin stored no policy
    line = fails(a.tierctl("du", "zzz"), 1)
    assert "no bucket name starts with 'zzz'" in line
    assert api(a, "/v1/jobs")["jobs"] == [] or all(
        not j["prefix"].startswith("nosuch") for j in api(a, "/v1/jobs")["jobs"])


def test_buckets_and_their_policies(ctl: tuple[Admin, Path], tmp_path: Path) -> None:
    a, _ = ctl
    assert ok(a, "bucket", "create", "made-by-ctl") == "created bucket made-by-ctl (owner root)\n"
    rows = keyed(table(ok(a, "bucket", "list")))
    assert rows["NAME"] == ["NAME", "OWNER", "CREATED", "ACL", "POLICY"]
    assert rows["made-by-ctl"][1] == "root" and rows["made-by-ctl"][4] == "-"
    assert "dset" in rows  # the bucket the cold store had
    assert json.loads(ok(a, "bucket", "list", "--json")) == api(a, "/v1/buckets")
    line = fails(a.tierctl("bucket", "create", "made-by-ctl"), 1)
    assert "exists already" in line
    line = fails(a.tierctl("bucket", "create", "Bad_Name"), 1)
    assert "invalid bucket name" in line

    policy = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
        "Resource": "arn:aws:s3:::made-by-ctl/pub/*"}]}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    out = ok(a, "bucket", "policy", "set", "made-by-ctl", str(path))
    assert out == "set the policy of made-by-ctl (public: it allows everyone something)\n"
    got = json.loads(ok(a, "bucket", "policy", "get", "made-by-ctl"))
    assert got["Statement"][0]["Resource"] == "arn:aws:s3:::made-by-ctl/pub/*"
    assert keyed(table(ok(a, "bucket", "list")))["made-by-ctl"][4] == "public"
    # from standard input too
    r = run_ctl("--data-dir", str(a.data), "bucket", "policy", "set", "made-by-ctl", "-",
                stdin="{not json")
    assert r.returncode == 2 and "not a JSON document" in r.stderr
    assert ok(a, "bucket", "policy", "rm", "made-by-ctl") == "removed the policy of made-by-ctl\n"
    assert ok(a, "bucket", "policy", "rm", "made-by-ctl") == "made-by-ctl had no policy\n"
    line = fails(a.tierctl("bucket", "policy", "get", "made-by-ctl"), 1)
    assert "has no policy" in line

    s3 = a.d.client()
    s3.put_object(Bucket="made-by-ctl", Key="x", Body=b"1")
    line = fails(a.tierctl("bucket", "rm", "made-by-ctl"), 1)
    assert "not empty" in line
    s3.delete_object(Bucket="made-by-ctl", Key="x")
    assert ok(a, "bucket", "rm", "made-by-ctl") == "removed bucket made-by-ctl\n"
    assert "no such bucket" in fails(a.tierctl("bucket", "rm", "made-by-ctl"), 1)


def test_ls_shows_where_each_file_is(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    ok(a, "import", DS)  # ls, like du, shows what the namespace has: import it first
    ok(a, "evict", DS)
    rows = table(ok(a, "ls", DS))
    assert rows[0] == ["KEY", "SIZE", "STATE", "MEM", "HOT", "WARM", "COLD", "PIN"]
    files = keyed(rows[1:])
    assert set(files) == {"dset/set/a.bin", "dset/set/b.bin", "dset/set/sub/c.bin"}
    assert files["dset/set/a.bin"][2:] == ["clean", "-", "-", "-", "100%", "no"]
    ok(a, "warmup", "dset/set/a.bin")
    assert keyed(table(ok(a, "ls", DS)))["dset/set/a.bin"][4] == "100%"  # on hot now
    doc = json.loads(ok(a, "ls", DS, "--json"))
    assert doc == api(a, "/v1/placement/ls?prefix=dset/set/")
    r = a.tierctl("ls", DS, "--limit", "1")
    assert r.returncode == 0 and len(table(r.stdout)) == 2
    assert "the first 1 files" in r.stderr


def test_policy_rm(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    ok(a, "policy", "set", "dset/set/sub/", "--mode", "write-through")
    assert "dset/set/sub/" in keyed(table(ok(a, "policy", "get")))
    assert ok(a, "policy", "rm", "dset/set/sub/") == "removed the policy of dset/set/sub/\n"
    assert "dset/set/sub/" not in keyed(table(ok(a, "policy", "get")))
    assert "no placement policy" in fails(a.tierctl("policy", "rm", "dset/set/sub/"), 1)


def test_ckpt_list_every_run_and_rm(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    assert ok(a, "ckpt", "list") == "no checkpoint runs in checkpoints\n"
    s3 = a.d.client()
    s3.create_bucket(Bucket="checkpoints")
    for run, steps in (("run-a", (1, 2, 3)), ("run-b", (7,))):
        for n in steps:
            s3.put_object(Bucket="checkpoints", Key=f"{run}/step-{n}/weights", Body=b"w")
    rows = table(ok(a, "ckpt", "list"))
    assert rows[0] == ["RUN", "STEPS", "NEWEST", "STATE", "SIZE"]
    runs = keyed(rows[1:])
    assert runs["checkpoints/run-a"][1:3] == ["3", "3"]
    assert runs["checkpoints/run-b"][1:3] == ["1", "7"]
    assert json.loads(ok(a, "ckpt", "list", "--json")) == api(a, "/v1/ckpt")
    assert "no such bucket" in fails(a.tierctl("ckpt", "list", "--bucket", "nope-ckpt"), 1)

    assert ok(a, "ckpt", "rm", "run-a", "1", "2") == (
        "removed step 1 of checkpoints/run-a\nremoved step 2 of checkpoints/run-a\n")
    steps = table(ok(a, "ckpt", "list", "run-a"))
    assert [r[0] for r in steps[1:]] == ["3"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="checkpoints")["Contents"]]
    assert keys == ["run-a/step-3/weights", "run-b/step-7/weights"]
    line = fails(a.tierctl("ckpt", "rm", "run-a", "1"), 1)
    assert "has no step 1" in line


def test_health_json(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    doc = json.loads(ok(a, "health", "--json"))
    assert doc == {"healthy": True, "status": "ok", "url": a.url}
    # unreachable: one error line, exit 1, as every command
    r = run_ctl("--admin-url", "http://127.0.0.1:9", "health", "--json")
    assert r.returncode == 1 and "cannot reach" in r.stderr


@pytest.mark.parametrize("args", [("bucket",), ("mount",), ("ckpt", "rm", "run")])
def test_incomplete_commands_are_usage_errors(ctl: tuple[Admin, Path],
                                              args: tuple[str, ...]) -> None:
    a, _ = ctl
    r = a.tierctl(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
