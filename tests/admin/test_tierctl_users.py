"""``tierctl user ...`` and ``tierctl key ...`` against a real daemon."""

from __future__ import annotations

import json
import uuid

from .conftest import Admin
from .test_users import error_code, s3_client


def ok(admin: Admin, *args: str) -> str:
    r = admin.tierctl(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def fails(admin: Admin, *args: str) -> str:
    r = admin.tierctl(*args)
    assert r.returncode != 0, r.stdout
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("tierctl: "), r.stderr
    assert "Traceback" not in r.stderr
    return line


def test_user_and_key_commands(admin: Admin) -> None:
    name = f"cli{uuid.uuid4().hex[:6]}"
    out = ok(admin, "user", "add", name, "--uid", "2301", "--groups", "10,11")
    assert f"added user {name} (uid 2301, gid 2301)" in out
    table = ok(admin, "user", "list")
    header, *rows = table.splitlines()
    assert header.split() == ["NAME", "UID", "GID", "GROUPS", "ADMIN", "KEYS", "CREATED"]
    row = next(r.split() for r in rows if r.startswith(name + " "))
    assert row[:6] == [name, "2301", "2301", "10,11", "no", "0"]
    users = json.loads(ok(admin, "user", "list", "--json"))["users"]
    assert {"name": name, "uid": 2301, "gid": 2301, "groups": [10, 11],
            "admin": False}.items() <= next(u for u in users if u["name"] == name).items()

    created = json.loads(ok(admin, "key", "add", name, "--json"))
    ak, secret = created["access_key"], created["secret"]
    s3_client(admin, ak, secret).list_buckets()
    out = ok(admin, "key", "add", name)
    assert "secret" in out and "not shown again" in out
    second = out.split()[2]

    listing = ok(admin, "key", "list", "--user", name)
    assert ak in listing and second in listing and secret not in listing
    assert listing.splitlines()[0].split() == ["ACCESS", "KEY", "USER", "STATUS", "CREATED"]
    keys = json.loads(ok(admin, "key", "list", "--json"))["keys"]
    assert {k["access_key"] for k in keys} >= {ak, second}
    assert all("secret" not in k for k in keys)

    assert f"disabled {ak}" in ok(admin, "key", "disable", ak)
    assert error_code(s3_client(admin, ak, secret).list_buckets) == "InvalidAccessKeyId"
    row = next(r for r in ok(admin, "key", "list").splitlines() if r.startswith(ak))
    assert "disabled" in row
    ok(admin, "key", "enable", ak)
    s3_client(admin, ak, secret).list_buckets()
    assert f"deleted {second}" in ok(admin, "key", "rm", second)

    out = ok(admin, "user", "rm", name)
    assert f"deleted user {name} and its keys {ak}" in out
    assert name not in ok(admin, "user", "list")


def test_errors_are_one_line(admin: Admin) -> None:
    name = f"dup{uuid.uuid4().hex[:6]}"
    ok(admin, "user", "add", name, "--uid", "2302")
    assert "already exists" in fails(admin, "user", "add", name, "--uid", "2399")
    assert "HTTP 409" in fails(admin, "user", "add", name + "x", "--uid", "2302")
    assert "no user" in fails(admin, "user", "rm", "nobody-at-all")
    assert "no user" in fails(admin, "key", "add", "nobody-at-all")
    assert "no access key" in fails(admin, "key", "disable", "NOSUCHKEY")
    assert "no access key" in fails(admin, "key", "rm", "NOSUCHKEY")
    assert "--groups" in fails(admin, "user", "add", name + "y", "--uid", "5",
                               "--groups", "a,b")
    r = admin.tierctl("user", "add", name + "z")  # --uid missing: click's usage error
    assert r.returncode == 2 and "--uid" in r.stderr
    ok(admin, "user", "rm", name)


def test_token_discovery(admin: Admin) -> None:
    """--token and TIERD_ADMIN_TOKEN win over the file; without any token, a hint."""
    r = admin.tierctl("--token", "wrong-token-0123456789", "user", "list")
    assert r.returncode == 1 and "HTTP 401" in r.stderr and "--token" in r.stderr
    r = admin.tierctl("user", "list", env={"TIERD_ADMIN_TOKEN": "wrong-token-0123456789"})
    assert r.returncode == 1 and "HTTP 401" in r.stderr
    r = admin.tierctl("user", "list", env={"TIERD_ADMIN_TOKEN": admin.token})
    assert r.returncode == 0 and "root" in r.stdout
    # another data directory (no token there) but the right URL: 401 with the hint
    r = admin.tierctl("--admin-url", admin.url, "--data-dir", "/nonexistent-tierd",
                      "user", "list")
    assert r.returncode == 1 and "no admin token" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
