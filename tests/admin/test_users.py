"""Users and access keys through the admin API, used over S3 with boto3 (a real daemon)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from s3.conftest import REGION, ROOT_KEY, ROOT_SECRET, USER_KEY, USER_SECRET, add_user_key

from tierd.acl.keys import canonical_user_id
from tierd.meta import MetaStore

from .conftest import Admin, start_admin

PROTECTED = ["/v1/status", "/v1/pool", "/v1/ckpt", "/v1/placement/du?prefix=",
             "/v1/placement/policy", "/v1/users", "/v1/keys", "/v1/users/root",
             "/no/such/endpoint"]


def s3_client(admin: Admin, key: str, secret: str) -> Any:
    return boto3.client("s3", endpoint_url=admin.d.url, aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name=REGION,
                        config=Config(signature_version="s3v4",
                                      s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


def error_code(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as info:
        fn(*args, **kwargs)
    return str(info.value.response["Error"]["Code"])


def signed(admin: Admin, method: str, path: str, key: str, secret: str,
           body: bytes = b"", payload_hash: str | None = None) -> tuple[int, Any]:
    """A request to the admin API signed with SigV4 the way boto3 signs S3 requests."""
    url = admin.url + path
    headers = {"x-amz-content-sha256": payload_hash or hashlib.sha256(body).hexdigest()}
    req = AWSRequest(method=method, url=url, data=body, headers=headers)
    SigV4Auth(Credentials(key, secret), "s3", REGION).add_auth(req)
    hdrs = dict(req.headers.items())
    return admin.call(method, path, token=None, headers=hdrs, body=body or None)


def test_everything_but_healthz_needs_credentials(admin: Admin) -> None:
    status, _ = admin.call("GET", "/healthz", token=None)
    assert status == 200
    for path in PROTECTED:
        for token in (None, "wrong-token-0123456789abcdef"):
            status, doc = admin.call("GET", path, token=token)
            assert status == 401, (path, token, doc)
            assert doc["error"] == "unauthorized" and doc["message"], (path, doc)
        status, doc = admin.call("GET", path)
        assert status in (200, 404), (path, doc)  # 404 only for the unknown endpoint
    # mutations too, before any body is looked at
    status, doc = admin.call("POST", "/v1/users", {"name": "mallory", "uid": 6666},
                             token=None)
    assert status == 401
    status, doc = admin.call("DELETE", "/v1/users/root", token="nope-nope-nope-nope")
    assert status == 401
    assert admin.call("GET", "/v1/users/mallory")[0] == 404
    # the token file is the operator's alone
    for name in ("admin-token", "secrets.key", "root-credentials"):
        assert stat.S_IMODE((admin.data / name).stat().st_mode) == 0o600, name


def test_user_key_lifecycle_over_s3(admin: Admin) -> None:
    name, uid = f"u{uuid.uuid4().hex[:8]}", 2001
    status, user = admin.call("POST", "/v1/users", {"name": name, "uid": uid,
                                                    "groups": [3000, 3001]})
    assert status == 201 and user == {**user, "name": name, "uid": uid, "gid": uid,
                                      "groups": [3000, 3001], "admin": False}
    status, k1 = admin.call("POST", "/v1/keys", {"user": name})
    assert status == 201 and k1["secret"] and k1["enabled"] and k1["user"] == name
    status, k2 = admin.call("POST", "/v1/keys", {"user": name})
    assert status == 201 and k2["access_key"] != k1["access_key"]

    # listing never shows a secret
    status, doc = admin.call("GET", f"/v1/keys?user={name}")
    assert status == 200
    assert sorted(k["access_key"] for k in doc["keys"]) == sorted(
        [k1["access_key"], k2["access_key"]])
    assert all("secret" not in k for k in doc["keys"])
    assert k1["secret"] not in json.dumps(doc) and k2["secret"] not in json.dumps(doc)
    status, doc = admin.call("GET", f"/v1/users/{name}")
    assert doc["keys"] == 2 and k1["secret"] not in json.dumps(doc)

    # the key acts as the user: objects it writes are owned by the uid
    root = s3_client(admin, ROOT_KEY, ROOT_SECRET)
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    root.create_bucket(Bucket=bucket, ACL="public-read-write")  # (private by default)
    c1 = s3_client(admin, k1["access_key"], k1["secret"])
    c1.put_object(Bucket=bucket, Key="mine.txt", Body=b"hello")
    listing = root.list_objects_v2(Bucket=bucket, FetchOwner=True)["Contents"]
    assert listing[0]["Owner"]["ID"] == canonical_user_id(uid)
    assert listing[0]["Owner"]["DisplayName"] == name

    # disabled: refused at once (no stale cache); enabled again: accepted
    status, doc = admin.call("POST", f"/v1/keys/{k1['access_key']}/disable")
    assert status == 200 and doc["enabled"] is False
    assert error_code(c1.list_buckets) == "InvalidAccessKeyId"
    s3_client(admin, k2["access_key"], k2["secret"]).list_buckets()  # the other key works
    assert admin.call("POST", f"/v1/keys/{k1['access_key']}/enable")[0] == 200
    c1.list_buckets()

    # a wrong secret for a real key
    # (its last character changed: one that is already "x" becomes "y")
    wrong = k1["secret"][:-1] + ("y" if k1["secret"].endswith("x") else "x")
    bad = s3_client(admin, k1["access_key"], wrong)
    assert error_code(bad.list_buckets) == "SignatureDoesNotMatch"

    # deleting one key
    status, doc = admin.call("DELETE", f"/v1/keys/{k2['access_key']}")
    assert status == 200 and doc["deleted"] == k2["access_key"]
    assert admin.call("DELETE", f"/v1/keys/{k2['access_key']}")[0] == 404

    # deleting the user removes its keys, never its files
    status, doc = admin.call("DELETE", f"/v1/users/{name}")
    assert status == 200 and doc["keys_removed"] == [k1["access_key"]]
    assert error_code(c1.list_buckets) == "InvalidAccessKeyId"
    assert root.get_object(Bucket=bucket, Key="mine.txt")["Body"].read() == b"hello"
    listing = root.list_objects_v2(Bucket=bucket, FetchOwner=True)["Contents"]
    assert listing[0]["Owner"]["ID"] == canonical_user_id(uid)
    status, doc = admin.call("GET", "/v1/keys")
    assert all(k["user"] != name for k in doc["keys"])
    root.delete_object(Bucket=bucket, Key="mine.txt")
    root.delete_bucket(Bucket=bucket)


@pytest.mark.parametrize(("doc", "status", "code"), [
    ({"name": "root", "uid": 4242}, 409, "conflict"),
    ({"name": "dupuid", "uid": 0}, 409, "conflict"),
    ({"name": "bad name", "uid": 5}, 400, "invalid"),
    ({"name": "-x", "uid": 5}, 400, "invalid"),
    ({"name": "x" * 65, "uid": 5}, 400, "invalid"),
    ({"name": "neg", "uid": -1}, 400, "invalid"),
    ({"name": "big", "uid": 2**32 - 1}, 400, "invalid"),
    ({"name": "str", "uid": "7"}, 400, "invalid"),
    ({"name": "boolid", "uid": True}, 400, "invalid"),
    ({"name": "grp", "uid": 8, "groups": "1,2"}, 400, "invalid"),
    ({"name": "adm", "uid": 9, "admin": "yes"}, 400, "invalid"),
    ({"uid": 10}, 400, "invalid"),
    ([1, 2], 400, "invalid"),
])
def test_bad_user_requests(admin: Admin, doc: Any, status: int, code: str) -> None:
    got, answer = admin.call("POST", "/v1/users", doc)
    assert (got, answer["error"]) == (status, code), answer
    assert answer["message"]


def test_bad_key_and_delete_requests(admin: Admin) -> None:
    assert admin.call("POST", "/v1/keys", {"user": "nobody-here"})[1]["error"] == "not_found"
    assert admin.call("POST", "/v1/keys", {})[1]["error"] == "invalid"
    assert admin.call("POST", "/v1/keys", body=b"not json")[1]["error"] == "invalid"
    status, doc = admin.call("POST", "/v1/keys", {"user": "root", "access_key": "AK"})
    assert (status, doc["error"]) == (400, "invalid")
    status, doc = admin.call("POST", "/v1/keys", {"user": "root", "access_key": "A B C",
                                                  "secret": "long-enough-secret"})
    assert (status, doc["error"]) == (400, "invalid")
    status, doc = admin.call("POST", "/v1/keys", {"user": "root", "access_key": ROOT_KEY,
                                                  "secret": "long-enough-secret"})
    assert (status, doc["error"]) == (409, "conflict")
    status, doc = admin.call("DELETE", "/v1/users/root")
    assert (status, doc["error"]) == (409, "conflict")
    assert admin.call("DELETE", "/v1/users/nobody-here")[0] == 404
    assert admin.call("POST", "/v1/keys/NOSUCHKEY/disable")[0] == 404
    assert admin.call("GET", "/v1/keys?user=nobody-here")[0] == 404


def test_imported_key_pair(admin: Admin) -> None:
    """An existing access key and secret can be brought in (moving users from elsewhere)."""
    name = f"imp{uuid.uuid4().hex[:6]}"
    assert admin.call("POST", "/v1/users", {"name": name, "uid": 2101})[0] == 201
    ak, sk = f"AKIMPORT{uuid.uuid4().hex[:8].upper()}", "imported-secret-" + "s" * 20
    status, doc = admin.call("POST", "/v1/keys", {"user": name, "access_key": ak,
                                                  "secret": sk})
    assert status == 201 and doc["secret"] == sk
    s3_client(admin, ak, sk).list_buckets()
    assert admin.call("DELETE", f"/v1/users/{name}")[0] == 200


def test_admin_api_with_sigv4(admin: Admin) -> None:
    # the root key belongs to the admin user root
    status, doc = signed(admin, "GET", "/v1/status", ROOT_KEY, ROOT_SECRET)
    assert status == 200 and doc["pid"] == admin.d.proc.pid
    # a signed change: the body's hash is part of the signature
    name = f"sig{uuid.uuid4().hex[:6]}"
    body = json.dumps({"name": name, "uid": 2201}).encode()
    status, doc = signed(admin, "POST", "/v1/users", ROOT_KEY, ROOT_SECRET, body)
    assert status == 201 and doc["name"] == name
    assert f"identity=\"user:root key:{ROOT_KEY}\"" in admin.log()
    # a body that does not match its signed hash
    other = json.dumps({"name": name + "x", "uid": 2202}).encode()
    status, doc = signed(admin, "POST", "/v1/users", ROOT_KEY, ROOT_SECRET, other,
                         payload_hash=hashlib.sha256(body).hexdigest())
    assert status == 401
    assert admin.call("GET", f"/v1/users/{name}x")[0] == 404
    # a wrong secret, an unknown key
    assert signed(admin, "GET", "/v1/status", ROOT_KEY, ROOT_SECRET + "x")[0] == 401
    assert signed(admin, "GET", "/v1/status", "NOSUCHKEY123", ROOT_SECRET)[0] == 401
    # a key of a user without the admin flag: authenticated, but forbidden
    status, key = admin.call("POST", "/v1/keys", {"user": name})
    status, doc = signed(admin, "GET", "/v1/status", key["access_key"], key["secret"])
    assert (status, doc["error"]) == (403, "forbidden")
    # an admin user's key may
    admin_name = name + "adm"
    assert admin.call("POST", "/v1/users", {"name": admin_name, "uid": 2203,
                                            "admin": True})[0] == 201
    status, akey = admin.call("POST", "/v1/keys", {"user": admin_name})
    status, doc = signed(admin, "GET", "/v1/users", akey["access_key"], akey["secret"])
    assert status == 200 and {u["name"] for u in doc["users"]} >= {name, admin_name}
    for n in (name, admin_name):
        assert admin.call("DELETE", f"/v1/users/{n}")[0] == 200


def test_secrets_encrypted_at_rest_and_old_keys_migrated(tmp_path: Path) -> None:
    """A key written in clear by an older tierd is encrypted at the next start and keeps
    working; a key created through the API never reaches the disk in clear; the secrets key
    file is what makes them readable."""
    data = tmp_path / "data"
    add_user_key(data, USER_KEY, USER_SECRET, 1000, "alice")
    a = start_admin(data)
    try:
        s3_client(a, USER_KEY, USER_SECRET).list_buckets()
        status, user = a.call("GET", "/v1/users/alice")  # created from the old key
        assert status == 200 and (user["uid"], user["keys"]) == (1000, 1)
        status, key = a.call("POST", "/v1/keys", {"user": "alice"})
        assert status == 201
    finally:
        a.d.stop()
    raw = b"".join(p.read_bytes() for p in (data / "meta").iterdir() if p.is_file())
    assert key["secret"].encode() not in raw
    store = MetaStore.open_lmdb(data / "meta")
    try:
        with store.snapshot() as tx:
            for k in tx.list_access_keys():
                assert k.secret == "" and len(k.secret_enc) > 28, k.access_key
    finally:
        store.close()
    # restart: the same keys work (the secrets key and the records agree)
    a = start_admin(data)
    try:
        s3_client(a, USER_KEY, USER_SECRET).list_buckets()
        s3_client(a, key["access_key"], key["secret"]).list_buckets()
        s3_client(a, ROOT_KEY, ROOT_SECRET).list_buckets()
    finally:
        a.d.stop()


def test_generated_root_key_and_token_survive_restarts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    a = start_admin(data, env=env)
    try:
        creds = (data / "root-credentials").read_text()
        token = a.token
        assert len(token) >= 32
    finally:
        a.d.stop()
    a = start_admin(data, env=env)
    try:
        assert (data / "root-credentials").read_text() == creds
        assert a.token == token
        lines = dict(ln.split(" = ") for ln in creds.splitlines() if " = " in ln)
        s3_client(a, lines["aws_access_key_id"], lines["aws_secret_access_key"]).list_buckets()
        assert a.call("GET", "/v1/status", token=token)[0] == 200
    finally:
        a.d.stop()
    # TIERD_ADMIN_TOKEN replaces the token (and the file follows)
    chosen = "chosen-admin-token-" + uuid.uuid4().hex
    a = start_admin(data, env={**env, "TIERD_ADMIN_TOKEN": chosen})
    try:
        assert a.token == chosen
        assert a.call("GET", "/v1/status", token=token)[0] == 401
        assert a.call("GET", "/v1/status", token=chosen)[0] == 200
    finally:
        a.d.stop()
    assert token not in a.log() and chosen not in a.log()
